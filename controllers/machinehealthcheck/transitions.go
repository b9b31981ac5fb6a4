package machinehealthcheck

import (
	"context"
	"errors"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/cluster-api/controllers/clustercache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// This file holds what the health checker remembers in memory between reconciles. Losing it on a
// restart only falls back to what the API says.

// firstConnectionGrace bounds how long the health checker waits for the ClusterCache to attempt its
// first connection to a workload cluster before reporting it unreachable.
const firstConnectionGrace = time.Minute

// reportedReasons is the reason this process last set on each condition of each health check.
type reportedReasons struct {
	mu   sync.Mutex
	last map[types.UID]map[string]string
}

// swap records reason as the last one set on condition conditionType of health check uid and
// returns the previous one: the one recorded before, or fallback when none was (after a restart:
// the object's).
func (r *reportedReasons) swap(uid types.UID, conditionType, fallback, reason string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.last == nil {
		r.last = map[types.UID]map[string]string{}
	}
	byType, ok := r.last[uid]
	if !ok {
		byType = map[string]string{}
		r.last[uid] = byType
	}
	previous, ok := byType[conditionType]
	if !ok {
		previous = fallback
	}
	byType[conditionType] = reason
	return previous
}

// forget drops what was recorded for a deleted health check.
func (r *reportedReasons) forget(uid types.UID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.last, uid)
}

// firstConnections remembers since when the health checker has been waiting for the ClusterCache's
// first connection to each workload cluster.
type firstConnections struct {
	mu    sync.Mutex
	since map[client.ObjectKey]time.Time
}

// waiting reports whether err only means that the ClusterCache has not connected to the workload
// cluster yet, as on every start: it never connected, no connection attempt has failed since the
// health checker started waiting, and the wait is shorter than firstConnectionGrace. Anything else is
// an unreachable workload cluster.
func (f *firstConnections) waiting(ctx context.Context, cc clustercache.ClusterCache, key client.ObjectKey, err error, now time.Time) bool {
	if !errors.Is(err, clustercache.ErrClusterNotConnected) {
		return false
	}
	state := cc.GetHealthCheckingState(ctx, key)
	if !state.LastProbeSuccessTime.IsZero() {
		return false // it was connected: the connection was lost
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.since == nil {
		f.since = map[client.ObjectKey]time.Time{}
	}
	since, ok := f.since[key]
	if !ok {
		since = now
		f.since[key] = now
	}
	return !state.LastProbeTime.After(since) && now.Sub(since) < firstConnectionGrace
}

// done forgets the wait once the workload cluster was reached.
func (f *firstConnections) done(key client.ObjectKey) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.since, key)
}

// machineEventBudget is how many events of each reason the health checks of a namespace may still
// record on Machines: machineEventsPerSecond per second, as many at once. Many health checks marking
// a few Machines each in the same second (a zone lost, spread over many pools) would otherwise each
// record an event per Machine. Its zero value is ready to use; a nil budget allows every event.
type machineEventBudget struct {
	mu      sync.Mutex
	buckets map[eventBucket]*rate.Limiter
}

type eventBucket struct {
	namespace, reason string
}

// allow takes one event of reason in namespace from the budget, if there is one left.
func (b *machineEventBudget) allow(namespace, reason string, now time.Time) bool {
	if b == nil {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.buckets == nil {
		b.buckets = map[eventBucket]*rate.Limiter{}
	}
	key := eventBucket{namespace: namespace, reason: reason}
	l := b.buckets[key]
	if l == nil {
		l = rate.NewLimiter(rate.Limit(machineEventsPerSecond), machineEventsPerSecond)
		b.buckets[key] = l
	}
	return l.AllowN(now, 1)
}
