package scenarios_test

import (
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	. "github.com/onsi/gomega"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/remediation"
	"github.com/capr-io/capr/remediation/controlplane"
	capienv "github.com/capr-io/capr/test/envtest"
	"github.com/capr-io/capr/test/sandbox"
	sbcontrolplanev1 "github.com/capr-io/capr/test/sandbox/api/controlplane/v1alpha1"
)

// The life cycle around the step sequence (issue "remediation lifecycle safety"): atomic start,
// abort, a lock that cannot leak or be lost, timeouts, retry, CAPI's stop signals, RBAC.

func controlPlaneObject(g Gomega, wc *sandbox.WorkloadCluster) *sbcontrolplanev1.SandboxControlPlane {
	cp := &sbcontrolplanev1.SandboxControlPlane{}
	g.Expect(sb.Client.Get(ctx, client.ObjectKey{Namespace: wc.Namespace, Name: wc.Name + "-cp"}, cp)).To(Succeed())
	return cp
}

// setLock writes the control-plane lock by hand (as a crashed start would have left it).
func setLock(g Gomega, wc *sandbox.WorkloadCluster, holder string, desired int32) {
	cp := controlPlaneObject(g, wc)
	base := cp.DeepCopy()
	value, err := (&caprv1.ControlPlaneLock{MachineRemediation: holder, DesiredReplicas: desired}).Marshal()
	g.Expect(err).NotTo(HaveOccurred())
	if cp.Annotations == nil {
		cp.Annotations = map[string]string{}
	}
	cp.Annotations[caprv1.ControlPlaneLockAnnotation] = value
	g.Expect(sb.Client.Patch(ctx, cp, client.MergeFrom(base))).To(Succeed())
}

// eventCount counts the events with reason about the named object (a series counts its repeats).
func eventCount(g Gomega, namespace, name, reason string) int {
	list := &eventsv1.EventList{}
	g.Expect(sb.Client.List(ctx, list, client.InNamespace(namespace))).To(Succeed())
	n := 0
	for _, e := range list.Items {
		if e.Regarding.Name != name || e.Reason != reason {
			continue
		}
		n++
		if e.Series != nil && e.Series.Count > 1 {
			n += int(e.Series.Count) - 1
		}
	}
	return n
}

// expectRequestGone waits until the request named after a Machine no longer exists.
func expectRequestGone(t *testing.T, wc *sandbox.WorkloadCluster, name string) {
	t.Helper()
	NewWithT(t).Eventually(func(g Gomega) {
		err := sb.Client.Get(ctx, client.ObjectKey{Namespace: wc.Namespace, Name: name}, &caprv1.MachineRemediation{})
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "request %s still there (err: %v)", name, err)
	}, remediationTimeout, 100*time.Millisecond).Should(Succeed())
}

// pendingRequest creates a MachineRemediation by hand for a Machine.
func pendingRequest(g Gomega, wc *sandbox.WorkloadCluster, machine string, source caprv1.RemediationSource) {
	mr := &caprv1.MachineRemediation{
		ObjectMeta: metav1.ObjectMeta{Namespace: wc.Namespace, Name: machine, Labels: map[string]string{clusterv1.ClusterNameLabel: wc.Name}},
		Spec:       caprv1.MachineRemediationSpec{Source: source, Reason: "Test"},
	}
	g.Expect(sb.Client.Create(ctx, mr)).To(Succeed())
}

