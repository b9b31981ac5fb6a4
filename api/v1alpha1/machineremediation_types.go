package v1alpha1

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// RemediationSource says who asked for a remediation.
// +kubebuilder:validation:Enum=HealthCheck;CAPIMachineHealthCheck;Manual
type RemediationSource string

const (
	// MachineRemediationSourceHealthCheck is CAPR's own MachineHealthCheck.
	MachineRemediationSourceHealthCheck RemediationSource = "HealthCheck"
	// MachineRemediationSourceCAPIMachineHealthCheck is CAPI's MachineHealthCheck through spec.remediation.templateRef.
	// CAPI copies the template's spec, so this is also what an unset source means.
	MachineRemediationSourceCAPIMachineHealthCheck RemediationSource = "CAPIMachineHealthCheck"
	// MachineRemediationSourceManual is a person.
	MachineRemediationSourceManual RemediationSource = "Manual"
)

// MachineRemediationSpec is what to remediate and how. The Machine is the one with the same name
// in the same namespace (CAPI's convention for remediation requests).
type MachineRemediationSpec struct {
	// source says who asked for this remediation. Unset means CAPI's MachineHealthCheck, which copies
	// a MachineRemediationTemplate's spec without adding anything.
	// +optional
	Source RemediationSource `json:"source,omitempty"`

	// reason is the reason of the mark that caused this remediation (e.g. UnhealthyNode).
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Reason string `json:"reason,omitempty"`

	// message is the mark's message.
	// +optional
	// +kubebuilder:validation:MaxLength=10240
	Message string `json:"message,omitempty"`

	// fencing configures storage fencing before the Machine is deleted. Unset means Disabled.
	// +optional
	Fencing *FencingSpec `json:"fencing,omitempty"`

	// controlPlane configures the remediation of a control-plane Machine.
	// +optional
	ControlPlane *ControlPlaneRemediationSpec `json:"controlPlane,omitempty"`

	// escalation is an ordered list of remediations tried, each for its timeout, before a worker
	// Machine is fenced and deleted (medik8s NodeHealthCheck's semantics): for each step an object is
	// created from the template (kind without the Template suffix, named after the Machine, owned by
	// this MachineRemediation); the Machine's health mark going away ends the remediation, nothing
	// deleted; the timeout passing deletes that object and tries the next step. The health checker
	// copies its spec.remediation.escalation here.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=8
	Escalation []EscalationStep `json:"escalation,omitempty"`
}

// RemediationPhase is the coarse state of a MachineRemediation.
type RemediationPhase string

const (
	// MachineRemediationPhasePending means not started yet, waiting for its preconditions (the reason is in the Progressing
	// condition). Nothing irreversible has been done and the request may still be withdrawn.
	MachineRemediationPhasePending RemediationPhase = "Pending"
	// MachineRemediationPhaseRunning means the sequence has started; it will be completed even if the Machine recovers.
	MachineRemediationPhaseRunning RemediationPhase = "Running"
	// MachineRemediationPhaseSucceeded means the Machine was replaced.
	MachineRemediationPhaseSucceeded RemediationPhase = "Succeeded"
	// MachineRemediationPhaseFailed means CAPR gave up (e.g. maxRetry, a step timed out before the
	// victim's etcd member was removed) after undoing what it had done: replicas back to what they
	// were, the lock released. The reason is in the conditions; the RetryAnnotation starts it again.
	MachineRemediationPhaseFailed RemediationPhase = "Failed"
)

// StepOutcome is the outcome of one step.
type StepOutcome string

const (
	// StepOutcomeInProgress means the step was issued and its effect is not yet visible.
	StepOutcomeInProgress StepOutcome = "InProgress"
	// StepOutcomeSucceeded means the step's effect is visible.
	StepOutcomeSucceeded StepOutcome = "Succeeded"
	// StepOutcomeSkipped means the step was not needed (e.g. fencing Disabled, leader already elsewhere).
	StepOutcomeSkipped StepOutcome = "Skipped"
	// StepOutcomeFailed means the step failed; the message says why.
	StepOutcomeFailed StepOutcome = "Failed"
)

// StepName names one step of a remediation sequence.
type StepName string

