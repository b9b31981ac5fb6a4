package machinehealthcheck

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// randomFleet is a fleet that changes at random, the oracle of TestIncrementalRoundsAgreeWithAFullPass:
// a full evaluation of every target (evaluateAll) at each step, which does not use the cache.
type randomFleet struct {
	rnd     *rand.Rand
	now     time.Time
	targets map[string]target
	seq     int
}

func (w *randomFleet) newTarget() target {
	w.seq++
	name := fmt.Sprintf("m%03d", w.seq)
	m := machine(func(m *clusterv1.Machine) {
		m.Name = name
		m.CreationTimestamp = metav1.NewTime(w.now.Add(-time.Duration(w.rnd.IntN(1200)) * time.Second))
		if w.rnd.IntN(4) == 0 {
			asControlPlane(m)
		}
	})
	t := target{machine: m}
	switch w.rnd.IntN(6) {
	case 0: // no Node yet: node startup timeout running or expired
		m.Status.NodeRef = clusterv1.MachineNodeReference{}
	case 1:
		t.nodeMissing = true
	default:
		t.node = w.randomNode()
	}
	return t
}

// randomNode is a Node whose Ready condition changed at a random time: healthy, unhealthy with a
// timeout still running, or expired.
func (w *randomFleet) randomNode() *corev1.Node {
	status := []corev1.ConditionStatus{corev1.ConditionTrue, corev1.ConditionFalse, corev1.ConditionUnknown}[w.rnd.IntN(3)]
	since := w.now.Add(-time.Duration(w.rnd.IntN(400)) * time.Second)
	return &corev1.Node{Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{
		{Type: corev1.NodeReady, Status: status, LastTransitionTime: metav1.NewTime(since)},
	}}}
}

func (w *randomFleet) all() []target {
	names := make([]string, 0, len(w.targets))
	for name := range w.targets {
		names = append(names, name)
	}
	slices.Sort(names)
	out := make([]target, 0, len(names))
	for _, name := range names {
		out = append(out, w.targets[name])
	}
	return out
}

// Incremental rounds (begin, update, summarize), fed with the names the watches would report,
// agree with a full pass over the whole fleet at every step: the counts the limits use, the names
// the status reports, every target's verdict class, and when the next timeout expires (the
// requeue). Time passes between steps, so targets become unhealthy without any event.
func TestIncrementalRoundsAgreeWithAFullPass(t *testing.T) {
	cfg := defaultConfig()
	cfg.etcdMemberTimeout = 0
	key := types.NamespacedName{Namespace: "ns", Name: "hc"}
	valid := evalCacheKey{uid: "u1", generation: 1, facts: readyCluster}
	for seed := range uint64(200) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			g := NewWithT(t)
			w := &randomFleet{rnd: rand.New(rand.NewPCG(seed, 7)), now: now, targets: map[string]target{}}
			for range 5 + w.rnd.IntN(30) {
				tg := w.newTarget()
				w.targets[tg.machine.Name] = tg
			}
			caches := &evalCaches{}
			ec, _, full := caches.begin(key, valid, w.now)
			g.Expect(full).To(BeTrue(), "the first round is a full pass")
			ec.reset(evaluateAll(w.all(), cfg, readyCluster, w.now), valid, w.now)

			for step := range 40 {
				// Change the world as watch events would report it.
				changed := map[string]bool{}
				for range w.rnd.IntN(4) {
					switch op := w.rnd.IntN(10); {
					case op < 5 && len(w.targets) > 0: // a Node's condition changes
						names := slices.Sorted(maps.Keys(w.targets))
						name := names[w.rnd.IntN(len(names))]
						tg := w.targets[name]
						tg.node, tg.nodeMissing = w.randomNode(), false
						tg.machine.Status.NodeRef = clusterv1.MachineNodeReference{Name: "n"}
						w.targets[name] = tg
						changed[name] = true
					case op < 7: // a Machine comes
						tg := w.newTarget()
						w.targets[tg.machine.Name] = tg
						changed[tg.machine.Name] = true
					case op < 9 && len(w.targets) > 0: // a Machine goes (deleted, unselected, paused)
						names := slices.Sorted(maps.Keys(w.targets))
						name := names[w.rnd.IntN(len(names))]
						delete(w.targets, name)
						changed[name] = true
					default: // time passes
					}
				}
				w.now = w.now.Add(time.Duration(w.rnd.IntN(90)) * time.Second)
				for name := range changed {
					caches.changed(key, name)
				}

				ec, work, full := caches.begin(key, valid, w.now)
				want := evaluateAll(w.all(), cfg, readyCluster, w.now)
				if full {
					// Only time, or more changes than targets (changed gives up on its list), make a
					// full pass here.
					g.Expect(w.now.Sub(ec.lastFull) >= fullPassInterval || len(changed) > len(ec.targets)).To(BeTrue(),
						"step %d: an unexpected full pass", step)
					ec.reset(want, valid, w.now)
					continue
				}
				for name := range changed {
					g.Expect(work).To(ContainElement(name), "step %d: a changed Machine is evaluated", step)
				}
				var targets []target
				var gone []string
				for _, name := range work {
					if tg, ok := w.targets[name]; ok {
						targets = append(targets, tg)
					} else {
						gone = append(gone, name)
					}
				}
				got := evaluateSome(targets, cfg, readyCluster, w.now)
				ec.update(targets, got.evals, gone)
				ec.summarize(got)

				g.Expect([]int{got.total, got.healthy, got.cpTargets, got.cpNotHealthy, got.cpStarting}).To(
					Equal([]int{want.total, want.healthy, want.cpTargets, want.cpNotHealthy, want.cpStarting}), "step %d: counts", step)
				g.Expect(got.names).To(Equal(want.names), "step %d: names", step)
				g.Expect(got.unhealthy).To(Equal(want.unhealthy), "step %d: unhealthy names", step)
				g.Expect(got.next).To(Equal(want.next), "step %d: next timeout", step)
				for i, tg := range want.targets {
					g.Expect(ec.targets[tg.machine.Name]).To(Equal(countedOf(tg, want.evals[i])), "step %d: %s", step, tg.machine.Name)
				}
				// Nothing the full pass would write is skipped: every target that is not healthy with
				// nothing running is evaluated in this round.
				for i, tg := range want.targets {
					if want.evals[i].verdict == verdictUnhealthy || want.evals[i].nextCheck > 0 {
						g.Expect(work).To(ContainElement(tg.machine.Name), "step %d: watched target %s", step, tg.machine.Name)
					}
				}
			}
		})
	}
}

