package machinehealthcheck

import (
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/cluster-api/util"
)

// This file holds what lets a round evaluate only what changed: per health check, the last
// evaluation of every target (what the counts and the status need of it) and the Machines whose
// watch events came in since. A round that starts from it reads and evaluates the changed Machines
// and those it must look at every round (unhealthy, or with a timeout running), instead of every
// target. Anything it cannot account for makes the next round a full pass, which rebuilds it:
// a new or changed spec, other Cluster facts, a (re)connection to the workload cluster, a failed
// round, a watch event that could not be mapped, a restart (memory is lost), and at least every
// fullPassInterval, in case a watch event was missed.

// fullPassInterval bounds how long rounds run from memory alone before a full pass.
const fullPassInterval = 5 * time.Minute

// memories holds the memory of each health check, keyed by its namespaced name (all the watch
// handlers know).
type memories struct {
	mu sync.Mutex
	m  map[types.NamespacedName]*memory
}

// memory is one health check's memory. dirty and stale are written by the watch handlers under
// memories.mu; the rest only by the health check's own reconciles, which never run at once.
type memory struct {
	dirty map[string]struct{}
	stale bool

	uid        types.UID
	generation int64
	facts      clusterFacts
	lastFull   time.Time

	targets map[string]remembered
	// watched are the targets evaluated every round: unhealthy (their requests depend on the limits,
	// which other targets change) or with a timeout running (they change with time alone).
	watched   map[string]struct{}
	unhealthy map[string]struct{}
	// names is every target's name, sorted; nil after a target came or went.
	names []string
	n     counts
}

// remembered is what the counts need of a target's last evaluation.
type remembered struct {
	controlPlane, healthy, starting bool
}

// counts are the round's counts that the limits and the status need.
type counts struct {
	healthy, cpTargets, cpNotHealthy, cpStarting int
}

func (c *counts) add(r remembered, sign int) {
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

// rememberedOf is what the counts need of target t evaluated as ev (as evaluateAll counts it).
func rememberedOf(t target, ev evaluation) remembered {
	cp := util.IsControlPlaneMachine(t.machine)
	return remembered{
		controlPlane: cp,
		healthy:      ev.verdict == verdictHealthy,
		starting:     cp && ev.verdict == verdictPending && !t.machine.Status.NodeRef.IsDefined(),
	}
}

// changed records a watch event of Machine name for the health check key; it is evaluated in the
// health check's next round. Nothing is recorded before the health check's first round: that one is
// a full pass.
func (ms *memories) changed(key types.NamespacedName, name string) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	mem := ms.m[key]
	if mem == nil || mem.stale {
		return
	}
	mem.dirty[name] = struct{}{}
	if len(mem.dirty) > len(mem.targets) {
		// More changed than there are targets (e.g. Machines replaced while no round runs, the
		// health check paused or its workload cluster unreachable): a full pass costs no more, and
		// the set stops growing.
		mem.dirty = map[string]struct{}{}
		mem.stale = true
	}
}

// invalidate makes the health check's next round a full pass.
func (ms *memories) invalidate(key types.NamespacedName) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if mem := ms.m[key]; mem != nil {
		mem.stale = true
	}
}

// invalidateAll makes every health check's next round a full pass (a watch event that could not be
// mapped to its health checks).
func (ms *memories) invalidateAll() {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	for _, mem := range ms.m {
		mem.stale = true
	}
}

// forget drops a deleted health check's memory.
func (ms *memories) forget(key types.NamespacedName) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	delete(ms.m, key)
}

// memoryKey is what a memory is valid for: a health check (its UID, as one deleted and created again
// under the same name starts over), its spec, and the Cluster facts the evaluation depends on.
type memoryKey struct {
	uid        types.UID
	generation int64
	facts      clusterFacts
}

