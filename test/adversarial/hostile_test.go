package adversarial_test

import (
	"encoding/json"
	"fmt"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/etcdutil"
	"github.com/capr-io/capr/remediation/fencing"
	"github.com/capr-io/capr/test/builder"
	capienv "github.com/capr-io/capr/test/envtest"
)

// What the hostile tenant names in its health checks: kinds whose CRDs envtest installs but for
// which CAPR ships no role, a group with a typo, and the name of a template that only the honest
// tenant has.
var (
	forbiddenTemplate  = caprv1.TemplateReference{APIVersion: "bootstrap.cluster.x-k8s.io/v1beta2", Kind: "KubeadmConfigTemplate", Name: "t"}
	forbiddenStep      = caprv1.TemplateReference{APIVersion: "controlplane.cluster.x-k8s.io/v1beta2", Kind: "KubeadmControlPlaneTemplate", Name: "t"}
	typoTemplate       = caprv1.TemplateReference{APIVersion: "remediaton.cluster.x-k8s.io/v1alpha1", Kind: "MachineRemediationTemplate", Name: "t"}
	honestTemplate     = caprv1.TemplateReference{APIVersion: caprv1.GroupVersion.String(), Kind: "MachineRemediationTemplate", Name: "honest-template"}
	powerFenceTemplate = caprv1.TemplateReference{APIVersion: "fencing.example.com/v1alpha1", Kind: "PowerFenceTemplate", Name: "bmc"}
)

// forbiddenHealthChecks is more than the manager's health-check workers (10, the default): each one
// that took a worker for good would leave the others none.
const forbiddenHealthChecks = 11

// Names of the hostile tenant's objects.
const (
	// Worker Machines (MachineSet "ms", Cluster "c1").
	forbiddenTarget = "f"         // not Ready; selected by the health checks naming kinds CAPR may not read
	manualTarget    = "manual"    // Ready; a hand-written request asks for it with fencing Disabled
	forgedNFTarget  = "forged-nf" // not Ready; a NetworkFence forged under its fence's name says fenced
	poweredTarget   = "powered"   // Ready; garbage in its unhealthy annotation; a forged PowerFence says fenced
	// The control-plane Cluster, whose etcd-endpoints annotation points elsewhere.
	cpCluster = "cp1"
	// A request for a Machine that does not exist.
	ghostRequest = "ghost"
)

// hostile is the hostile tenant: everything it writes is made to stall, steer or mislead CAPR.
type hostile struct {
	*tenant
	// forged are the UIDs of the forged fence objects, by Machine, to tell them from CAPR's.
	forged map[string]types.UID
	// unparsableSelector is the error of creating a health check whose selector does not parse.
	unparsableSelector error
	// machineEscalation is the error of creating a health check whose escalation step's object would
	// be the Machine itself (a MachineTemplate of CAPI's core group).
	machineEscalation error
}