// Steps of a control-plane remediation, in the order ScaleUpFirst runs them
// (remediation/controlplane StepsFor).
const (
	// StepScaleUp raises the control plane's replicas by one so that the provider creates the replacement.
	StepScaleUp StepName = "ScaleUp"
	// StepWaitForReplacement waits until the replacement has a Node and a healthy voting etcd member.
	StepWaitForReplacement StepName = "WaitForReplacement"
	// StepMoveLeader moves etcd leadership off the victim's member (skipped when it does not lead).
	StepMoveLeader StepName = "MoveLeader"
	// StepRemoveMember removes the victim's etcd member.
	StepRemoveMember StepName = "RemoveMember"
	// StepFence fences the victim's storage (remediation/fencing).
	StepFence StepName = "Fence"
	// StepDelete deletes the victim through its control-plane provider (a worker Machine: deletes the
	// Machine; its MachineSet replaces it).
	StepDelete StepName = "Delete"
)

// A worker remediation (remediation/worker) runs one step per spec.escalation entry, named
// EscalationStepName(i), then StepFence, then StepDelete.

// EscalationStepName names the i-th (from 0) escalation step: Escalate1, Escalate2, ...
func EscalationStepName(i int) StepName { return StepName(fmt.Sprintf("Escalate%d", i+1)) }

