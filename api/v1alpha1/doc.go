// Package v1alpha1 contains the CAPR API, group remediation.cluster.x-k8s.io, version v1alpha1:
// MachineHealthCheck (marks unhealthy Machines), MachineRemediation (one per Machine being
// remediated, its status is the durable state of the remediation) and MachineRemediationTemplate
// (what CAPI's own MachineHealthCheck points spec.remediation.templateRef at).
//
// +kubebuilder:object:generate=true
// +groupName=remediation.cluster.x-k8s.io
package v1alpha1
