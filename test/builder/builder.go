// Package builder builds the objects CAPR's tests create: CAPI Machines and MachineSets,
// KubeadmControlPlanes, CAPR MachineHealthChecks and MachineRemediations, and Nodes, each with the
// fields the API requires filled in and the rest set through chained calls, as CAPI's
// internal/test/builder does for its own tests. Build returns a new object each time; nothing is
// created on an API server.
package builder

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// MachineBuilder builds a CAPI Machine.
type MachineBuilder struct {
	m *clusterv1.Machine
}

// Machine starts a Machine of cluster with the CAPI contract's required fields: the cluster name
// label and field, a bootstrap data secret and an infrastructure reference (a SandboxMachine of the
// same name, which the envtest suites do not create).
func Machine(namespace, cluster, name string) *MachineBuilder {
	return &MachineBuilder{m: &clusterv1.Machine{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: namespace,
			Name:      name,
			Labels:    map[string]string{clusterv1.ClusterNameLabel: cluster},
		},
		Spec: clusterv1.MachineSpec{
			ClusterName: cluster,
			Bootstrap:   clusterv1.Bootstrap{DataSecretName: ptr.To(name + "-bootstrap")},
			InfrastructureRef: clusterv1.ContractVersionedObjectReference{
				APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "SandboxMachine", Name: name,
			},
		},
	}}
}

// ControlPlane labels the Machine cluster.x-k8s.io/control-plane.
func (b *MachineBuilder) ControlPlane() *MachineBuilder {
	return b.WithLabels(map[string]string{clusterv1.MachineControlPlaneLabel: ""})
}

// WithLabels adds labels.
func (b *MachineBuilder) WithLabels(labels map[string]string) *MachineBuilder {
	for k, v := range labels {
		b.m.Labels[k] = v
	}
	return b
}

// WithAnnotations adds annotations.
func (b *MachineBuilder) WithAnnotations(annotations map[string]string) *MachineBuilder {
	if len(annotations) == 0 {
		return b
	}
	if b.m.Annotations == nil {
		b.m.Annotations = map[string]string{}
	}
	for k, v := range annotations {
		b.m.Annotations[k] = v
	}
	return b
}

// OwnedByMachineSet makes the MachineSet the Machine's controller, as CAPI's MachineSet controller
// does: what the worker remediator requires before it deletes a Machine (something replaces it).
func (b *MachineBuilder) OwnedByMachineSet(ms *clusterv1.MachineSet) *MachineBuilder {
	b.m.OwnerReferences = []metav1.OwnerReference{{
		APIVersion: clusterv1.GroupVersion.String(), Kind: "MachineSet", Name: ms.Name, UID: ms.UID, Controller: ptr.To(true),
	}}
	return b
}

// Build returns a copy of the Machine.
func (b *MachineBuilder) Build() *clusterv1.Machine { return b.m.DeepCopy() }

// MachineSet returns a MachineSet of cluster with the CAPI contract's required fields, selecting (and
// templating) the Machines labelled with labels; no replicas are asked of anyone (no CAPI controller
// runs in the envtest suites: the remediators only read it).
func MachineSet(namespace, cluster, name string, labels map[string]string) *clusterv1.MachineSet {
	return &clusterv1.MachineSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: map[string]string{clusterv1.ClusterNameLabel: cluster}},
		Spec: clusterv1.MachineSetSpec{
			ClusterName: cluster, Replicas: ptr.To[int32](0),
			Selector: metav1.LabelSelector{MatchLabels: labels},
			Template: clusterv1.MachineTemplateSpec{
				ObjectMeta: clusterv1.ObjectMeta{Labels: labels},
				Spec:       Machine(namespace, cluster, name).Build().Spec,
			},
		},
	}
}

// KubeadmControlPlane returns a KubeadmControlPlane (unstructured) with the fields its CRD requires
// and spec.replicas; no KCP controller runs in the envtest suites, CAPR reads and patches it.
func KubeadmControlPlane(namespace, name string, replicas int32) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "controlplane.cluster.x-k8s.io/v1beta2",
		"kind":       "KubeadmControlPlane",
		"metadata":   map[string]any{"namespace": namespace, "name": name},
		"spec": map[string]any{
			"replicas": int64(replicas),
			"version":  "v1.36.3",
			"machineTemplate": map[string]any{"spec": map[string]any{
				"infrastructureRef": map[string]any{"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "SandboxMachineTemplate", "name": "t"},
			}},
		},
	}}
}

// HealthCheckBuilder builds a CAPR MachineHealthCheck.
type HealthCheckBuilder struct {
	h *caprv1.MachineHealthCheck
}