// RemediationStep records one step of the sequence.
type RemediationStep struct {
	// name of the step, e.g. ScaleUp, WaitForReplacement, MoveLeader, RemoveMember, Fence, Delete.
	// +required
	Name StepName `json:"name"`
	// startTime is when the step was started.
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`
	// finishTime is when the step's effect was seen.
	// +optional
	FinishTime *metav1.Time `json:"finishTime,omitempty"`
	// outcome of the step.
	// +optional
	Outcome StepOutcome `json:"outcome,omitempty"`
	// message says what was done or why not.
	// +optional
	Message string `json:"message,omitempty"`
}

// ControlPlaneRemediationStatus is what a control-plane remediation must remember across restarts:
// everything else is re-read from the world (etcd, Machines, Nodes).
type ControlPlaneRemediationStatus struct {
	// clusterName is the Cluster of the Machine.
	// +optional
	ClusterName string `json:"clusterName,omitempty"`
	// order is the order chosen from etcd state and why.
	// +optional
	Order ControlPlaneOrder `json:"order,omitempty"`
	// orderReason says why that order was chosen.
	// +optional
	OrderReason string `json:"orderReason,omitempty"`
	// desiredReplicas is the control plane's replicas before the remediation scaled it up; the
	// remediation returns it to this value.
	// +optional
	DesiredReplicas *int32 `json:"desiredReplicas,omitempty"`
	// machinesBefore are the control-plane Machines that existed before scaling up; any other one is
	// the replacement.
	// +optional
	// +listType=atomic
	MachinesBefore []string `json:"machinesBefore,omitempty"`
	// replacement is the name of the replacement Machine once it exists (the first one, with a surge
	// of two).
	// +optional
	Replacement string `json:"replacement,omitempty"`
	// surge is how far the remediation raises spec.replicas above desiredReplicas: 1, or 2 where the
	// control-plane provider only accepts an odd number of replicas (KubeadmControlPlane with stacked
	// etcd), or 0 for DeleteFirst. The control plane is returned to desiredReplicas at the Delete step,
	// or as soon as the first replacement exists when replacements is 1 and surge 2.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=2
	Surge int32 `json:"surge,omitempty"`
	// replacements is how many replacement Machines the remediation has the provider create before
	// the victim goes: surge (also when unset), or 1 with a surge of 2 where the provider creates one
	// Machine at a time and the next only once the previous is healthy (KubeadmControlPlane). The
	// victim is then marked cluster.x-k8s.io/delete-machine before the replicas are raised, and the
	// replicas return to desiredReplicas as soon as the first replacement exists, so that the
	// provider never creates the second. It is 2 when the provider had created a second one before
	// the replicas could return.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=2
	Replacements int32 `json:"replacements,omitempty"`
	// surgeReason says why that surge.
	// +optional
	SurgeReason string `json:"surgeReason,omitempty"`
	// memberName is the victim's etcd member name (its Node name).
	// +optional
	MemberName string `json:"memberName,omitempty"`
	// memberID is the victim's etcd member ID (hex), once known.
	// +optional
	MemberID string `json:"memberID,omitempty"`
	// retryCount is the retry count of this remediation (KCP's meaning).
	// +optional
	RetryCount int32 `json:"retryCount,omitempty"`
	// etcd is where the cluster's etcd ran when the remediation chose its order: Stacked (also when
	// unset) or External, in which case the order has no MoveLeader and RemoveMember steps.
	// +optional
	Etcd EtcdPlacement `json:"etcd,omitempty"`
	// undo is set while the remediation is being undone before its point of no return (aborted,
	// failed, or giving way): the replicas are back at desiredReplicas, and the remediation keeps the
	// control plane until the control-plane provider has observed them (its
	// status.observedGeneration), then marks for deletion any Machine the provider created from the
	// replicas it had read before, and ends as undo says.
	// +optional
	Undo *ControlPlaneUndo `json:"undo,omitempty"`
	// replicasField is where the remediation changes the control plane's replicas for a surge:
	// ControlPlane (also when unset: spec.replicas of the control-plane object) or ClusterTopology
	// (Cluster spec.topology.controlPlane.replicas, when the Cluster topology owns the replicas).
	// +optional
	ReplicasField ReplicasField `json:"replicasField,omitempty"`
}

// ControlPlaneUndo is an undo in progress (ControlPlaneRemediationStatus.undo): when it began and
// what the remediation becomes once it is done.
type ControlPlaneUndo struct {
	// startTime is when the undo began: it waits for the provider for a bounded time from it.
	// +required
	StartTime metav1.Time `json:"startTime"`
	// phase is what the remediation becomes once undone: Pending (it gave way, or its request is
	// being deleted) or Failed.
	// +required
	// +kubebuilder:validation:Enum=Pending;Failed
	Phase RemediationPhase `json:"phase"`
	// reason is the reason of the Progressing condition meanwhile and afterwards.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	Reason string `json:"reason"`
	// message says why the remediation is undone and what was undone.
	// +optional
	Message string `json:"message,omitempty"`
}

// WorkerRemediationStatus is what a worker remediation must remember across restarts. It is written
// when the worker remediator first acts on a request, while the Machine still exists: from then on the
// request is a worker request, also after its Machine is gone, and the control-plane remediator leaves
// it alone (and the worker remediator leaves alone every request with status.controlPlane).
type WorkerRemediationStatus struct {
	// clusterName is the Cluster of the Machine.
	// +optional
	ClusterName string `json:"clusterName,omitempty"`
	// machineSet is the MachineSet owning the Machine ("" when it has none: it is not remediated).
	// +optional
	MachineSet string `json:"machineSet,omitempty"`
	// machineDeployment is the MachineDeployment owning that MachineSet, if any: its
	// spec.remediation.maxInFlight bounds the remediations of its Machines in flight.
	// +optional
	MachineDeployment string `json:"machineDeployment,omitempty"`
	// nodeName is the Machine's Node when the remediation started (the fencing target).
	// +optional
	NodeName string `json:"nodeName,omitempty"`
}

// MachineRemediationStatus is the durable, resumable state of a remediation.
type MachineRemediationStatus struct {
	// phase is Pending, Running, Succeeded or Failed.
	// +optional
	Phase RemediationPhase `json:"phase,omitempty"`
	// currentStep is the step being worked on.
	// +optional
	CurrentStep StepName `json:"currentStep,omitempty"`
	// steps are the steps taken so far, in order.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	Steps []RemediationStep `json:"steps,omitempty"`
	// startTime is when the remediation left Pending.
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`
	// completionTime is when it reached Succeeded or Failed.
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`
	// lastError is the last error met, kept until the step succeeds.
	// +optional
	LastError string `json:"lastError,omitempty"`
	// controlPlane is the state of a control-plane remediation.
	// +optional
	ControlPlane *ControlPlaneRemediationStatus `json:"controlPlane,omitempty"`
	// worker is the state of a worker remediation. A request has at most one of controlPlane and
	// worker: the one set says which remediator owns it.
	// +optional
	Worker *WorkerRemediationStatus `json:"worker,omitempty"`
	// appliedFencing is the fencing this remediation applies, decided when it starts: spec.fencing
	// raised to the strictest fencing of the CAPR MachineHealthChecks covering the Machine. Unset
	// (a request started by an earlier CAPR) means spec.fencing.
	// +optional
	AppliedFencing *AppliedFencing `json:"appliedFencing,omitempty"`
	// fencing records the storage fence of the Machine's Node: what was fenced, by which backend,
	// when, and whether it was undone. It is written before the first backend acts, so a restart
	// resumes and the unfencing owed after the Machine is gone (or when the remediation is aborted
	// before the delete) is never forgotten.
	// +optional
	Fencing *FencingStatus `json:"fencing,omitempty"`
	// conditions: Progressing (why it waits), Succeeded.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=32
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// observedGeneration is the last generation reconciled.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// FencingStatus is the storage fence of a remediation's Node (remediation/fencing).
type FencingStatus struct {
	// nodeName is the workload-cluster Node fenced.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	NodeName string `json:"nodeName"`
	// startTime is when the first backend was asked to fence.
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`
	// backends are the applied fencing's backends' results (status.appliedFencing, else
	// spec.fencing), in the same order.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=8
	Backends []FencingBackendStatus `json:"backends,omitempty"`
	// unfencedTime is when every fence was undone: after the Machine and its Node were gone, or when
	// the remediation was aborted before the Machine was deleted. Unset while unfencing is owed.
	// +optional
	UnfencedTime *metav1.Time `json:"unfencedTime,omitempty"`
	// pods records the force-deletion of the fenced Node's pods, done once every backend confirmed
	// the fence (remediation/fencing, pods.go). Unset until it was tried.
	// +optional
	Pods *FencedPodsStatus `json:"pods,omitempty"`
}

