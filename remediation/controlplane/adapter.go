package controlplane

import (
	"fmt"
	"time"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/version"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/etcdutil"
)

// Adapter is what the remediator needs to know about a control-plane provider. Replicas are changed
// through spec.replicas and the scale-down victim is chosen with cluster.x-k8s.io/delete-machine,
// both part of CAPI's control-plane contract; providers differ in whether they join members as
// learners and in when they refuse to scale up.
type Adapter interface {
	// Name is used in messages.
	Name() string
	// AddsLearners is true when new etcd members join as learners and are promoted once caught up.
	AddsLearners() bool
	// ScaleUpRefusal says why the provider would refuse to create a replacement for victim ("" when
	// it would create one). afterRemoval asks about the moment after the victim's etcd member is gone.
	ScaleUpRefusal(view ProviderView, afterRemoval bool) string
	// ScaleDownRefusal says why the provider would not remove a Machine other than the victim now
	// ("" when it would): the surge orders end with a scale-down.
	ScaleDownRefusal(view ProviderView) string
	// SurgeRefusal says why CAPR does not raise the replicas for this victim at all, although the
	// provider would scale up ("" when it may): the replicas are someone else's to change (the
	// Cluster topology's) and the surge is not worth it or not allowed. No surge order is taken
	// then, and a victim whose member is removed first is deleted first (DeleteFirst).
	SurgeRefusal(view ProviderView) string
	// Explain returns the provider's own words on what it is doing or waiting for (e.g. KCP's
	// ScalingUp and ScalingDown condition messages), appended to CAPR's messages while a step waits on
	// the provider; "" when it has none.
	Explain(cp *unstructured.Unstructured) string
	// Surge is how a remediation that adds its replacement before the victim goes asks the provider
	// for it: how far spec.replicas is raised, how many Machines the provider then creates, and why.
	Surge(cp *unstructured.Unstructured) SurgePlan
	// Busy says why the provider is not quiet enough for a remediation to start (scaling, rolling
	// out, remediating on its own, replicas owned by someone else); "" when it is.
	Busy(view ProviderView) string
	// BeforeScaleUp may change the control-plane object before the provider creates a replacement
	// (e.g. KCP's remediation-in-progress annotation, stamped with at). It is called again before
	// each further Machine of a surge, must be idempotent, and must fail rather than overwrite what
	// the provider set for another Machine.
	BeforeScaleUp(cp *unstructured.Unstructured, victim string, at time.Time, retryCount int32) error
	// ClearScaleUp removes what BeforeScaleUp set for victim, when it is still there (an abort or a
	// failure). It never removes what the provider or another remediation set for another Machine.
	// It reports whether it changed cp.
	ClearScaleUp(cp *unstructured.Unstructured, victim string) bool
	// MemberRemovedOnDelete says how the provider's own deletion of a control-plane Machine removes
	// its etcd member at the pre-terminate point, as late as the Machine's deletion allows ("" when it
	// does not): a victim whose member votes may then be deleted before its member is removed
	// (caprv1.ControlPlaneOrderDeleteBeforeMemberRemoval), the member voting meanwhile.
	MemberRemovedOnDelete(cp *unstructured.Unstructured) string
	// ServesAPI says what a control-plane Machine lacks to serve the API ("" when it serves). With
	// external etcd this is what a replacement must reach before the victim goes, and what must
	// remain while the victim is gone or rebooting.
	ServesAPI(m *clusterv1.Machine) string
}

// SurgePlan is how a provider is asked for the replacement while the victim still exists.
type SurgePlan struct {
	// Replicas is how far spec.replicas is raised above the desired count: 1, or 2 where the provider
	// admits only odd counts.
	Replicas int32
	// Machines is how many Machines the provider creates for that: Replicas, or 1 where the replicas
	// can return to the desired count as soon as the first replacement exists because the provider
	// creates one Machine at a time and the next only once the previous one is healthy (KCP). It is
	// the cost of a surge order that ChooseOrder weighs (OrderInput.SurgeMachines).
	Machines int32
	Reason   string
	// WaitsForDeletion says why the provider creates no replacement while a control-plane Machine is
	// deleting ("" when it does): a replacement asked for before the victim is deleted is then
	// provisioned after its deletion all the same (OrderInput.SurgeWaitsForDeletion).
	WaitsForDeletion string
}

// ProviderView is what a provider's preflight checks look at.
type ProviderView struct {
	ControlPlane *unstructured.Unstructured
	// Machines are the control-plane Machines, victim included.
	Machines []*clusterv1.Machine
	Victim   *clusterv1.Machine
	Etcd     *etcdutil.State
}

