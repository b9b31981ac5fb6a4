//go:build envtest

package worker_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	clusterctlv1 "sigs.k8s.io/cluster-api/cmd/clusterctl/api/v1alpha3"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	capienv "github.com/capr-io/capr/test/envtest"
)

// waitingForFencing creates a worker Machine of a MachineSet and its request with Required fencing,
// and waits until the remediation waits for the fencing backend (nothing is deleted before it confirms).
func waitingForFencing(t *testing.T, g *WithT) *fixture {
	const name = "w1"
	t.Helper()
	f := newFixture(t, g, nil)
	m := f.workerOfMachineSet(g, name)
	f.request(g, m, required(), caprv1.MachineRemediationSourceHealthCheck)
	g.Eventually(func(g Gomega) string {
		reason, _ := progressing(g, f.ns, name)
		return reason
	}, eventually, poll).Should(Equal(caprv1.MachineRemediationWaitingForFencingReason))
	return f
}

// TestWorkerFencedThenDeleted: a worker Machine of a MachineSet is fenced, then deleted, and the
// request Succeeds with both steps recorded in order; the control-plane remediator never writes it.
func TestWorkerFencedThenDeleted(t *testing.T) {
	g := NewWithT(t)
	f := waitingForFencing(t, g)
	g.Expect(backend.wasAsked(f.node("w1"))).To(BeTrue())
	g.Expect(machineExists(g, f.ns, "w1")).To(BeTrue())
	backend.confirm(f.node("w1"))

	g.Eventually(func(g Gomega) caprv1.RemediationPhase { return phase(g, f.ns, "w1") }, eventually, poll).
		Should(Equal(caprv1.MachineRemediationPhaseSucceeded))
	g.Expect(machineExists(g, f.ns, "w1")).To(BeFalse())
	mr := getRemediation(g, f.ns, "w1")
	g.Expect(mr.Status.Steps).To(HaveLen(2))
	g.Expect(mr.Status.Steps[0].Name).To(Equal(caprv1.StepFence))
	g.Expect(mr.Status.Steps[0].Outcome).To(Equal(caprv1.StepOutcomeSucceeded))
	g.Expect(mr.Status.Steps[1].Name).To(Equal(caprv1.StepDelete))
	g.Expect(mr.Status.Steps[1].Outcome).To(Equal(caprv1.StepOutcomeSucceeded))
	g.Expect(mr.Status.Steps[1].StartTime.Time).NotTo(BeTemporally("<", mr.Status.Steps[0].FinishTime.Time))
	g.Expect(mr.Status.Worker).NotTo(BeNil())
	g.Expect(mr.Status.Worker.MachineSet).To(Equal("md-ms"))
	g.Expect(mr.Status.Worker.MachineDeployment).To(Equal("md"))
	g.Expect(mr.Status.ControlPlane).To(BeNil())
	g.Expect(mr.Finalizers).To(BeEmpty())
	// Re-owned by the Cluster when it started: the record outlives the Machine it deleted.
	g.Expect(mr.OwnerReferences).To(HaveLen(1))
	g.Expect(mr.OwnerReferences[0].Kind).To(Equal("Cluster"))
	g.Eventually(func(g Gomega) []string { return eventReasons(g, f.ns, "w1") }, eventually, poll).
		Should(ContainElements("RemediationStarted", "RemediationSucceeded"))
}

