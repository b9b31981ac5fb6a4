package sandbox

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// ControlPlaneHealthCheck returns a CAPR MachineHealthCheck for a cluster's control plane, with
// timeouts short enough for the sandbox: a Node not Ready for nodeSeconds, or an etcd member
// unhealthy for 10s, marks the Machine.
func ControlPlaneHealthCheck(namespace, name, cluster string, nodeSeconds int32) *caprv1.MachineHealthCheck {
	return &caprv1.MachineHealthCheck{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: caprv1.MachineHealthCheckSpec{
			ClusterName: cluster,
			Selector:    caprv1.MachineSelector{MatchLabels: map[string]caprv1.LabelValue{clusterv1.MachineControlPlaneLabel: ""}},
			Checks: caprv1.MachineHealthCheckChecks{
				NodeStartupTimeoutSeconds: ptr.To[int32](0),
				UnhealthyNodeConditions: []caprv1.UnhealthyNodeCondition{
					{Type: corev1.NodeReady, Status: corev1.ConditionUnknown, TimeoutSeconds: ptr.To(nodeSeconds)},
					{Type: corev1.NodeReady, Status: corev1.ConditionFalse, TimeoutSeconds: ptr.To(nodeSeconds)},
				},
				EtcdMember: &caprv1.EtcdMemberCheck{TimeoutSeconds: ptr.To[int32](10)},
			},
		},
	}
}

// WorkerHealthCheck returns a CAPR MachineHealthCheck for a cluster's workers (every Machine without
// the control-plane label): a Node not Ready for nodeSeconds marks the Machine.
func WorkerHealthCheck(namespace, name, cluster string, nodeSeconds int32) *caprv1.MachineHealthCheck {
	return &caprv1.MachineHealthCheck{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: caprv1.MachineHealthCheckSpec{
			ClusterName: cluster,
			Selector: caprv1.MachineSelector{MatchExpressions: []caprv1.MachineSelectorRequirement{
				{Key: clusterv1.MachineControlPlaneLabel, Operator: metav1.LabelSelectorOpDoesNotExist}}},
			Checks: caprv1.MachineHealthCheckChecks{
				NodeStartupTimeoutSeconds: ptr.To[int32](0),
				UnhealthyNodeConditions: []caprv1.UnhealthyNodeCondition{
					{Type: corev1.NodeReady, Status: corev1.ConditionUnknown, TimeoutSeconds: ptr.To(nodeSeconds)},
					{Type: corev1.NodeReady, Status: corev1.ConditionFalse, TimeoutSeconds: ptr.To(nodeSeconds)},
				},
			},
		},
	}
}
