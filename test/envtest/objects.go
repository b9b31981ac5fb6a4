package envtest

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/cluster-api/util/kubeconfig"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/test/builder"
)

// CreateNamespace creates a namespace with a generated name.
func CreateNamespace(ctx context.Context, c client.Client, prefix string) (string, error) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"}}
	if err := c.Create(ctx, ns); err != nil {
		return "", fmt.Errorf("creating namespace: %w", err)
	}
	return ns.Name, nil
}

// NewCluster returns a v1beta2 Cluster whose control plane is the given reference (may be empty).
func NewCluster(namespace, name string, controlPlane clusterv1.ContractVersionedObjectReference) *clusterv1.Cluster {
	return &clusterv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: clusterv1.ClusterSpec{
			ControlPlaneEndpoint: clusterv1.APIEndpoint{Host: "127.0.0.1", Port: 6443},
			ControlPlaneRef:      controlPlane,
		},
	}
}

// ClusterStatus is what SetClusterStatus reports about a Cluster.
type ClusterStatus int

const (
	// ControlPlaneInitialized means infrastructure ready and the control plane initialized.
	ControlPlaneInitialized ClusterStatus = iota
	// InfrastructureReadyOnly means infrastructure ready, the control plane not initialized yet.
	InfrastructureReadyOnly
)

// SetClusterReady sets the Cluster's InfrastructureReady and ControlPlaneInitialized conditions (and
// status.initialization) as CAPI's Cluster controller would.
func SetClusterReady(ctx context.Context, c client.Client, cluster *clusterv1.Cluster, state ClusterStatus) error {
	initialized := state == ControlPlaneInitialized
	base := cluster.DeepCopy()
	conditions.Set(cluster, metav1.Condition{Type: clusterv1.ClusterInfrastructureReadyCondition, Status: metav1.ConditionTrue, Reason: "Ready"})
	status := metav1.ConditionFalse
	if initialized {
		status = metav1.ConditionTrue
	}
	conditions.Set(cluster, metav1.Condition{Type: clusterv1.ClusterControlPlaneInitializedCondition, Status: status, Reason: "Sandbox"})
	cluster.Status.Initialization.InfrastructureProvisioned = ptr.To(true)
	cluster.Status.Initialization.ControlPlaneInitialized = ptr.To(initialized)
	if err := c.Status().Patch(ctx, cluster, client.MergeFrom(base)); err != nil {
		return fmt.Errorf("setting Cluster %s ready: %w", cluster.Name, err)
	}
	return nil
}

// CreateKubeconfigSecret writes secret <cluster>-kubeconfig pointing at cfg's API server, which then
// serves as the cluster's workload cluster.
func CreateKubeconfigSecret(ctx context.Context, c client.Client, cfg *rest.Config, cluster *clusterv1.Cluster) error {
	secret := kubeconfig.GenerateSecret(cluster, kubeconfig.FromEnvTestConfig(cfg, cluster))
	if err := c.Create(ctx, secret); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating kubeconfig secret of %s: %w", cluster.Name, err)
	}
	return nil
}

// NewMachine returns a Machine of cluster with the CAPI contract's required fields (builder.Machine).
func NewMachine(namespace, cluster, name string, opts ...MachineOption) *clusterv1.Machine {
	m := builder.Machine(namespace, cluster, name).Build()
	for _, o := range opts {
		o(m)
	}
	return m
}

// MachineOption changes a Machine made by NewMachine.
type MachineOption func(*clusterv1.Machine)

// AsControlPlane labels the Machine cluster.x-k8s.io/control-plane.
func AsControlPlane(m *clusterv1.Machine) { m.Labels[clusterv1.MachineControlPlaneLabel] = "" }

// SetMachineNode sets the Machine's nodeRef and InfrastructureReady condition, as CAPI's Machine
// controller would once the Node exists.
func SetMachineNode(ctx context.Context, c client.Client, m *clusterv1.Machine, node string) error {
	base := m.DeepCopy()
	m.Status.NodeRef = clusterv1.MachineNodeReference{Name: node}
	conditions.Set(m, metav1.Condition{Type: clusterv1.MachineInfrastructureReadyCondition, Status: metav1.ConditionTrue, Reason: "Ready"})
	if err := c.Status().Patch(ctx, m, client.MergeFrom(base)); err != nil {
		return fmt.Errorf("setting nodeRef of Machine %s: %w", m.Name, err)
	}
	return nil
}

// NewNode returns a Node with a Ready condition of the given status, last changed at since.
func NewNode(name string, ready corev1.ConditionStatus, since time.Time) *corev1.Node {
	return builder.Node(name).Ready(ready, since).Build()
}

// CreateNode creates a Node and sets its status (status is ignored on create).
func CreateNode(ctx context.Context, c client.Client, node *corev1.Node) error {
	status := node.Status
	if err := c.Create(ctx, node); err != nil {
		return fmt.Errorf("creating Node %s: %w", node.Name, err)
	}
	node.Status = status
	if err := c.Status().Update(ctx, node); err != nil {
		return fmt.Errorf("setting status of Node %s: %w", node.Name, err)
	}
	return nil
}

// SetNodeReady sets the Node's Ready condition, as the kubelet or the node lifecycle controller would.
func SetNodeReady(ctx context.Context, c client.Client, name string, ready corev1.ConditionStatus) error {
	return SetNodeCondition(ctx, c, name, corev1.NodeReady, ready)
}

// SetNodeCondition sets one condition of the Node (added when missing), as the kubelet would.
func SetNodeCondition(ctx context.Context, c client.Client, name string, condition corev1.NodeConditionType, status corev1.ConditionStatus) error {
	node := &corev1.Node{}
	if err := c.Get(ctx, client.ObjectKey{Name: name}, node); err != nil {
		return fmt.Errorf("reading Node %s: %w", name, err)
	}
	base := node.DeepCopy()
	now := metav1.Now()
	found := false
	for i := range node.Status.Conditions {
		if node.Status.Conditions[i].Type == condition {
			found = true
			if node.Status.Conditions[i].Status != status {
				node.Status.Conditions[i].LastTransitionTime = now
			}
			node.Status.Conditions[i].Status = status
			node.Status.Conditions[i].LastHeartbeatTime = now
		}
	}
	if !found {
		node.Status.Conditions = append(node.Status.Conditions, corev1.NodeCondition{
			Type: condition, Status: status, Reason: "Sandbox", LastTransitionTime: now, LastHeartbeatTime: now,
		})
	}
	if err := c.Status().Patch(ctx, node, client.MergeFrom(base)); err != nil {
		return fmt.Errorf("setting %s=%s on Node %s: %w", condition, status, name, err)
	}
	return nil
}

// NewHealthCheck returns CAPR's MachineHealthCheck "hc" of cluster over the Machines labelled
// pool=<pool>: a target is unhealthy once its Node's Ready is False or Unknown for timeoutSeconds;
// no node startup timeout.
func NewHealthCheck(namespace, cluster, pool string, timeoutSeconds int32) *caprv1.MachineHealthCheck {
	return builder.HealthCheck(namespace, "hc", cluster).Pool(pool).NodeNotReadyFor(timeoutSeconds).Build()
}