// TestAbortBeforePointOfNoReturnUndoes: the replacement never comes up and the request is deleted
// (by hand, or by CAPI's MachineHealthCheck when the Machine looks healthy again). Nothing
// irreversible happened, so the remediation is undone: replicas back to 3, the lock released once the
// provider has observed them (undoWatch), and the request goes only after that. It was started
// exactly once.
func TestAbortBeforePointOfNoReturnUndoes(t *testing.T) {
	g := NewWithT(t)
	wc := newCluster(t)
	victim := controlPlane(g, wc)[1]
	startCAPR(t)
	undo := watchUndo(t, wc)

	sb.HoldProvisioning(wc, true)
	g.Expect(sb.StopHeartbeat(ctx, wc, victim.Status.NodeRef.Name)).To(Succeed())
	g.Eventually(func(g Gomega) {
		mr := getRemediation(g, wc, victim.Name)
		g.Expect(mr.Status.CurrentStep).To(Equal(caprv1.StepWaitForReplacement))
		g.Expect(*controlPlaneObject(g, wc).Spec.Replicas).To(BeEquivalentTo(4))
	}, remediationTimeout, 100*time.Millisecond).Should(Succeed())
	g.Expect(eventCount(g, wc.Namespace, victim.Name, remediation.EventRemediationStarted)).To(Equal(1), "started more than once")

	// The health check goes first, so that it does not ask again for the still-broken Machine.
	g.Expect(sb.Client.DeleteAllOf(ctx, &caprv1.MachineHealthCheck{}, client.InNamespace(wc.Namespace))).To(Succeed())
	g.Expect(sb.Client.Delete(ctx, getRemediation(g, wc, victim.Name))).To(Succeed())
	expectRequestGone(t, wc, victim.Name)
	cp := controlPlaneObject(g, wc)
	g.Expect(*cp.Spec.Replicas).To(BeEquivalentTo(3), "replicas left at the surge size")
	g.Expect(cp.Annotations).NotTo(HaveKey(caprv1.ControlPlaneLockAnnotation), "lock left behind")
	g.Expect(eventCount(g, wc.Namespace, victim.Name, remediation.EventRemediationAborted)).To(Equal(1))
	undo.expectWaitedForTheProvider(t, victim.Name)

	sb.HoldProvisioning(wc, false)
	g.Expect(sb.WaitForControlPlane(ctx, wc, 3, time.Minute)).To(Succeed())
}

// TestTimeoutBeforePointOfNoReturnFailsAndCanBeRetried: a replacement that never comes up is a
// timeout, not a stall. Before the victim's member was removed the remediation is undone and Failed,
// saying so (the lock released once the provider has observed the replicas set back: undoWatch); the
// retry annotation starts it again.
func TestTimeoutBeforePointOfNoReturnFailsAndCanBeRetried(t *testing.T) {
	g := NewWithT(t)
	wc := newCluster(t, withReplacementTimeout(3))
	victim := controlPlane(g, wc)[1]
	startCAPR(t)
	undo := watchUndo(t, wc)

	sb.HoldProvisioning(wc, true)
	g.Expect(sb.StopHeartbeat(ctx, wc, victim.Status.NodeRef.Name)).To(Succeed())
	var failed *caprv1.MachineRemediation
	g.Eventually(func(g Gomega) {
		failed = getRemediation(g, wc, victim.Name)
		g.Expect(failed.Status.Phase).To(Equal(caprv1.MachineRemediationPhaseFailed))
	}, remediationTimeout, 100*time.Millisecond).Should(Succeed())
	g.Expect(failed.Status.Conditions).To(ContainElement(And(
		HaveField("Type", caprv1.MachineRemediationSucceededCondition),
		HaveField("Reason", caprv1.MachineRemediationStepTimedOutReason),
		HaveField("Message", ContainSubstring("replicas back from 4 to 3")))))
	cp := controlPlaneObject(g, wc)
	g.Expect(*cp.Spec.Replicas).To(BeEquivalentTo(3))
	g.Expect(cp.Annotations).NotTo(HaveKey(caprv1.ControlPlaneLockAnnotation))
	undo.expectWaitedForTheProvider(t, victim.Name)

	sb.HoldProvisioning(wc, false)
	g.Expect(sb.WaitForControlPlane(ctx, wc, 3, time.Minute)).To(Succeed())
	base := failed.DeepCopy()
	failed.Annotations = map[string]string{caprv1.RetryAnnotation: ""}
	g.Expect(sb.Client.Patch(ctx, failed, client.MergeFrom(base))).To(Succeed())
	g.Eventually(func(g Gomega) {
		mr := getRemediation(g, wc, victim.Name)
		g.Expect(mr.Annotations).NotTo(HaveKey(caprv1.RetryAnnotation))
		g.Expect(mr.Status.Phase).NotTo(Equal(caprv1.MachineRemediationPhaseFailed))
	}, remediationTimeout, 100*time.Millisecond).Should(Succeed())
	g.Expect(eventCount(g, wc.Namespace, victim.Name, controlplane.EventRemediationRetried)).To(Equal(1))
}

