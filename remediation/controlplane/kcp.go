package controlplane

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	"sigs.k8s.io/cluster-api/util/annotations"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/etcdutil"
	"github.com/capr-io/capr/remediation"
)

// KCP knows KubeadmControlPlane's preflight rules (sigs.k8s.io/cluster-api
// controlplane/kubeadm/reconcilers/kubeadmcontrolplane: scale.go preflightChecks, checkHealthiness,
// checkHealthinessWhileRemediationInProgress and targetEtcdClusterHealthy in remediation.go): KCP
// refuses to scale up while any control-plane Machine is not fully healthy, unless its
// remediation-in-progress annotation is set; then it projects the etcd cluster with the new member
// counted as unhealthy and refuses if that projection would lose quorum or if a learner exists.
// CAPR asks before scaling, so it never raises replicas that KCP would silently not act on.
type KCP struct{ learners bool }

// Name implements Adapter.
func (KCP) Name() string { return "KubeadmControlPlane" }

// AddsLearners implements Adapter: what the KCP declares (caprv1.EtcdLearnerJoinsAnnotation), else
// whether its kubeadm always joins learners (kubeadmJoinsLearners); kubeadm's earlier learner mode
// depended on a feature gate, so the answer is no for those versions.
func (k KCP) AddsLearners() bool { return k.learners }

// kcpRemediationData is KCP's RemediationData JSON.
type kcpRemediationData struct {
	Machine    string      `json:"machine"`
	Timestamp  metav1.Time `json:"timestamp"`
	RetryCount int         `json:"retryCount"`
}

// kcpRemediationDataFromAnnotation and marshal are the one codec of KCP's remediation-in-progress
// value in CAPR; kcp_test checks it against KCP's own RemediationDataFromAnnotation (sigs.k8s.io/cluster-api
// controlplane/kubeadm/reconcilers/kubeadmcontrolplane/remediation.go).
func kcpRemediationDataFromAnnotation(value string) (*kcpRemediationData, error) {
	d := &kcpRemediationData{}
	if err := json.Unmarshal([]byte(value), d); err != nil {
		return nil, fmt.Errorf("unmarshalling value %q of annotation %s: %w", value, controlplanev1.RemediationInProgressAnnotation, err)
	}
	return d, nil
}

func (d *kcpRemediationData) marshal() (string, error) {
	b, err := json.Marshal(d)
	if err != nil {
		return "", fmt.Errorf("marshalling KCP remediation data of %s: %w", d.Machine, err)
	}
	return string(b), nil
}

// Surge implements Adapter. KCP's admission refuses an even spec.replicas when etcd is stacked
// (controlplane/kubeadm/webhooks/admission kubeadmcontrolplane.go and kubeadmcontrolplane_scale.go,
// on create, update and /scale), so N → N+1 is impossible there: the replicas are raised by two. But
// KCP creates one Machine per reconcile (kubeadmcontrolplane_controller.go reconcile → scale.go
// scaleUpControlPlane) and the next only when its scale-up preflight passes (preflight.go): the
// strict check needs every Machine, the new one included, to have a Node and every health condition
// True, and the relaxed one needs remediation-in-progress, which KCP deletes when it creates the
// Machine (helpers.go createMachine) and also when it is older than a Machine (remediation.go,
// reconcileUnhealthyMachines' stale cleanup). So while the first replacement has no Node yet, KCP
// creates no second one, and the replicas go back to N then (3 → 5 → 3 with one Machine created):
// KCP's scale-down, should it come before CAPR's Delete step, takes the victim, which is marked
// cluster.x-k8s.io/delete-machine before the replicas were raised (scale.go
// selectMachineForInPlaceUpdateOrScaleDown). External etcd accepts any count.
//
// KCP creates no Machine while one is deleting (preflight.go: HasDeletingMachine, before any health
// check), so a replacement asked for right before the victim's Delete is provisioned after the
// victim is gone all the same (SurgePlan.WaitsForDeletion). Measured on the full stack
// (BenchmarkKCPStepLatency, docs/performance.md): with RemoveMemberFirst KCP created the replacement
// only once the victim was gone, and the raised replicas made KCP reconcile while the victim's dead
// member was still listed; KCP's etcd client then tries the Nodes in the order of its
// EtcdMemberHealthy condition, True for a dead member that is listed and raises no alarm
// (pkg/workload_cluster_conditions.go getNodeNamesSortedByLastKnownEtcdHealth), and a call to the
// dead one waits out KCP's 15 s call timeout, during which the victim's kcp-cleanup hook waits too.
// A deleting Machine is left out of that read.
func (KCP) Surge(cp *unstructured.Unstructured) SurgePlan {
	const waits = "KCP creates no Machine while another is deleting"
	if kcpEtcdManaged(cp) {
		return SurgePlan{Replicas: 2, Machines: 1, WaitsForDeletion: waits, Reason: "replicas raised by two (KubeadmControlPlane with stacked etcd accepts only an odd number) " +
			"and back as soon as the first replacement exists: KCP creates one Machine at a time, so only one is created"}
	}
	return SurgePlan{Replicas: 1, Machines: 1, WaitsForDeletion: waits, Reason: "one replacement: KubeadmControlPlane with external etcd accepts any number of replicas"}
}

