package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// MachineHealthCheck conditions and reasons.
const (
	// MachineHealthCheckRemediationAllowedCondition is True when the number of unhealthy targets is within the
	// configured limits (triggerIf and, for control-plane targets, the quorum-safe limit).
	MachineHealthCheckRemediationAllowedCondition = "RemediationAllowed"
	// MachineHealthCheckRemediationAllowedReason is used when remediation is allowed.
	MachineHealthCheckRemediationAllowedReason = "RemediationAllowed"
	// MachineHealthCheckTooManyUnhealthyReason is used when triggerIf short-circuits remediation.
	MachineHealthCheckTooManyUnhealthyReason = "TooManyUnhealthy"
	// MachineHealthCheckEtcdQuorumLostReason is used when the cluster's etcd has lost quorum: nothing
	// automatic is done (disaster recovery is a person's job); the message names the dead members.
	MachineHealthCheckEtcdQuorumLostReason = "EtcdQuorumLost"
	// MachineHealthCheckControlPlaneQuorumLimitReason is used when more control-plane Machines are unhealthy than the
	// quorum-safe limit floor((N-1)/2) allows.
	MachineHealthCheckControlPlaneQuorumLimitReason = "ControlPlaneQuorumLimit"
	// MachineHealthCheckStormCooldownReason is used (on RemediationAllowed and StormCooldown) while the
	// cooldown after a storm runs (spec.remediation.stormCooldownSeconds).
	MachineHealthCheckStormCooldownReason = "StormCooldown"
	// MachineHealthCheckInvalidSelectorReason is used (on RemediationAllowed) when spec.selector does
	// not parse as a label selector: nothing is checked until it is fixed. Admission refuses such a
	// selector; one stored before it did (an older CRD) is reported so.
	MachineHealthCheckInvalidSelectorReason = "InvalidSelector"

	// MachineHealthCheckStormCooldownCondition is True while the cooldown after a remediation storm
	// runs; its lastTransitionTime is when the storm ended. False with reason StormActive during a
	// storm (more unhealthy targets than triggerIf allows), NoStorm otherwise. Only set when
	// spec.remediation.stormCooldownSeconds is.
	MachineHealthCheckStormCooldownCondition = "StormCooldown"
	// MachineHealthCheckStormActiveReason is used while more targets are unhealthy than triggerIf allows.
	MachineHealthCheckStormActiveReason = "StormActive"
	// MachineHealthCheckNoStormReason is used when no storm runs and no cooldown either.
	MachineHealthCheckNoStormReason = "NoStorm"

	// MachineHealthCheckWorkloadClusterReachableCondition is False when the workload cluster's API server cannot be
	// reached; no new Machine is marked while it is False.
	MachineHealthCheckWorkloadClusterReachableCondition = "WorkloadClusterReachable"
	// MachineHealthCheckWorkloadClusterReachableReason is used when the workload cluster can be reached.
	MachineHealthCheckWorkloadClusterReachableReason = "Reachable"
	// MachineHealthCheckWorkloadClusterUnreachableReason is used when the workload cluster cannot be reached.
	MachineHealthCheckWorkloadClusterUnreachableReason = "Unreachable"
	// MachineHealthCheckControlPlaneNotInitializedReason is used before the control plane is initialized.
	MachineHealthCheckControlPlaneNotInitializedReason = "ControlPlaneNotInitialized"

	// MachineHealthCheckRemediationTemplatesValidCondition is True when every template of
	// spec.remediation (templateRef, escalation) exists and has spec.template.spec; False names each
	// problem. Unset when the spec names no template. Informational: remediators report a missing
	// template again when they need it.
	MachineHealthCheckRemediationTemplatesValidCondition = "RemediationTemplatesValid"
	// MachineHealthCheckRemediationTemplatesValidReason is used when every template is valid.
	MachineHealthCheckRemediationTemplatesValidReason = "RemediationTemplatesValid"
	// MachineHealthCheckRemediationTemplateNotFoundReason is used when a template (or its kind) does not exist.
	MachineHealthCheckRemediationTemplateNotFoundReason = "RemediationTemplateNotFound"
	// MachineHealthCheckRemediationTemplateInvalidReason is used when a template cannot be read or is not a template.
	MachineHealthCheckRemediationTemplateInvalidReason = "RemediationTemplateInvalid"

	// MachineHealthCheckTargetsOverlapCondition is True while another CAPR MachineHealthCheck of the
	// same cluster selects some of this health check's targets; its message names the other health
	// checks and one Machine each shares with this one. CAPI forbids overlapping health checks but
	// does not enforce it. CAPR keeps one entry per health check in a Machine's mark (MarkEntries):
	// overlapping health checks never clear each other's marks, and a Machine stays marked while any
	// of them finds it unhealthy. Set by every full pass over the targets (False when no other
	// health check selects any of them); a round over some targets only sets it True.
	MachineHealthCheckTargetsOverlapCondition = "TargetsOverlap"
	// MachineHealthCheckTargetsOverlapReason is used while another health check selects some of the targets.
	MachineHealthCheckTargetsOverlapReason = "TargetsOverlap"
	// MachineHealthCheckNoTargetsOverlapReason is used when no other health check selects any target.
	MachineHealthCheckNoTargetsOverlapReason = "NoTargetsOverlap"

	// MachineHealthCheckPausedCondition mirrors CAPI's Paused condition.
	MachineHealthCheckPausedCondition = "Paused"
)

