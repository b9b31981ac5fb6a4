//go:build envtest

package v1alpha1_test

import (
	"fmt"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// These tests apply bad specs to a real kube-apiserver with CAPR's CRDs installed and check that each
// is refused at admission with a message that names the field.

func validHealthCheck(name string) *caprv1.MachineHealthCheck {
	return &caprv1.MachineHealthCheck{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: caprv1.MachineHealthCheckSpec{
			ClusterName: "c1",
			Selector:    caprv1.MachineSelector{MatchLabels: map[string]caprv1.LabelValue{"cluster.x-k8s.io/control-plane": ""}},
			Checks: caprv1.MachineHealthCheckChecks{
				NodeStartupTimeoutSeconds: ptr.To[int32](600),
				UnhealthyNodeConditions: []caprv1.UnhealthyNodeCondition{
					{Type: corev1.NodeReady, Status: corev1.ConditionUnknown, TimeoutSeconds: ptr.To[int32](300)},
				},
				EtcdMember: &caprv1.EtcdMemberCheck{TimeoutSeconds: ptr.To[int32](120)},
			},
			Remediation: caprv1.MachineHealthCheckRemediation{
				TriggerIf: &caprv1.MachineHealthCheckRemediationTriggerIf{UnhealthyLessThanOrEqualTo: ptr.To(intstr.FromString("40%"))},
				Fencing: &caprv1.FencingSpec{Policy: caprv1.FencingRequired, Backends: []caprv1.FencingBackend{
					{Type: caprv1.FencingBackendNetworkFence, NetworkFenceClassNames: []string{"ceph"}},
					{Type: caprv1.FencingBackendOutOfServiceTaint},
				}},
				ControlPlane: &caprv1.ControlPlaneRemediationSpec{MaxRetry: ptr.To[int32](3)},
			},
		},
	}
}

func TestValidHealthCheckIsAccepted(t *testing.T) {
	g := NewWithT(t)
	mhc := validHealthCheck("valid")
	g.Expect(testEnv.Client.Create(ctx, mhc)).To(Succeed())
	// Defaults are applied by the CRD.
	g.Expect(mhc.Spec.Remediation.ControlPlane.Order).To(Equal(caprv1.ControlPlaneOrderAuto))

	// Templates of a provider's groups (under cluster.x-k8s.io, but not CAPI's core group) are fine.
	metal3 := validHealthCheck("metal3")
	metal3.Spec.Remediation.Escalation = []caprv1.EscalationStep{{TimeoutSeconds: 300, TemplateRef: caprv1.TemplateReference{
		APIVersion: "infrastructure.cluster.x-k8s.io/v1beta1", Kind: "Metal3RemediationTemplate", Name: "reboot"}}}
	g.Expect(testEnv.Client.Create(ctx, metal3)).To(Succeed())

	range15 := validHealthCheck("range")
	range15.Spec.Remediation.TriggerIf = &caprv1.MachineHealthCheckRemediationTriggerIf{UnhealthyInRange: "[1-5]"}
	range15.Spec.Remediation.TriggerIf.UnhealthyLessThanOrEqualTo = ptr.To(intstr.FromInt32(2))
	g.Expect(testEnv.Client.Create(ctx, range15)).To(Succeed())
}

func TestBadHealthCheckIsRefusedNamingTheField(t *testing.T) {
	tests := []struct {
		name    string
		mutate  func(*caprv1.MachineHealthCheck)
		field   string
		message string
	}{
		{"clusterName required", func(m *caprv1.MachineHealthCheck) { m.Spec.ClusterName = "" },
			"spec.clusterName", "at least 1 chars long"},
		{"selector empty", func(m *caprv1.MachineHealthCheck) { m.Spec.Selector = caprv1.MachineSelector{} },
			"spec.selector", "selector must not be empty"},
		{"selector cluster-name label disagrees with clusterName", func(m *caprv1.MachineHealthCheck) {
			m.Spec.Selector.MatchLabels["cluster.x-k8s.io/cluster-name"] = "other"
		}, "spec.selector", "must equal clusterName"},
		{"selector label key invalid", func(m *caprv1.MachineHealthCheck) { m.Spec.Selector.MatchLabels["bad key!"] = "x" },
			"spec.selector.matchLabels", "keys must be valid label keys"},
		{"selector operator unknown", func(m *caprv1.MachineHealthCheck) {
			m.Spec.Selector.MatchExpressions = []caprv1.MachineSelectorRequirement{{Key: "a", Operator: "Equals", Values: []string{"b"}}}
		}, "spec.selector.matchExpressions[0].operator", "Unsupported value"},
		{"selector In without values", func(m *caprv1.MachineHealthCheck) {
			m.Spec.Selector.MatchExpressions = []caprv1.MachineSelectorRequirement{{Key: "a", Operator: metav1.LabelSelectorOpIn}}
		}, "spec.selector.matchExpressions[0]", "values must be non-empty for operators In and NotIn"},
		{"selector Exists with values", func(m *caprv1.MachineHealthCheck) {
			m.Spec.Selector.MatchExpressions = []caprv1.MachineSelectorRequirement{{Key: "a", Operator: metav1.LabelSelectorOpExists, Values: []string{"b"}}}
		}, "spec.selector.matchExpressions[0]", "empty for Exists and DoesNotExist"},
		{"nodeStartupTimeoutSeconds between 1 and 29", func(m *caprv1.MachineHealthCheck) { m.Spec.Checks.NodeStartupTimeoutSeconds = ptr.To[int32](10) },
			"spec.checks.nodeStartupTimeoutSeconds", "must be 0 (disabled) or at least 30"},
		{"nodeStartupTimeoutSeconds negative", func(m *caprv1.MachineHealthCheck) { m.Spec.Checks.NodeStartupTimeoutSeconds = ptr.To[int32](-1) },
			"spec.checks.nodeStartupTimeoutSeconds", "greater than or equal to 0"},
		{"node condition status invalid", func(m *caprv1.MachineHealthCheck) { m.Spec.Checks.UnhealthyNodeConditions[0].Status = "Maybe" },
			"spec.checks.unhealthyNodeConditions[0].status", "Unsupported value"},
		{"node condition timeout missing", func(m *caprv1.MachineHealthCheck) { m.Spec.Checks.UnhealthyNodeConditions[0].TimeoutSeconds = nil },
			"spec.checks.unhealthyNodeConditions[0].timeoutSeconds", "Required"},
		{"machine condition collides with CAPI's HealthCheckSucceeded", func(m *caprv1.MachineHealthCheck) {
			m.Spec.Checks.UnhealthyMachineConditions = []caprv1.UnhealthyMachineCondition{{Type: "HealthCheckSucceeded", Status: metav1.ConditionFalse, TimeoutSeconds: ptr.To[int32](1)}}
		}, "spec.checks.unhealthyMachineConditions[0].type", "must not be a condition written by remediation"},
		{"machine condition collides with CAPR's own condition", func(m *caprv1.MachineHealthCheck) {
			m.Spec.Checks.UnhealthyMachineConditions = []caprv1.UnhealthyMachineCondition{{Type: caprv1.MachineCAPRHealthCheckSucceededCondition, Status: metav1.ConditionFalse, TimeoutSeconds: ptr.To[int32](1)}}
		}, "spec.checks.unhealthyMachineConditions[0].type", "must not be a condition written by remediation"},
		{"machine condition OwnerRemediated", func(m *caprv1.MachineHealthCheck) {
			m.Spec.Checks.UnhealthyMachineConditions = []caprv1.UnhealthyMachineCondition{{Type: "OwnerRemediated", Status: metav1.ConditionFalse, TimeoutSeconds: ptr.To[int32](1)}}
		}, "spec.checks.unhealthyMachineConditions[0].type", "must not be a condition written by remediation"},
		{"step timeout above a day", func(m *caprv1.MachineHealthCheck) {
			m.Spec.Remediation.ControlPlane = &caprv1.ControlPlaneRemediationSpec{StepTimeoutSeconds: ptr.To[int32](86401)}
		}, "spec.remediation.controlPlane.stepTimeoutSeconds", "less than or equal to 86400"},
		{"replacement timeout above a day", func(m *caprv1.MachineHealthCheck) {
			m.Spec.Remediation.ControlPlane = &caprv1.ControlPlaneRemediationSpec{ReplacementTimeoutSeconds: ptr.To[int32](86401)}
		}, "spec.remediation.controlPlane.replacementTimeoutSeconds", "less than or equal to 86400"},
		{"fencing timeout above a day", func(m *caprv1.MachineHealthCheck) { m.Spec.Remediation.Fencing.TimeoutSeconds = ptr.To[int32](86401) },
			"spec.remediation.fencing.timeoutSeconds", "less than or equal to 86400"},
		{"etcd member timeout too short", func(m *caprv1.MachineHealthCheck) { m.Spec.Checks.EtcdMember.TimeoutSeconds = ptr.To[int32](3) },
			"spec.checks.etcdMember.timeoutSeconds", "greater than or equal to 10"},
		{"unhealthyInRange min above max", func(m *caprv1.MachineHealthCheck) {
			m.Spec.Remediation.TriggerIf = &caprv1.MachineHealthCheckRemediationTriggerIf{UnhealthyInRange: "[3-1]"}
		}, "spec.remediation.triggerIf.unhealthyInRange", "min must be less than or equal to max"},
		{"unhealthyInRange malformed", func(m *caprv1.MachineHealthCheck) {
			m.Spec.Remediation.TriggerIf = &caprv1.MachineHealthCheckRemediationTriggerIf{UnhealthyInRange: "[1 - 3]"}
		}, "spec.remediation.triggerIf.unhealthyInRange", "should match"},
		{"unhealthyLessThanOrEqualTo not a percentage", func(m *caprv1.MachineHealthCheck) {
			m.Spec.Remediation.TriggerIf.UnhealthyLessThanOrEqualTo = ptr.To(intstr.FromString("half"))
		}, "spec.remediation.triggerIf.unhealthyLessThanOrEqualTo", "must be a non-negative integer or a percentage"},
		{"unhealthyLessThanOrEqualTo negative", func(m *caprv1.MachineHealthCheck) {
			m.Spec.Remediation.TriggerIf.UnhealthyLessThanOrEqualTo = ptr.To(intstr.FromInt32(-1))
		}, "spec.remediation.triggerIf.unhealthyLessThanOrEqualTo", "must be a non-negative integer or a percentage"},
		{"triggerIf empty", func(m *caprv1.MachineHealthCheck) {
			m.Spec.Remediation.TriggerIf = &caprv1.MachineHealthCheckRemediationTriggerIf{}
		}, "spec.remediation.triggerIf", "should have at least 1 properties"},
		{"fencing policy unknown", func(m *caprv1.MachineHealthCheck) { m.Spec.Remediation.Fencing.Policy = "Sometimes" },
			"spec.remediation.fencing.policy", "Unsupported value"},
		{"fencing required without backends", func(m *caprv1.MachineHealthCheck) { m.Spec.Remediation.Fencing.Backends = nil },
			"spec.remediation.fencing", "backends must not be empty unless policy is Disabled"},
		{"out-of-service taint first", func(m *caprv1.MachineHealthCheck) {
			m.Spec.Remediation.Fencing.Backends = []caprv1.FencingBackend{{Type: caprv1.FencingBackendOutOfServiceTaint}}
		}, "spec.remediation.fencing", "OutOfServiceTaint must follow another backend"},
		{"NetworkFence without classes", func(m *caprv1.MachineHealthCheck) {
			m.Spec.Remediation.Fencing.Backends[0].NetworkFenceClassNames = nil
		}, "spec.remediation.fencing.backends[0]", "networkFenceClassNames is required when type is NetworkFence"},
		{"External without templateRef", func(m *caprv1.MachineHealthCheck) {
			m.Spec.Remediation.Fencing.Backends[0] = caprv1.FencingBackend{Type: caprv1.FencingBackendExternal}
		}, "spec.remediation.fencing.backends[0]", "templateRef is required when type is External"},
		{"templateRef not a template kind", func(m *caprv1.MachineHealthCheck) {
			m.Spec.Remediation.TemplateRef = &caprv1.TemplateReference{APIVersion: "remediation.cluster.x-k8s.io/v1alpha1", Kind: "MachineRemediation", Name: "t"}
		}, "spec.remediation.templateRef", "kind must be a template kind, ending in Template"},
		{"escalation templateRef not a template kind", func(m *caprv1.MachineHealthCheck) {
			m.Spec.Remediation.Escalation = []caprv1.EscalationStep{{TimeoutSeconds: 60,
				TemplateRef: caprv1.TemplateReference{APIVersion: "example.com/v1", Kind: "Reboot", Name: "r"}}}
		}, "spec.remediation.escalation[0].templateRef", "kind must be a template kind, ending in Template"},
		{"templateRef of CAPI's core group", func(m *caprv1.MachineHealthCheck) {
			m.Spec.Remediation.TemplateRef = &caprv1.TemplateReference{APIVersion: "cluster.x-k8s.io/v1beta2", Kind: "MachineTemplate", Name: "t"}
		}, "spec.remediation.templateRef.apiVersion", "never a remediation or fencing template"},
		{"escalation templateRef of CAPI's core group", func(m *caprv1.MachineHealthCheck) {
			m.Spec.Remediation.Escalation = []caprv1.EscalationStep{{TimeoutSeconds: 60,
				TemplateRef: caprv1.TemplateReference{APIVersion: "cluster.x-k8s.io/v1beta2", Kind: "MachineTemplate", Name: "t"}}}
		}, "spec.remediation.escalation[0].templateRef.apiVersion", "would be a Machine or another core object"},
		{"escalation templateRef of CAPR's group", func(m *caprv1.MachineHealthCheck) {
			m.Spec.Remediation.Escalation = []caprv1.EscalationStep{{TimeoutSeconds: 60,
				TemplateRef: caprv1.TemplateReference{APIVersion: "remediation.cluster.x-k8s.io/v1alpha1", Kind: "MachineRemediationTemplate", Name: "t"}}}
		}, "spec.remediation.escalation[0].templateRef.apiVersion", "would be the remediation request itself"},
		{"External fencing templateRef of CAPI's core group", func(m *caprv1.MachineHealthCheck) {
			m.Spec.Remediation.Fencing.Backends[0] = caprv1.FencingBackend{Type: caprv1.FencingBackendExternal,
				TemplateRef: &caprv1.TemplateReference{APIVersion: "cluster.x-k8s.io/v1beta2", Kind: "MachineTemplate", Name: "t"}}
		}, "spec.remediation.fencing.backends[0].templateRef.apiVersion", "never a remediation or fencing template"},
		{"stormCooldownSeconds without triggerIf", func(m *caprv1.MachineHealthCheck) {
			m.Spec.Remediation.TriggerIf = nil
			m.Spec.Remediation.StormCooldownSeconds = ptr.To[int32](60)
		}, "spec.remediation", "stormCooldownSeconds needs triggerIf"},
		{"stormCooldownSeconds zero", func(m *caprv1.MachineHealthCheck) { m.Spec.Remediation.StormCooldownSeconds = ptr.To[int32](0) },
			"spec.remediation.stormCooldownSeconds", "greater than or equal to 1"},
		{"control-plane maxRetry negative", func(m *caprv1.MachineHealthCheck) { m.Spec.Remediation.ControlPlane.MaxRetry = ptr.To[int32](-1) },
			"spec.remediation.controlPlane.maxRetry", "greater than or equal to 0"},
		{"control-plane order unknown", func(m *caprv1.MachineHealthCheck) { m.Spec.Remediation.ControlPlane.Order = "DeleteFirst" },
			"spec.remediation.controlPlane.order", "Unsupported value"},
		{"templateRef kind invalid", func(m *caprv1.MachineHealthCheck) {
			m.Spec.Remediation.TemplateRef = &caprv1.TemplateReference{APIVersion: "remediation.cluster.x-k8s.io/v1alpha1", Kind: "1bad", Name: "t"}
		}, "spec.remediation.templateRef.kind", "should match"},
		{"templateRef with escalation", func(m *caprv1.MachineHealthCheck) {
			ref := caprv1.TemplateReference{APIVersion: "remediation.cluster.x-k8s.io/v1alpha1", Kind: "MachineRemediationTemplate", Name: "t"}
			m.Spec.Remediation.TemplateRef = &ref
			m.Spec.Remediation.Escalation = []caprv1.EscalationStep{{TemplateRef: ref, TimeoutSeconds: 120}}
		}, "spec.remediation", "templateRef and escalation are mutually exclusive"},
		{"escalation timeout too short", func(m *caprv1.MachineHealthCheck) {
			m.Spec.Remediation.Escalation = []caprv1.EscalationStep{{TemplateRef: caprv1.TemplateReference{
				APIVersion: "infrastructure.cluster.x-k8s.io/v1beta1", Kind: "Metal3RemediationTemplate", Name: "reboot"}, TimeoutSeconds: 10}}
		}, "spec.remediation.escalation[0].timeoutSeconds", "greater than or equal to 60"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			mhc := validHealthCheck(fmt.Sprintf("bad-%d", i))
			tt.mutate(mhc)
			err := testEnv.Client.Create(ctx, mhc)
			g.Expect(err).To(HaveOccurred())
			g.Expect(apierrors.IsInvalid(err)).To(BeTrue(), "want Invalid, got %v", err)
			g.Expect(err.Error()).To(ContainSubstring(tt.field))
			g.Expect(err.Error()).To(ContainSubstring(tt.message))
		})
	}
}