// TestRequiredFencingWaitsThenAbort: Required fencing that never confirms keeps the Machine, says so
// in a condition and an event, and the control-plane remediator does not take the request over;
// deleting the request then aborts: the Machine is kept, the fencer's unfence hook is called, the
// request goes.
func TestRequiredFencingWaitsThenAbort(t *testing.T) {
	g := NewWithT(t)
	f := waitingForFencing(t, g)
	g.Eventually(func(g Gomega) []string { return eventReasons(g, f.ns, "w1") }, eventually, poll).
		Should(ContainElement("RemediationWaiting"))
	// Waiting holds across the remediator's next look (the backend asked again), not only for a
	// window shorter than its requeue.
	stillWaiting := func(g Gomega) {
		mr := getRemediation(g, f.ns, "w1")
		reason, msg := progressing(g, f.ns, "w1")
		g.Expect(reason).To(Equal(caprv1.MachineRemediationWaitingForFencingReason))
		g.Expect(msg).To(ContainSubstring("fencing is Required and not confirmed"))
		g.Expect(mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhaseRunning))
		g.Expect(mr.Status.CurrentStep).To(Equal(caprv1.StepFence))
		g.Expect(mr.Status.Step(caprv1.StepDelete)).To(BeNil())
		g.Expect(mr.Finalizers).To(ContainElement(caprv1.MachineRemediationFinalizer))
		g.Expect(mr.Annotations).To(HaveKey(clusterctlv1.BlockMoveAnnotation), "clusterctl move would drop the running remediation's status")
		g.Expect(machineExists(g, f.ns, "w1")).To(BeTrue())
		// Fence before delete, whoever deletes: CAPI's Machine controller would hold a deletion.
		g.Expect(getMachine(g, f.ns, "w1").Annotations).To(HaveKeyWithValue(caprv1.FenceBeforeDeleteHookAnnotation, "w1"))
	}
	asked := backend.askCount(f.node("w1"))
	g.Eventually(func(g Gomega) {
		stillWaiting(g)
		g.Expect(backend.askCount(f.node("w1"))).To(BeNumerically(">", asked), "the remediator has not looked again yet")
	}, nextLook, poll).Should(Succeed())
	g.Consistently(stillWaiting, quiet, poll).Should(Succeed())

	g.Expect(k8sClient.Delete(ctx, getRemediation(g, f.ns, "w1"))).To(Succeed())
	g.Eventually(func(g Gomega) bool { return remediationExists(g, f.ns, "w1") }, eventually, poll).Should(BeFalse())
	g.Expect(backend.wasUnfenced(f.node("w1"))).To(BeTrue())
	g.Expect(getMachine(g, f.ns, "w1").Annotations).NotTo(HaveKey(caprv1.FenceBeforeDeleteHookAnnotation), "an aborted remediation leaves no hook")
	g.Consistently(func(g Gomega) bool { return machineExists(g, f.ns, "w1") }, quiet, poll).Should(BeTrue())
	g.Expect(eventReasons(g, f.ns, "w1")).To(ContainElement("RemediationAborted"))
}

// TestAbortWhileSomeoneElseDeletesKeepsTheFence: while Fence waits, someone else deletes the Machine
// (a finalizer stands in for CAPI's Machine controller, which honours the hook). Deleting the request
// then neither removes the hook nor unfences: the Machine is going anyway, so it is fenced first, then
// let go, and the request goes with it, unfencing only once the Machine is gone (the stand-in fencer
// does not check the Node; TestRealFenceThenTaintUnfencedAfterMachineAndNodeGone does). No step of
// CAPR's own follows.
func TestAbortWhileSomeoneElseDeletesKeepsTheFence(t *testing.T) {
	g := NewWithT(t)
	f := waitingForFencing(t, g)
	const capi = "test.capr.io/machine-controller"
	patchMachine(g, f.ns, "w1", func(m *clusterv1.Machine) { m.Finalizers = append(m.Finalizers, capi) })
	t.Cleanup(func() { releaseMachine(f.ns, "w1", capi) })
	g.Expect(k8sClient.Delete(ctx, getMachine(g, f.ns, "w1"))).To(Succeed())
	g.Expect(k8sClient.Delete(ctx, getRemediation(g, f.ns, "w1"))).To(Succeed())

	g.Eventually(func(g Gomega) {
		_, msg := progressing(g, f.ns, "w1")
		g.Expect(msg).To(ContainSubstring("The request was deleted, but Machine w1 is being deleted by someone else; its deletion is held until it is fenced"))
	}, eventually, poll).Should(Succeed())
	g.Consistently(func(g Gomega) {
		g.Expect(getMachine(g, f.ns, "w1").Annotations).To(HaveKey(caprv1.FenceBeforeDeleteHookAnnotation))
		g.Expect(remediationExists(g, f.ns, "w1")).To(BeTrue())
		g.Expect(backend.wasUnfenced(f.node("w1"))).To(BeFalse())
	}, quiet, poll).Should(Succeed())

	backend.confirm(f.node("w1"))
	g.Eventually(func(g Gomega) {
		g.Expect(getMachine(g, f.ns, "w1").Annotations).NotTo(HaveKey(caprv1.FenceBeforeDeleteHookAnnotation))
	}, eventually, poll).Should(Succeed())
	// The event is recorded after the hook is removed, and sent in the background.
	g.Eventually(func(g Gomega) []string { return eventReasons(g, f.ns, "w1") }, eventually, poll).
		Should(ContainElement("FencedDeletingMachine"))
	mr := getRemediation(g, f.ns, "w1")
	g.Expect(mr.Status.Step(caprv1.StepFence).Outcome).To(Equal(caprv1.StepOutcomeInProgress), "no step of CAPR's own after the deletion began")
	g.Expect(mr.Status.Step(caprv1.StepDelete)).To(BeNil())

	g.Expect(backend.wasUnfenced(f.node("w1"))).To(BeFalse())
	releaseMachine(f.ns, "w1", capi) // CAPI's Machine controller finishes the deletion
	g.Eventually(func(g Gomega) bool { return remediationExists(g, f.ns, "w1") }, eventually, poll).Should(BeFalse())
	g.Expect(backend.wasUnfenced(f.node("w1"))).To(BeTrue(), "unfenced once the Machine was gone")
}

