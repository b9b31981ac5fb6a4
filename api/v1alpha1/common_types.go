package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Annotations of a remediation request (written by a person or another tool) and of the
// control-plane sequence (written by remediation/controlplane). Each has one codec, in
// annotation_codecs.go.
const (
	// UnhealthyAnnotation on a Machine requests its remediation, like CAPI's
	// cluster.x-k8s.io/remediate-machine, with a reason: a health check over the Machine marks it at
	// once with reason ManualRequest and never removes the annotation. Its value is a JSON record
	// {reason, message, since, checker} (see MarkRecord), or any text, kept as the message. The
	// health checker's own mark is the MachineCAPRHealthCheckSucceededCondition at False, one write;
	// CAPR before that wrote this annotation too, with the health check's name as checker, and such an
	// annotation is removed when the Machine is healthy again.
	UnhealthyAnnotation = "remediation.cluster.x-k8s.io/unhealthy"

	// RemediationRecordAnnotation is set on the replacement Machine created by a control-plane remediation.
	// Its value is a JSON RemediationRecord; it carries the retry count across remediations exactly as
	// KCP's controlplane.cluster.x-k8s.io/remediation-for annotation does.
	RemediationRecordAnnotation = "remediation.cluster.x-k8s.io/remediation-for"

	// ControlPlaneLockAnnotation is set on a cluster's control-plane object while a control-plane
	// remediation holds it. Its value is the name of the MachineRemediation holding it. Writing it with
	// optimistic locking is what makes "one control-plane remediation per cluster at a time" hold even
	// with several controller replicas or after a crash.
	ControlPlaneLockAnnotation = "remediation.cluster.x-k8s.io/remediation-in-progress"

	// FenceBeforeDeleteHookAnnotation is a CAPI pre-drain deletion hook
	// (clusterv1.PreDrainDeleteHookAnnotationPrefix + "/capr-fence-before-delete") that a running
	// remediation keeps on its victim Machine until the victim is fenced. Whoever deletes the Machine
	// meanwhile (a KCP rollout, a person), CAPI's Machine controller neither drains nor deletes it
	// before the hook is removed. Its value is the name of the MachineRemediation.
	FenceBeforeDeleteHookAnnotation = "pre-drain.delete.hook.machine.cluster.x-k8s.io/capr-fence-before-delete"

	// ReplicasBackHookAnnotation is a CAPI pre-terminate deletion hook
	// (clusterv1.PreTerminateDeleteHookAnnotationPrefix + "/capr-replicas-back") that a control-plane
	// remediation puts on its victim just before deleting it, after a surge, and removes once the
	// control plane's replicas are back to what they were (as the provider sees them). While it holds,
	// the victim stays (deleting), so the provider neither replaces it at the surged replicas nor, when
	// they come back, scales down a healthy Machine instead; a crash between the delete and the
	// replicas' write cannot open that window. Pre-terminate, not pre-drain: CAPI's Machine controller
	// honours pre-drain hooks only on a Machine whose Node it may delete (one with a nodeRef), and a
	// victim that never got a Node is removed member-first after a surge too. KCP runs its own
	// pre-terminate hook (the etcd member's removal) only after the others are gone. Its value is the
	// name of the MachineRemediation.
	ReplicasBackHookAnnotation = "pre-terminate.delete.hook.machine.cluster.x-k8s.io/capr-replicas-back"

	// QuorumSafeHookAnnotation is a CAPI pre-terminate deletion hook
	// (clusterv1.PreTerminateDeleteHookAnnotationPrefix + "/capr-quorum-safe") that a control-plane
	// remediation puts on its victim just before deleting it while its etcd member still votes
	// (DeleteBeforeMemberRemoval), and removes once its own reading of etcd says that removing the
	// member keeps quorum. The provider's pre-terminate hook removes the member (KCP's kcp-cleanup,
	// which from Kubernetes v1.31 on runs only after every other pre-terminate hook is gone) and
	// judges that from its Machine conditions, which can show a dead member healthy: without this
	// hook a second member dying during the deletion has KCP ask etcd for a removal that would leave
	// too few healthy voters, which etcd refuses (its strict reconfiguration check) on every retry, and
	// the deletion never ends (with that check off, quorum would be lost). CAPR removes the dead
	// member first, then releases the hook. Its value is the name of the MachineRemediation.
	QuorumSafeHookAnnotation = "pre-terminate.delete.hook.machine.cluster.x-k8s.io/capr-quorum-safe"

	// EtcdLearnerJoinsAnnotation on a cluster's control-plane object, "true", says that its provider
	// joins new etcd members as learners and promotes them once caught up (kubeadm's EtcdLearnerMode,
	// on by default since Kubernetes 1.29). CAPI's control-plane contract does not say how members
	// join, so without it CAPR assumes voting joins, the stricter model; the models differ for a
	// control plane of one Machine, which only a learner join can replace without losing quorum. A
	// KubeadmControlPlane of spec.version v1.34.0 or later joins learners without it (that kubeadm
	// has no way to join voters); "false" says otherwise.
	EtcdLearnerJoinsAnnotation = "remediation.cluster.x-k8s.io/etcd-learner-joins"
)

