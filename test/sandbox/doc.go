// Package sandbox runs a Cluster API management cluster on one machine for tests and `make demo`: a
// real kube-apiserver and etcd (envtest), CAPI's CRDs, a contract-conformant test infrastructure
// provider and control-plane provider, and for every workload cluster a real etcd cluster with one
// member process per control-plane Machine. Each sandbox Node has a kubelet stand-in that serves
// the API server's pods/portforward to that Machine's etcd member, so CAPR reaches etcd exactly as in
// production. Faults are injected by killing member processes, kubelets and Node heartbeats.
package sandbox