// TestOrphanedHookIsReleased: a hook whose MachineRemediation is gone (its finalizer removed by hand
// mid-remediation) would hold the Machine's deletion forever; it is removed.
func TestOrphanedHookIsReleased(t *testing.T) {
	g := NewWithT(t)
	f := waitingForFencing(t, g)
	g.Expect(getMachine(g, f.ns, "w1").Annotations).To(HaveKey(caprv1.FenceBeforeDeleteHookAnnotation))
	// The remediator may still be writing the request: retry on conflicts, as kubectl edit does.
	mr := &caprv1.MachineRemediation{}
	g.Eventually(func(g Gomega) {
		mr = getRemediation(g, f.ns, "w1")
		mr.Finalizers = nil
		g.Expect(k8sClient.Update(ctx, mr)).To(Succeed())
	}, eventually, poll).Should(Succeed())
	g.Expect(k8sClient.Delete(ctx, mr)).To(Succeed())
	g.Eventually(func(g Gomega) {
		g.Expect(getMachine(g, f.ns, "w1").Annotations).NotTo(HaveKey(caprv1.FenceBeforeDeleteHookAnnotation))
	}, eventually, poll).Should(Succeed())
}

// TestOrphanedReplicasBackHookIsReleased: the control-plane remediator's replicas-back hook on a
// deleting Machine whose MachineRemediation is gone (CAPR stopped after its delete, the request
// deleted without it) would hold the Machine, and with it the control-plane provider, forever; it is
// removed, and a hook whose request exists is left to that request.
func TestOrphanedReplicasBackHookIsReleased(t *testing.T) {
	g := NewWithT(t)
	f := newFixture(t, g, nil)
	controlPlane := func(m *clusterv1.Machine) {
		m.Labels[clusterv1.MachineControlPlaneLabel] = ""
		m.Finalizers = []string{"test.capr.io/hold"} // CAPI's Machine controller's, in the real thing
	}
	orphan := f.machine(g, "orphan", controlPlane, func(m *clusterv1.Machine) {
		m.Annotations = map[string]string{caprv1.ReplicasBackHookAnnotation: "orphan"}
	})
	// As the control-plane remediator does: the request exists before its hook is added.
	owned := f.machine(g, "owned", controlPlane)
	f.request(g, owned, nil, caprv1.MachineRemediationSourceHealthCheck)
	base := owned.DeepCopy()
	owned.Annotations = map[string]string{caprv1.ReplicasBackHookAnnotation: "owned"}
	g.Expect(k8sClient.Patch(ctx, owned, client.MergeFrom(base))).To(Succeed())
	g.Expect(k8sClient.Delete(ctx, orphan)).To(Succeed())
	g.Eventually(func(g Gomega) {
		g.Expect(getMachine(g, f.ns, "orphan").Annotations).NotTo(HaveKey(caprv1.ReplicasBackHookAnnotation))
	}, eventually, poll).Should(Succeed())
	g.Expect(getMachine(g, f.ns, "owned").Annotations).To(HaveKeyWithValue(caprv1.ReplicasBackHookAnnotation, "owned"))
}

// TestMachineWithoutReplacingOwnerIsNeverDeleted: a Machine without a MachineSet owner, and one of a
// MachinePool, are never deleted, and the request says why (condition and event).
func TestMachineWithoutReplacingOwnerIsNeverDeleted(t *testing.T) {
	g := NewWithT(t)
	f := newFixture(t, g, nil)
	lone := f.machine(g, "lone")
	pooled := f.machine(g, "pooled", func(m *clusterv1.Machine) {
		m.OwnerReferences = ownedBy("MachinePool", "mp", "00000000-0000-0000-0000-000000000001")
	})
	f.request(g, lone, nil, caprv1.MachineRemediationSourceManual)
	f.request(g, pooled, nil, caprv1.MachineRemediationSourceHealthCheck)

	for name, why := range map[string]string{"lone": "has no controller owner", "pooled": "MachinePool mp"} {
		g.Eventually(func(g Gomega) {
			reason, msg := progressing(g, f.ns, name)
			g.Expect(reason).To(Equal(caprv1.MachineRemediationNoRemediatorReason))
			g.Expect(msg).To(ContainSubstring(why))
			g.Expect(msg).To(ContainSubstring("never deleted"))
			g.Expect(eventReasons(g, f.ns, name)).To(ContainElement("NoRemediator"))
			// Written in the same status patch as the condition (remediation.Persist).
			mr := getRemediation(g, f.ns, name)
			g.Expect(mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhasePending))
			g.Expect(mr.Status.Worker).NotTo(BeNil())
		}, eventually, poll).Should(Succeed())
	}
	g.Consistently(func(g Gomega) {
		for _, name := range []string{"lone", "pooled"} {
			g.Expect(machineExists(g, f.ns, name)).To(BeTrue())
			mr := getRemediation(g, f.ns, name)
			g.Expect(mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhasePending))
			g.Expect(mr.Status.Steps).To(BeEmpty())
			g.Expect(mr.Status.Worker).NotTo(BeNil()) // the role is recorded: it stays a worker request
		}
	}, quiet, poll).Should(Succeed())
}