// TestReplacementThatNeverComesUpAfterThePointOfNoReturnEnds: a dead member is removed first and
// its Machine deleted; then the replacement never comes up. Nothing can be undone, but waiting for
// ever would hold the control-plane lock for ever, and every other request of the cluster with it
// (the replacement's own among them, when a health check marks it). Past the replacement timeout the
// remediation ends, Failed, saying why, with the lock released and nothing undone: the provider keeps
// the replicas and its replacement, which comes up once provisioning works again.
func TestReplacementThatNeverComesUpAfterThePointOfNoReturnEnds(t *testing.T) {
	g := NewWithT(t)
	wc := newCluster(t, withReplacementTimeout(3))
	victim := controlPlane(g, wc)[1]
	startCAPR(t)

	sb.HoldProvisioning(wc, true)
	sb.KillEtcdMember(wc, victim.Status.NodeRef.Name)
	var failed *caprv1.MachineRemediation
	g.Eventually(func(g Gomega) {
		failed = getRemediation(g, wc, victim.Name)
		g.Expect(failed.Status.Phase).To(Equal(caprv1.MachineRemediationPhaseFailed), "step %s: %s",
			failed.Status.CurrentStep, conditions.GetMessage(failed, caprv1.MachineRemediationProgressingCondition))
	}, remediationTimeout, 100*time.Millisecond).Should(Succeed())
	g.Expect(failed.Status.Steps).To(ContainElement(And(
		HaveField("Name", caprv1.StepDelete), HaveField("Outcome", caprv1.StepOutcomeSucceeded))), "the victim was deleted before the wait")
	g.Expect(failed.Status.Conditions).To(ContainElement(And(
		HaveField("Type", caprv1.MachineRemediationSucceededCondition),
		HaveField("Reason", caprv1.MachineRemediationStepTimedOutReason),
		HaveField("Message", ContainSubstring("nothing is undone")))))
	cp := controlPlaneObject(g, wc)
	g.Expect(cp.Annotations).NotTo(HaveKey(caprv1.ControlPlaneLockAnnotation), "the lock is released")
	g.Expect(*cp.Spec.Replicas).To(BeEquivalentTo(3))

	sb.HoldProvisioning(wc, false)
	g.Expect(sb.WaitForControlPlane(ctx, wc, 3, time.Minute)).To(Succeed())
}

// TestMarkedReplacementAfterThePointOfNoReturnTakesOver: the same, but a request for the replacement
// exists (a health check marked it, or a person asked) before the replacement timeout: the
// remediation that waits for it ends at once, nothing undone, and the replacement's own request runs
// next (it never would while the first held the lock).
func TestMarkedReplacementAfterThePointOfNoReturnTakesOver(t *testing.T) {
	g := NewWithT(t)
	wc := newCluster(t)
	victim := controlPlane(g, wc)[1]
	startCAPR(t)

	sb.HoldProvisioning(wc, true)
	sb.KillEtcdMember(wc, victim.Status.NodeRef.Name)
	var replacement string
	g.Eventually(func(g Gomega) {
		mr := getRemediation(g, wc, victim.Name)
		g.Expect(mr.Status.CurrentStep).To(Equal(caprv1.StepWaitForReplacement))
		g.Expect(mr.Status.Steps).To(ContainElement(And(
			HaveField("Name", caprv1.StepDelete), HaveField("Outcome", caprv1.StepOutcomeSucceeded))))
		g.Expect(mr.Status.ControlPlane.Replacement).NotTo(BeEmpty())
		replacement = mr.Status.ControlPlane.Replacement
	}, remediationTimeout, 100*time.Millisecond).Should(Succeed())

	pendingRequest(g, wc, replacement, caprv1.MachineRemediationSourceManual)
	g.Eventually(func(g Gomega) {
		mr := getRemediation(g, wc, victim.Name)
		g.Expect(mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhaseFailed))
		g.Expect(conditions.GetMessage(mr, caprv1.MachineRemediationSucceededCondition)).To(ContainSubstring(replacement + " is itself to be remediated"))
	}, remediationTimeout, 100*time.Millisecond).Should(Succeed())
	g.Eventually(func(g Gomega) {
		g.Expect(getRemediation(g, wc, replacement).Status.Phase).To(BeElementOf(caprv1.MachineRemediationPhaseRunning, caprv1.MachineRemediationPhaseSucceeded))
	}, remediationTimeout, 100*time.Millisecond).Should(Succeed())

	sb.HoldProvisioning(wc, false)
	waitRemediated(t, wc, replacement, 3)
}

