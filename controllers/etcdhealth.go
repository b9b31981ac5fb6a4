package controllers

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
	"k8s.io/apimachinery/pkg/types"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capr-io/capr/controllers/machinehealthcheck"
	"github.com/capr-io/capr/etcdutil"
)

// etcdMemberSource feeds the health checker's checks.etcdMember from the workload cluster's etcd,
// reached the same way the remediator reaches it.
type etcdMemberSource struct {
	client   client.Client
	workload *etcdutil.Workload
}

// MemberHealth implements machinehealthcheck.EtcdMemberSource.
func (e *etcdMemberSource) MemberHealth(ctx context.Context, cluster *clusterv1.Cluster) (map[string]machinehealthcheck.EtcdMemberHealth, error) {
	machines := &clusterv1.MachineList{}
	if err := e.client.List(ctx, machines, client.InNamespace(cluster.Namespace),
		client.MatchingLabels{clusterv1.ClusterNameLabel: cluster.Name}, client.HasLabels{clusterv1.MachineControlPlaneLabel}); err != nil {
		return nil, fmt.Errorf("listing the control-plane Machines of cluster %s: %w", cluster.Name, err)
	}
	var nodes []string
	for _, m := range machines.Items {
		if m.Status.NodeRef.IsDefined() {
			nodes = append(nodes, m.Status.NodeRef.Name)
		}
	}
	ec, err := e.workload.ForCluster(ctx, cluster)
	if err != nil {
		return nil, err
	}
	state, err := ec.Inspect(ctx, nodes)
	if err != nil {
		return nil, fmt.Errorf("inspecting the etcd members of cluster %s: %w", cluster.Name, err)
	}
	out := map[string]machinehealthcheck.EtcdMemberHealth{}
	keep := nodes
	for _, m := range state.Members {
		if m.Name != "" {
			out[m.Name] = machinehealthcheck.EtcdMemberHealth{Healthy: m.Healthy, Votes: m.Up(), Problem: m.Problem, Learner: m.IsLearner}
			keep = append(keep, m.Name)
		}
	}
	// The cached clients of members whose Machines and members are gone are closed now, not when idle.
	e.workload.Retain(cluster.UID, keep)
	if !state.QuorumProven {
		ctrl.LoggerFrom(ctx).Info("No etcd member could serve a linearizable read: member health is one member's local view",
			"unreachable", state.UnreachableNames())
	}
	return out, nil
}

// sharedEtcdMembers is one etcd observation per cluster, shared by every health check that reads
// it. Overlapping health checks over one cluster each poll etcd every few seconds, and each read
// holds one of the health checker's workers (shared by every namespace) for as long as the slowest
// member takes to answer; a black-holed node makes that a dial timeout. So a call for a cluster whose
// read is in flight waits for that read instead of starting its own, and a read younger than maxAge
// is given again. Failed reads are not kept. The shared read runs on the context of the caller that
// started it: if that caller's reconcile ends first, the others get its error and read again at their
// next poll, never a wait longer than their own context. The remediator does not share it: it reads etcd live
// before each step it decides (remediation/controlplane).
type sharedEtcdMembers struct {
	source machinehealthcheck.EtcdMemberSource
	maxAge time.Duration
	// now is time.Now, replaceable in tests.
	now func() time.Time

	flight singleflight.Group
	mu     sync.Mutex
	last   map[types.UID]etcdObservation
}

// sharedEtcdMaxAge is how old an etcd observation may be when a health check is given it: well under
// the etcd member check's poll interval (5 s) and any timeout it counts against.
const sharedEtcdMaxAge = 2 * time.Second

type etcdObservation struct {
	at     time.Time
	health map[string]machinehealthcheck.EtcdMemberHealth
}

func newSharedEtcdMembers(source machinehealthcheck.EtcdMemberSource) *sharedEtcdMembers {
	return &sharedEtcdMembers{source: source, maxAge: sharedEtcdMaxAge, now: time.Now, last: map[types.UID]etcdObservation{}}
}

// MemberHealth implements machinehealthcheck.EtcdMemberSource. Each caller gets its own copy.
func (s *sharedEtcdMembers) MemberHealth(ctx context.Context, cluster *clusterv1.Cluster) (map[string]machinehealthcheck.EtcdMemberHealth, error) {
	if h, ok := s.fresh(cluster.UID); ok {
		return h, nil
	}
	// A caller that joins another's read still waits no longer than its own context allows.
	ch := s.flight.DoChan(string(cluster.UID), func() (any, error) {
		if h, ok := s.fresh(cluster.UID); ok {
			return h, nil
		}
		h, err := s.source.MemberHealth(ctx, cluster)
		if err != nil {
			return nil, err
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		s.last[cluster.UID] = etcdObservation{at: s.now(), health: h}
		return h, nil
	})
	select {
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for the etcd read of cluster %s: %w", cluster.Name, ctx.Err())
	case r := <-ch:
		if r.Err != nil {
			return nil, r.Err
		}
		return maps.Clone(r.Val.(map[string]machinehealthcheck.EtcdMemberHealth)), nil
	}
}

// fresh returns a copy of the cluster's last observation while it is no older than maxAge, and drops
// every older one (of this cluster or any other).
func (s *sharedEtcdMembers) fresh(uid types.UID) (map[string]machinehealthcheck.EtcdMemberHealth, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	for k, o := range s.last {
		if now.Sub(o.at) > s.maxAge {
			delete(s.last, k)
		}
	}
	o, ok := s.last[uid]
	if !ok {
		return nil, false
	}
	return maps.Clone(o.health), true
}