// TestADeletedRequestIsNotReadLive: the reconcile a request's deletion starts (its delete event)
// finds it gone from the cache and sends the API server nothing (no live read answered 404). A wave
// of withdrawn requests costs the API server no reads.
func TestADeletedRequestIsNotReadLive(t *testing.T) {
	g := NewWithT(t)
	f, m := unreplacedRequest(t, g, "gone")
	g.Expect(k8sClient.Delete(ctx, getRemediation(g, f.ns, m.Name))).To(Succeed())
	g.Eventually(func(g Gomega) bool { return remediationExists(g, f.ns, m.Name) }, eventually, poll).Should(BeFalse())
	g.Consistently(func() int { return requests.NotFoundOf(http.MethodGet, requestPath(f.ns, m.Name)) }, quiet, poll).Should(BeZero())
}

// TestARequestThisRemediatorWroteLastIsNotReadLive: a new request is decided from the cache (its
// status is empty: nothing was recorded in it yet), and so is the reconcile its own first write
// starts (the cache holds that write). Before, each read the request live: two reads per new request.
func TestARequestThisRemediatorWroteLastIsNotReadLive(t *testing.T) {
	g := NewWithT(t)
	f, m := unreplacedRequest(t, g, "cached")
	path := requestPath(f.ns, m.Name)
	// The write is counted when its response has come back, which may be after the test saw it.
	g.Eventually(func() int { return requests.WritesTo(path) }, eventually, poll).Should(Equal(1))
	g.Consistently(func() int { return requests.ReadsOf(path) }, quiet, poll).Should(BeZero())
}

// TestARequestSomeoneElseWroteIsReadLive: once someone else writes the request (here a label, by
// hand), its cached copy is no longer the one this remediator last wrote, and the reconcile that
// write starts reads the request live before deciding.
func TestARequestSomeoneElseWroteIsReadLive(t *testing.T) {
	g := NewWithT(t)
	f, m := unreplacedRequest(t, g, "edited")
	path := requestPath(f.ns, m.Name)
	g.Consistently(func() int { return requests.ReadsOf(path) }, quiet, poll).Should(BeZero())
	mr := getRemediation(g, f.ns, m.Name)
	base := mr.DeepCopy()
	mr.Labels["edited-by"] = "hand"
	g.Expect(k8sClient.Patch(ctx, mr, client.MergeFrom(base))).To(Succeed())
	g.Eventually(func() int { return requests.ReadsOf(path) }, eventually, poll).Should(Equal(1))
	// Read live once: the copy read is then the one seen last, and the cache's matches it. A later
	// reconcile (the Machine paused, which the request's watch maps to it) decides from the cache.
	patchMachine(g, f.ns, m.Name, func(m *clusterv1.Machine) { m.Annotations = map[string]string{clusterv1.PausedAnnotation: ""} })
	g.Eventually(func(g Gomega) string { r, _ := progressing(g, f.ns, m.Name); return r }, eventually, poll).Should(Equal(caprv1.MachineRemediationPausedReason))
	g.Consistently(func() int { return requests.ReadsOf(path) }, quiet, poll).Should(Equal(1))
}

// TestANewRequestIsRecordedInOneWrite: the remediator records what it found out about a new
// request (phase, role, the Progressing and Paused conditions) in one status write, not one for the
// conditions and one for the rest.
func TestANewRequestIsRecordedInOneWrite(t *testing.T) {
	g := NewWithT(t)
	f, m := unreplacedRequest(t, g, "new")
	path := requestPath(f.ns, m.Name)
	// The write is counted when its response has come back, which may be after the test saw it.
	g.Eventually(func() int { return requests.WritesTo(path) }, eventually, poll).Should(Equal(1))
	g.Consistently(func() int { return requests.WritesTo(path) }, quiet, poll).Should(Equal(1))
}