// MemberRemovedOnDelete implements Adapter: with stacked etcd KCP puts its kcp-cleanup pre-terminate
// hook on every control-plane Machine and, once a deleting Machine waits for its pre-terminate hooks
// and KCP's is the last, forwards etcd leadership and removes the Machine's member before it lets the
// deletion go on (kubeadmcontrolplane_controller.go reconcilePreTerminateHook, after checking that
// the etcd cluster without that member is healthy). That is where KCP's own remediation removes
// it, after the first stages of the deletion.
func (KCP) MemberRemovedOnDelete(cp *unstructured.Unstructured) string {
	if !kcpEtcdManaged(cp) {
		return ""
	}
	return kcpCleanupRemovesMember
}

// kcpCleanupRemovesMember is how KCP's deletion of a control-plane Machine removes its etcd member.
const kcpCleanupRemovesMember = "KCP's kcp-cleanup pre-terminate hook removes a deleting Machine's etcd member once the Machine waits for it"

// Busy implements Adapter: KCP must be quiet before CAPR changes its replicas, because KCP acts on
// spec.replicas only between its own operations (kubeadmcontrolplane_controller.go reconcile: rollouts
// first, then scaling, one Machine at a time). A KCP whose replicas the Cluster topology owns gets the
// Topology adapter around this one (topology.go): CAPR then changes the Cluster's field, never KCP's.
func (KCP) Busy(view ProviderView) string {
	cp := view.ControlPlane
	if value, ok := cp.GetAnnotations()[controlplanev1.RemediationInProgressAnnotation]; ok {
		if data, err := kcpRemediationDataFromAnnotation(value); err != nil || data.Machine != view.Victim.Name {
			return fmt.Sprintf("KubeadmControlPlane %s has %s set by another remediation (%s); waiting until KCP clears it", cp.GetName(), controlplanev1.RemediationInProgressAnnotation, value)
		}
	}
	spec, err := Replicas(cp)
	if err != nil {
		return err.Error()
	}
	if int(spec) != len(view.Machines) {
		return fmt.Sprintf("KubeadmControlPlane %s is scaling: spec.replicas is %d, it has %d Machines%s", cp.GetName(), spec, len(view.Machines), kcpConditionMessages(cp))
	}
	if status, found, _ := unstructured.NestedInt64(cp.Object, "status", "replicas"); !found || status != int64(spec) {
		return fmt.Sprintf("KubeadmControlPlane %s has not observed its %d replicas yet (status.replicas %d)%s", cp.GetName(), spec, status, kcpConditionMessages(cp))
	}
	if upToDate, found, _ := unstructured.NestedInt64(cp.Object, "status", "upToDateReplicas"); found && upToDate < int64(spec) {
		return fmt.Sprintf("KubeadmControlPlane %s is rolling out: %d of %d Machines are up to date%s", cp.GetName(), upToDate, spec, kcpConditionMessages(cp))
	}
	return ""
}

// SurgeRefusal implements Adapter: a hand-built KubeadmControlPlane's replicas are the remediation's
// to raise (its lock, KCP's remediation-in-progress).
func (KCP) SurgeRefusal(ProviderView) string { return "" }

