// Package scenarios holds the control-plane remediation scenarios that run CAPR against the sandbox
// (test/sandbox): a real kube-apiserver and etcd for the management cluster and, for every workload
// cluster, real etcd member processes. They need the binaries built by `make envtest-assets`; the
// remediator's pure tests stay beside the code in remediation/controlplane and run with `make unit`.
package scenarios
