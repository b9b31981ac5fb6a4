// Package kind is the kind platform's own code and data (docs/developer/kind.md):
//
//   - etcdview.go: the e2e observer's reading of etcdctl's answers (ParseEtcdctl), kept here, outside
//     the kind-tagged e2e files, so that make test runs its table test;
//   - cmd/: the programs the platform's images run: pause, the pod network (cni) and the stand-in for
//     cert-manager's controllers (certissuer, its logic in package certissuer);
//   - manifests/: the pod network, the cert-manager stand-in's Deployment and the power-fencing
//     provider's CRDs and RBAC;
//   - templates/: the workload cluster templates, each carrying the pod network (templates_test.go).
package kind