func TestClusterNameIsImmutable(t *testing.T) {
	g := NewWithT(t)
	mhc := validHealthCheck("immutable")
	g.Expect(testEnv.Client.Create(ctx, mhc)).To(Succeed())
	base := mhc.DeepCopy()
	mhc.Spec.ClusterName = "c2"
	mhc.Spec.Selector.MatchLabels = map[string]caprv1.LabelValue{"cluster.x-k8s.io/control-plane": ""}
	err := testEnv.Client.Patch(ctx, mhc, client.MergeFrom(base))
	g.Expect(apierrors.IsInvalid(err)).To(BeTrue(), "want Invalid, got %v", err)
	g.Expect(err.Error()).To(ContainSubstring("spec.clusterName"))
	g.Expect(err.Error()).To(ContainSubstring("clusterName is immutable"))
}

func TestBadMachineRemediationIsRefused(t *testing.T) {
	for name, tt := range map[string]struct {
		spec           caprv1.MachineRemediationSpec
		field, message string
	}{
		"unknown source": {caprv1.MachineRemediationSpec{Source: "Robot"}, "spec.source", "Unsupported value"},
		"fencing without backends": {caprv1.MachineRemediationSpec{Fencing: &caprv1.FencingSpec{Policy: caprv1.FencingBestEffort}},
			"spec.fencing", "backends must not be empty"},
		"escalation to the Machine itself": {caprv1.MachineRemediationSpec{Escalation: []caprv1.EscalationStep{{TimeoutSeconds: 60,
			TemplateRef: caprv1.TemplateReference{APIVersion: "cluster.x-k8s.io/v1beta2", Kind: "MachineTemplate", Name: "t"}}}},
			"spec.escalation[0].templateRef.apiVersion", "would be a Machine"},
	} {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			mr := &caprv1.MachineRemediation{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "m"}, Spec: tt.spec}
			err := testEnv.Client.Create(ctx, mr)
			g.Expect(apierrors.IsInvalid(err)).To(BeTrue(), "want Invalid, got %v", err)
			g.Expect(err.Error()).To(ContainSubstring(tt.field))
			g.Expect(err.Error()).To(ContainSubstring(tt.message))
		})
	}
}