// Machine condition owned by the health checker, and its reasons. The type is qualified
// so that it never collides with CAPI's HealthCheckSucceeded: KCP and MachineSets act on that one, and
// writing it would make them remediate in parallel with CAPR.
const (
	// MachineCAPRHealthCheckSucceededCondition is the health checker's verdict on a Machine.
	MachineCAPRHealthCheckSucceededCondition = "remediation.cluster.x-k8s.io/HealthCheckSucceeded"

	// MachineCAPRHealthCheckSucceededReason is used when the Machine is healthy.
	MachineCAPRHealthCheckSucceededReason = "HealthCheckSucceeded"
	// MachineCAPRHealthCheckNodeDeletedReason is used when the Machine's Node no longer exists.
	MachineCAPRHealthCheckNodeDeletedReason = "NodeDeleted"
	// MachineCAPRHealthCheckNodeDeletingReason is used when the Machine's Node has been deleting
	// (held by a finalizer) for longer than checks.nodeDeletingTimeoutSeconds.
	MachineCAPRHealthCheckNodeDeletingReason = "NodeDeleting"
	// MachineCAPRHealthCheckNodeStartupTimeoutReason is used when no Node appeared within nodeStartupTimeoutSeconds.
	MachineCAPRHealthCheckNodeStartupTimeoutReason = "NodeStartupTimeout"
	// MachineCAPRHealthCheckUnhealthyNodeReason is used when a Node condition matched for longer than its timeout.
	MachineCAPRHealthCheckUnhealthyNodeReason = "UnhealthyNode"
	// MachineCAPRHealthCheckUnhealthyMachineReason is used when a Machine condition matched for longer than its timeout.
	MachineCAPRHealthCheckUnhealthyMachineReason = "UnhealthyMachine"
	// MachineCAPRHealthCheckUnhealthyEtcdMemberReason is used when the Machine's etcd member failed checks.etcdMember.
	MachineCAPRHealthCheckUnhealthyEtcdMemberReason = "UnhealthyEtcdMember"
	// MachineCAPRHealthCheckManualRequestReason is used for cluster.x-k8s.io/remediate-machine or a hand-written mark.
	MachineCAPRHealthCheckManualRequestReason = "ManualRequest"
)