// HealthCheck starts the MachineHealthCheck name of cluster, with no selector and no checks (the
// API defaults them).
func HealthCheck(namespace, name, cluster string) *HealthCheckBuilder {
	return &HealthCheckBuilder{h: &caprv1.MachineHealthCheck{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec:       caprv1.MachineHealthCheckSpec{ClusterName: cluster},
	}}
}

// Pool selects the Machines labelled pool=<pool>.
func (b *HealthCheckBuilder) Pool(pool string) *HealthCheckBuilder {
	b.h.Spec.Selector = caprv1.MachineSelector{MatchLabels: map[string]caprv1.LabelValue{"pool": caprv1.LabelValue(pool)}}
	return b
}

// NodeNotReadyFor makes a target unhealthy once its Node's Ready has been False or Unknown for
// seconds, with no node startup timeout.
func (b *HealthCheckBuilder) NodeNotReadyFor(seconds int32) *HealthCheckBuilder {
	b.h.Spec.Checks.NodeStartupTimeoutSeconds = ptr.To[int32](0)
	b.h.Spec.Checks.UnhealthyNodeConditions = []caprv1.UnhealthyNodeCondition{
		{Type: corev1.NodeReady, Status: corev1.ConditionFalse, TimeoutSeconds: ptr.To(seconds)},
		{Type: corev1.NodeReady, Status: corev1.ConditionUnknown, TimeoutSeconds: ptr.To(seconds)},
	}
	return b
}

// Build returns a copy of the MachineHealthCheck.
func (b *HealthCheckBuilder) Build() *caprv1.MachineHealthCheck { return b.h.DeepCopy() }

// MachineRemediationBuilder builds a CAPR MachineRemediation.
type MachineRemediationBuilder struct {
	r *caprv1.MachineRemediation
}

// MachineRemediation starts the request name (named after its Machine, as the health checker names
// it) of cluster: labelled with the cluster, source HealthCheck, reason UnhealthyNode.
func MachineRemediation(namespace, cluster, name string) *MachineRemediationBuilder {
	return &MachineRemediationBuilder{r: &caprv1.MachineRemediation{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: namespace, Name: name,
			Labels: map[string]string{clusterv1.ClusterNameLabel: cluster},
		},
		Spec: caprv1.MachineRemediationSpec{Source: caprv1.MachineRemediationSourceHealthCheck, Reason: "UnhealthyNode"},
	}}
}

// OwnedByMachine makes the Machine the request's owner, as the health checker does.
func (b *MachineRemediationBuilder) OwnedByMachine(m *clusterv1.Machine) *MachineRemediationBuilder {
	return b.ownedBy("Machine", m.Name, m.UID)
}

// OwnedByCluster makes the Cluster the request's owner, as a remediator does once it has finished.
func (b *MachineRemediationBuilder) OwnedByCluster(c *clusterv1.Cluster) *MachineRemediationBuilder {
	return b.ownedBy("Cluster", c.Name, c.UID)
}

func (b *MachineRemediationBuilder) ownedBy(kind, name string, uid types.UID) *MachineRemediationBuilder {
	b.r.OwnerReferences = []metav1.OwnerReference{{APIVersion: clusterv1.GroupVersion.String(), Kind: kind, Name: name, UID: uid}}
	return b
}

// Source sets who asked for the remediation.
func (b *MachineRemediationBuilder) Source(source caprv1.RemediationSource) *MachineRemediationBuilder {
	b.r.Spec.Source = source
	return b
}

// Fencing sets the fencing policy.
func (b *MachineRemediationBuilder) Fencing(spec *caprv1.FencingSpec) *MachineRemediationBuilder {
	b.r.Spec.Fencing = spec
	return b
}

// Build returns a copy of the MachineRemediation.
func (b *MachineRemediationBuilder) Build() *caprv1.MachineRemediation { return b.r.DeepCopy() }

// NodeBuilder builds a Node.
type NodeBuilder struct {
	n *corev1.Node
}

// Node starts a Node with no status.
func Node(name string) *NodeBuilder {
	return &NodeBuilder{n: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}}
}

// Ready sets the Node's Ready condition to status, last changed and last heard of at since.
func (b *NodeBuilder) Ready(status corev1.ConditionStatus, since time.Time) *NodeBuilder {
	b.n.Status.Conditions = []corev1.NodeCondition{{
		Type: corev1.NodeReady, Status: status, Reason: "Sandbox",
		LastTransitionTime: metav1.NewTime(since), LastHeartbeatTime: metav1.NewTime(since),
	}}
	return b
}

// Build returns a copy of the Node.
func (b *NodeBuilder) Build() *corev1.Node { return b.n.DeepCopy() }
