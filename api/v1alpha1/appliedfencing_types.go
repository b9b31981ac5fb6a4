package v1alpha1

// EventFencingRaised is emitted (Normal) on a MachineRemediation when it starts with a fencing
// stricter than its own spec.fencing because CAPR MachineHealthChecks cover its Machine
// (status.appliedFencing.raisedBy names them): a hand-written request, or one CAPI's
// MachineHealthCheck created from a template without fencing, cannot lower the fencing of the
// Machine's health checks.
const EventFencingRaised = "FencingRaised"

// AppliedFencing is the fencing a remediation applies: the strictest of its spec.fencing and the
// spec.remediation.fencing of every CAPR MachineHealthCheck in its namespace that selects the Machine
// (remediation/fencing Strictest). It is decided when the remediation starts and kept until it ends:
// a fence is undone with the backends it was made with, whatever the health checks say by then.
type AppliedFencing struct {
	// policy is the strictest policy of the request and the health checks (Required, then
	// BestEffort, then Disabled).
	// +required
	Policy FencingPolicy `json:"policy"`

	// backends are the backends of every source whose policy is not Disabled, each once, in the
	// order of the request's, then of the health checks' by name; OutOfServiceTaint last (it must
	// follow the backends that confirm the node no longer writes).
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=8
	Backends []FencingBackend `json:"backends,omitempty"`

	// timeoutSeconds is the longest timeout of those sources (unset: the default of 300); the
	// request's own, also a shorter one, when no health check asks for longer.
	// +optional
	// +kubebuilder:validation:Minimum=1
	TimeoutSeconds *int32 `json:"timeoutSeconds,omitempty"`

	// raisedBy names the MachineHealthChecks whose fencing made the applied fencing stricter than
	// spec.fencing (a stricter policy, another backend or a longer timeout); empty when no health
	// check added anything to spec.fencing.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=253
	RaisedBy []string `json:"raisedBy,omitempty"`
}

// Spec returns the applied fencing as a FencingSpec (nil for nil).
func (a *AppliedFencing) Spec() *FencingSpec {
	if a == nil {
		return nil
	}
	return &FencingSpec{Policy: a.Policy, Backends: a.Backends, TimeoutSeconds: a.TimeoutSeconds}
}
