package adversarial_test

import (
	"fmt"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/controllers/machinehealthcheck"
	"github.com/capr-io/capr/etcdutil"
	"github.com/capr-io/capr/remediation"
	"github.com/capr-io/capr/remediation/controlplane"
	"github.com/capr-io/capr/remediation/fencing"
	capienv "github.com/capr-io/capr/test/envtest"
)

// honestTarget is the honest tenant's Machine that goes unhealthy.
const honestTarget = "m"

// newHonestTenant writes the honest tenant: a worker Machine with a Ready Node, a health check over it
// that requires a NetworkFence, and a MachineRemediationTemplate (whose name the hostile tenant names).
func newHonestTenant(t *testing.T, g *WithT) *tenant {
	t.Helper()
	o := newTenant(t, g, "honest", 77)
	g.Expect(k8sClient.Create(ctx, &caprv1.MachineRemediationTemplate{
		ObjectMeta: metav1.ObjectMeta{Namespace: o.ns, Name: honestTemplate.Name},
	})).To(Succeed())
	o.machine(g, honestTarget, machineSpec{pool: "workers", ready: corev1.ConditionTrue})
	o.healthCheck(g, "hc", "workers", func(mhc *caprv1.MachineHealthCheck) { mhc.Spec.Remediation.Fencing = o.requiredNetworkFence() })
	return o
}