// FencedPodsStatus is the force-deletion of a fenced Node's pods.
type FencedPodsStatus struct {
	// deletedTime is when no pod was left on the Node (mirror pods aside); unset while a deletion
	// failed (it is tried again while the Fence step runs).
	// +optional
	DeletedTime *metav1.Time `json:"deletedTime,omitempty"`
	// deleted is how many pods CAPR force-deleted.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Deleted int32 `json:"deleted,omitempty"`
	// message says which pods were deleted, or why not all.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`
}

// FencingBackendState is where one backend's fence stands.
// +kubebuilder:validation:Enum=Fencing;Fenced;NotAvailable;Unfenced
type FencingBackendState string

const (
	// FencingBackendFencing means asked, not confirmed yet.
	FencingBackendFencing FencingBackendState = "Fencing"
	// FencingBackendFenced means the backend confirmed the node cannot write.
	FencingBackendFenced FencingBackendState = "Fenced"
	// FencingBackendNotAvailable means the backend cannot run here (e.g. its CRDs are absent from the
	// workload cluster); nothing was created.
	FencingBackendNotAvailable FencingBackendState = "NotAvailable"
	// FencingBackendUnfenced means the fence was undone (or nothing of it was left).
	FencingBackendUnfenced FencingBackendState = "Unfenced"
)

