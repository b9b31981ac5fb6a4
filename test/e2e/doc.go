// Package e2e is CAPR's end-to-end suite: given a management cluster with CAPI and CAPR installed, it
// creates a workload cluster, breaks a control-plane Machine and a worker, and checks that both are
// remediated end to end, through the management cluster's API only.
//
// It runs on two platforms (suite_test.go):
//
//   - the sandbox (default, part of `make test`): CAPI's core, kubeadm bootstrap and KCP reconcilers
//     in-process, admission webhooks, kube-controller-manager, real etcd members, and the **built
//     capr binary** running as the rendered components' ServiceAccount with their RBAC only;
//   - a real management cluster, e.g. kind with CAPD (`make e2e E2E_KUBECONFIG=...`): see
//     docs/developer/testing.md (End-to-end suite). Only creating the cluster and breaking a node differ (platform_*.go).
//
// With the tag kind it also holds the kind faults (kind_test.go), judged by an observer that uses no
// CAPR package (observer_kind_test.go), and the comparison with CAPI's MachineHealthCheck and KCP's
// own remediation (compare_kind_test.go, make compare-kind): docs/developer/kind.md.
package e2e