// unreplacedRequest creates a Machine that nothing replaces (no MachineSet) and its request, and
// waits until the remediator has recorded it: Pending, a worker request, NoRemediator, not paused.
func unreplacedRequest(t *testing.T, g *WithT, name string) (*fixture, *clusterv1.Machine) {
	t.Helper()
	f := newFixture(t, g, nil)
	m := f.machine(g, name)
	f.request(g, m, nil, caprv1.MachineRemediationSourceHealthCheck)
	g.Eventually(func(g Gomega) {
		mr := getRemediation(g, f.ns, m.Name)
		g.Expect(conditions.GetReason(mr, caprv1.MachineRemediationProgressingCondition)).To(Equal(caprv1.MachineRemediationNoRemediatorReason))
		g.Expect(conditions.IsFalse(mr, clusterv1.PausedCondition)).To(BeTrue())
		g.Expect(mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhasePending))
		g.Expect(mr.Status.Worker).NotTo(BeNil())
	}, eventually, poll).Should(Succeed())
	return f, m
}

func requestPath(ns, name string) string {
	return fmt.Sprintf("/apis/%s/namespaces/%s/machineremediations/%s", caprv1.GroupVersion.String(), ns, name)
}

// TestMaxInFlightOneAtATime: nothing starts while the Cluster is paused; then, with maxInFlight 1,
// three requests are remediated one at a time, the explicit request
// (cluster.x-k8s.io/remediate-machine) first, then the oldest. A hand-written request (spec.source
// Manual) is not explicit: anyone who may write a request can set that, so it waits its turn.
func TestMaxInFlightOneAtATime(t *testing.T) {
	g := NewWithT(t)
	f := newFixture(t, g, ptr.To(intstr.FromInt32(1)))
	a := f.workerOfMachineSet(g, "a")
	b := f.workerOfMachineSet(g, "b", func(m *clusterv1.Machine) {
		m.Annotations = map[string]string{clusterv1.RemediateMachineAnnotation: ""}
	})
	c := f.workerOfMachineSet(g, "c")
	// The requests arrive while the Cluster is paused, oldest first: a, then the hand-written c, then
	// the explicit b.
	setClusterPaused(g, f.cluster, true)
	f.request(g, a, required(), caprv1.MachineRemediationSourceHealthCheck)
	f.request(g, c, required(), caprv1.MachineRemediationSourceManual)
	f.request(g, b, required(), caprv1.MachineRemediationSourceHealthCheck)
	g.Eventually(func(g Gomega) {
		for _, name := range []string{"a", "b", "c"} {
			g.Expect(conditions.IsTrue(getRemediation(g, f.ns, name), clusterv1.PausedCondition)).To(BeTrue())
		}
	}, eventually, poll).Should(Succeed())
	g.Consistently(func(g Gomega) {
		for _, name := range []string{"a", "b", "c"} {
			g.Expect(getRemediation(g, f.ns, name).Status.Phase).To(BeEmpty())
			g.Expect(backend.wasAsked(f.node(name))).To(BeFalse())
		}
	}, quiet, poll).Should(Succeed())
	setClusterPaused(g, f.cluster, false)

	running := func(g Gomega) []string {
		list := &caprv1.MachineRemediationList{}
		g.Expect(k8sClient.List(ctx, list, client.InNamespace(f.ns))).To(Succeed())
		var out []string
		for _, mr := range list.Items {
			if mr.Status.Phase == caprv1.MachineRemediationPhaseRunning {
				out = append(out, mr.Name)
			}
		}
		return out
	}
	for i, next := range []string{"b", "a", "c"} {
		g.Eventually(running, eventually, poll).Should(Equal([]string{next}), "step %d", i)
		// The others wait, deferred, and stay waiting while this one holds the slot.
		othersDeferred := func(g Gomega) {
			g.Expect(running(g)).To(Equal([]string{next}))
			for _, other := range []string{"a", "b", "c"} {
				if other == next || phase(g, f.ns, other) == caprv1.MachineRemediationPhaseSucceeded {
					continue
				}
				reason, msg := progressing(g, f.ns, other)
				g.Expect(reason).To(Equal(caprv1.MachineRemediationDeferredReason))
				g.Expect(msg).To(ContainSubstring("maxInFlight is 1"))
				g.Expect(machineExists(g, f.ns, other)).To(BeTrue())
			}
		}
		g.Eventually(othersDeferred, eventually, poll).Should(Succeed())
		g.Consistently(othersDeferred, quiet, poll).Should(Succeed())
		backend.confirm(f.node(next))
		g.Eventually(func(g Gomega) caprv1.RemediationPhase { return phase(g, f.ns, next) }, eventually, poll).
			Should(Equal(caprv1.MachineRemediationPhaseSucceeded))
		g.Expect(machineExists(g, f.ns, next)).To(BeFalse())
	}
}