// ScaleDownRefusal implements Adapter with KCP's scale-down preflight (kubeadmcontrolplane scale.go
// scaleDownControlPlane → preflightChecks with the Machine to delete excluded): every other Machine
// must pass the strict health check, and there is no relaxed path. With another unhealthy Machine a
// scale-down never happens, so a surge would never be undone.
//
// KCP judges from its Machine conditions, which lag etcd: KCP refreshes them only when it reconciles
// (its EtcdMemberHealthy condition saw a killed member tens of seconds after CAPR's etcd inspection
// did). A member that CAPR's inspection (view.Etcd) finds down or unreachable will fail KCP's
// preflight as soon as KCP looks again, so it refuses now too: the order is decided once, from the
// truth, and no replacement is created only to be thrown away.
func (KCP) ScaleDownRefusal(view ProviderView) string {
	managed := kcpEtcdManaged(view.ControlPlane)
	var unhealthy, lagging []string
	for _, m := range view.Machines {
		if m.Name == view.Victim.Name || !m.DeletionTimestamp.IsZero() {
			continue
		}
		if !kcpFullyHealthy([]*clusterv1.Machine{m}, managed) {
			unhealthy = append(unhealthy, m.Name)
			continue
		}
		if managed {
			if why := memberNotHealthy(view.Etcd, m); why != "" {
				lagging = append(lagging, fmt.Sprintf("%s (%s)", m.Name, why))
			}
		}
	}
	switch {
	case len(unhealthy) > 0:
		return fmt.Sprintf("KCP scales down only when every other control-plane Machine is healthy, and %s is not", strings.Join(unhealthy, ", "))
	case len(lagging) > 0:
		return fmt.Sprintf("KCP scales down only when every other control-plane Machine is healthy, and in etcd %s is not (KCP's conditions have not caught up yet)",
			strings.Join(lagging, ", "))
	}
	return ""
}

// memberNotHealthy says why m's etcd member, as CAPR's inspection found it, would fail KCP's etcd
// health check ("" when it would pass, or when etcd was not inspected). KCP reads each member
// through its Node's kubelet, as CAPR does, so a member CAPR cannot reach is one KCP cannot either.
func memberNotHealthy(state *etcdutil.State, m *clusterv1.Machine) string {
	if state == nil || !m.Status.NodeRef.IsDefined() {
		return ""
	}
	member := state.ByName(m.Status.NodeRef.Name)
	switch {
	case member == nil:
		return "no member"
	case member.IsLearner:
		return "its member is a learner"
	case !member.Reachable:
		return "its member cannot be reached"
	case !member.Healthy:
		return "its member is not healthy: " + member.Problem
	}
	return ""
}

// Explain implements Adapter with KCP's ScalingUp, ScalingDown and RollingOut messages (e.g. "Scaling
// up would cause etcd to lose quorum", the preflight that holds a replacement back).
func (KCP) Explain(cp *unstructured.Unstructured) string { return kcpConditionMessages(cp) }

// kcpConditionMessages returns KCP's own words on what it is doing (its ScalingUp, ScalingDown and
// RollingOut conditions when True), for CAPR's condition.
func kcpConditionMessages(cp *unstructured.Unstructured) string {
	out := ""
	for _, t := range []string{controlplanev1.KubeadmControlPlaneScalingUpCondition, controlplanev1.KubeadmControlPlaneScalingDownCondition, controlplanev1.KubeadmControlPlaneRollingOutCondition} {
		if c, err := conditions.UnstructuredGet(cp, t); err == nil && c != nil && c.Status == metav1.ConditionTrue && c.Message != "" {
			out += fmt.Sprintf("; KCP %s: %s", t, strings.ReplaceAll(c.Message, "\n", " "))
		}
	}
	return out
}

