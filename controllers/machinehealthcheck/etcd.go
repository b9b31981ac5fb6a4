package machinehealthcheck

import (
	"context"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util"
	ctrl "sigs.k8s.io/controller-runtime"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// etcdForgetAfter is how long an unhealthy-since time is kept once no health check observes its
// Machine any more (the Machine, its cluster or its health check is gone). Forgetting a Machine that
// still exists only restarts its timeout: it can delay a mark, never make one early.
const etcdForgetAfter = time.Hour

// etcdSince remembers since when each control-plane Machine's etcd member has been seen unhealthy.
// It lives in memory, on the Reconciler: after a restart the timeout starts again, which can only
// delay a mark, never make one early. Its zero value is ready to use.
type etcdSince struct {
	mu    sync.Mutex
	since map[types.UID]etcdSinceEntry
}

type etcdSinceEntry struct {
	since    time.Time
	observed time.Time
	// joining: the member was last seen not yet a voter (a learner, reachable or not, or not listed).
	joining bool
	// promoted: the time was started again when the member was first seen voting; once only.
	promoted bool
}

// etcdProblemMissing is the problem of a control-plane Machine whose Node has no member in the list.
const etcdProblemMissing = "missing from the member list"

// observeEtcdMembers fills target.etcd for control-plane targets from the etcd member source. A
// Machine seen healthy is forgotten at once; one not observed for etcdForgetAfter (gone) is pruned.
//
// A member's promotion to voter starts its time again, once: a learner (reachable or not) or a
// member not listed yet is timed as joining, and one that is then a voter but not healthy is timed
// from its promotion. etcd promotes a learner once its log holds 90 % of the leader's
// (readyPercentThreshold, etcd server.go), so a replacement can vote before it has caught up and
// fail its reads for a few seconds; counted from the start of its join, a short timeout marked such
// a replacement on real nodes (docs/developer/kind.md).
func (r *Reconciler) observeEtcdMembers(health map[string]EtcdMemberHealth, targets []target, now time.Time) {
	e := &r.state.etcdUnhealthy
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.since == nil {
		e.since = map[types.UID]etcdSinceEntry{}
	}
	for uid, entry := range e.since {
		if now.Sub(entry.observed) > etcdForgetAfter {
			delete(e.since, uid)
		}
	}
	for i := range targets {
		m := targets[i].machine
		if !isControlPlane(m) || !m.Status.NodeRef.IsDefined() {
			continue
		}
		h, ok := health[m.Status.NodeRef.Name]
		if !ok {
			h = EtcdMemberHealth{Problem: etcdProblemMissing}
		}
		if h.Healthy {
			delete(e.since, m.UID)
			targets[i].etcd = &etcdMemberFact{healthy: true}
			continue
		}
		entry, seen := e.since[m.UID]
		joining := !ok || h.Learner
		switch {
		case !seen:
			entry.since = now
		case entry.joining && !joining && !entry.promoted:
			entry.since, entry.promoted = now, true
		}
		entry.observed, entry.joining = now, joining
		e.since[m.UID] = entry
		targets[i].etcd = &etcdMemberFact{problem: h.Problem, since: entry.since}
	}
}

// etcdPollInterval is how often etcd member health is read when checks.etcdMember is set (etcd
// changes produce no Kubernetes events to react to).
const etcdPollInterval = 5 * time.Second

// EtcdMemberSource reports, per Node name, the health of the etcd members of a cluster.
type EtcdMemberSource interface {
	MemberHealth(ctx context.Context, cluster *clusterv1.Cluster) (map[string]EtcdMemberHealth, error)
}

// EtcdMemberHealth is the health of one etcd member, as seen now.
type EtcdMemberHealth struct {
	Healthy bool
	// Votes is true when the member runs and follows a leader although it is not Healthy: its only
	// problem is an etcd alarm, which stops requests, not its vote (etcdutil.MemberStatus.Votes). It
	// is still reported by the etcd member check, and counted as up by quorumOf.
	Votes bool
	// Problem says what is wrong, e.g. "unreachable", "missing", "alarmed (NOSPACE)", "a learner".
	// "has no leader" also decides the etcd quorum (quorumOf).
	Problem string
	// Learner is true for a member that does not vote yet, whether or not it could be reached (an
	// unreachable learner's Problem is "unreachable").
	Learner bool
}

// observeEtcd reads etcd for the etcd member check: each control-plane target's member health
// (observeEtcdMembers) and whether etcd has quorum. Without etcd state the check neither marks nor
// clears, and the quorum is unknown (the zero etcdQuorum). A round without control-plane targets
// does not read etcd at all: only control-plane targets carry etcd facts and only the control-plane
// limit uses the quorum, so reading it would only delay the marks of the workers. Nor does a round
// of a cluster whose etcd is external: its control-plane Machines have no members.
func (r *Reconciler) observeEtcd(ctx context.Context, cluster *clusterv1.Cluster, cfg checkConfig, facts clusterFacts, targets []target, placement caprv1.EtcdPlacement, now time.Time) etcdQuorum {
	if cfg.etcdMemberTimeout <= 0 || r.EtcdMembers == nil || !facts.controlPlaneInitialized || !hasControlPlaneTarget(targets) ||
		placement == caprv1.EtcdPlacementExternal {
		return etcdQuorum{}
	}
	health, err := r.EtcdMembers.MemberHealth(ctx, cluster)
	if err != nil {
		ctrl.LoggerFrom(ctx).Info("Could not read etcd member health; the etcd member check and the quorum are skipped this time", "err", err.Error())
		return etcdQuorum{readErr: err}
	}
	r.observeEtcdMembers(health, targets, now)
	q := quorumOf(health)
	if q.lost() {
		excuseLeaderless(targets)
	}
	return q
}

func hasControlPlaneTarget(targets []target) bool {
	for _, t := range targets {
		if util.IsControlPlaneMachine(t.machine) {
			return true
		}
	}
	return false
}