// Events.
const (
	// EventMachineMarkedUnhealthy is emitted on a Machine when it is marked; its message says when
	// the remediation was requested in the same round (no RemediationRequested event then).
	EventMachineMarkedUnhealthy = "MachineMarkedUnhealthy"
	// EventMachineMarkCleared is emitted on a Machine when its mark is removed.
	EventMachineMarkCleared = "MachineMarkCleared"
	// EventRemediationRestricted is emitted on a MachineHealthCheck when limits stop remediation.
	EventRemediationRestricted = "RemediationRestricted"
	// EventRemediationRequested is emitted on a Machine when its MachineRemediation is created for a
	// mark of an earlier round (e.g. once the limits allow it).
	EventRemediationRequested = "RemediationRequested"
	// EventEtcdQuorumLost is emitted (Warning) on a MachineHealthCheck when its cluster's etcd loses
	// quorum, naming the dead members.
	EventEtcdQuorumLost = "EtcdQuorumLost"
	// EventStormCooldownStarted is emitted on a MachineHealthCheck when a storm ends and its cooldown starts.
	EventStormCooldownStarted = "StormCooldownStarted"
	// EventStormCooldownEnded is emitted on a MachineHealthCheck when the cooldown after a storm is over.
	EventStormCooldownEnded = "StormCooldownEnded"
	// EventTargetsOverlap is emitted (Warning) on a MachineHealthCheck when TargetsOverlap becomes
	// True, naming the other health checks that select some of its targets.
	EventTargetsOverlap = "TargetsOverlap"
	// EventWorkloadClusterUnreachable is emitted when the workload cluster cannot be reached.
	EventWorkloadClusterUnreachable = "WorkloadClusterUnreachable"
	// EventInvalidSelector is emitted (Warning) on a MachineHealthCheck when its spec.selector does
	// not parse.
	EventInvalidSelector = "InvalidSelector"
	// EventRemediationRequestsNotWithdrawn is emitted (Warning) on a MachineHealthCheck being deleted
	// whose remediation requests cannot be listed (their kind does not exist, or CAPR may not list
	// it): the deletion goes on, and any such request left is not withdrawn.
	EventRemediationRequestsNotWithdrawn = "RemediationRequestsNotWithdrawn"
)

// Default values applied by the controller when a field is unset.
const (
	// DefaultNodeStartupTimeoutSeconds matches CAPI's MachineHealthCheck default.
	DefaultNodeStartupTimeoutSeconds int32 = 600
	// DefaultEtcdMemberTimeoutSeconds is checks.etcdMember.timeoutSeconds when unset.
	DefaultEtcdMemberTimeoutSeconds int32 = 300
)

// MachineHealthCheckSpec is CAPI's cluster.x-k8s.io/v1beta2 MachineHealthCheck spec, field for
// field, plus CAPR's additions (checks.etcdMember and remediation.{fencing,controlPlane,escalation}),
// so an existing manifest moves over by changing apiVersion.
// +kubebuilder:validation:XValidation:rule="(has(self.selector.matchLabels) && size(self.selector.matchLabels) > 0) || (has(self.selector.matchExpressions) && size(self.selector.matchExpressions) > 0)",message="selector must not be empty: an empty selector would select every Machine of the cluster",fieldPath=".selector"
// +kubebuilder:validation:XValidation:rule="!has(self.selector.matchLabels) || !('cluster.x-k8s.io/cluster-name' in self.selector.matchLabels) || self.selector.matchLabels['cluster.x-k8s.io/cluster-name'] == self.clusterName",message="selector: matchLabels cluster.x-k8s.io/cluster-name must equal clusterName",fieldPath=".selector"
type MachineHealthCheckSpec struct {
	// clusterName is the name of the Cluster this health check applies to. It cannot be changed: a
	// health check moving to another cluster would carry marks and counts that mean nothing there.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="clusterName is immutable"
	ClusterName string `json:"clusterName"`

	// selector selects the Machines to check, within clusterName. It must not be empty.
	// +required
	Selector MachineSelector `json:"selector"`

	// checks are the conditions that make a Machine unhealthy.
	// +optional
	Checks MachineHealthCheckChecks `json:"checks,omitempty,omitzero"`

	// remediation says when and how unhealthy Machines are remediated.
	// +optional
	Remediation MachineHealthCheckRemediation `json:"remediation,omitempty,omitzero"`
}

