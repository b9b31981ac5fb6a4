// Package v1alpha1 is the sandbox control-plane provider's API (group
// controlplane.cluster.x-k8s.io): SandboxControlPlane, following CAPI's v1beta2 control-plane
// contract (spec.replicas, spec.version, spec.machineTemplate, status replicas and initialization,
// cluster.x-k8s.io/delete-machine to choose the scale-down victim), and status.observedGeneration as
// KubeadmControlPlane writes it. Like kubeadm, it joins etcd
// members as learners and promotes them once caught up.
//
// +kubebuilder:object:generate=true
// +groupName=controlplane.cluster.x-k8s.io
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// GroupVersion of the sandbox control-plane provider.
var GroupVersion = schema.GroupVersion{Group: "controlplane.cluster.x-k8s.io", Version: "v1alpha1"}

var (
	schemeBuilder = runtime.NewSchemeBuilder(func(s *runtime.Scheme) error {
		s.AddKnownTypes(GroupVersion, &SandboxControlPlane{}, &SandboxControlPlaneList{})
		metav1.AddToGroupVersion(s, GroupVersion)
		return nil
	})
	// AddToScheme registers the types.
	AddToScheme = schemeBuilder.AddToScheme
)

// MachineTemplate is the contract's spec.machineTemplate.
type MachineTemplate struct {
	// spec.infrastructureRef points at a SandboxMachineTemplate.
	Spec MachineTemplateSpec `json:"spec"`
}

// MachineTemplateSpec holds the infrastructure template reference.
type MachineTemplateSpec struct {
	InfrastructureRef clusterv1.ContractVersionedObjectReference `json:"infrastructureRef"`
}

// SandboxControlPlaneSpec is the desired control plane.
type SandboxControlPlaneSpec struct {
	// replicas is the number of control-plane Machines.
	// +kubebuilder:validation:Minimum=1
	Replicas *int32 `json:"replicas"`
	// version is the Kubernetes version.
	Version string `json:"version"`
	// machineTemplate is used for new Machines.
	MachineTemplate MachineTemplate `json:"machineTemplate"`
}

// Initialization is the contract's status.initialization.
type Initialization struct {
	// +optional
	ControlPlaneInitialized *bool `json:"controlPlaneInitialized,omitempty"`
}

// SandboxControlPlaneStatus is the observed state.
type SandboxControlPlaneStatus struct {
	// observedGeneration is the metadata.generation the provider read in its last reconcile that
	// returned no error, written at its end as KubeadmControlPlane's reconciler does (CAPR's undo
	// waits for it: remediation/controlplane/undo.go).
	// +optional
	// +kubebuilder:validation:Minimum=1
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// +optional
	Initialization Initialization `json:"initialization,omitempty,omitzero"`
	// +optional
	Replicas *int32 `json:"replicas,omitempty"`
	// +optional
	ReadyReplicas *int32 `json:"readyReplicas,omitempty"`
	// +optional
	AvailableReplicas *int32 `json:"availableReplicas,omitempty"`
	// +optional
	UpToDateReplicas *int32 `json:"upToDateReplicas,omitempty"`
	// +optional
	Version string `json:"version,omitempty"`
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:metadata:labels="cluster.x-k8s.io/v1beta2=v1alpha1"
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Replicas",type="integer",JSONPath=".spec.replicas"
// +kubebuilder:printcolumn:name="Ready",type="integer",JSONPath=".status.readyReplicas"

// SandboxControlPlane is a sandbox control plane.
type SandboxControlPlane struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              SandboxControlPlaneSpec   `json:"spec,omitempty"`
	Status            SandboxControlPlaneStatus `json:"status,omitempty"`
}

// GetConditions returns the conditions.
func (c *SandboxControlPlane) GetConditions() []metav1.Condition { return c.Status.Conditions }

// SetConditions sets the conditions.
func (c *SandboxControlPlane) SetConditions(conds []metav1.Condition) { c.Status.Conditions = conds }

// +kubebuilder:object:root=true

// SandboxControlPlaneList is a list of SandboxControlPlanes.
type SandboxControlPlaneList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SandboxControlPlane `json:"items"`
}