// TestMachineRemediationFencingIsImmutable: a fence is undone with the backends it was made with, so
// spec.fencing cannot be changed, added or removed once the request exists; the rest of the spec can.
func TestMachineRemediationFencingIsImmutable(t *testing.T) {
	g := NewWithT(t)
	nf := caprv1.FencingBackend{Type: caprv1.FencingBackendNetworkFence, NetworkFenceClassNames: []string{"a"}}
	mr := &caprv1.MachineRemediation{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "fencing-immutable"},
		Spec: caprv1.MachineRemediationSpec{Fencing: &caprv1.FencingSpec{Policy: caprv1.FencingRequired, Backends: []caprv1.FencingBackend{nf}}}}
	g.Expect(testEnv.Client.Create(ctx, mr)).To(Succeed())
	t.Cleanup(func() { _ = testEnv.Client.Delete(ctx, mr) })
	for name, mutate := range map[string]func(*caprv1.MachineRemediation){
		"policy":  func(m *caprv1.MachineRemediation) { m.Spec.Fencing.Policy = caprv1.FencingDisabled },
		"classes": func(m *caprv1.MachineRemediation) { m.Spec.Fencing.Backends[0].NetworkFenceClassNames = []string{"b"} },
		"removed": func(m *caprv1.MachineRemediation) { m.Spec.Fencing = nil },
	} {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			current := &caprv1.MachineRemediation{}
			g.Expect(testEnv.Client.Get(ctx, client.ObjectKeyFromObject(mr), current)).To(Succeed())
			changed := current.DeepCopy()
			mutate(changed)
			err := testEnv.Client.Update(ctx, changed)
			g.Expect(apierrors.IsInvalid(err)).To(BeTrue(), "want Invalid, got %v", err)
			g.Expect(err.Error()).To(ContainSubstring("spec.fencing is immutable"))
		})
	}
	current := &caprv1.MachineRemediation{}
	g.Expect(testEnv.Client.Get(ctx, client.ObjectKeyFromObject(mr), current)).To(Succeed())
	current.Spec.Message = "a note"
	g.Expect(testEnv.Client.Update(ctx, current)).To(Succeed())

	unfenced := &caprv1.MachineRemediation{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "fencing-added"}}
	g.Expect(testEnv.Client.Create(ctx, unfenced)).To(Succeed())
	t.Cleanup(func() { _ = testEnv.Client.Delete(ctx, unfenced) })
	unfenced.Spec.Fencing = &caprv1.FencingSpec{Policy: caprv1.FencingRequired, Backends: []caprv1.FencingBackend{nf}}
	err := testEnv.Client.Update(ctx, unfenced)
	g.Expect(apierrors.IsInvalid(err)).To(BeTrue(), "want Invalid, got %v", err)
}