// TestLostLockNeverAllowsTwoRunning: the lock annotation is stripped again and again (a GitOps tool
// replacing the object) while two Machines of five need remediation. Who holds the control plane is
// derived from the Running requests, so the two are never Running at once, and both complete.
// `make test-scenarios` runs it; `make test` leaves it out (hack/test-levels.sh; the claims resting on
// it: docs/developer/testing.md#ci).
func TestLostLockNeverAllowsTwoRunning(t *testing.T) {
	g := NewWithT(t)
	wc := newCluster(t, withControlPlane(5))
	machines := controlPlane(g, wc)
	startCAPR(t)
	running := sb.WatchRunning(ctx, wc)

	stop := make(chan struct{})
	stripped := make(chan struct{})
	go func() {
		defer close(stripped)
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			_ = sb.StripControlPlaneLock(ctx, wc)
		}
	}()
	for _, m := range machines[1:3] {
		sb.KillEtcdMember(wc, m.Status.NodeRef.Name)
	}
	waitRemediated(t, wc, machines[1].Name, 5)
	waitRemediated(t, wc, machines[2].Name, 5)
	close(stop)
	<-stripped
	g.Expect(running.Stop()).To(BeEmpty(), "two control-plane remediations Running at once")
}

// TestStaleLockHoldersDoNotBlock: a lock left by a request whose Machine is gone, and a lock held by
// a Pending request that must not go first, never block the remediation that should run.
func TestStaleLockHoldersDoNotBlock(t *testing.T) {
	g := NewWithT(t)
	wc := newCluster(t)
	machines := controlPlane(g, wc)
	startCAPR(t)

	// A request whose Machine is gone, holding the lock (a start that crashed, then the Machine went).
	pendingRequest(g, wc, "gone", caprv1.MachineRemediationSourceHealthCheck)
	setLock(g, wc, "gone", 3)
	sb.KillEtcdMember(wc, machines[1].Status.NodeRef.Name)
	waitRemediated(t, wc, machines[1].Name, 3)

	// A Pending request for a healthy Machine holds the lock while a Machine whose member is dead
	// must go first: the holder gives the lock back instead of both waiting on each other. (The
	// member dies first: a request that finds every member healthy would simply start; what a
	// running one does when another member dies is TestRunningYieldsToMoreBroken.)
	healthy, broken := controlPlane(g, wc)[0], controlPlane(g, wc)[1]
	sb.KillEtcdMember(wc, broken.Status.NodeRef.Name)
	pendingRequest(g, wc, healthy.Name, caprv1.MachineRemediationSourceHealthCheck)
	setLock(g, wc, healthy.Name, 3)
	g.Eventually(func(g Gomega) {
		g.Expect(getRemediation(g, wc, broken.Name).Status.Phase).To(Equal(caprv1.MachineRemediationPhaseRunning))
	}, remediationTimeout, 100*time.Millisecond).Should(Succeed())
	// The stale request is withdrawn while the other runs, so that it cannot start (it names a
	// healthy Machine, and nobody else would withdraw it) once the other is done.
	g.Expect(sb.AnnotateMachine(ctx, wc, healthy.Name, clusterv1.MachineSkipRemediationAnnotation, true)).To(Succeed())
	expectRequestGone(t, wc, healthy.Name)
	waitRemediated(t, wc, broken.Name, 3)
	g.Eventually(func(g Gomega) {
		g.Expect(controlPlaneObject(g, wc).Annotations).NotTo(HaveKey(caprv1.ControlPlaneLockAnnotation))
	}, remediationTimeout, 100*time.Millisecond).Should(Succeed())
}