// MachineSelector is a metav1.LabelSelector with its rules checked at admission (CAPI checks them in
// a webhook; here the CRD does, so no webhook is needed).
type MachineSelector struct {
	// matchLabels is a map of {key,value} pairs; all must match.
	// +optional
	// +kubebuilder:validation:MaxProperties=32
	// +kubebuilder:validation:XValidation:rule="self.all(k, k.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$'))",message="selector.matchLabels: keys must be valid label keys"
	// +kubebuilder:validation:XValidation:rule="self.all(k, k.indexOf('/') <= 253)",message="selector.matchLabels: keys must be valid label keys (prefix at most 253 characters)"
	MatchLabels map[string]LabelValue `json:"matchLabels,omitempty"`

	// matchExpressions is a list of label selector requirements; all must match.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	MatchExpressions []MachineSelectorRequirement `json:"matchExpressions,omitempty"`
}

// LabelValue is a label value (k8s.io/apimachinery pkg/util/validation IsValidLabelValue). A type of
// its own because only a named type carries a schema for map values: a CEL rule with matches() over
// the values of an unbounded map exceeds the CRD's estimated cost budget, maxLength bounds it.
// +kubebuilder:validation:MaxLength=63
// +kubebuilder:validation:Pattern=`^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$`
type LabelValue string

// MachineSelectorRequirement is a metav1.LabelSelectorRequirement with its rules in the CRD.
// +kubebuilder:validation:XValidation:rule="(self.operator in ['In', 'NotIn']) == (has(self.values) && size(self.values) > 0)",message="values must be non-empty for operators In and NotIn, and empty for Exists and DoesNotExist"
type MachineSelectorRequirement struct {
	// key is the label key the selector applies to.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=316
	// +kubebuilder:validation:XValidation:rule="self.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$') && self.indexOf('/') <= 253",message="key must be a valid label key"
	Key string `json:"key"`
	// operator is In, NotIn, Exists or DoesNotExist.
	// +required
	// +kubebuilder:validation:Enum=In;NotIn;Exists;DoesNotExist
	Operator metav1.LabelSelectorOperator `json:"operator"`
	// values for In and NotIn.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$`
	Values []string `json:"values,omitempty"`
}

// MachineHealthCheckChecks are the checks that make a Machine unhealthy. They are OR-ed.
type MachineHealthCheckChecks struct {
	// nodeStartupTimeoutSeconds is how long a Machine may run without a Node before it is unhealthy,
	// measured as CAPI does from the latest of the Machine's creation and its and the Cluster's
	// infrastructure/control-plane readiness. 0 disables the check; otherwise at least 30 (shorter
	// timeouts remediate Machines that are still booting). Defaults to 600.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:XValidation:rule="self == 0 || self >= 30",message="nodeStartupTimeoutSeconds must be 0 (disabled) or at least 30"
	NodeStartupTimeoutSeconds *int32 `json:"nodeStartupTimeoutSeconds,omitempty"`

	// nodeDeletingTimeoutSeconds: a Machine is unhealthy when its Node has been deleting
	// (metadata.deletionTimestamp set, the Node held by a finalizer) for longer than this, unless the
	// Machine is being deleted itself (its deletion deletes the Node). A Node held like that usually
	// still reports Ready from its last heartbeat. CAPI's MachineHealthCheck has no such check
	// (kubernetes-sigs/cluster-api#13591 asks for one). Unset or 0 disables it.
	// +optional
	// +kubebuilder:validation:Minimum=0
	NodeDeletingTimeoutSeconds *int32 `json:"nodeDeletingTimeoutSeconds,omitempty"`

	// unhealthyNodeConditions: a Machine is unhealthy when its Node has one of these conditions with
	// the given status for longer than timeoutSeconds.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=100
	UnhealthyNodeConditions []UnhealthyNodeCondition `json:"unhealthyNodeConditions,omitempty"`

	// unhealthyMachineConditions: a Machine is unhealthy when it has one of these conditions with the
	// given status for longer than timeoutSeconds. Conditions written by remediation itself (Ready,
	// Available, HealthCheckSucceeded, OwnerRemediated, ExternallyRemediated and CAPR's own
	// remediation.cluster.x-k8s.io/HealthCheckSucceeded) are refused: they would loop.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=100
	UnhealthyMachineConditions []UnhealthyMachineCondition `json:"unhealthyMachineConditions,omitempty"`

	// etcdMember makes a control-plane Machine unhealthy when its etcd member is missing, unreachable,
	// alarmed (NOSPACE/CORRUPT) or stuck as a learner for longer than timeoutSeconds. It does nothing
	// when the cluster's etcd is external (the Machines have no members).
	// +optional
	EtcdMember *EtcdMemberCheck `json:"etcdMember,omitempty"`
}