// MachineRemediation lifecycle.
const (
	// MachineRemediationFinalizer lets the remediator finish or undo a remediation before its
	// MachineRemediation goes away: deleting a request (by hand, or CAPI's MachineHealthCheck when the
	// Machine looks healthy again) aborts it. Before the victim's etcd member is removed an abort
	// undoes what was done (replicas back, provider annotations and the lock cleared); after it, the
	// remediation is finished first, because a Machine without its etcd member cannot be kept.
	MachineRemediationFinalizer = "remediation.cluster.x-k8s.io/machineremediation"

	// RetryAnnotation on a Failed MachineRemediation asks the remediator to try again from the
	// start: the request goes back to Pending and the annotation is removed. A Failed remediation has
	// always left the control plane as it found it (see MachineRemediationPhaseFailed).
	RetryAnnotation = "remediation.cluster.x-k8s.io/retry"
)

// MarkRecord is the JSON value of UnhealthyAnnotation.
type MarkRecord struct {
	// Reason is one of the MachineHealthCheckSucceeded condition reasons (e.g. UnhealthyNode).
	Reason string `json:"reason"`
	// Message says in a sentence what failed.
	Message string `json:"message,omitempty"`
	// Since is when the Machine was first found unhealthy (RFC 3339).
	Since metav1.Time `json:"since,omitempty"`
	// Checker is who wrote the annotation: anything (e.g. "manual") for a person's request, or
	// "<namespace>/<name>" of a MachineHealthCheck for an annotation an earlier CAPR wrote as its mark.
	Checker string `json:"checker,omitempty"`
}

// RemediationRecord is the JSON value of RemediationRecordAnnotation.
type RemediationRecord struct {
	// Machine is the name of the Machine that was remediated.
	Machine string `json:"machine"`
	// Timestamp is when that remediation started (RFC 3339, UTC), as KCP's RemediationData.Timestamp.
	Timestamp metav1.Time `json:"timestamp"`
	// RetryCount is how many remediations in a row this chain of replacements has seen.
	RetryCount int32 `json:"retryCount"`
}

// ControlPlaneLock is the JSON value of ControlPlaneLockAnnotation.
type ControlPlaneLock struct {
	// MachineRemediation is the name of the MachineRemediation holding the control plane.
	MachineRemediation string `json:"machineRemediation"`
	// DesiredReplicas is the control plane's replicas before the remediation changed them: health
	// checks use it for the quorum-safe limit while replicas are temporarily N+1.
	DesiredReplicas int32 `json:"desiredReplicas"`
}