// AdapterFor returns the adapter for a control-plane object's kind.
func AdapterFor(cp *unstructured.Unstructured) Adapter {
	learners, _ := learnerJoins(cp)
	if cp.GroupVersionKind().Group == controlplanev1.GroupVersion.Group && cp.GetKind() == "KubeadmControlPlane" {
		if _, declared := cp.GetAnnotations()[caprv1.EtcdLearnerJoinsAnnotation]; !declared {
			learners = kubeadmJoinsLearners(cp)
		}
		return KCP{learners: learners}
	}
	return Generic{learners: learners}
}

// kubeadmAlwaysLearners is the first kubeadm version read to join every stacked etcd member as a
// learner, with no feature gate to turn it off: cmd/kubeadm/app/phases/etcd/local.go
// (CreateStackedEtcdStaticPodManifestFile) calls AddMemberAsLearner unconditionally in v1.34.0 and
// v1.36.3. Earlier versions had the EtcdLearnerMode gate (beta, on by default, from v1.29), which a
// KubeadmControlPlane's featureGates could turn off; the release that made it unconditional was not
// read, so those versions count as voting joins unless the annotation says otherwise.
var kubeadmAlwaysLearners = version.MustParseSemantic("v1.34.0")

// kubeadmJoinsLearners reads a KubeadmControlPlane's spec.version: the version of the kubeadm that
// joins its replacement Machines.
func kubeadmJoinsLearners(kcp *unstructured.Unstructured) bool {
	v, _, _ := unstructured.NestedString(kcp.Object, "spec", "version")
	parsed, err := version.ParseGeneric(v)
	return err == nil && parsed.AtLeast(kubeadmAlwaysLearners)
}

// Generic follows CAPI's control-plane contract only. It assumes voting joins (the conservative
// choice when the provider's join mode is unknown) unless the control-plane object declares learner
// joins (caprv1.EtcdLearnerJoinsAnnotation), and no preflight refusals.
type Generic struct{ learners bool }

// Name implements Adapter.
func (Generic) Name() string { return "control-plane provider" }

// AddsLearners implements Adapter.
func (g Generic) AddsLearners() bool { return g.learners }

// ScaleUpRefusal implements Adapter.
func (Generic) ScaleUpRefusal(ProviderView, bool) string { return "" }

// Surge implements Adapter: CAPI's contract puts no constraint on replicas.
func (Generic) Surge(*unstructured.Unstructured) SurgePlan {
	return SurgePlan{Replicas: 1, Machines: 1, Reason: "one replacement: the control-plane provider accepts any replica count"}
}

// Busy implements Adapter.
func (Generic) Busy(ProviderView) string { return "" }

// ScaleDownRefusal implements Adapter.
func (Generic) ScaleDownRefusal(ProviderView) string { return "" }

// SurgeRefusal implements Adapter: the replicas are the remediation's to raise.
func (Generic) SurgeRefusal(ProviderView) string { return "" }

// Explain implements Adapter.
func (Generic) Explain(*unstructured.Unstructured) string { return "" }

// BeforeScaleUp implements Adapter.
func (Generic) BeforeScaleUp(*unstructured.Unstructured, string, time.Time, int32) error { return nil }

// ClearScaleUp implements Adapter.
func (Generic) ClearScaleUp(*unstructured.Unstructured, string) bool { return false }

// MemberRemovedOnDelete implements Adapter: CAPI's contract says nothing about etcd members, so CAPR
// removes the victim's member itself before the delete.
func (Generic) MemberRemovedOnDelete(*unstructured.Unstructured) string { return "" }

// ServesAPI implements Adapter with what CAPI's contract offers: a Node that is healthy (the
// Machine's NodeHealthy condition).
func (Generic) ServesAPI(m *clusterv1.Machine) string {
	if !m.Status.NodeRef.IsDefined() {
		return fmt.Sprintf("Machine %s has no Node yet", m.Name)
	}
	if !conditions.IsTrue(m, clusterv1.MachineNodeHealthyCondition) {
		return fmt.Sprintf("the Node of Machine %s is not healthy (condition %s)", m.Name, clusterv1.MachineNodeHealthyCondition)
	}
	return ""
}

// Replicas returns spec.replicas of a control-plane object.
func Replicas(cp *unstructured.Unstructured) (int32, error) {
	v, found, err := unstructured.NestedInt64(cp.Object, "spec", "replicas")
	if err != nil || !found {
		return 0, fmt.Errorf("%s %s has no spec.replicas", cp.GetKind(), cp.GetName())
	}
	return int32(v), nil
}

// SetReplicas sets spec.replicas (in memory).
func SetReplicas(cp *unstructured.Unstructured, n int32) error {
	return unstructured.SetNestedField(cp.Object, int64(n), "spec", "replicas")
}