func setClusterPaused(g *WithT, cluster *clusterv1.Cluster, paused bool) {
	c := &clusterv1.Cluster{}
	g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(cluster), c)).To(Succeed())
	base := c.DeepCopy()
	c.Spec.Paused = ptr.To(paused)
	g.Expect(k8sClient.Patch(ctx, c, client.MergeFrom(base))).To(Succeed())
}

// TestControlPlaneRequestLeftToTheControlPlaneRemediator: the worker remediator never records a
// role on, nor deletes, a control-plane Machine's request.
func TestControlPlaneRequestLeftToTheControlPlaneRemediator(t *testing.T) {
	g := NewWithT(t)
	f := newFixture(t, g, nil)
	m := f.machine(g, "cp1", capienv.AsControlPlane, func(m *clusterv1.Machine) {
		m.OwnerReferences = ownedBy("MachineSet", f.ms.Name, f.ms.UID) // even with a MachineSet owner
	})
	f.request(g, m, nil, caprv1.MachineRemediationSourceManual)

	// The control-plane remediator acts on it (it waits: this Cluster has no control plane object).
	g.Eventually(func(g Gomega) string {
		reason, _ := progressing(g, f.ns, "cp1")
		return reason
	}, eventually, poll).ShouldNot(BeEmpty())
	g.Consistently(func(g Gomega) {
		mr := getRemediation(g, f.ns, "cp1")
		g.Expect(mr.Status.Worker).To(BeNil())
		g.Expect(mr.Status.Steps).To(BeEmpty())
		reason, _ := progressing(g, f.ns, "cp1")
		g.Expect(reason).NotTo(Equal(caprv1.MachineRemediationNoRemediatorReason))
		g.Expect(machineExists(g, f.ns, "cp1")).To(BeTrue())
	}, quiet, poll).Should(Succeed())
}

// TestBestEffortFencingGivesUpAfterItsTimeout: BestEffort fencing that never confirms deletes the
// Machine after the fencing timeout, with a Warning event.
func TestBestEffortFencingGivesUpAfterItsTimeout(t *testing.T) {
	g := NewWithT(t)
	f := newFixture(t, g, nil)
	m := f.workerOfMachineSet(g, "w1")
	spec := required()
	spec.Policy = caprv1.FencingBestEffort
	spec.TimeoutSeconds = ptr.To[int32](2)
	f.request(g, m, spec, caprv1.MachineRemediationSourceHealthCheck)

	g.Eventually(func(g Gomega) caprv1.RemediationPhase { return phase(g, f.ns, "w1") }, eventually, poll).
		Should(Equal(caprv1.MachineRemediationPhaseSucceeded))
	g.Expect(machineExists(g, f.ns, "w1")).To(BeFalse())
	mr := getRemediation(g, f.ns, "w1")
	fence := mr.Status.Step(caprv1.StepFence)
	g.Expect(fence).NotTo(BeNil())
	g.Expect(fence.Message).To(ContainSubstring("deleting anyway (BestEffort)"))
	g.Expect(fence.FinishTime.Sub(fence.StartTime.Time)).To(BeNumerically(">=", 1500*time.Millisecond))
	g.Expect(eventReasons(g, f.ns, "w1")).To(ContainElement("FencingGaveUp"))
}

