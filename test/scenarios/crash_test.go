package scenarios_test

import (
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"k8s.io/utils/ptr"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/controllers"
	"github.com/capr-io/capr/remediation/controlplane"
	"github.com/capr-io/capr/test/sandbox"
)

// crashPoint says when the first controller dies.
type crashPoint struct {
	name string
	// afterStepEvent > 0: at the n-th step boundary (a step issued, or its effect seen).
	afterStepEvent int64
	// afterWrites > 0: after that many API writes (any point between two API calls).
	afterWrites int64
	// afterVictimDelete: right after the Delete step's delete of the victim, before the replicas
	// come back (a window no step boundary and few random writes hit).
	afterVictimDelete bool
	// variant is the order the remediation takes and how (crashorders_test.go).
	variant crashVariant
}

// TestCrashSafety kills the controller at every step boundary of a remediation in turn, and at
// random points between API calls, then starts a new one; the seed picks each crash point's order
// (ScaleUpFirst, RemoveMemberFirst, DeleteFirst, or ScaleUpFirst with one replacement for a surge of
// two; CRASH_ORDERS=all runs each point in each).
// Every run must complete in that order with exactly one new Machine and exactly the victim's member
// removed, without losing quorum.
func TestCrashSafety(t *testing.T) {
	wc := newCluster(t)
	check := writeData(t, wc)
	seed := time.Now().UnixNano()
	if v := os.Getenv("CRASH_SEED"); v != "" {
		var err error
		if seed, err = strconv.ParseInt(v, 10, 64); err != nil {
			t.Fatalf("CRASH_SEED=%q: %v", v, err)
		}
	}
	// Replay a run's random crash points with CRASH_SEED=<seed>.
	t.Logf("crash points and their orders use seed %d (CRASH_SEED=%d replays them)", seed, seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	points := crashPointsFor(t, rng)
	for _, p := range points {
		t.Logf("seed %d: %s", seed, p.name)
	}
	for i, p := range points {
		victimIndex := i % 3
		t.Run(p.name, func(t *testing.T) {
			t.Logf("crash point %+v", p)
			crashRun(t, wc, victimIndex, p)
		})
		if t.Failed() {
			break
		}
	}
	check()
}

func crashRun(t *testing.T, wc *sandbox.WorkloadCluster, victimIndex int, p crashPoint) {
	g := NewWithT(t)
	before := controlPlane(g, wc)
	victim := before[victimIndex]
	victimNode := victim.Status.NodeRef.Name
	start := time.Now()

	var first atomic.Pointer[sandbox.CAPR]
	var events atomic.Int64
	setOrderPolicy(g, wc, p.variant.order)
	setKCPPreflight(g, wc, p.variant.kcpPreflight)
	opts := sandbox.CAPROptions{CrashAfterWrites: p.afterWrites, Options: controllers.Options{ControlPlaneAdapter: p.variant.adapter}}
	if p.afterVictimDelete {
		opts.CrashAfterDeleting = victim.Name
	}
	if p.afterStepEvent > 0 {
		opts.StepObserver = func(e controlplane.StepEvent) {
			if e.Remediation.Name == victim.Name && events.Add(1) == p.afterStepEvent {
				if c := first.Load(); c != nil {
					c.Crash.Trip()
				}
			}
		}
	}
	c1, err := sb.StartCAPR(ctx, opts)
	g.Expect(err).NotTo(HaveOccurred())
	first.Store(c1)
	watch := sb.WatchQuorum(ctx, wc)
	g.Expect(sb.StopHeartbeat(ctx, wc, victimNode)).To(Succeed())

	g.Eventually(func() bool { return c1.Stopped() }, remediationTimeout, 100*time.Millisecond).Should(BeTrue(), "the first controller never reached its crash point")
	c1.Stop()
	if p.afterVictimDelete {
		waitVictimHeldOrReplaced(g, wc, victim.Name)
	}
	c2, err := sb.StartCAPR(ctx, sandbox.CAPROptions{Options: controllers.Options{ControlPlaneAdapter: p.variant.adapter}})
	g.Expect(err).NotTo(HaveOccurred())
	defer c2.Stop()
	mr := waitRemediated(t, wc, victim.Name, 3)
	_, lost := watch.Stop()
	g.Expect(lost).To(BeEmpty(), "etcd lost quorum")

	after := controlPlane(g, wc)
	beforeNames := make([]string, 0, len(before))
	afterNames := make([]string, 0, len(after))
	for _, m := range before {
		beforeNames = append(beforeNames, m.Name)
	}
	for _, m := range after {
		afterNames = append(afterNames, m.Name)
	}
	var added []string
	for _, n := range afterNames {
		if !slices.Contains(beforeNames, n) {
			added = append(added, n)
		}
	}
	g.Expect(added).To(HaveLen(1), "exactly one new Machine: before %v after %v", beforeNames, afterNames)
	g.Expect(afterNames).NotTo(ContainElement(victim.Name))
	created := 0
	for _, e := range sb.Log.Since(wc.LogKey(), start) {
		if strings.Contains(e.Text, "scales up: created Machine") {
			created++
		}
	}
	g.Expect(created).To(Equal(1), "the control plane was scaled up more than once")
	members := memberNames(g, wc)
	g.Expect(members).To(HaveLen(3))
	g.Expect(members).NotTo(ContainElement(victimNode))
	g.Expect(members).To(ContainElement(added[0]))
	g.Expect(mr.Status.ControlPlane.Replacement).To(Equal(added[0]))
	g.Expect(mr.Status.ControlPlane.Order).To(Equal(p.variant.order), "the crash point's order (%s)", mr.Status.ControlPlane.OrderReason)
	if p.variant.surge > 0 {
		g.Expect(mr.Status.ControlPlane.Surge).To(Equal(p.variant.surge), mr.Status.ControlPlane.SurgeReason)
		g.Expect(mr.Status.ControlPlane.Replacements).To(Equal(p.variant.replacements))
	}
	g.Expect(controlPlaneObject(g, wc).Annotations).NotTo(HaveKey(controlplanev1.RemediationInProgressAnnotation))
	g.Expect(ptr.Deref(mr.Status.ControlPlane.DesiredReplicas, 0)).To(BeEquivalentTo(3))
}

// waitVictimHeldOrReplaced waits, with no controller running, until the victim deleted at the crash is
// either held (being deleted, with the replicas-back hook) or gone with the provider back at the
// surged replicas: what the provider does in the window between the victim's delete and the
// replicas' return, before the next controller can close it.
func waitVictimHeldOrReplaced(g Gomega, wc *sandbox.WorkloadCluster, victim string) {
	g.Eventually(func(g Gomega) string {
		live := 0
		for _, m := range controlPlane(g, wc) {
			if m.Name == victim {
				g.Expect(m.DeletionTimestamp.IsZero()).To(BeFalse(), "the victim was deleted before the crash")
				if _, held := m.Annotations[caprv1.ReplicasBackHookAnnotation]; held {
					return "held"
				}
			}
			if m.DeletionTimestamp.IsZero() {
				live++
			}
		}
		replicas := ptr.Deref(controlPlaneObject(g, wc).Spec.Replicas, 0)
		g.Expect(live).To(BeEquivalentTo(replicas), "the provider has not caught up with the replicas")
		return "replaced"
	}, remediationTimeout, 100*time.Millisecond).Should(Or(Equal("held"), Equal("replaced")))
}