// UnhealthyNodeCondition is a Node condition that makes a Machine unhealthy after a timeout.
type UnhealthyNodeCondition struct {
	// type of the Node condition, e.g. Ready.
	// +required
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=316
	Type corev1.NodeConditionType `json:"type"`

	// status of the condition that is unhealthy.
	// +required
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Enum=True;False;Unknown
	Status corev1.ConditionStatus `json:"status"`

	// timeoutSeconds the condition must hold before the Machine is unhealthy.
	// +required
	// +kubebuilder:validation:Minimum=0
	TimeoutSeconds *int32 `json:"timeoutSeconds"`
}

// UnhealthyMachineCondition is a Machine condition that makes a Machine unhealthy after a timeout.
type UnhealthyMachineCondition struct {
	// type of the Machine condition.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=316
	// +kubebuilder:validation:Pattern=`^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$`
	// +kubebuilder:validation:XValidation:rule="!(self in ['Ready','Available','HealthCheckSucceeded','OwnerRemediated','ExternallyRemediated','remediation.cluster.x-k8s.io/HealthCheckSucceeded'])",message="type must not be a condition written by remediation (Ready, Available, HealthCheckSucceeded, OwnerRemediated, ExternallyRemediated, remediation.cluster.x-k8s.io/HealthCheckSucceeded)"
	Type string `json:"type"`

	// status of the condition that is unhealthy.
	// +required
	// +kubebuilder:validation:Enum=True;False;Unknown
	Status metav1.ConditionStatus `json:"status"`

	// timeoutSeconds the condition must hold before the Machine is unhealthy.
	// +required
	// +kubebuilder:validation:Minimum=0
	TimeoutSeconds *int32 `json:"timeoutSeconds"`
}

// EtcdMemberCheck configures the etcd member check of control-plane Machines.
type EtcdMemberCheck struct {
	// timeoutSeconds the member must be unhealthy before the Machine is. At least 10, so one slow
	// status call never marks a Machine. Defaults to 300.
	// +optional
	// +kubebuilder:validation:Minimum=10
	TimeoutSeconds *int32 `json:"timeoutSeconds,omitempty"`
}