// begin starts a round of health check key. It returns the health check's memory and whether the
// round must be a full pass; when it need not, work is what the round must evaluate: the Machines
// changed since the last round and the watched targets, sorted. Changes recorded from now on are for
// the next round.
func (ms *memories) begin(key types.NamespacedName, valid memoryKey, now time.Time) (mem *memory, work []string, full bool) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if ms.m == nil {
		ms.m = map[types.NamespacedName]*memory{}
	}
	mem = ms.m[key]
	if mem == nil {
		mem = &memory{}
		ms.m[key] = mem
	}
	dirty := mem.dirty
	mem.dirty = map[string]struct{}{}
	full = mem.targets == nil || mem.stale || mem.uid != valid.uid || mem.generation != valid.generation ||
		!mem.facts.equal(valid.facts) || now.Sub(mem.lastFull) >= fullPassInterval
	mem.stale = false
	if full {
		return mem, nil, true
	}
	for name := range dirty {
		work = append(work, name)
	}
	for name := range mem.watched {
		if _, ok := dirty[name]; !ok {
			work = append(work, name)
		}
	}
	slices.Sort(work)
	return mem, work, false
}

// reset rebuilds the memory from a full pass's round.
func (mem *memory) reset(rd *round, valid memoryKey, now time.Time) {
	mem.uid, mem.generation, mem.facts, mem.lastFull = valid.uid, valid.generation, valid.facts, now
	mem.targets = make(map[string]remembered, len(rd.targets))
	mem.watched, mem.unhealthy = map[string]struct{}{}, map[string]struct{}{}
	mem.n = counts{}
	for i, t := range rd.targets {
		mem.put(t, rd.evals[i])
	}
	mem.names = rd.names
}

// put records target t's evaluation ev in place of its previous one, if any.
func (mem *memory) put(t target, ev evaluation) {
	name := t.machine.Name
	mem.remove(name)
	r := rememberedOf(t, ev)
	mem.targets[name] = r
	mem.n.add(r, 1)
	mem.names = nil
	if ev.verdict == verdictUnhealthy {
		mem.unhealthy[name] = struct{}{}
	}
	if ev.verdict == verdictUnhealthy || ev.nextCheck > 0 {
		mem.watched[name] = struct{}{}
	}
}

// remove forgets a Machine that is no longer a target (gone, no longer selected, paused, skipped).
func (mem *memory) remove(name string) {
	r, ok := mem.targets[name]
	if !ok {
		return
	}
	mem.n.add(r, -1)
	delete(mem.targets, name)
	delete(mem.watched, name)
	delete(mem.unhealthy, name)
	mem.names = nil
}

// update records a round of some targets: evaluated ones (evals[i] of targets[i]) and the names
// found to be no target any more.
func (mem *memory) update(targets []target, evals []evaluation, gone []string) {
	for _, name := range gone {
		mem.remove(name)
	}
	for i, t := range targets {
		// A remove and a put leave names as it was when the set of names did not change.
		_, known := mem.targets[t.machine.Name]
		names := mem.names
		mem.put(t, evals[i])
		if known {
			mem.names = names
		}
	}
	if mem.names == nil {
		mem.names = make([]string, 0, len(mem.targets))
		for name := range mem.targets {
			mem.names = append(mem.names, name)
		}
		slices.Sort(mem.names)
	}
}

// summarize fills the round's counts, names and unhealthy names from the memory.
func (mem *memory) summarize(rd *round) {
	rd.total = len(mem.targets)
	rd.healthy, rd.cpTargets, rd.cpNotHealthy, rd.cpStarting = mem.n.healthy, mem.n.cpTargets, mem.n.cpNotHealthy, mem.n.cpStarting
	rd.names = mem.names
	rd.unhealthy = nil
	for name := range mem.unhealthy {
		rd.unhealthy = append(rd.unhealthy, name)
	}
	slices.Sort(rd.unhealthy)
}

func (f clusterFacts) equal(o clusterFacts) bool {
	return f.infrastructureReady == o.infrastructureReady && f.infrastructureReadyTime.Equal(o.infrastructureReadyTime) &&
		f.controlPlaneInitialized == o.controlPlaneInitialized && f.controlPlaneInitTime.Equal(o.controlPlaneInitTime)
}
