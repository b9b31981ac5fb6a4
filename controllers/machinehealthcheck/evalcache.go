package machinehealthcheck

import (
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/cluster-api/util"
)

// This file holds the evaluation cache, which lets a round evaluate only what changed: per health
// check, the last
// evaluation of every target (what the counts and the status need of it) and the Machines whose
// watch events came in since. A round that starts from it reads and evaluates the changed Machines
// and those it must look at every round (unhealthy, or with a timeout running), instead of every
// target. Anything it cannot account for makes the next round a full pass, which rebuilds it:
// a new or changed spec, other Cluster facts, a (re)connection to the workload cluster, a failed
// round, a watch event that could not be mapped, a restart (the cache is lost), and at least every
// fullPassInterval, in case a watch event was missed.

// fullPassInterval bounds how long incremental rounds run from the cache alone before a full pass.
const fullPassInterval = 5 * time.Minute

// evalCaches holds the evaluation cache of each health check, keyed by its namespaced name (all the watch
// handlers know).
type evalCaches struct {
	mu sync.Mutex
	m  map[types.NamespacedName]*evalCache
}

// evalCache is one health check's evaluation cache. dirty and stale are written by the watch handlers under
// evalCaches.mu; the rest only by the health check's own reconciles, which never run at once.
type evalCache struct {
	dirty map[string]struct{}
	stale bool

	uid        types.UID
	generation int64
	facts      clusterFacts
	lastFull   time.Time

	targets map[string]counted
	// watched are the targets evaluated every round: unhealthy (their requests depend on the limits,
	// which other targets change) or with a timeout running (they change with time alone).
	watched   map[string]struct{}
	unhealthy map[string]struct{}
	// names is every target's name, sorted; nil after a target came or went.
	names []string
	n     counts
}

// counted is what the counts need of a target's last evaluation.
type counted struct {
	controlPlane, healthy, starting bool
}

// counts are the round's counts that the limits and the status need.
type counts struct {
	healthy, cpTargets, cpNotHealthy, cpStarting int
}

func (c *counts) add(r counted, sign int) {
	if r.healthy {
		c.healthy += sign
	}
	if r.controlPlane {
		c.cpTargets += sign
		if !r.healthy {
			c.cpNotHealthy += sign
		}
		if r.starting {
			c.cpStarting += sign
		}
	}
}

// countedOf is what the counts need of target t evaluated as ev (as evaluateAll counts it).
func countedOf(t target, ev evaluation) counted {
	cp := util.IsControlPlaneMachine(t.machine)
	return counted{
		controlPlane: cp,
		healthy:      ev.verdict == verdictHealthy,
		starting:     cp && ev.verdict == verdictPending && !t.machine.Status.NodeRef.IsDefined(),
	}
}

// changed records a watch event of Machine name for the health check key; it is evaluated in the
// health check's next round. Nothing is recorded before the health check's first round: that one is
// a full pass.
func (caches *evalCaches) changed(key types.NamespacedName, name string) {
	caches.mu.Lock()
	defer caches.mu.Unlock()
	ec := caches.m[key]
	if ec == nil || ec.stale {
		return
	}
	ec.dirty[name] = struct{}{}
	if len(ec.dirty) > len(ec.targets) {
		// More changed than there are targets (e.g. Machines replaced while no round runs, the
		// health check paused or its workload cluster unreachable): a full pass costs no more, and
		// the set stops growing.
		ec.dirty = map[string]struct{}{}
		ec.stale = true
	}
}

// invalidate makes the health check's next round a full pass.
func (caches *evalCaches) invalidate(key types.NamespacedName) {
	caches.mu.Lock()
	defer caches.mu.Unlock()
	if ec := caches.m[key]; ec != nil {
		ec.stale = true
	}
}

// invalidateAll makes every health check's next round a full pass (a watch event that could not be
// mapped to its health checks).
func (caches *evalCaches) invalidateAll() {
	caches.mu.Lock()
	defer caches.mu.Unlock()
	for _, ec := range caches.m {
		ec.stale = true
	}
}

// forget drops a deleted health check's cache.
func (caches *evalCaches) forget(key types.NamespacedName) {
	caches.mu.Lock()
	defer caches.mu.Unlock()
	delete(caches.m, key)
}

// evalCacheKey is what a cache is valid for: a health check (its UID, as one deleted and created again
// under the same name starts over), its spec, and the Cluster facts the evaluation depends on.
type evalCacheKey struct {
	uid        types.UID
	generation int64
	facts      clusterFacts
}