// TestAHostileTenantBesideAnHonestOne writes every hostile input at once (hostile_test.go)
// and then lets the honest tenant's Machine go unhealthy. The honest Machine is marked and remediated,
// fenced first; each hostile object is reported where CAPR promises a condition or an event; none of
// the hostile Machines is deleted (every request for one is covered by a health check requiring a
// fence, which nobody confirms: the forged fences must not count); and no reconcile panicked.
func TestAHostileTenantBesideAnHonestOne(t *testing.T) {
	g := NewWithT(t)
	h := newHostileTenant(t, g)
	var o *tenant
	t.Cleanup(func() {
		if t.Failed() {
			h.logState(t)
			if o != nil {
				o.logState(t)
			}
		}
	})
	// Every hostile health check has been taken up (the finalizer is a first round's only write); the
	// next rounds read their templates and reach their Machines while the honest tenant starts.
	g.Eventually(func(g Gomega) {
		list := &caprv1.MachineHealthCheckList{}
		g.Expect(k8sClient.List(ctx, list, client.InNamespace(h.ns))).To(Succeed())
		g.Expect(list.Items).To(HaveLen(forbiddenHealthChecks + 6))
		for i := range list.Items {
			g.Expect(controllerutil.ContainsFinalizer(&list.Items[i], machinehealthcheck.Finalizer)).To(BeTrue(), list.Items[i].Name)
		}
	}, eventually, poll).Should(Succeed())

	o = newHonestTenant(t, g)
	g.Eventually(func(g Gomega) *int32 { return getHealthCheck(g, o.ns, "hc").Status.ExpectedMachines }, eventually, poll).
		Should(HaveValue(BeEquivalentTo(1)))
	g.Expect(capienv.SetNodeReady(ctx, k8sClient, o.node(honestTarget), corev1.ConditionFalse)).To(Succeed())

	t.Run("the honest Machine is marked and remediated, fenced first", func(t *testing.T) {
		g := NewWithT(t)
		g.Eventually(func(g Gomega) {
			cond := conditions.Get(getMachine(g, o.ns, honestTarget), caprv1.MachineCAPRHealthCheckSucceededCondition)
			g.Expect(cond).NotTo(BeNil())
			g.Expect(cond.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(cond.Reason).To(Equal(caprv1.MachineCAPRHealthCheckUnhealthyNodeReason))
		}, eventually, poll).Should(Succeed(), "marked")
		// csi-addons (the test) reports CAPR's NetworkFence done once it exists: the Machine is there then.
		g.Eventually(func(g Gomega) {
			nf := o.networkFence(g, honestTarget)
			g.Expect(nf).NotTo(BeNil())
			g.Expect(nf.GetLabels()).To(HaveKeyWithValue(fencing.ManagedByLabel, fencing.ManagedBy))
			g.Expect(capienv.FenceState(nf)).To(Equal("Fenced"))
			g.Expect(machineExists(g, o.ns, honestTarget)).To(BeTrue(), "deleted before its fence was confirmed")
			g.Expect(capienv.ReportNetworkFence(ctx, k8sClient, nf, capienv.CSIAddonsFenced)).To(Succeed())
		}, eventually, poll).Should(Succeed(), "fenced")
		g.Eventually(func(g Gomega) bool { return machineExists(g, o.ns, honestTarget) }, eventually, poll).Should(BeFalse(), "deleted")
		// CAPI deletes the Node of a deleted Machine; then the fence is undone and the remediation ends.
		g.Expect(k8sClient.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: o.node(honestTarget)}})).To(Succeed())
		g.Eventually(func(g Gomega) {
			if nf := o.networkFence(g, honestTarget); nf != nil && capienv.FenceState(nf) == "Unfenced" {
				g.Expect(capienv.ReportNetworkFence(ctx, k8sClient, nf, capienv.CSIAddonsUnfenced)).To(Succeed())
			}
			mr := getRemediation(g, o.ns, honestTarget)
			g.Expect(mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhaseSucceeded), "%v", mr.Status.Conditions)
			g.Expect(mr.Status.Step(caprv1.StepFence).Outcome).To(Equal(caprv1.StepOutcomeSucceeded))
		}, eventually, poll).Should(Succeed(), "remediated")
	})

	t.Run("health checks naming what CAPR may not read or cannot find say so, or are refused", func(t *testing.T) {
		g := NewWithT(t)
		type want struct{ reason, message string }
		wants := map[string]want{
			"typo": {caprv1.MachineHealthCheckRemediationTemplateNotFoundReason,
				"spec.remediation.templateRef: MachineRemediationTemplate " + h.ns + "/t not found"},
			"borrowed": {caprv1.MachineHealthCheckRemediationTemplateNotFoundReason,
				"spec.remediation.templateRef: MachineRemediationTemplate " + h.ns + "/honest-template not found"},
		}
		for i := range forbiddenHealthChecks {
			w := want{caprv1.MachineHealthCheckRemediationTemplateInvalidReason, "spec.remediation.templateRef: KubeadmConfigTemplate " + h.ns + "/t cannot be read"}
			if i%2 == 1 {
				w.message = "spec.remediation.escalation[0].templateRef: KubeadmControlPlaneTemplate " + h.ns + "/t cannot be read"
			}
			wants[fmt.Sprintf("forbidden-%d", i)] = w
		}
		for name, w := range wants {
			g.Eventually(func(g Gomega) {
				c := conditions.Get(getHealthCheck(g, h.ns, name), caprv1.MachineHealthCheckRemediationTemplatesValidCondition)
				g.Expect(c).NotTo(BeNil())
				g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
				g.Expect(c.Reason).To(Equal(w.reason))
				g.Expect(c.Message).To(ContainSubstring(w.message))
				g.Expect(events(g, h.ns, "MachineHealthCheck", name, w.reason)).To(ContainElement(HaveField("Type", corev1.EventTypeWarning)))
			}, eventually, poll).Should(Succeed(), "health check %s", name)
		}
		g.Expect(apierrors.IsInvalid(h.unparsableSelector)).To(BeTrue(), "a selector that does not parse is refused: %v", h.unparsableSelector)
		g.Expect(h.unparsableSelector.Error()).To(ContainSubstring("spec.selector.matchLabels"))
		g.Expect(apierrors.IsInvalid(h.machineEscalation)).To(BeTrue(), "an escalation step naming a MachineTemplate is refused: %v", h.machineEscalation)
		g.Expect(h.machineEscalation.Error()).To(ContainSubstring("spec.remediation.escalation[0].templateRef.apiVersion"))
	})

	t.Run("overlapping health checks report it and leave each other's mark", func(t *testing.T) {
		g := NewWithT(t)
		for _, pair := range [][2]string{{"guard", "disk"}, {"disk", "guard"}} {
			g.Eventually(func(g Gomega) {
				c := conditions.Get(getHealthCheck(g, h.ns, pair[0]), caprv1.MachineHealthCheckTargetsOverlapCondition)
				g.Expect(c).NotTo(BeNil())
				g.Expect(c.Status).To(Equal(metav1.ConditionTrue))
				g.Expect(c.Message).To(ContainSubstring(pair[1]))
				g.Expect(events(g, h.ns, "MachineHealthCheck", pair[0], caprv1.EventTargetsOverlap)).NotTo(BeEmpty())
			}, eventually, poll).Should(Succeed(), "health check %s reports the overlap with %s", pair[0], pair[1])
		}
		var since metav1.Time
		g.Eventually(func(g Gomega) {
			cond, checkers := markOf(g, h.ns, forgedNFTarget)
			g.Expect(checkers).To(Equal([]string{h.ns + "/guard"}))
			since = cond.LastTransitionTime
		}, eventually, poll).Should(Succeed())
		g.Consistently(func(g Gomega) {
			cond, checkers := markOf(g, h.ns, forgedNFTarget)
			g.Expect(checkers).To(Equal([]string{h.ns + "/guard"}), "the mark stays")
			g.Expect(cond.LastTransitionTime.Time).To(BeTemporally("==", since.Time), "never cleared and set again")
		}, quiet, poll).Should(Succeed())
	})

	t.Run("a hand-written request gets the fencing its health check requires", func(t *testing.T) {
		g := NewWithT(t)
		g.Eventually(func(g Gomega) {
			mr := getRemediation(g, h.ns, manualTarget)
			g.Expect(mr.Status.AppliedFencing).NotTo(BeNil())
			g.Expect(mr.Status.AppliedFencing.Policy).To(Equal(caprv1.FencingRequired))
			g.Expect(mr.Status.AppliedFencing.RaisedBy).To(Equal([]string{"guard"}))
			g.Expect(conditions.GetReason(mr, caprv1.MachineRemediationProgressingCondition)).To(Equal(caprv1.MachineRemediationWaitingForFencingReason))
			g.Expect(events(g, h.ns, "MachineRemediation", manualTarget, caprv1.EventFencingRaised)).NotTo(BeEmpty())
		}, eventually, poll).Should(Succeed())
	})

	t.Run("forged fences are not believed", func(t *testing.T) {
		g := NewWithT(t)
		for _, machine := range []string{forgedNFTarget, poweredTarget} {
			g.Eventually(func(g Gomega) {
				mr := getRemediation(g, h.ns, machine)
				fence := h.fenceObject(g, machine)
				g.Expect(fence).NotTo(BeNil())
				g.Expect(fence.GetUID()).NotTo(Equal(h.forged[machine]), "the forgery is replaced")
				g.Expect(fence.GetAnnotations()).To(HaveKeyWithValue(fencing.RemediationUIDAnnotation, string(mr.UID)))
				g.Expect(notes(events(g, h.ns, "MachineRemediation", machine, remediation.EventRemediationWaiting))).
					To(ContainSubstring("is not the fence CAPR made for this remediation"))
				g.Expect(mr.Status.Step(caprv1.StepDelete)).To(BeNil())
			}, eventually, poll).Should(Succeed(), "the fence of %s", machine)
		}
		// The garbage in the unhealthy annotation is a person's request, its text kept as the message.
		cond, _ := markOf(g, h.ns, poweredTarget)
		g.Expect(cond).NotTo(BeNil())
		g.Expect(cond.Reason).To(Equal(caprv1.MachineCAPRHealthCheckManualRequestReason))
	})

	t.Run("the etcd-endpoints annotation is ignored and its address never dialled", func(t *testing.T) {
		g := NewWithT(t)
		g.Eventually(func(g Gomega) {
			g.Expect(notes(events(g, h.ns, "Cluster", cpCluster, etcdutil.EventEndpointsIgnored))).To(ContainSubstring(etcdutil.AllowEndpointsFlag))
		}, eventually, poll).Should(Succeed())
	})

	t.Run("hand-written control-plane requests wait and say why", func(t *testing.T) {
		g := NewWithT(t)
		g.Eventually(func(g Gomega) {
			mr := getRemediation(g, h.ns, cpCluster+"-2")
			c := conditions.Get(mr, caprv1.MachineRemediationProgressingCondition)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Reason).To(Equal(caprv1.MachineRemediationWaitingForPreconditionsReason))
			g.Expect(c.Message).To(ContainSubstring("status.controlPlane is missing"))
		}, eventually, poll).Should(Succeed())
		// The lock of garbage names no request: it holds nothing. What stops the request is that etcd
		// cannot be read (no etcd Pod to port-forward to, and the annotation's address not dialled).
		g.Eventually(func(g Gomega) {
			mr := getRemediation(g, h.ns, cpCluster+"-1")
			g.Expect(mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhasePending))
			c := conditions.Get(mr, caprv1.MachineRemediationProgressingCondition)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Reason).To(Equal(caprv1.MachineRemediationEtcdUnreachableReason))
			g.Expect(c.Message).To(ContainSubstring("cannot read etcd state"))
		}, eventually, poll).Should(Succeed())
	})

	t.Run("a request for a Machine that does not exist says so", func(t *testing.T) {
		g := NewWithT(t)
		g.Eventually(func(g Gomega) {
			c := conditions.Get(getRemediation(g, h.ns, ghostRequest), caprv1.MachineRemediationProgressingCondition)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Reason).To(Equal(caprv1.MachineRemediationMachineNotFoundReason), c.Message)
			g.Expect(c.Message).To(ContainSubstring("Machine " + ghostRequest + " does not exist in namespace " + h.ns))
			g.Expect(events(g, h.ns, "MachineRemediation", ghostRequest, caprv1.MachineRemediationMachineNotFoundReason)).
				To(ContainElement(HaveField("Type", corev1.EventTypeWarning)))
		}, eventually, poll).Should(Succeed())
	})

	t.Run("nothing of the hostile tenant's was deleted, nothing dialled, no reconcile panicked", func(t *testing.T) {
		g := NewWithT(t)
		for _, name := range []string{forbiddenTarget, manualTarget, forgedNFTarget, poweredTarget, cpCluster + "-0", cpCluster + "-1", cpCluster + "-2"} {
			g.Expect(machineExists(g, h.ns, name)).To(BeTrue(), "Machine %s was deleted", name)
			g.Expect(getMachine(g, h.ns, name).DeletionTimestamp.IsZero()).To(BeTrue(), "Machine %s is being deleted", name)
		}
		kcp := &unstructured.Unstructured{}
		kcp.SetAPIVersion("controlplane.cluster.x-k8s.io/v1beta2")
		kcp.SetKind("KubeadmControlPlane")
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: h.ns, Name: cpCluster}, kcp)).To(Succeed())
		g.Expect(controlplane.Replicas(kcp)).To(BeEquivalentTo(3))
		g.Expect(etcdElsewhere.accepted.Load()).To(BeZero(), "connections to the address of the etcd-endpoints annotation")
		g.Expect(reconcilePanics(g)).To(BeZero())
	})
}