// FencingPolicy says what happens when storage fencing cannot be confirmed.
// +kubebuilder:validation:Enum=Disabled;BestEffort;Required
type FencingPolicy string

const (
	// FencingDisabled skips the fencing step (it is still recorded, as skipped).
	FencingDisabled FencingPolicy = "Disabled"
	// FencingBestEffort deletes the Machine after the fencing timeout even if not every backend
	// confirmed, with a Warning event.
	FencingBestEffort FencingPolicy = "BestEffort"
	// FencingRequired never deletes an unfenced Machine: on timeout the remediation stops, reports and
	// retries later.
	FencingRequired FencingPolicy = "Required"
)

// FencingBackendType names a storage-fencing backend (remediation/fencing).
// +kubebuilder:validation:Enum=NetworkFence;External;OutOfServiceTaint
type FencingBackendType string

const (
	// FencingBackendNetworkFence creates csi-addons NetworkFence objects for the node's addresses.
	FencingBackendNetworkFence FencingBackendType = "NetworkFence"
	// FencingBackendExternal creates an object from a template (e.g. power fencing) and waits for its
	// Fenced condition.
	FencingBackendExternal FencingBackendType = "External"
	// FencingBackendOutOfServiceTaint taints the workload Node node.kubernetes.io/out-of-service. It is
	// only safe once the node is known not to write any more, so it must follow another backend.
	FencingBackendOutOfServiceTaint FencingBackendType = "OutOfServiceTaint"
)

// FencingBackend is one storage-fencing backend.
// +kubebuilder:validation:XValidation:rule="self.type != 'NetworkFence' || (has(self.networkFenceClassNames) && size(self.networkFenceClassNames) > 0)",message="networkFenceClassNames is required when type is NetworkFence"
// +kubebuilder:validation:XValidation:rule="self.type == 'NetworkFence' || !has(self.networkFenceClassNames)",message="networkFenceClassNames is only allowed when type is NetworkFence"
// +kubebuilder:validation:XValidation:rule="self.type != 'External' || has(self.templateRef)",message="templateRef is required when type is External"
// +kubebuilder:validation:XValidation:rule="self.type == 'External' || !has(self.templateRef)",message="templateRef is only allowed when type is External"
type FencingBackend struct {
	// type is the backend.
	// +required
	Type FencingBackendType `json:"type"`

	// networkFenceClassNames are the csi-addons NetworkFenceClasses to fence through, one
	// NetworkFence per class (one per storage system the node may write to).
	// +optional
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=253
	NetworkFenceClassNames []string `json:"networkFenceClassNames,omitempty"`

	// templateRef points at the template of the External fencing object.
	// +optional
	TemplateRef *TemplateReference `json:"templateRef,omitempty"`
}

// FencingSpec configures storage fencing before a Machine is deleted (remediation/fencing).
// +kubebuilder:validation:XValidation:rule="!has(self.backends) || !self.backends.exists(b, b.type == 'OutOfServiceTaint') || self.backends[0].type != 'OutOfServiceTaint'",message="backends: OutOfServiceTaint must follow another backend that confirms the node no longer writes"
// +kubebuilder:validation:XValidation:rule="self.policy == 'Disabled' || (has(self.backends) && size(self.backends) > 0)",message="backends must not be empty unless policy is Disabled"
type FencingSpec struct {
	// policy says what happens when fencing cannot be confirmed: Required never deletes an unfenced
	// Machine, BestEffort deletes after timeoutSeconds with a Warning event, Disabled skips fencing.
	// +optional
	// +kubebuilder:default=Disabled
	Policy FencingPolicy `json:"policy,omitempty"`

	// backends are tried in order; the fencing step is done only when every backend confirmed.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=8
	Backends []FencingBackend `json:"backends,omitempty"`

	// timeoutSeconds bounds the wait for all backends to confirm. Defaults to 300, at most a day.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=86400
	TimeoutSeconds *int32 `json:"timeoutSeconds,omitempty"`
}