// begin starts a round of health check key. It returns the health check's cache and whether the
// round must be a full pass; when it need not, work is what the round must evaluate: the Machines
// changed since the last round and the watched targets, sorted. Changes recorded from now on are for
// the next round.
func (caches *evalCaches) begin(key types.NamespacedName, valid evalCacheKey, now time.Time) (ec *evalCache, work []string, full bool) {
	caches.mu.Lock()
	defer caches.mu.Unlock()
	if caches.m == nil {
		caches.m = map[types.NamespacedName]*evalCache{}
	}
	ec = caches.m[key]
	if ec == nil {
		ec = &evalCache{}
		caches.m[key] = ec
	}
	dirty := ec.dirty
	ec.dirty = map[string]struct{}{}
	full = ec.targets == nil || ec.stale || ec.uid != valid.uid || ec.generation != valid.generation ||
		!ec.facts.equal(valid.facts) || now.Sub(ec.lastFull) >= fullPassInterval
	ec.stale = false
	if full {
		return ec, nil, true
	}
	for name := range dirty {
		work = append(work, name)
	}
	for name := range ec.watched {
		if _, ok := dirty[name]; !ok {
			work = append(work, name)
		}
	}
	slices.Sort(work)
	return ec, work, false
}

// reset rebuilds the cache from a full pass's round.
func (ec *evalCache) reset(rd *round, valid evalCacheKey, now time.Time) {
	ec.uid, ec.generation, ec.facts, ec.lastFull = valid.uid, valid.generation, valid.facts, now
	ec.targets = make(map[string]counted, len(rd.targets))
	ec.watched, ec.unhealthy = map[string]struct{}{}, map[string]struct{}{}
	ec.n = counts{}
	for i, t := range rd.targets {
		ec.put(t, rd.evals[i])
	}
	ec.names = rd.names
}

// put records target t's evaluation ev in place of its previous one, if any.
func (ec *evalCache) put(t target, ev evaluation) {
	name := t.machine.Name
	ec.remove(name)
	r := countedOf(t, ev)
	ec.targets[name] = r
	ec.n.add(r, 1)
	ec.names = nil
	if ev.verdict == verdictUnhealthy {
		ec.unhealthy[name] = struct{}{}
	}
	if ev.verdict == verdictUnhealthy || ev.nextCheck > 0 {
		ec.watched[name] = struct{}{}
	}
}

// remove forgets a Machine that is no longer a target (gone, no longer selected, paused, skipped).
func (ec *evalCache) remove(name string) {
	r, ok := ec.targets[name]
	if !ok {
		return
	}
	ec.n.add(r, -1)
	delete(ec.targets, name)
	delete(ec.watched, name)
	delete(ec.unhealthy, name)
	ec.names = nil
}

// update records a round of some targets: evaluated ones (evals[i] of targets[i]) and the names
// found to be no target any more.
func (ec *evalCache) update(targets []target, evals []evaluation, gone []string) {
	for _, name := range gone {
		ec.remove(name)
	}
	for i, t := range targets {
		// A remove and a put leave names as it was when the set of names did not change.
		_, known := ec.targets[t.machine.Name]
		names := ec.names
		ec.put(t, evals[i])
		if known {
			ec.names = names
		}
	}
	if ec.names == nil {
		ec.names = make([]string, 0, len(ec.targets))
		for name := range ec.targets {
			ec.names = append(ec.names, name)
		}
		slices.Sort(ec.names)
	}
}

// summarize fills the round's counts, names and unhealthy names from the cache.
func (ec *evalCache) summarize(rd *round) {
	rd.total = len(ec.targets)
	rd.healthy, rd.cpTargets, rd.cpNotHealthy, rd.cpStarting = ec.n.healthy, ec.n.cpTargets, ec.n.cpNotHealthy, ec.n.cpStarting
	rd.names = ec.names
	rd.unhealthy = nil
	for name := range ec.unhealthy {
		rd.unhealthy = append(rd.unhealthy, name)
	}
	slices.Sort(rd.unhealthy)
}

func (f clusterFacts) equal(o clusterFacts) bool {
	return f.infrastructureReady == o.infrastructureReady && f.infrastructureReadyTime.Equal(o.infrastructureReadyTime) &&
		f.controlPlaneInitialized == o.controlPlaneInitialized && f.controlPlaneInitTime.Equal(o.controlPlaneInitTime)
}