// TestRunningYieldsToMoreBroken: a requested remediation of a Machine whose etcd member is healthy
// is under way (its replacement is not up yet) when another Machine's member dies. Removing the
// healthy member would now not be quorum-safe, so the running one could only wait for its timeout
// while the broken Machine waits behind it. It gives way instead, before its point of no return:
// its replacement marked for deletion, replicas back to 3, the lock released, Pending again. The
// broken Machine is remediated first, then the requested one; never two Running at once.
func TestRunningYieldsToMoreBroken(t *testing.T) {
	g := NewWithT(t)
	wc := newCluster(t)
	machines := controlPlane(g, wc)
	healthy, broken := machines[0], machines[1]
	startCAPR(t)
	running := sb.WatchRunning(ctx, wc)

	sb.HoldProvisioning(wc, true)
	pendingRequest(g, wc, healthy.Name, caprv1.MachineRemediationSourceManual)
	g.Eventually(func(g Gomega) {
		g.Expect(getRemediation(g, wc, healthy.Name).Status.CurrentStep).To(Equal(caprv1.StepWaitForReplacement))
		g.Expect(*controlPlaneObject(g, wc).Spec.Replicas).To(BeEquivalentTo(4))
	}, remediationTimeout, 100*time.Millisecond).Should(Succeed())

	sb.KillEtcdMember(wc, broken.Status.NodeRef.Name)
	g.Eventually(func(g Gomega) {
		g.Expect(eventCount(g, wc.Namespace, healthy.Name, controlplane.EventRemediationYielded)).To(Equal(1))
		g.Expect(getRemediation(g, wc, healthy.Name).Status.Phase).To(Equal(caprv1.MachineRemediationPhasePending))
		g.Expect(*controlPlaneObject(g, wc).Spec.Replicas).To(BeEquivalentTo(3))
	}, remediationTimeout, 100*time.Millisecond).Should(Succeed())
	// The replacement had no Node (and could not join while a member is down): it is deleted, not
	// an old Machine.
	g.Eventually(func(g Gomega) {
		g.Expect(controlPlane(g, wc)).To(ConsistOf(
			HaveField("Name", machines[0].Name), HaveField("Name", machines[1].Name), HaveField("Name", machines[2].Name)))
	}, remediationTimeout, 100*time.Millisecond).Should(Succeed())

	sb.HoldProvisioning(wc, false)
	waitRemediated(t, wc, broken.Name, 3)
	waitRemediated(t, wc, healthy.Name, 3)
	g.Expect(running.Stop()).To(BeEmpty(), "two control-plane remediations Running at once")
}

// TestStopSignals: CAPI's cluster.x-k8s.io/skip-remediation withdraws a Pending request, and
// cluster.x-k8s.io/paused on the Machine keeps a request from starting until it is removed.
func TestStopSignals(t *testing.T) {
	g := NewWithT(t)
	wc := newCluster(t)
	machines := controlPlane(g, wc)
	startCAPR(t)

	annotate := func(m clusterv1.Machine, key string, set bool) {
		g.Expect(sb.AnnotateMachine(ctx, wc, m.Name, key, set)).To(Succeed())
	}

	skipped := machines[0]
	annotate(skipped, clusterv1.MachineSkipRemediationAnnotation, true)
	pendingRequest(g, wc, skipped.Name, caprv1.MachineRemediationSourceManual)
	expectRequestGone(t, wc, skipped.Name)

	paused := machines[1]
	annotate(paused, clusterv1.PausedAnnotation, true)
	pendingRequest(g, wc, paused.Name, caprv1.MachineRemediationSourceManual)
	g.Eventually(func(g Gomega) {
		mr := getRemediation(g, wc, paused.Name)
		g.Expect(mr.Status.Conditions).To(ContainElement(HaveField("Reason", caprv1.MachineRemediationPausedReason)))
	}, remediationTimeout, 100*time.Millisecond).Should(Succeed())
	g.Consistently(func(g Gomega) {
		g.Expect(getRemediation(g, wc, paused.Name).Status.Phase).NotTo(Equal(caprv1.MachineRemediationPhaseRunning))
		g.Expect(*controlPlaneObject(g, wc).Spec.Replicas).To(BeEquivalentTo(3))
	}, 3*time.Second, 200*time.Millisecond).Should(Succeed())
	annotate(paused, clusterv1.PausedAnnotation, false)
	waitRemediated(t, wc, paused.Name, 3)
}