// ControlPlaneOrder is the order of a control-plane remediation (remediation/controlplane
// ChooseOrder). The spec's ordering
// policy takes Auto or RemoveMemberFirst; the status records the order actually followed
// (ScaleUpFirst, RemoveMemberFirst, DeleteFirst, DeleteBeforeMemberRemoval or Replace).
type ControlPlaneOrder string

const (
	// ControlPlaneOrderAuto (policy only) chooses from real etcd state: scale up first when the victim's
	// member is healthy (or scaling up first is quorum-safe), otherwise remove the victim's member first
	// — but never a healthy member when that leaves no failure margin (3 healthy voters → 2 of 2): then
	// the remediation waits (reason WouldLoseFailureMargin).
	ControlPlaneOrderAuto ControlPlaneOrder = "Auto"
	// ControlPlaneOrderRemoveMemberFirst removes the victim's member before scaling up. As a policy it
	// is for infrastructures without spare capacity for a surge Machine (e.g. a fixed pool of
	// bare-metal hosts), and it accepts removing a healthy member even when that leaves no failure
	// margin until the replacement votes (e.g. KCP refusing to scale up while the etcd leader's
	// kubelet is down).
	ControlPlaneOrderRemoveMemberFirst ControlPlaneOrder = "RemoveMemberFirst"
	// ControlPlaneOrderScaleUpFirst (status only) scales up, waits for the new member to vote, then
	// removes the victim's member.
	ControlPlaneOrderScaleUpFirst ControlPlaneOrder = "ScaleUpFirst"
	// ControlPlaneOrderReplace (status only) deletes the Machine and lets the provider recreate it
	// (the control plane is not initialized yet).
	ControlPlaneOrderReplace ControlPlaneOrder = "Replace"
	// ControlPlaneOrderDeleteFirst (status only) removes the victim's member, fences and deletes the
	// victim without changing replicas, then waits for the provider to create the replacement. It is
	// taken where the provider would refuse the scale-down that ends the other orders, e.g. KCP while
	// another control-plane Machine is unhealthy (its scale-down preflight has no relaxed path).
	ControlPlaneOrderDeleteFirst ControlPlaneOrder = "DeleteFirst"
	// ControlPlaneOrderDeleteBeforeMemberRemoval (status only) is DeleteFirst for a victim whose member
	// still votes and answers through its node, where the provider's own deletion removes the member
	// at its pre-terminate point (KCP's kcp-cleanup hook): the victim is fenced and deleted first, and
	// its member keeps voting until that point instead of leaving before the delete. The RemoveMember
	// step follows the Delete step and removes the member should it still be listed.
	ControlPlaneOrderDeleteBeforeMemberRemoval ControlPlaneOrder = "DeleteBeforeMemberRemoval"
)

// EtcdPlacement is where a control plane's etcd runs (remediation.EtcdPlacementOf reads it from the
// control-plane object).
// +kubebuilder:validation:Enum=Stacked;External
type EtcdPlacement string

const (
	// EtcdPlacementStacked means every control-plane Machine runs an etcd member (kubeadm's default). A
	// control-plane remediation moves leadership and removes the victim's member, and the
	// max-unhealthy limit keeps etcd quorum.
	EtcdPlacementStacked EtcdPlacement = "Stacked"
	// EtcdPlacementExternal means etcd runs outside the control-plane Machines (KubeadmControlPlane
	// spec.kubeadmConfigSpec.clusterConfiguration.etcd.external). A control-plane remediation has no
	// membership steps and reads no etcd; what must be kept is one control-plane Machine serving the
	// API while another is replaced.
	EtcdPlacementExternal EtcdPlacement = "External"
)