// MachineHealthCheckRemediation says when and how unhealthy Machines are remediated.
// +kubebuilder:validation:XValidation:rule="!has(self.templateRef) || !has(self.escalation)",message="templateRef and escalation are mutually exclusive: put the template in escalation"
// +kubebuilder:validation:XValidation:rule="!has(self.stormCooldownSeconds) || has(self.triggerIf)",message="stormCooldownSeconds needs triggerIf: a storm is more unhealthy targets than triggerIf allows"
type MachineHealthCheckRemediation struct {
	// triggerIf limits remediation to when few enough targets are unhealthy (a short-circuit against
	// remediation storms). Unset means always. For control-plane targets the quorum-safe limit
	// floor((N-1)/2) of the control plane's desired replicas N applies on top of it.
	// +optional
	TriggerIf *MachineHealthCheckRemediationTriggerIf `json:"triggerIf,omitempty"`

	// stormCooldownSeconds keeps remediation off for this long after a storm ended (medik8s
	// NodeHealthCheck's stormCooldownDuration). A storm is more unhealthy targets than triggerIf
	// allows; when it ends, late health updates of the same incident could otherwise start a second
	// wave at once. During the cooldown, condition StormCooldown is True (its lastTransitionTime is
	// when the storm ended) and RemediationAllowed is False with reason StormCooldown; Machines are
	// still marked, but no remediation is requested. Unset means no cooldown. Requires triggerIf.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=86400
	StormCooldownSeconds *int32 `json:"stormCooldownSeconds,omitempty"`

	// templateRef points at the template of the remediation request created for each unhealthy
	// Machine (named after the Machine, owned by it). A MachineRemediationTemplate gives CAPR's own
	// remediation with its options; any other kind is created as an external remediation request, as
	// CAPI does. Unset means a MachineRemediation with the fencing and controlPlane options below.
	// Its kind ends in Template.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self.kind.endsWith('Template')",message="kind must be a template kind, ending in Template"
	TemplateRef *TemplateReference `json:"templateRef,omitempty"`

	// fencing configures storage fencing before a Machine is deleted.
	// +optional
	Fencing *FencingSpec `json:"fencing,omitempty"`

	// controlPlane configures control-plane remediation (retry limits, ordering).
	// +optional
	ControlPlane *ControlPlaneRemediationSpec `json:"controlPlane,omitempty"`

	// escalation is an ordered list of remediation templates tried, each for its timeout, before the
	// Machine is replaced (e.g. reboot first, then replace).
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=8
	Escalation []EscalationStep `json:"escalation,omitempty"`
}