// newHostileTenant writes the hostile tenant's objects. The forged fences come before the health
// checks that cover their Machines, so that CAPR's first look at each fence finds the forgery.
func newHostileTenant(t *testing.T, g *WithT) *hostile {
	t.Helper()
	h := &hostile{tenant: newTenant(t, g, "hostile", 66), forged: map[string]types.UID{}}
	h.machine(g, forbiddenTarget, machineSpec{pool: "forbidden", ready: corev1.ConditionFalse})
	h.machine(g, manualTarget, machineSpec{pool: "guarded", ready: corev1.ConditionTrue})
	h.machine(g, forgedNFTarget, machineSpec{pool: "guarded", ready: corev1.ConditionFalse})
	// Any text in the annotation is a request with that text as its message (UnhealthyAnnotation).
	h.machine(g, poweredTarget, machineSpec{pool: "power", ready: corev1.ConditionTrue,
		annotations: map[string]string{caprv1.UnhealthyAnnotation: `{"reason": not json`}})
	h.createPowerFenceTemplate(g)
	h.forgeNetworkFence(g, forgedNFTarget)
	h.forgePowerFence(g, poweredTarget)

	// Health checks that name kinds CAPR may not read (its templateRef or an escalation step), a
	// group with a typo, and the honest tenant's template (templates are read in the health check's
	// own namespace): all over the one Machine, which they also make overlap, all requiring a fence.
	for i := range forbiddenHealthChecks {
		h.healthCheck(g, fmt.Sprintf("forbidden-%d", i), "forbidden", func(mhc *caprv1.MachineHealthCheck) {
			mhc.Spec.Remediation.Fencing = h.requiredNetworkFence()
			if i%2 == 0 {
				mhc.Spec.Remediation.TemplateRef = ptr.To(forbiddenTemplate)
			} else {
				mhc.Spec.Remediation.Escalation = []caprv1.EscalationStep{{TemplateRef: forbiddenStep, TimeoutSeconds: 60}}
			}
		})
	}
	h.healthCheck(g, "typo", "forbidden", func(mhc *caprv1.MachineHealthCheck) { mhc.Spec.Remediation.TemplateRef = ptr.To(typoTemplate) })
	h.healthCheck(g, "borrowed", "forbidden", func(mhc *caprv1.MachineHealthCheck) { mhc.Spec.Remediation.TemplateRef = ptr.To(honestTemplate) })
	// A selector that does not parse.
	unparsable := builder.HealthCheck(h.ns, "unparsable", h.cluster.Name).Build()
	unparsable.Spec.Selector = caprv1.MachineSelector{MatchLabels: map[string]caprv1.LabelValue{"bad key!": "v"}}
	h.unparsableSelector = k8sClient.Create(ctx, unparsable)
	// An escalation step whose object, named after the Machine, would be the Machine: at the step's
	// end CAPR would delete the victim by name.
	machineStep := builder.HealthCheck(h.ns, "machine-step", h.cluster.Name).Build()
	machineStep.Spec.Remediation.Escalation = []caprv1.EscalationStep{{TimeoutSeconds: 60,
		TemplateRef: caprv1.TemplateReference{APIVersion: clusterv1.GroupVersion.String(), Kind: "MachineTemplate", Name: "t"}}}
	h.machineEscalation = k8sClient.Create(ctx, machineStep)

	// "guard" requires a NetworkFence of what it covers; "disk" overlaps it (DiskPressure only).
	h.healthCheck(g, "guard", "guarded", func(mhc *caprv1.MachineHealthCheck) { mhc.Spec.Remediation.Fencing = h.requiredNetworkFence() })
	h.healthCheck(g, "disk", "guarded", func(mhc *caprv1.MachineHealthCheck) {
		mhc.Spec.Checks.UnhealthyNodeConditions = []caprv1.UnhealthyNodeCondition{
			{Type: corev1.NodeDiskPressure, Status: corev1.ConditionTrue, TimeoutSeconds: ptr.To[int32](1)},
		}
	})
	// "power-guard" requires a PowerFence of what it covers.
	h.healthCheck(g, "power-guard", "power", func(mhc *caprv1.MachineHealthCheck) {
		mhc.Spec.Remediation.Fencing = &caprv1.FencingSpec{Policy: caprv1.FencingRequired, Backends: []caprv1.FencingBackend{
			{Type: caprv1.FencingBackendExternal, TemplateRef: ptr.To(powerFenceTemplate)},
		}}
	})

	// Hand-written requests: one that asks for no fencing of a Machine "guard" covers and claims to
	// come from a person, and one for a Machine that does not exist.
	g.Expect(k8sClient.Create(ctx, builder.MachineRemediation(h.ns, h.cluster.Name, manualTarget).
		Source(caprv1.MachineRemediationSourceManual).Fencing(&caprv1.FencingSpec{Policy: caprv1.FencingDisabled}).Build())).To(Succeed())
	g.Expect(k8sClient.Create(ctx, builder.MachineRemediation(h.ns, h.cluster.Name, ghostRequest).
		Source(caprv1.MachineRemediationSourceManual).Build())).To(Succeed())

	h.controlPlaneCluster(g)
	return h
}

