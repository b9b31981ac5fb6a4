// Package etcdutil reaches a workload cluster's etcd and holds the quorum math.
//
// quorum.go holds the pure decisions of design §5 (quorum present, safe to add, safe to remove,
// quorum-safe maxUnhealthy). client.go builds clients the way KCP does: port-forward through the
// workload cluster's API server to the etcd-<node> pod with a client certificate signed by the CA in
// secret <cluster>-etcd, or direct endpoints for external etcd and tests. cluster.go has the
// membership operations, each bounded by a timeout.
package etcdutil