// BeforeScaleUp sets KCP's remediation-in-progress annotation, which makes KCP use its relaxed
// preflight for the replacement and copy the record into the new Machine's remediation-for (so KCP's
// own retry accounting stays consistent). KCP removes the annotation when it creates the Machine, and
// treats it as stale once a Machine newer than its timestamp exists (remediation.go
// reconcileUnhealthyMachines): before the second Machine of a surge, at must be no earlier than the
// first replacement's creation.
func (KCP) BeforeScaleUp(cp *unstructured.Unstructured, victim string, at time.Time, retryCount int32) error {
	if value, ok := cp.GetAnnotations()[controlplanev1.RemediationInProgressAnnotation]; ok {
		data, err := kcpRemediationDataFromAnnotation(value)
		if err != nil || data.Machine != victim {
			return fmt.Errorf("KubeadmControlPlane %s has %s=%s set for another remediation: not overwritten", cp.GetName(), controlplanev1.RemediationInProgressAnnotation, value)
		}
		if !data.Timestamp.Time.Before(at.UTC().Truncate(time.Second)) {
			return nil
		}
	}
	value, err := (&kcpRemediationData{Machine: victim, Timestamp: metav1.NewTime(at.UTC()), RetryCount: int(retryCount)}).marshal()
	if err != nil {
		return err
	}
	annotations.AddAnnotations(cp, map[string]string{controlplanev1.RemediationInProgressAnnotation: value})
	return nil
}

// ClearScaleUp removes KCP's remediation-in-progress annotation when it still names victim (KCP
// deletes it itself once it created the replacement).
func (KCP) ClearScaleUp(cp *unstructured.Unstructured, victim string) bool {
	value, ok := cp.GetAnnotations()[controlplanev1.RemediationInProgressAnnotation]
	if !ok {
		return false
	}
	if data, err := kcpRemediationDataFromAnnotation(value); err != nil || data.Machine != victim {
		return false
	}
	a := cp.GetAnnotations()
	delete(a, controlplanev1.RemediationInProgressAnnotation)
	cp.SetAnnotations(a)
	return true
}

// ScaleUpRefusal implements Adapter with KCP's scale-up preflight as it will run once CAPR has set
// remediation-in-progress.
func (KCP) ScaleUpRefusal(view ProviderView, afterRemoval bool) string {
	if len(view.Machines) == 0 {
		return ""
	}
	if !unstructuredConditionTrue(view.ControlPlane, controlplanev1.KubeadmControlPlaneCertificatesAvailableCondition) {
		return "KCP condition CertificatesAvailable is not True, KCP cannot join a new Machine"
	}
	for _, m := range view.Machines {
		if !m.DeletionTimestamp.IsZero() {
			return fmt.Sprintf("KCP waits for Machine %s to be deleted before scaling up", m.Name)
		}
	}
	managed := kcpEtcdManaged(view.ControlPlane)
	if kcpFullyHealthy(view.Machines, managed) {
		return ""
	}
	// Relaxed check (remediation in progress): at least one Machine keeps all control-plane
	// components, and the etcd projection with the new member unhealthy keeps quorum.
	componentsOK := false
	for _, m := range view.Machines {
		if m.Status.NodeRef.IsDefined() && allTrue(m, kcpComponentConditions(managed)...) {
			componentsOK = true
			break
		}
	}
	if !componentsOK {
		return "KCP sees no control-plane Machine with all Kubernetes control plane components healthy"
	}
	if !managed {
		return ""
	}
	if view.Etcd == nil || len(view.Etcd.Members) == 0 {
		return "KCP cannot check etcd before scaling up: the etcd member list is empty"
	}
	removed := ""
	if afterRemoval && view.Victim != nil {
		removed = view.Victim.Status.NodeRef.Name
	}
	if reason := kcpEtcdProjection(view, removed); reason != "" {
		return reason
	}
	return ""
}