// FencingBackendStatus is one backend's fence.
type FencingBackendStatus struct {
	// type is the backend.
	// +required
	Type FencingBackendType `json:"type"`
	// state is Fencing, Fenced, NotAvailable or Unfenced.
	// +required
	State FencingBackendState `json:"state"`
	// message is the backend's last word (which objects, what it waits for).
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`
	// fencedTime is when the backend first confirmed the fence.
	// +optional
	FencedTime *metav1.Time `json:"fencedTime,omitempty"`
	// unfencedTime is when its fence was undone.
	// +optional
	UnfencedTime *metav1.Time `json:"unfencedTime,omitempty"`
	// objects are the fence objects this backend created for the fence (a NetworkFence per class, the
	// External fence object), recorded before any of them is believed. A backend confirms only an
	// object whose UID is recorded here: anyone who may create the kind can copy its name, labels,
	// annotations and spec, but not its UID.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	Objects []FencingObject `json:"objects,omitempty"`
}

// FencingObject is an object a fencing backend created.
type FencingObject struct {
	// kind of the object.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Kind string `json:"kind"`
	// name of the object.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// uid of the object as created.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	UID string `json:"uid"`
}

// +kubebuilder:object:root=true
// +kubebuilder:metadata:labels="cluster.x-k8s.io/v1beta2=v1alpha1"
// +kubebuilder:resource:path=machineremediations,shortName=mr,scope=Namespaced,categories=cluster-api;capr
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Cluster",type="string",JSONPath=".status.controlPlane.clusterName"
// +kubebuilder:printcolumn:name="Phase",type="string",JSONPath=".status.phase"
// +kubebuilder:printcolumn:name="Step",type="string",JSONPath=".status.currentStep"
// +kubebuilder:printcolumn:name="Order",type="string",JSONPath=".status.controlPlane.order"
// +kubebuilder:printcolumn:name="Reason",type="string",JSONPath=".spec.reason",priority=10
// +kubebuilder:printcolumn:name="Waiting",type="string",JSONPath=".status.conditions[?(@.type==\"Progressing\")].message",priority=10
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"
// What a Running remediation's plan depends on is frozen: its steps are recomputed from
// spec.escalation on every reconcile, escalation steps first (remediation/controlplane PlanSteps,
// remediation/worker), spec.controlPlane gives the order policy chosen again after an escalation and
// the step timeouts, and spec.reason is what it was started for. The rules are on the object, not on
// spec, because they read status.phase: an update of the object keeps the stored status, a status
// update the stored spec. Running is recorded by a write conditional on the resourceVersion the
// remediation was planned from (remediation.Persist), so the spec frozen is the one it runs.
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.status) || !has(oldSelf.status.phase) || oldSelf.status.phase != 'Running' || ((has(self.spec) && has(self.spec.escalation)) == (has(oldSelf.spec) && has(oldSelf.spec.escalation)) && (!has(self.spec) || !has(self.spec.escalation) || self.spec.escalation == oldSelf.spec.escalation))",message="spec.escalation cannot change while the remediation is Running: its steps are part of the running plan (delete the request to abort it)",fieldPath=".spec.escalation"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.status) || !has(oldSelf.status.phase) || oldSelf.status.phase != 'Running' || ((has(self.spec) && has(self.spec.controlPlane)) == (has(oldSelf.spec) && has(oldSelf.spec.controlPlane)) && (!has(self.spec) || !has(self.spec.controlPlane) || self.spec.controlPlane == oldSelf.spec.controlPlane))",message="spec.controlPlane cannot change while the remediation is Running: the running plan's order policy and step timeouts come from it (delete the request to abort it)",fieldPath=".spec.controlPlane"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.status) || !has(oldSelf.status.phase) || oldSelf.status.phase != 'Running' || ((has(self.spec) && has(self.spec.reason)) == (has(oldSelf.spec) && has(oldSelf.spec.reason)) && (!has(self.spec) || !has(self.spec.reason) || self.spec.reason == oldSelf.spec.reason))",message="spec.reason cannot change while the remediation is Running: it is what the running remediation was started for (delete the request to abort it)",fieldPath=".spec.reason"

// MachineRemediation is the remediation of one Machine: same name and namespace as the Machine,
// owned by it while Pending. Once the remediation starts it is re-owned by the Cluster, so that its
// record outlives the Machine it deletes. Its status is the durable state of the sequence, so a
// controller restart continues where it stopped; `kubectl get machineremediations -A` is the
// operator's dashboard.
//
// While it is Running, spec.escalation, spec.controlPlane and spec.reason cannot change: the running
// plan depends on them. Deleting the request aborts it (undone before its point of no return,
// finished after it).
type MachineRemediation struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec says what to remediate and how. Its fencing cannot change once set: the fence recorded
	// in status.fencing is undone with the backends it was made with.
	// +optional
	// +kubebuilder:validation:XValidation:rule="has(self.fencing) == has(oldSelf.fencing) && (!has(self.fencing) || self.fencing == oldSelf.fencing)",message="spec.fencing is immutable: a fence made with it is undone with the same backends"
	Spec MachineRemediationSpec `json:"spec,omitempty"`

	// status is the progress.
	// +optional
	Status MachineRemediationStatus `json:"status,omitempty"`
}

// GetConditions returns the conditions (for sigs.k8s.io/cluster-api/util/conditions).
func (m *MachineRemediation) GetConditions() []metav1.Condition { return m.Status.Conditions }

// SetConditions sets the conditions (for sigs.k8s.io/cluster-api/util/conditions).
func (m *MachineRemediation) SetConditions(c []metav1.Condition) { m.Status.Conditions = c }

// +kubebuilder:object:root=true

// MachineRemediationList is a list of MachineRemediations.
type MachineRemediationList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []MachineRemediation `json:"items"`
}

// MachineRemediationTemplateResource is the template's content.
type MachineRemediationTemplateResource struct {
	// spec of the MachineRemediations created from this template.
	// +optional
	Spec MachineRemediationSpec `json:"spec,omitempty"`
}

// MachineRemediationTemplateSpec holds the template.
type MachineRemediationTemplateSpec struct {
	// template is copied into each MachineRemediation created from it.
	// +required
	Template MachineRemediationTemplateResource `json:"template"`
}

// +kubebuilder:object:root=true
// +kubebuilder:metadata:labels="cluster.x-k8s.io/v1beta2=v1alpha1"
// clusterctl move carries an object only if an owner-reference chain links it to a Cluster, or if its
// CRD has the clusterctl.cluster.x-k8s.io/move label (cluster-api v1.14.2
// cmd/clusterctl/client/cluster/objectgraph.go:380-385 and getMoveNodes, :674-684). Nothing owns a
// template (neither CAPI's MachineHealthCheck controller nor CAPR's sets an owner on the template it
// references), so without the label a move would leave it behind and the health checks moved with
// their Cluster would reference a template missing on the new management cluster.
// +kubebuilder:metadata:labels="clusterctl.cluster.x-k8s.io/move="
// +kubebuilder:resource:path=machineremediationtemplates,shortName=mrt,scope=Namespaced,categories=cluster-api;capr
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"

// MachineRemediationTemplate is what CAPI's MachineHealthCheck spec.remediation.templateRef (or
// CAPR's) points at: CAPI then creates a MachineRemediation named after each unhealthy Machine.
type MachineRemediationTemplate struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec holds the template.
	// +required
	Spec MachineRemediationTemplateSpec `json:"spec"`
}

// +kubebuilder:object:root=true

// MachineRemediationTemplateList is a list of MachineRemediationTemplates.
type MachineRemediationTemplateList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []MachineRemediationTemplate `json:"items"`
}

// MachineRemediation conditions and reasons.
const (
	// MachineRemediationProgressingCondition is True while the remediation moves, False while it waits; the message
	// says why it waits.
	MachineRemediationProgressingCondition = "Progressing"
	// MachineRemediationSucceededCondition is True when the Machine was replaced.
	MachineRemediationSucceededCondition = "Succeeded"

	// MachineRemediationWaitingForPreconditionsReason: a precondition is not met (the message names it).
	MachineRemediationWaitingForPreconditionsReason = "WaitingForPreconditions"
	// MachineRemediationQuorumLostReason: etcd has lost quorum; nothing automatic is done.
	MachineRemediationQuorumLostReason = "QuorumLost"
	// MachineRemediationNotQuorumSafeReason: the next step would not be quorum-safe now.
	MachineRemediationNotQuorumSafeReason = "NotQuorumSafe"
	// MachineRemediationWouldLoseFailureMarginReason: the only order possible now removes a healthy
	// etcd member first, which would leave no failure margin (3 healthy voters → 2 of 2); the
	// remediation waits. spec.controlPlane.order RemoveMemberFirst accepts that margin.
	MachineRemediationWouldLoseFailureMarginReason = "WouldLoseFailureMargin"
	// MachineRemediationAnotherRemediationInProgressReason: another control-plane remediation of the cluster holds it.
	MachineRemediationAnotherRemediationInProgressReason = "AnotherRemediationInProgress"
	// MachineRemediationRetryLimitReachedReason: maxRetry was reached.
	MachineRemediationRetryLimitReachedReason = "RetryLimitReached"
	// MachineRemediationWaitingForRetryPeriodReason: waiting for retryPeriodSeconds.
	MachineRemediationWaitingForRetryPeriodReason = "WaitingForRetryPeriod"
	// MachineRemediationNoServingControlPlaneReason: etcd is external and no control-plane Machine
	// other than the victim serves the API, so a replacement could not join; nothing is done.
	MachineRemediationNoServingControlPlaneReason = "NoServingControlPlane"
	// MachineRemediationEtcdUnreachableReason: etcd state could not be read; CAPR never guesses.
	MachineRemediationEtcdUnreachableReason = "EtcdUnreachable"
	// MachineRemediationStepInProgressReason: a step was issued and its effect is awaited.
	MachineRemediationStepInProgressReason = "StepInProgress"
	// MachineRemediationNoRemediatorReason: no remediator can handle this Machine (the message says
	// why, e.g. a worker Machine without a MachineSet owner that would replace it); nothing is done.
	MachineRemediationNoRemediatorReason = "NoRemediator"
	// MachineRemediationSucceededReason: done.
	MachineRemediationSucceededReason = "RemediationSucceeded"
	// MachineRemediationStepTimedOutReason: a step did not finish within its timeout (the message says
	// what state the control plane was left in).
	MachineRemediationStepTimedOutReason = "StepTimedOut"
	// MachineRemediationAbortedReason: the request was deleted and the remediation undone.
	MachineRemediationAbortedReason = "Aborted"
	// MachineRemediationPausedReason: the Machine or the control plane is paused
	// (cluster.x-k8s.io/paused); nothing is done until it is not.
	MachineRemediationPausedReason = "Paused"
	// MachineRemediationControlPlaneInitializationUnknownReason: the Cluster says neither that its
	// control plane is initialized nor that it is not; CAPR fails closed and waits.
	MachineRemediationControlPlaneInitializationUnknownReason = "ControlPlaneInitializationUnknown"
	// MachineRemediationDeferredReason: a worker remediation waits because its MachineDeployment's
	// spec.remediation.maxInFlight remediations are already in flight (or others go first).
	MachineRemediationDeferredReason = "RemediationDeferred"
	// MachineRemediationWaitingForFencingReason: the Fence step waits for the fencing backends to
	// confirm (with policy Required the Machine is never deleted before they do).
	MachineRemediationWaitingForFencingReason = "WaitingForFencing"
	// MachineRemediationWaitingForUnfencingReason: the Machine is gone (or the remediation was
	// aborted before deleting it) and the fence of its Node is being undone; with the Machine gone,
	// unfencing waits for the Node to be gone too (its address may go to a new node).
	MachineRemediationWaitingForUnfencingReason = "WaitingForUnfencing"
	// MachineRemediationCannotRemediateReason: the Machine cannot be remediated (message says why).
	MachineRemediationCannotRemediateReason = "CannotRemediate"
	// MachineRemediationMachineNotFoundReason: the Machine the request is named after does not exist
	// and the remediation never started: there is nothing to remediate, and nothing is done. The
	// request waits for the Machine (it may not be in CAPR's cache yet) and goes on if it appears.
	MachineRemediationMachineNotFoundReason = "MachineNotFound"
	// MachineRemediationEscalationObjectNotOwnedReason: an object of the escalation step's kind named
	// after the Machine exists that CAPR did not create for this remediation (its controller is not
	// this MachineRemediation): it is left alone, never deleted, and the step waits for its timeout.
	MachineRemediationEscalationObjectNotOwnedReason = "EscalationObjectNotOwned"
	// MachineRemediationEscalationObjectNotDeletedReason: an escalation step timed out but CAPR may not
	// delete (or read) the object it created for it; the delete is retried for one more step timeout,
	// then the remediation goes on with the object left in place.
	MachineRemediationEscalationObjectNotDeletedReason = "EscalationObjectNotDeleted"
)

func init() {
	objectTypes = append(objectTypes, &MachineRemediation{}, &MachineRemediationList{},
		&MachineRemediationTemplate{}, &MachineRemediationTemplateList{})
}

// Step returns the record of the named step, nil when it was not started.
func (s *MachineRemediationStatus) Step(name StepName) *RemediationStep {
	for i := range s.Steps {
		if s.Steps[i].Name == name {
			return &s.Steps[i]
		}
	}
	return nil
}