// What invalidates the cache makes the next round a full pass: no cache yet, an invalidation (a
// Cluster event, a failed round), a new spec, another health check under the same name, other
// Cluster facts, and time.
func TestEvalCacheStartsAFullPassWhenItCannotAccountForAChange(t *testing.T) {
	key := types.NamespacedName{Namespace: "ns", Name: "hc"}
	valid := evalCacheKey{uid: "u1", generation: 1, facts: readyCluster}
	rd := evaluateAll([]target{{machine: machine(), node: node(nodeCond(corev1.NodeReady, corev1.ConditionTrue, time.Hour))}}, defaultConfig(), readyCluster, now)
	fresh := func() *evalCaches {
		caches := &evalCaches{}
		ec, _, _ := caches.begin(key, valid, now)
		ec.reset(rd, valid, now)
		return caches
	}
	tests := []struct {
		name   string
		change func(caches *evalCaches, v *evalCacheKey, at *time.Time)
		full   bool
	}{
		{"nothing", func(*evalCaches, *evalCacheKey, *time.Time) {}, false},
		{"invalidated", func(caches *evalCaches, _ *evalCacheKey, _ *time.Time) { caches.invalidate(key) }, true},
		{"new spec", func(_ *evalCaches, v *evalCacheKey, _ *time.Time) { v.generation++ }, true},
		{"recreated", func(_ *evalCaches, v *evalCacheKey, _ *time.Time) { v.uid = "u2" }, true},
		{"cluster facts", func(_ *evalCaches, v *evalCacheKey, _ *time.Time) { v.facts.controlPlaneInitTime = now }, true},
		{"interval", func(_ *evalCaches, _ *evalCacheKey, at *time.Time) { *at = now.Add(fullPassInterval) }, true},
		{"just before the interval", func(_ *evalCaches, _ *evalCacheKey, at *time.Time) { *at = now.Add(fullPassInterval - time.Second) }, false},
		{"forgotten", func(caches *evalCaches, _ *evalCacheKey, _ *time.Time) { caches.forget(key) }, true},
		{"all invalidated", func(caches *evalCaches, _ *evalCacheKey, _ *time.Time) { caches.invalidateAll() }, true},
		{"as many changed as there are targets", func(caches *evalCaches, _ *evalCacheKey, _ *time.Time) { caches.changed(key, "m") }, false},
		{"more changed than there are targets", func(caches *evalCaches, _ *evalCacheKey, _ *time.Time) {
			caches.changed(key, "m")
			caches.changed(key, "other")
		}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			caches, v, at := fresh(), valid, now
			tt.change(caches, &v, &at)
			_, _, full := caches.begin(key, v, at)
			g.Expect(full).To(Equal(tt.full))
		})
	}
}