// TestRunningMachineRemediationPlanIsFrozen: a running remediation's steps come from its spec
// (spec.escalation's steps first, the timeouts and policies of spec.controlPlane) and its early
// removal of waiting members trusts spec.reason, so while status.phase is Running those fields cannot
// change; before the start and after the end they can, and the rest of the request still can.
func TestRunningMachineRemediationPlanIsFrozen(t *testing.T) {
	g := NewWithT(t)
	step := caprv1.EscalationStep{TimeoutSeconds: 60, TemplateRef: caprv1.TemplateReference{
		APIVersion: "infrastructure.cluster.x-k8s.io/v1beta1", Kind: "Metal3RemediationTemplate", Name: "reboot"}}
	mr := &caprv1.MachineRemediation{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "plan-frozen"},
		Spec: caprv1.MachineRemediationSpec{Reason: caprv1.MachineCAPRHealthCheckUnhealthyNodeReason,
			ControlPlane: &caprv1.ControlPlaneRemediationSpec{StepTimeoutSeconds: ptr.To[int32](600)}}}
	g.Expect(testEnv.Client.Create(ctx, mr)).To(Succeed())
	t.Cleanup(func() { _ = testEnv.Client.Delete(ctx, mr) })
	current := func(g Gomega) *caprv1.MachineRemediation {
		got := &caprv1.MachineRemediation{}
		g.Expect(testEnv.Client.Get(ctx, client.ObjectKeyFromObject(mr), got)).To(Succeed())
		return got
	}
	setPhase := func(g Gomega, phase caprv1.RemediationPhase) {
		got := current(g)
		got.Status.Phase = phase
		g.Expect(testEnv.Client.Status().Update(ctx, got)).To(Succeed())
	}
	mutations := map[string]func(*caprv1.MachineRemediation){
		"spec.escalation": func(m *caprv1.MachineRemediation) { m.Spec.Escalation = append(m.Spec.Escalation, step) },
		"spec.controlPlane": func(m *caprv1.MachineRemediation) {
			m.Spec.ControlPlane.Order = caprv1.ControlPlaneOrderRemoveMemberFirst
		},
		"spec.reason": func(m *caprv1.MachineRemediation) {
			m.Spec.Reason = caprv1.MachineCAPRHealthCheckUnhealthyEtcdMemberReason
		},
	}

	// Pending: a person may still change them (spec.controlPlane.order: RemoveMemberFirst is the
	// consent a waiting request asks for).
	setPhase(g, caprv1.MachineRemediationPhasePending)
	changed := current(g)
	changed.Spec.ControlPlane.StepTimeoutSeconds = ptr.To[int32](300)
	g.Expect(testEnv.Client.Update(ctx, changed)).To(Succeed())

	setPhase(g, caprv1.MachineRemediationPhaseRunning)
	for field, mutate := range mutations {
		t.Run(field+" is frozen while Running", func(t *testing.T) {
			g := NewWithT(t)
			changed := current(g)
			mutate(changed)
			err := testEnv.Client.Update(ctx, changed)
			g.Expect(apierrors.IsInvalid(err)).To(BeTrue(), "want Invalid, got %v", err)
			g.Expect(err.Error()).To(ContainSubstring(field + ": Invalid value"))
			g.Expect(err.Error()).To(ContainSubstring(field + " cannot change while the remediation is Running"))
		})
	}
	t.Run("what the plan does not depend on, the metadata and the status still change", func(t *testing.T) {
		g := NewWithT(t)
		changed := current(g)
		changed.Spec.Message = "a note"
		changed.Labels = map[string]string{"note": "yes"}
		g.Expect(testEnv.Client.Update(ctx, changed)).To(Succeed())
		setPhase(g, caprv1.MachineRemediationPhaseFailed)
	})
	t.Run("after the run they change again", func(t *testing.T) {
		g := NewWithT(t)
		for _, mutate := range mutations {
			changed := current(g)
			mutate(changed)
			g.Expect(testEnv.Client.Update(ctx, changed)).To(Succeed())
		}
	})
}