// kcpEtcdProjection is KCP's targetEtcdClusterHealthy with addEtcdMember=true. A member counts as
// healthy when KCP's EtcdMemberHealthy condition on its Machine is True, or when CAPR's inspection
// just found it healthy (it answered through its Node, votes and raises no alarm): KCP's condition
// says no more than that (membership, learner, alarms; pkg/workload_cluster_conditions.go) and is
// refreshed only when KCP reconciles, so such a member passes KCP's check at KCP's next reconcile.
// Without that, a Machine that joined moments before (KCP's condition not True yet, or KCP's
// reconcile held up by a dead member's 15 s call timeout) made a remediation wait for KCP
// (compare-kcp "member dead": 5 s between the mark and the start).
func kcpEtcdProjection(view ProviderView, removed string) string {
	byNode := map[string]*clusterv1.Machine{}
	for _, m := range view.Machines {
		if m.Status.NodeRef.IsDefined() {
			byNode[m.Status.NodeRef.Name] = m
		}
	}
	var voting, learners, current int
	var unhealthy []string
	for _, member := range view.Etcd.Members {
		if member.Name == removed && removed != "" {
			continue
		}
		current++
		if member.Name == "" {
			learners++
			unhealthy = append(unhealthy, fmt.Sprintf("%x (starting)", member.ID))
			continue
		}
		if member.IsLearner {
			learners++
		} else {
			voting++
		}
		if m, ok := byNode[member.Name]; ok {
			answered := member.Reachable && member.Healthy && !member.IsLearner
			if !conditions.IsTrue(m, controlplanev1.KubeadmControlPlaneMachineEtcdMemberHealthyCondition) && !answered {
				unhealthy = append(unhealthy, member.Name)
			}
		} else if len(member.Alarms) > 0 {
			unhealthy = append(unhealthy, member.Name)
		}
	}
	if current > 1 {
		voting++
		unhealthy = append(unhealthy, "new member (worst case)")
	}
	quorum := voting/2 + 1
	if voting-len(unhealthy) < quorum {
		return fmt.Sprintf("KCP projects %d voting members with %d unhealthy (%s) after adding the replacement; quorum needs %d",
			voting, len(unhealthy), strings.Join(unhealthy, ", "), quorum)
	}
	if learners > 0 {
		return "KCP waits for etcd learners to be promoted before scaling up"
	}
	return ""
}

func kcpEtcdManaged(cp *unstructured.Unstructured) bool {
	return remediation.EtcdPlacementOf(cp) == caprv1.EtcdPlacementStacked
}

// ServesAPI implements Adapter with the conditions KCP sets from the static pods of a control-plane
// Machine (APIServerPodHealthy, ControllerManagerPodHealthy, SchedulerPodHealthy): what its relaxed
// scale-up preflight requires of at least one Machine.
func (KCP) ServesAPI(m *clusterv1.Machine) string {
	if !m.Status.NodeRef.IsDefined() {
		return fmt.Sprintf("Machine %s has no Node yet", m.Name)
	}
	for _, t := range kcpComponentConditions(false) {
		if !conditions.IsTrue(m, t) {
			return fmt.Sprintf("Machine %s is not %s yet", m.Name, t)
		}
	}
	return ""
}

func kcpComponentConditions(managed bool) []string {
	c := []string{controlplanev1.KubeadmControlPlaneMachineAPIServerPodHealthyCondition, controlplanev1.KubeadmControlPlaneMachineControllerManagerPodHealthyCondition, controlplanev1.KubeadmControlPlaneMachineSchedulerPodHealthyCondition}
	if managed {
		c = append(c, controlplanev1.KubeadmControlPlaneMachineEtcdPodHealthyCondition)
	}
	return c
}

// kcpFullyHealthy is KCP's checkHealthiness: every Machine has a Node and all health conditions True.
func kcpFullyHealthy(machines []*clusterv1.Machine, managed bool) bool {
	conds := kcpComponentConditions(managed)
	if managed {
		conds = append(conds, controlplanev1.KubeadmControlPlaneMachineEtcdMemberHealthyCondition)
	}
	for _, m := range machines {
		if !m.Status.NodeRef.IsDefined() || !allTrue(m, conds...) {
			return false
		}
	}
	return true
}

func allTrue(m *clusterv1.Machine, types ...string) bool {
	for _, t := range types {
		if !conditions.IsTrue(m, t) {
			return false
		}
	}
	return true
}

var _ Adapter = KCP{}
var _ Adapter = Generic{}

// unstructuredConditionTrue reports whether the object has condition t with status True.
func unstructuredConditionTrue(obj *unstructured.Unstructured, t string) bool {
	c, err := conditions.UnstructuredGet(obj, t)
	return err == nil && c != nil && c.Status == metav1.ConditionTrue
}
