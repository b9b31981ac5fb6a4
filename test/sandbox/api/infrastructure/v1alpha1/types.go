// Package v1alpha1 is the sandbox infrastructure provider's API (group
// infrastructure.cluster.x-k8s.io): SandboxCluster, SandboxClusterTemplate (the infrastructure of a
// ClusterClass), SandboxMachine and SandboxMachineTemplate,
// following CAPI's v1beta2 infrastructure contract. A SandboxMachine is "provisioned" by starting a
// kubelet stand-in (and, for control-plane Machines, an etcd member process) on this machine.
//
// +kubebuilder:object:generate=true
// +groupName=infrastructure.cluster.x-k8s.io
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// GroupVersion of the sandbox infrastructure provider.
var GroupVersion = schema.GroupVersion{Group: "infrastructure.cluster.x-k8s.io", Version: "v1alpha1"}

var (
	schemeBuilder = runtime.NewSchemeBuilder(func(s *runtime.Scheme) error {
		s.AddKnownTypes(GroupVersion, &SandboxCluster{}, &SandboxClusterList{}, &SandboxMachine{}, &SandboxMachineList{},
			&SandboxMachineTemplate{}, &SandboxMachineTemplateList{}, &SandboxClusterTemplate{}, &SandboxClusterTemplateList{})
		metav1.AddToGroupVersion(s, GroupVersion)
		return nil
	})
	// AddToScheme registers the types.
	AddToScheme = schemeBuilder.AddToScheme
)

// InitializationStatus is the contract's status.initialization.
type InitializationStatus struct {
	// provisioned is true once the infrastructure is ready.
	// +optional
	Provisioned *bool `json:"provisioned,omitempty"`
}

// SandboxClusterSpec is the infrastructure of a Cluster.
type SandboxClusterSpec struct {
	// controlPlaneEndpoint is the API endpoint (the sandbox's API server).
	// +optional
	ControlPlaneEndpoint clusterv1.APIEndpoint `json:"controlPlaneEndpoint,omitempty,omitzero"`
}

// SandboxClusterStatus is the observed state.
type SandboxClusterStatus struct {
	// +optional
	Initialization InitializationStatus `json:"initialization,omitempty,omitzero"`
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:metadata:labels="cluster.x-k8s.io/v1beta2=v1alpha1"
// +kubebuilder:subresource:status

// SandboxCluster is a sandbox workload cluster's infrastructure.
type SandboxCluster struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              SandboxClusterSpec   `json:"spec,omitempty"`
	Status            SandboxClusterStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// SandboxClusterList is a list of SandboxClusters.
type SandboxClusterList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SandboxCluster `json:"items"`
}

// SandboxMachineSpec is a sandbox host.
type SandboxMachineSpec struct {
	// providerID is sandbox://<node>.
	// +optional
	ProviderID string `json:"providerID,omitempty"`
}

// SandboxMachineStatus is the observed state.
type SandboxMachineStatus struct {
	// +optional
	Initialization InitializationStatus `json:"initialization,omitempty,omitzero"`
	// +optional
	Addresses []clusterv1.MachineAddress `json:"addresses,omitempty"`
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:metadata:labels="cluster.x-k8s.io/v1beta2=v1alpha1"
// +kubebuilder:subresource:status

// SandboxMachine is one sandbox host.
type SandboxMachine struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              SandboxMachineSpec   `json:"spec,omitempty"`
	Status            SandboxMachineStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// SandboxMachineList is a list of SandboxMachines.
type SandboxMachineList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SandboxMachine `json:"items"`
}

// SandboxMachineTemplateResource is the template's content.
type SandboxMachineTemplateResource struct {
	// +optional
	Spec SandboxMachineSpec `json:"spec,omitempty"`
}

// SandboxMachineTemplateSpec holds the template.
type SandboxMachineTemplateSpec struct {
	Template SandboxMachineTemplateResource `json:"template"`
}

// +kubebuilder:object:root=true
// +kubebuilder:metadata:labels="cluster.x-k8s.io/v1beta2=v1alpha1"

// SandboxMachineTemplate is the template of SandboxMachines.
type SandboxMachineTemplate struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              SandboxMachineTemplateSpec `json:"spec"`
}

// +kubebuilder:object:root=true

// SandboxMachineTemplateList is a list of SandboxMachineTemplates.
type SandboxMachineTemplateList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SandboxMachineTemplate `json:"items"`
}

// SandboxClusterTemplateResource is the template's content.
type SandboxClusterTemplateResource struct {
	// +optional
	Spec SandboxClusterSpec `json:"spec,omitempty"`
}

// SandboxClusterTemplateSpec holds the template.
type SandboxClusterTemplateSpec struct {
	Template SandboxClusterTemplateResource `json:"template"`
}

// +kubebuilder:object:root=true
// +kubebuilder:metadata:labels="cluster.x-k8s.io/v1beta2=v1alpha1"

// SandboxClusterTemplate is the template of SandboxClusters: the infrastructure of a ClusterClass.
type SandboxClusterTemplate struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              SandboxClusterTemplateSpec `json:"spec"`
}

// +kubebuilder:object:root=true

// SandboxClusterTemplateList is a list of SandboxClusterTemplates.
type SandboxClusterTemplateList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SandboxClusterTemplate `json:"items"`
}