// MachineHealthCheckRemediationTriggerIf is CAPI's triggerIf.
// +kubebuilder:validation:MinProperties=1
type MachineHealthCheckRemediationTriggerIf struct {
	// unhealthyLessThanOrEqualTo allows remediation only while at most this many targets (an integer,
	// or a percentage of the targets rounded down, e.g. "40%") are unhealthy or not yet started.
	// +optional
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 0 : self.matches('^[0-9]+%$')",message="unhealthyLessThanOrEqualTo must be a non-negative integer or a percentage such as 40%"
	UnhealthyLessThanOrEqualTo *intstr.IntOrString `json:"unhealthyLessThanOrEqualTo,omitempty"`

	// unhealthyInRange allows remediation only while the number of unhealthy targets is within
	// "[min-max]", e.g. "[1-3]". It takes precedence over unhealthyLessThanOrEqualTo.
	// +optional
	// +kubebuilder:validation:MinLength=5
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^\[[0-9]+-[0-9]+\]$`
	// +kubebuilder:validation:XValidation:rule="!self.matches('^\\\\[[0-9]+-[0-9]+\\\\]$') || int(self.substring(1, self.indexOf('-'))) <= int(self.substring(self.indexOf('-') + 1, size(self) - 1))",message="unhealthyInRange: min must be less than or equal to max"
	UnhealthyInRange string `json:"unhealthyInRange,omitempty"`
}

// EscalationStep is one remediation tried before replacement.
type EscalationStep struct {
	// templateRef is the remediation template of this step; its kind ends in Template (the request
	// created from it has the kind without that suffix). Not of CAPR's own group: the object of a
	// MachineRemediationTemplate, named after the Machine, would be the remediation request itself.
	// +required
	// +kubebuilder:validation:XValidation:rule="self.kind.endsWith('Template')",message="kind must be a template kind, ending in Template"
	// +kubebuilder:validation:XValidation:rule="!self.apiVersion.startsWith('remediation.cluster.x-k8s.io/')",message="an escalation step's template is not of CAPR's group remediation.cluster.x-k8s.io: the object made from a MachineRemediationTemplate, named after the Machine, would be the remediation request itself",fieldPath=".apiVersion"
	TemplateRef TemplateReference `json:"templateRef"`

	// timeoutSeconds is how long this step may take before the next one starts. At least 60, so two
	// remediations never run in parallel on one Machine.
	// +required
	// +kubebuilder:validation:Minimum=60
	TimeoutSeconds int32 `json:"timeoutSeconds"`
}

// MachineHealthCheckStatus mirrors CAPI's status plus the quorum-safe control-plane limit. While
// targets change one after another (a storm), the counts and lists (expectedMachines to
// unhealthyMachines) are written at most once per second, the last change included; a change of a
// condition is written at once.
type MachineHealthCheckStatus struct {
	// conditions: RemediationAllowed, WorkloadClusterReachable, StormCooldown, RemediationTemplatesValid, Paused.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=32
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// expectedMachines is the number of targets (skip-remediation and paused Machines excluded).
	// +optional
	ExpectedMachines *int32 `json:"expectedMachines,omitempty"`

	// currentHealthy is the number of healthy targets.
	// +optional
	CurrentHealthy *int32 `json:"currentHealthy,omitempty"`

	// remediationsAllowed is how many more targets may become unhealthy and still be remediated now
	// (triggerIf, capped by the quorum-safe limit when there are control-plane targets); 0 whenever
	// the RemediationAllowed condition is False.
	// +optional
	RemediationsAllowed *int32 `json:"remediationsAllowed,omitempty"`

	// controlPlaneUnhealthyLimit is the effective limit on unhealthy control-plane targets:
	// min(triggerIf limit, floor((N-1)/2)) with N the control plane's desired replicas. Unset when no
	// target is a control-plane Machine.
	// +optional
	ControlPlaneUnhealthyLimit *int32 `json:"controlPlaneUnhealthyLimit,omitempty"`

	// targets are the names of the Machines checked, sorted.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=10000
	Targets []string `json:"targets,omitempty"`

	// unhealthyMachines are the names of the targets currently marked unhealthy, sorted.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=10000
	UnhealthyMachines []string `json:"unhealthyMachines,omitempty"`

	// observedGeneration is the last generation reconciled without error.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:resource:path=machinehealthchecks,shortName=rmhc,scope=Namespaced,categories=cluster-api;capr
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Cluster",type="string",JSONPath=".spec.clusterName",description="Cluster"
// +kubebuilder:printcolumn:name="Expected",type="integer",JSONPath=".status.expectedMachines",description="Number of Machines checked"
// +kubebuilder:printcolumn:name="Healthy",type="integer",JSONPath=".status.currentHealthy",description="Number of healthy Machines"
// +kubebuilder:printcolumn:name="Allowed",type="string",JSONPath=".status.conditions[?(@.type==\"RemediationAllowed\")].status",description="Whether remediation is allowed"
// +kubebuilder:printcolumn:name="Reachable",type="string",JSONPath=".status.conditions[?(@.type==\"WorkloadClusterReachable\")].status",priority=10
// +kubebuilder:printcolumn:name="Paused",type="string",JSONPath=".status.conditions[?(@.type==\"Paused\")].status",priority=10
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"

// MachineHealthCheck checks the Machines of one Cluster and marks the unhealthy ones (condition
// remediation.cluster.x-k8s.io/HealthCheckSucceeded at False). A Machine annotated
// remediation.cluster.x-k8s.io/unhealthy or cluster.x-k8s.io/remediate-machine by a person is marked
// at once.
// It never deletes anything: when remediation is allowed it creates a MachineRemediation per marked
// Machine, which CAPR's remediators act on.
type MachineHealthCheck struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the desired health check.
	// +required
	Spec MachineHealthCheckSpec `json:"spec"`

	// status is the observed state.
	// +optional
	Status MachineHealthCheckStatus `json:"status,omitempty"`
}

// GetConditions returns the conditions (for sigs.k8s.io/cluster-api/util/conditions).
func (m *MachineHealthCheck) GetConditions() []metav1.Condition { return m.Status.Conditions }

// SetConditions sets the conditions (for sigs.k8s.io/cluster-api/util/conditions).
func (m *MachineHealthCheck) SetConditions(c []metav1.Condition) { m.Status.Conditions = c }

// +kubebuilder:object:root=true

// MachineHealthCheckList is a list of MachineHealthChecks.
type MachineHealthCheckList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []MachineHealthCheck `json:"items"`
}

func init() {
	objectTypes = append(objectTypes, &MachineHealthCheck{}, &MachineHealthCheckList{})
}
