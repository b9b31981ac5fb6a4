package machinehealthcheck

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
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
}

// observeEtcdMembers fills target.etcd for control-plane targets from the etcd member source. A
// Machine seen healthy is forgotten at once; one not observed for etcdForgetAfter (gone) is pruned.
func (r *Reconciler) observeEtcdMembers(health map[string]EtcdMemberHealth, targets []target, now time.Time) {
	e := &r.etcdUnhealthy
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
			h = EtcdMemberHealth{Problem: "missing from the member list"}
		}
		if h.Healthy {
			delete(e.since, m.UID)
			targets[i].etcd = &etcdMemberFact{healthy: true}
			continue
		}
		entry, seen := e.since[m.UID]
		if !seen {
			entry.since = now
		}
		entry.observed = now
		e.since[m.UID] = entry
		targets[i].etcd = &etcdMemberFact{problem: h.Problem, since: entry.since}
	}
}