// ControlPlaneRemediationSpec holds the control-plane remediation options. Retry fields have KCP's
// meaning (KubeadmControlPlane spec.remediation), so the same numbers behave the same way.
type ControlPlaneRemediationSpec struct {
	// maxRetry is how many times in a row a replacement Machine may itself be remediated before CAPR
	// gives up on it (a retry is the replacement of a remediated Machine failing too, within
	// minHealthyPeriodSeconds). Unset means no limit.
	// +optional
	// +kubebuilder:validation:Minimum=0
	MaxRetry *int32 `json:"maxRetry,omitempty"`

	// retryPeriodSeconds is how long to wait after a remediation before remediating its replacement.
	// Unset means immediately.
	// +optional
	// +kubebuilder:validation:Minimum=0
	RetryPeriodSeconds *int32 `json:"retryPeriodSeconds,omitempty"`

	// minHealthyPeriodSeconds: a replacement that fails later than this after its remediation started
	// is considered an unrelated failure and the retry count starts again. Defaults to 3600.
	// +optional
	// +kubebuilder:validation:Minimum=0
	MinHealthyPeriodSeconds *int32 `json:"minHealthyPeriodSeconds,omitempty"`

	// replacementTimeoutSeconds bounds the steps ScaleUp and WaitForReplacement: how long the
	// control-plane provider may take to create the replacement and for its etcd member to become a
	// healthy voter. Defaults to 1800, at most a day. Before the victim's etcd member is removed, a
	// timeout undoes the remediation (replicas back) and marks it Failed; once the victim was deleted,
	// it marks it Failed with nothing undone and releases the control plane, the provider keeping its
	// replacement.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=86400
	ReplacementTimeoutSeconds *int32 `json:"replacementTimeoutSeconds,omitempty"`

	// stepTimeoutSeconds bounds each of the steps MoveLeader, RemoveMember and Delete (a provider
	// that never deletes the Machine, etcd that never allows the removal). Defaults to 600, at most a
	// day. Before the victim's etcd member is removed, a timeout undoes the remediation and marks it
	// Failed; after it, the remediation keeps trying and says so in its Progressing condition and a
	// Warning event (it cannot be undone).
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=86400
	StepTimeoutSeconds *int32 `json:"stepTimeoutSeconds,omitempty"`

	// order is the ordering policy: Auto (default) or RemoveMemberFirst. Auto never removes a healthy
	// etcd member first when that leaves no failure margin (it waits instead, reason
	// WouldLoseFailureMargin); RemoveMemberFirst accepts that, and may be set on a waiting
	// MachineRemediation to let it proceed.
	// +optional
	// +kubebuilder:default=Auto
	// +kubebuilder:validation:Enum=Auto;RemoveMemberFirst
	Order ControlPlaneOrder `json:"order,omitempty"`

	// topologyReplicas says whether CAPR may surge a control plane whose replicas the Cluster topology
	// owns (a ClusterClass-based Cluster with spec.topology.controlPlane.replicas set) through
	// Cluster spec.topology.controlPlane.replicas: Surge (default) raises them with CAPR's own field
	// manager (server-side apply) and restores them when the victim is gone; Leave never writes the
	// Cluster (e.g. a GitOps tool reverts that field), so a victim whose etcd member is healthy waits
	// (WouldLoseFailureMargin) until order RemoveMemberFirst accepts deleting it first. A victim whose
	// member is down is deleted first either way: that loses no failure margin and changes no replicas.
	// +optional
	// +kubebuilder:default=Surge
	// +kubebuilder:validation:Enum=Surge;Leave
	TopologyReplicas TopologyReplicasPolicy `json:"topologyReplicas,omitempty"`
}

// TopologyReplicasPolicy is whether a control-plane remediation may change Cluster
// spec.topology.controlPlane.replicas (ControlPlaneRemediationSpec.topologyReplicas).
// +kubebuilder:validation:Enum=Surge;Leave
type TopologyReplicasPolicy string