// controlPlaneCluster writes a Cluster whose etcd-endpoints annotation names etcdElsewhere, with its
// KubeadmControlPlane (a lock annotation of garbage on it), three control-plane Machines (garbage in
// their remediation-for annotation), an etcd CA
// Secret (so that CAPR gets as far as deciding where to dial), a health check reading etcd that
// requires a NetworkFence, a hand-written request with fencing Disabled, and one whose status says
// Running without the control-plane record CAPR writes when it starts (defect 8 panicked on it).
func (h *hostile) controlPlaneCluster(g *WithT) {
	kcp := builder.KubeadmControlPlane(h.ns, cpCluster, 3)
	kcp.SetAnnotations(map[string]string{caprv1.ControlPlaneLockAnnotation: "not/a{lock"})
	g.Expect(k8sClient.Create(ctx, kcp)).To(Succeed())
	endpoints, err := json.Marshal(map[string]string{h.node(cpCluster + "-0"): etcdElsewhere.addr()})
	g.Expect(err).NotTo(HaveOccurred())
	cluster := h.newCluster(g, cpCluster, clusterv1.ContractVersionedObjectReference{
		APIGroup: "controlplane.cluster.x-k8s.io", Kind: "KubeadmControlPlane", Name: cpCluster,
	}, map[string]string{etcdutil.EndpointsAnnotation: string(endpoints)})
	etcdCA(g, cluster)
	for i := range 3 {
		// Garbage where CAPR records which Machine a replacement replaced (its retry limits).
		annotations := map[string]string{caprv1.RemediationRecordAnnotation: fmt.Sprintf(`{"machine": %d`, i)}
		h.machine(g, fmt.Sprintf("%s-%d", cpCluster, i), machineSpec{cluster: cpCluster, pool: "cp", ready: corev1.ConditionTrue, controlPlane: true, annotations: annotations})
	}
	mhc := builder.HealthCheck(h.ns, "etcd-watch", cpCluster).NodeNotReadyFor(1).Build()
	mhc.Spec.Selector = caprv1.MachineSelector{MatchLabels: map[string]caprv1.LabelValue{poolLabel: "cp"}}
	mhc.Spec.Checks.EtcdMember = &caprv1.EtcdMemberCheck{TimeoutSeconds: ptr.To[int32](60)}
	mhc.Spec.Remediation.Fencing = h.requiredNetworkFence()
	g.Expect(k8sClient.Create(ctx, mhc)).To(Succeed())

	g.Expect(k8sClient.Create(ctx, builder.MachineRemediation(h.ns, cpCluster, cpCluster+"-1").
		Source(caprv1.MachineRemediationSourceManual).Fencing(&caprv1.FencingSpec{Policy: caprv1.FencingDisabled}).Build())).To(Succeed())
	running := builder.MachineRemediation(h.ns, cpCluster, cpCluster+"-2").Source(caprv1.MachineRemediationSourceManual).Build()
	g.Expect(k8sClient.Create(ctx, running)).To(Succeed())
	running.Status.Phase = caprv1.MachineRemediationPhaseRunning
	g.Expect(k8sClient.Status().Update(ctx, running)).To(Succeed())
}

// createPowerFenceTemplate writes the template of the tenant's PowerFences.
func (h *hostile) createPowerFenceTemplate(g *WithT) {
	tmpl := &unstructured.Unstructured{Object: map[string]any{
		"spec": map[string]any{"template": map[string]any{"spec": map[string]any{"action": "power-off", "bmcSecret": "bmc"}}},
	}}
	tmpl.SetAPIVersion(powerFenceTemplate.APIVersion)
	tmpl.SetKind(powerFenceTemplate.Kind)
	tmpl.SetNamespace(h.ns)
	tmpl.SetName(powerFenceTemplate.Name)
	g.Expect(k8sClient.Create(ctx, tmpl)).To(Succeed())
}

// forgeNetworkFence writes, under the name CAPR gives the fence of machine's Node, a NetworkFence
// that fences the Node's address and that csi-addons reports done, but that CAPR did not make.
func (h *hostile) forgeNetworkFence(g *WithT, machine string) {
	node := &corev1.Node{}
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Name: h.node(machine)}, node)).To(Succeed())
	cidr := node.Status.Addresses[0].Address + "/32"
	nf := &unstructured.Unstructured{}
	nf.SetGroupVersionKind(fencing.NetworkFenceGVK)
	nf.SetName(fencing.NetworkFenceName(client.ObjectKeyFromObject(h.cluster), h.node(machine), h.class))
	nf.SetAnnotations(map[string]string{fencing.NetworkFenceNodeAnnotation: h.node(machine)})
	nf.Object["spec"] = map[string]any{"networkFenceClassName": h.class, "fenceState": "Fenced", "cidrs": []any{cidr}}
	g.Expect(k8sClient.Create(ctx, nf)).To(Succeed())
	g.Expect(capienv.ReportNetworkFence(ctx, k8sClient, nf, capienv.CSIAddonsFenced)).To(Succeed())
	h.forged[machine] = nf.GetUID()
}

// forgePowerFence writes the PowerFence named after machine, with the template's spec and Fenced=True,
// as the power-fencing provider would report a fenced node, but not made by CAPR.
func (h *hostile) forgePowerFence(g *WithT, machine string) {
	pf := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"action": "power-off", "bmcSecret": "bmc"}}}
	pf.SetAPIVersion(powerFenceTemplate.APIVersion)
	pf.SetKind("PowerFence")
	pf.SetNamespace(h.ns)
	pf.SetName(machine)
	pf.SetAnnotations(map[string]string{fencing.ExternalFenceNodeAnnotation: h.node(machine)})
	g.Expect(k8sClient.Create(ctx, pf)).To(Succeed())
	g.Expect(unstructured.SetNestedSlice(pf.Object, []any{map[string]any{
		"type": fencing.ExternalFencedCondition, "status": "True", "reason": "PoweredOff", "message": "chassis power is off",
		"lastTransitionTime": metav1.Now().UTC().Format("2006-01-02T15:04:05Z"),
	}}, "status", "conditions")).To(Succeed())
	g.Expect(k8sClient.Status().Update(ctx, pf)).To(Succeed())
	h.forged[machine] = pf.GetUID()
}
