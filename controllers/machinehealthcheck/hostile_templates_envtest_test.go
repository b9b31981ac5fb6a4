//go:build envtest

package machinehealthcheck_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/controllers/machinehealthcheck"
	capienv "github.com/capr-io/capr/test/envtest"
)

// The manager of this suite runs with the RBAC CAPR ships (capienv.Environment.ManagerConfig): it
// has no role for CAPI's bootstrap kinds nor for KubeadmControlPlaneTemplates, whose CRDs envtest
// installs. These are kinds a user may name by mistake, or on purpose.
var (
	forbiddenTemplate = caprv1.TemplateReference{APIVersion: "bootstrap.cluster.x-k8s.io/v1beta2", Kind: "KubeadmConfigTemplate", Name: "t"}
	forbiddenStep     = caprv1.TemplateReference{APIVersion: "controlplane.cluster.x-k8s.io/v1beta2", Kind: "KubeadmControlPlaneTemplate", Name: "t"}
)

// hostileHealthChecks is more than the manager's health-check workers (10, the default).
const hostileHealthChecks = 12

// TestHealthChecksNamingAKindCAPRMayNotReadDoNotStopOthers: twelve health
// checks whose templateRef or escalation step names a kind CAPR has no role for. Read through the
// manager's cache, each such read started an informer that could never sync and waited for it with no
// deadline: every health-check worker hung in checkTemplates, and a Machine in another namespace whose
// Node went Ready=False was never marked. Read live, the read is Forbidden at once: the health checks
// say so, naming the field and the kind, and the other namespace's Machine is marked.
func TestHealthChecksNamingAKindCAPRMayNotReadDoNotStopOthers(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	hostile := newFixture(t, g, 0)
	for i := range hostileHealthChecks {
		mhc := capienv.NewHealthCheck(hostile.ns, hostile.cluster.Name, "nothing", 1)
		mhc.Name = fmt.Sprintf("hostile-%d", i)
		if i%2 == 0 {
			mhc.Spec.Remediation.TemplateRef = ptr.To(forbiddenTemplate)
		} else {
			mhc.Spec.Remediation.Escalation = []caprv1.EscalationStep{{TemplateRef: forbiddenStep, TimeoutSeconds: 60}}
		}
		g.Expect(k8sClient.Create(ctx, mhc)).To(Succeed())
	}
	// Each has been reconciled once (the finalizer is the first round's only write); the next round
	// reads the templates.
	g.Eventually(func(g Gomega) {
		for i := range hostileHealthChecks {
			g.Expect(controllerutil.ContainsFinalizer(hostileHealthCheck(g, hostile.ns, i), machinehealthcheck.Finalizer)).To(BeTrue())
		}
	}, eventually, poll).Should(Succeed())

	victim := newFixture(t, g, 0)
	victim.machine(g, "m")
	victim.healthCheck(g, func(mhc *caprv1.MachineHealthCheck) {
		for i := range mhc.Spec.Checks.UnhealthyNodeConditions {
			mhc.Spec.Checks.UnhealthyNodeConditions[i].TimeoutSeconds = ptr.To[int32](1)
		}
	})
	g.Expect(capienv.SetNodeReady(ctx, k8sClient, victim.ns+"-m", corev1.ConditionFalse)).To(Succeed())
	g.Eventually(func(g Gomega) {
		rec, _ := markOf(g, victim.ns, "m")
		g.Expect(rec).NotTo(BeNil(), "the Machine whose Node is not Ready is marked")
		g.Expect(rec.Reason).To(Equal(caprv1.MachineCAPRHealthCheckUnhealthyNodeReason))
	}, time.Minute, poll).Should(Succeed())

	g.Eventually(func(g Gomega) {
		for i := range hostileHealthChecks {
			field, ref := "spec.remediation.templateRef", forbiddenTemplate
			if i%2 == 1 {
				field, ref = "spec.remediation.escalation[0].templateRef", forbiddenStep
			}
			c := conditions.Get(hostileHealthCheck(g, hostile.ns, i), caprv1.MachineHealthCheckRemediationTemplatesValidCondition)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Reason).To(Equal(caprv1.MachineHealthCheckRemediationTemplateInvalidReason))
			g.Expect(c.Message).To(ContainSubstring("%s: %s %s/%s cannot be read", field, ref.Kind, hostile.ns, ref.Name))
			g.Expect(c.Message).To(ContainSubstring("forbidden"))
		}
		// And a Warning event about each.
		events := &eventsv1.EventList{}
		g.Expect(k8sClient.List(ctx, events, client.InNamespace(hostile.ns))).To(Succeed())
		warned := map[string]bool{}
		for _, e := range events.Items {
			if e.Reason == caprv1.MachineHealthCheckRemediationTemplateInvalidReason && e.Type == corev1.EventTypeWarning && strings.Contains(e.Note, "forbidden") {
				warned[e.Regarding.Name] = true
			}
		}
		g.Expect(warned).To(HaveLen(hostileHealthChecks))
	}, eventually, poll).Should(Succeed())
}