const (
	// TopologyReplicasSurge lets a remediation surge through Cluster spec.topology.controlPlane.replicas.
	TopologyReplicasSurge TopologyReplicasPolicy = "Surge"
	// TopologyReplicasLeave never changes Cluster spec.topology.controlPlane.replicas.
	TopologyReplicasLeave TopologyReplicasPolicy = "Leave"
)

// ReplicasField is where a control-plane remediation changes the control plane's replicas
// (ControlPlaneRemediationStatus.replicasField).
// +kubebuilder:validation:Enum=ControlPlane;ClusterTopology
type ReplicasField string

const (
	// ReplicasFieldControlPlane is spec.replicas of the control-plane object (CAPI's control-plane
	// contract), patched conditionally on the replicas read.
	ReplicasFieldControlPlane ReplicasField = "ControlPlane"
	// ReplicasFieldClusterTopology is Cluster spec.topology.controlPlane.replicas, which the Cluster
	// topology controller applies to the control-plane object: written with server-side apply and
	// CAPR's field manager (remediation/controlplane TopologyFieldManager), restored only while CAPR
	// still owns the field with the value it set.
	ReplicasFieldClusterTopology ReplicasField = "ClusterTopology"
)

// TemplateReference points at a template object in the same namespace. The object made from it (a
// remediation request, an escalation step's object, an External fence) is named after the Machine, so
// a template of Cluster API's core group is refused: its object would be the Machine itself (a
// MachineTemplate), or another core object CAPR must never create or delete.
// +kubebuilder:validation:XValidation:rule="!self.apiVersion.startsWith('cluster.x-k8s.io/')",message="a template of Cluster API's core group cluster.x-k8s.io is never a remediation or fencing template: the object made from it, named after the Machine, would be a Machine or another core object",fieldPath=".apiVersion"
type TemplateReference struct {
	// apiVersion of the template, e.g. remediation.cluster.x-k8s.io/v1alpha1.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=317
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\/[a-z]([-a-z0-9]*[a-z0-9])?$`
	APIVersion string `json:"apiVersion"`

	// kind of the template, e.g. MachineRemediationTemplate.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$`
	Kind string `json:"kind"`

	// name of the template.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	Name string `json:"name"`
}

// MarkEntry is one health check's part of the health checker's mark, the
// MachineCAPRHealthCheckSucceededCondition at False. Health checks may overlap (CAPI forbids it but
// does not enforce it): the mark has one entry per health check that finds the Machine unhealthy,
// each health check writes and clears only its own, and the Machine stays marked while any entry
// remains. The entries are the condition's message (MarkEntriesFromMessage, MarkEntries.Marshal), so
// that a mark stays one write to the Machine's status.
// +kubebuilder:object:generate=false
type MarkEntry struct {
	// Checker is "<namespace>/<name>" of the MachineHealthCheck that wrote the entry.
	Checker string
	// Reason is one of the MachineCAPRHealthCheckSucceededCondition reasons (e.g. UnhealthyNode).
	Reason string
	// Message says what failed.
	Message string
}

// MarkEntries are the entries of a mark, in the order they were added: the first one's reason is
// the condition's reason.
// +kubebuilder:object:generate=false
type MarkEntries []MarkEntry

// Index returns the index of checker's entry, -1 when it has none.
func (e MarkEntries) Index(checker string) int {
	for i := range e {
		if e[i].Checker == checker {
			return i
		}
	}
	return -1
}

// With returns the entries with entry in place of its checker's entry, or added last.
func (e MarkEntries) With(entry MarkEntry) MarkEntries {
	out := append(MarkEntries(nil), e...)
	if i := out.Index(entry.Checker); i >= 0 {
		out[i] = entry
		return out
	}
	return append(out, entry)
}

// Without returns the entries without checker's.
func (e MarkEntries) Without(checker string) MarkEntries {
	out := make(MarkEntries, 0, len(e))
	for _, entry := range e {
		if entry.Checker != checker {
			out = append(out, entry)
		}
	}
	return out
}
