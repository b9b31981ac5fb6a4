// Package etcdutil reaches a workload cluster's etcd; the quorum math it feeds lives in etcdutil/quorum,
// which does not import the etcd client.
//
// client.go builds clients the way KCP does: port-forward through the workload cluster's API server
// to the etcd-<node> pod (CAPI's controlplane/kubeadm/pkg/proxy dialer) with a client certificate
// signed by the CA in secret <cluster>-etcd, or direct endpoints for external etcd and tests. The
// etcd client dials in the background and logs through etcd's own zap configuration at error level.
// clientcache.go shares connected clients per cluster and node, and dials a node whose last dial
// failed again in the background instead of making every caller wait (workload.go wires it per Cluster,
// reads the CA secret at most once a minute, and forgets idle clusters). cluster.go has the
// membership operations: Inspect dials and asks every member in parallel, each once, within one
// deadline, and reports whether a linearizable read proved quorum (State.QuorumProven) or the list
// is one member's node-local view (State.Serializable, never acted on). peers.go decides whether a
// member that cannot be reached runs anyway, from etcd's own view: the leader the others follow, or
// a follower whose raft messages the leader keeps receiving, read from its metrics (MetricsConnector).
//
// KCP's exported etcd client (sigs.k8s.io/cluster-api/controlplane/kubeadm/pkg/etcd and
// pkg.EtcdClientGenerator) was evaluated and is not used as a client: etcd.NewClient costs an extra
// Status round trip per connection, owns and closes its clients (no sharing), and the generator dials
// nodes one after the other (forFirstAvailableNode), which is the sequential behaviour this package
// avoids. Its certificate cache (pkg.Management.ClientCertCache, util/cache) needs a context-bound
// expiry goroutine and keys by cluster only, so a rotated CA is not noticed. What fits is reused: the
// proxy dialer, the non-blocking dial with DialTimeout, alarms from AlarmList only, and etcd's default
// zap logger (go.etcd.io/etcd/client/pkg/v3/logutil, as KCP's main.go does).
package etcdutil