// fenceObject is the object under the name CAPR gives machine's fence: its NetworkFence, or for the
// Machine fenced through the External backend its PowerFence (nil when there is none).
func (h *hostile) fenceObject(g Gomega, machine string) *unstructured.Unstructured {
	if machine != poweredTarget {
		return h.networkFence(g, machine)
	}
	pf := &unstructured.Unstructured{}
	pf.SetAPIVersion(powerFenceTemplate.APIVersion)
	pf.SetKind("PowerFence")
	err := k8sClient.Get(ctx, client.ObjectKey{Namespace: h.ns, Name: machine}, pf)
	if apierrors.IsNotFound(err) {
		return nil
	}
	g.Expect(err).NotTo(HaveOccurred())
	return pf
}

// markOf returns the health checker's mark on the Machine (nil when it has none) and the health
// checks whose entries it has (none when the Machine is not marked).
func markOf(g Gomega, ns, name string) (*metav1.Condition, []string) {
	cond := conditions.Get(getMachine(g, ns, name), caprv1.MachineCAPRHealthCheckSucceededCondition)
	if cond == nil || cond.Status != metav1.ConditionFalse {
		return cond, nil
	}
	entries, err := caprv1.MarkEntriesFromMessage(cond.Message)
	if err != nil {
		return cond, nil // a mark of one reason without entries (a person's request)
	}
	checkers := make([]string, 0, len(entries))
	for _, e := range entries {
		checkers = append(checkers, e.Checker)
	}
	return cond, checkers
}

// reconcilePanics is the number of reconciles of any controller that panicked (controller-runtime
// recovers them and counts them in controller_runtime_reconcile_panics_total).
func reconcilePanics(g Gomega) float64 {
	families, err := ctrlmetrics.Registry.Gather()
	g.Expect(err).NotTo(HaveOccurred())
	total := 0.0
	for _, f := range families {
		if f.GetName() != "controller_runtime_reconcile_panics_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			total += m.GetCounter().GetValue()
		}
	}
	return total
}
