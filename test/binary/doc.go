// Package binary runs the built CAPR manager binary as a process, authenticated as the ServiceAccount
// of the rendered clusterctl components with a token from the TokenRequest API and holding only the
// RBAC those components ship (aggregated by kube-controller-manager's ClusterRole aggregation
// controller), against the sandbox: the least-privilege claim checked on what a user installs.
package binary