// TestPausedMachineThenAbortAfterDeleteStarted: nothing is done while the Machine is paused; once the
// Delete step has started, deleting the request does not keep the Machine: the request says so and
// goes when the Machine is gone.
func TestPausedMachineThenAbortAfterDeleteStarted(t *testing.T) {
	g := NewWithT(t)
	f := newFixture(t, g, nil)
	const hold = "test.capr.io/hold" // keeps the Machine deleting, as a drain would
	m := f.workerOfMachineSet(g, "w1", func(m *clusterv1.Machine) {
		m.Annotations = map[string]string{clusterv1.PausedAnnotation: ""}
		m.Finalizers = []string{hold}
	})
	f.request(g, m, nil, caprv1.MachineRemediationSourceHealthCheck)

	g.Eventually(func(g Gomega) string {
		reason, _ := progressing(g, f.ns, "w1")
		return reason
	}, eventually, poll).Should(Equal(caprv1.MachineRemediationPausedReason))
	g.Consistently(func(g Gomega) {
		g.Expect(getRemediation(g, f.ns, "w1").Status.Phase).NotTo(Equal(caprv1.MachineRemediationPhaseRunning))
		g.Expect(getMachine(g, f.ns, "w1").DeletionTimestamp.IsZero()).To(BeTrue())
	}, quiet, poll).Should(Succeed())
	patchMachine(g, f.ns, "w1", func(m *clusterv1.Machine) { delete(m.Annotations, clusterv1.PausedAnnotation) })

	g.Eventually(func(g Gomega) bool { return getMachine(g, f.ns, "w1").DeletionTimestamp.IsZero() }, eventually, poll).Should(BeFalse())
	g.Expect(getRemediation(g, f.ns, "w1").Status.Step(caprv1.StepDelete)).NotTo(BeNil())
	g.Expect(k8sClient.Delete(ctx, getRemediation(g, f.ns, "w1"))).To(Succeed())
	g.Eventually(func(g Gomega) string {
		reason, _ := progressing(g, f.ns, "w1")
		return reason
	}, eventually, poll).Should(Equal(caprv1.MachineRemediationAbortedReason))
	g.Consistently(func(g Gomega) bool { return remediationExists(g, f.ns, "w1") }, quiet, poll).Should(BeTrue())

	patchMachine(g, f.ns, "w1", func(m *clusterv1.Machine) { m.Finalizers = nil })
	g.Eventually(func(g Gomega) bool { return remediationExists(g, f.ns, "w1") }, eventually, poll).Should(BeFalse())
	g.Expect(machineExists(g, f.ns, "w1")).To(BeFalse())
}

// TestDeleteThatNeverEndsIsReported: the Machine's deletion is held (a finalizer, as a stuck drain
// would); past the Delete step's timeout the request says StepTimedOut (condition and Warning event)
// and keeps waiting; when the Machine finally goes, it succeeds.
func TestDeleteThatNeverEndsIsReported(t *testing.T) {
	g := NewWithT(t)
	f := newFixture(t, g, nil)
	const hold = "test.capr.io/hold"
	m := f.workerOfMachineSet(g, "w1", func(m *clusterv1.Machine) { m.Finalizers = []string{hold} })
	t.Cleanup(func() { releaseMachine(f.ns, "w1", hold) })
	f.request(g, m, nil, caprv1.MachineRemediationSourceHealthCheck)

	g.Eventually(func(g Gomega) {
		reason, msg := progressing(g, f.ns, "w1")
		g.Expect(reason).To(Equal(caprv1.MachineRemediationStepTimedOutReason))
		g.Expect(msg).To(ContainSubstring("step Delete: Machine w1 is being deleted"))
		g.Expect(msg).To(ContainSubstring("not gone within 5s; still waiting"))
		g.Expect(eventReasons(g, f.ns, "w1")).To(ContainElement("StepTimedOut"))
		g.Expect(getRemediation(g, f.ns, "w1").Status.Phase).To(Equal(caprv1.MachineRemediationPhaseRunning))
	}, eventually, poll).Should(Succeed())

	patchMachine(g, f.ns, "w1", func(m *clusterv1.Machine) { m.Finalizers = nil })
	g.Eventually(func(g Gomega) caprv1.RemediationPhase { return phase(g, f.ns, "w1") }, eventually, poll).
		Should(Equal(caprv1.MachineRemediationPhaseSucceeded))
}

// TestRequiredFencingPastItsTimeoutReportsAndKeepsWaiting: Required fencing not confirmed within its
// timeout says StepTimedOut (condition and Warning event) and still never deletes the Machine.
func TestRequiredFencingPastItsTimeoutReportsAndKeepsWaiting(t *testing.T) {
	g := NewWithT(t)
	f := newFixture(t, g, nil)
	m := f.workerOfMachineSet(g, "w1")
	spec := required()
	spec.TimeoutSeconds = ptr.To[int32](1)
	f.request(g, m, spec, caprv1.MachineRemediationSourceHealthCheck)

	g.Eventually(func(g Gomega) {
		reason, msg := progressing(g, f.ns, "w1")
		g.Expect(reason).To(Equal(caprv1.MachineRemediationStepTimedOutReason))
		g.Expect(msg).To(ContainSubstring("not confirmed within 1s, still waiting"))
		g.Expect(eventReasons(g, f.ns, "w1")).To(ContainElement("StepTimedOut"))
	}, eventually, poll).Should(Succeed())
	// Still waiting at the remediator's next look after the timeout (the window alone was
	// shorter than its requeue).
	asked := backend.askCount(f.node("w1"))
	g.Eventually(func(g Gomega) {
		g.Expect(machineExists(g, f.ns, "w1")).To(BeTrue())
		g.Expect(getRemediation(g, f.ns, "w1").Status.Step(caprv1.StepDelete)).To(BeNil())
		g.Expect(backend.askCount(f.node("w1"))).To(BeNumerically(">", asked), "the remediator has not looked again yet")
	}, nextLook, poll).Should(Succeed())
	g.Consistently(func(g Gomega) {
		g.Expect(machineExists(g, f.ns, "w1")).To(BeTrue())
		g.Expect(getRemediation(g, f.ns, "w1").Status.Step(caprv1.StepDelete)).To(BeNil())
	}, quiet, poll).Should(Succeed())
}