// TestSkipRemediationStopsARunningRemediationWhileItCanBeUndone: CAPI's
// cluster.x-k8s.io/skip-remediation set on a Machine whose remediation already runs (the
// replacement is provisioning, nothing irreversible done) stops it: the request goes, the replicas
// are back to 3, the lock is released and the Machine is kept.
func TestSkipRemediationStopsARunningRemediationWhileItCanBeUndone(t *testing.T) {
	g := NewWithT(t)
	wc := newCluster(t)
	victim := controlPlane(g, wc)[1]
	startCAPR(t)

	sb.HoldProvisioning(wc, true)
	t.Cleanup(func() { sb.HoldProvisioning(wc, false) })
	g.Expect(sb.StopHeartbeat(ctx, wc, victim.Status.NodeRef.Name)).To(Succeed())
	g.Eventually(func(g Gomega) {
		g.Expect(getRemediation(g, wc, victim.Name).Status.Phase).To(Equal(caprv1.MachineRemediationPhaseRunning))
		g.Expect(*controlPlaneObject(g, wc).Spec.Replicas).To(BeEquivalentTo(4))
	}, remediationTimeout, 100*time.Millisecond).Should(Succeed())

	g.Expect(sb.AnnotateMachine(ctx, wc, victim.Name, clusterv1.MachineSkipRemediationAnnotation, true)).To(Succeed())
	expectRequestGone(t, wc, victim.Name)
	cp := controlPlaneObject(g, wc)
	g.Expect(*cp.Spec.Replicas).To(BeEquivalentTo(3))
	g.Expect(cp.Annotations).NotTo(HaveKey(caprv1.ControlPlaneLockAnnotation))
	m := &clusterv1.Machine{}
	g.Expect(sb.Client.Get(ctx, client.ObjectKey{Namespace: wc.Namespace, Name: victim.Name}, m)).To(Succeed())
	g.Expect(m.DeletionTimestamp.IsZero()).To(BeTrue(), "the skipped Machine is kept")
}

// TestUninitializedControlPlaneFailsClosedThenReplacesWithShippedRBAC: when the Cluster does not say
// whether its control plane is initialized, nothing is done; when it says it is not, the Machine is
// replaced by deleting it (as KCP does for the first Machine) — which the manager may do with the
// RBAC it ships (the test manager runs with it).
func TestUninitializedControlPlaneFailsClosedThenReplacesWithShippedRBAC(t *testing.T) {
	g := NewWithT(t)
	wc := newCluster(t)
	machines := controlPlane(g, wc)
	startCAPR(t)

	cluster := &clusterv1.Cluster{}
	g.Expect(sb.Client.Get(ctx, wc.Key(), cluster)).To(Succeed())
	base := cluster.DeepCopy()
	cluster.Status.Conditions = nil
	cluster.Status.Initialization.ControlPlaneInitialized = nil
	g.Expect(sb.Client.Status().Patch(ctx, cluster, client.MergeFrom(base))).To(Succeed())

	victim := machines[2]
	pendingRequest(g, wc, victim.Name, caprv1.MachineRemediationSourceManual)
	g.Eventually(func(g Gomega) {
		mr := getRemediation(g, wc, victim.Name)
		g.Expect(mr.Status.Conditions).To(ContainElement(HaveField("Reason", caprv1.MachineRemediationControlPlaneInitializationUnknownReason)))
		g.Expect(mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhasePending))
	}, remediationTimeout, 100*time.Millisecond).Should(Succeed())

	g.Expect(sb.Client.Get(ctx, wc.Key(), cluster)).To(Succeed())
	g.Expect(capienv.SetClusterReady(ctx, sb.Client, cluster, capienv.InfrastructureReadyOnly)).To(Succeed())
	mr := waitRemediated(t, wc, victim.Name, 3)
	g.Expect(mr.Status.ControlPlane.Order).To(Equal(caprv1.ControlPlaneOrderReplace))
}