func hostileHealthCheck(g Gomega, ns string, i int) *caprv1.MachineHealthCheck {
	mhc := &caprv1.MachineHealthCheck{}
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: fmt.Sprintf("hostile-%d", i)}, mhc)).To(Succeed())
	return mhc
}

// TestAControlPlaneKindCAPRMayNotReadIsReported: the Cluster's controlPlaneRef names a kind CAPR has
// no role for (what a control-plane provider without an aggregated role for CAPR looks like). Read
// through the cache, the round hung on it for good, with the worker. Read live, the round goes on:
// remediation of the control-plane Machine is refused and the health check says why, naming the kind,
// while the unhealthy worker Machine is marked and its remediation requested.
func TestAControlPlaneKindCAPRMayNotReadIsReported(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ns, err := capienv.CreateNamespace(ctx, k8sClient, "mhc")
	g.Expect(err).NotTo(HaveOccurred())
	f := &fixture{ns: ns, cluster: capienv.NewCluster(ns, "c1", clusterv1.ContractVersionedObjectReference{
		APIGroup: "bootstrap.cluster.x-k8s.io", Kind: "KubeadmConfig", Name: "cp",
	})}
	g.Expect(k8sClient.Create(ctx, f.cluster)).To(Succeed())
	g.Expect(capienv.SetClusterReady(ctx, k8sClient, f.cluster, capienv.ControlPlaneInitialized)).To(Succeed())
	g.Expect(capienv.CreateKubeconfigSecret(ctx, k8sClient, testEnv.Config, f.cluster)).To(Succeed())
	long := time.Now().Add(-time.Hour)
	f.machine(g, "cp-0", controlPlane(), nodeReady(corev1.ConditionFalse, long))
	f.machine(g, "w", nodeReady(corev1.ConditionFalse, long))
	f.healthCheck(g, nil)

	g.Eventually(func(g Gomega) {
		mhc := getHealthCheck(g, f.ns)
		g.Expect(mhc.Status.UnhealthyMachines).To(ConsistOf("cp-0", "w"))
		c := conditions.Get(mhc, caprv1.MachineHealthCheckRemediationAllowedCondition)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
		g.Expect(c.Reason).To(Equal(caprv1.MachineHealthCheckControlPlaneQuorumLimitReason))
		g.Expect(c.Message).To(ContainSubstring("Remediation of control-plane Machines is not allowed"))
		g.Expect(c.Message).To(ContainSubstring("KubeadmConfig %s/cp", f.ns))
		g.Expect(c.Message).To(ContainSubstring("forbidden"))
		g.Expect(remediationExists(f.ns, "w")).To(BeTrue(), "the worker Machine's remediation is requested")
	}, eventually, poll).Should(Succeed())
	g.Consistently(func() bool { return remediationExists(f.ns, "cp-0") }, time.Second, poll).Should(BeFalse())
}

// TestAHealthCheckWhoseRequestsCannotBeListedStillMarksAndCanBeDeleted: a templateRef naming a kind
// CAPR may not list makes the requests of the health check unlistable. The round listed them before it
// wrote any mark and gave up, so the health check never marked its unhealthy Machine, and its deletion
// listed them before releasing the finalizer, so it could never be deleted. The marks are the health
// check's answer whatever becomes of the requests: the Machine is marked, the health check says its
// requests cannot be listed (naming the kind), and it can be deleted, its mark cleared.
func TestAHealthCheckWhoseRequestsCannotBeListedStillMarksAndCanBeDeleted(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	f := newFixture(t, g, 0)
	f.machine(g, "m", nodeReady(corev1.ConditionFalse, time.Now().Add(-time.Hour)))
	mhc := f.healthCheck(g, func(mhc *caprv1.MachineHealthCheck) { mhc.Spec.Remediation.TemplateRef = ptr.To(forbiddenTemplate) })

	g.Eventually(func(g Gomega) {
		rec, _ := markOf(g, f.ns, "m")
		g.Expect(rec).NotTo(BeNil(), "the unhealthy Machine is marked")
		c := conditions.Get(getHealthCheck(g, f.ns), caprv1.MachineHealthCheckRemediationTemplatesValidCondition)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
		g.Expect(c.Message).To(ContainSubstring("spec.remediation.templateRef: KubeadmConfig requests in %s cannot be listed", f.ns))
	}, eventually, poll).Should(Succeed())

	g.Expect(k8sClient.Delete(ctx, mhc)).To(Succeed())
	g.Eventually(func(g Gomega) {
		err := k8sClient.Get(ctx, client.ObjectKeyFromObject(mhc), &caprv1.MachineHealthCheck{})
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the health check is deleted")
		rec, cond := markOf(g, f.ns, "m")
		g.Expect(rec).To(BeNil())
		g.Expect(cond).To(BeNil())
	}, eventually, poll).Should(Succeed())
	g.Expect(notesOf(g, f.ns, caprv1.EventRemediationRequestsNotWithdrawn)).To(ContainElement(ContainSubstring("KubeadmConfig")))
}