// releaseMachine removes a test's finalizer from a Machine (best effort: also used in cleanups).
func releaseMachine(ns, name, finalizer string) {
	m := &clusterv1.Machine{}
	if err := k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, m); err != nil {
		return
	}
	base := m.DeepCopy()
	if controllerutil.RemoveFinalizer(m, finalizer) {
		_ = k8sClient.Patch(ctx, m, client.MergeFrom(base))
	}
}

// TestRunningOverANoRemediatorRecordIsReportedNotRemediated: a request recorded as having no
// remediator (its Machine has no MachineSet owner) whose phase is then set to Running by hand keeps
// its Machine: the worker record names no MachineSet, so this remediator never started it.
func TestRunningOverANoRemediatorRecordIsReportedNotRemediated(t *testing.T) {
	g := NewWithT(t)
	f := newFixture(t, g, nil)
	lone := f.machine(g, "lone")
	f.request(g, lone, required(), caprv1.MachineRemediationSourceManual)
	g.Eventually(func(g Gomega) {
		reason, _ := progressing(g, f.ns, "lone")
		g.Expect(reason).To(Equal(caprv1.MachineRemediationNoRemediatorReason))
		g.Expect(getRemediation(g, f.ns, "lone").Status.Worker).NotTo(BeNil())
	}, eventually, poll).Should(Succeed())
	writeRunningByHand(g, f.ns, "lone", nil)
	f.expectLeftAloneRunning(g, "lone", "names no MachineSet")
}

// writeRunningByHand writes phase Running into a request's status, as a person or another tool
// would, changed further by mutate.
func writeRunningByHand(g *WithT, ns, name string, mutate func(*caprv1.MachineRemediation)) {
	g.Eventually(func(g Gomega) {
		mr := getRemediation(g, ns, name)
		mr.Status.Phase = caprv1.MachineRemediationPhaseRunning
		if mutate != nil {
			mutate(mr)
		}
		g.Expect(k8sClient.Status().Update(ctx, mr)).To(Succeed())
	}, eventually, poll).Should(Succeed())
}

// expectLeftAloneRunning waits for the request to say why nothing is done (message), then checks that
// it stays Running with its Machine neither fenced nor deleted.
func (f *fixture) expectLeftAloneRunning(g *WithT, name, message string) {
	g.Eventually(func(g Gomega) string {
		_, msg := progressing(g, f.ns, name)
		return msg
	}, eventually, poll).Should(ContainSubstring(message))
	g.Consistently(func(g Gomega) {
		g.Expect(machineExists(g, f.ns, name)).To(BeTrue())
		g.Expect(backend.wasAsked(f.node(name))).To(BeFalse())
		g.Expect(phase(g, f.ns, name)).To(Equal(caprv1.MachineRemediationPhaseRunning))
	}, quiet, poll).Should(Succeed())
}

// TestRunningWithoutWorkerStatusIsReportedNotRemediated: a request whose status says Running without
// the worker record the remediator writes when it starts (a status written by hand or by another
// tool) is left alone, saying why; it used to panic on the missing record.
func TestRunningWithoutWorkerStatusIsReportedNotRemediated(t *testing.T) {
	g := NewWithT(t)
	f := newFixture(t, g, nil)
	m := f.workerOfMachineSet(g, "w1")
	setClusterPaused(g, f.cluster, true) // the remediator records nothing meanwhile
	f.request(g, m, required(), caprv1.MachineRemediationSourceManual)
	writeRunningByHand(g, f.ns, "w1", func(mr *caprv1.MachineRemediation) { mr.Status.Worker = nil })
	setClusterPaused(g, f.cluster, false)
	f.expectLeftAloneRunning(g, "w1", "status.worker is missing")
}
