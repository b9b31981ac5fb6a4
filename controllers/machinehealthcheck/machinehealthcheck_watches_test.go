package machinehealthcheck

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A kubelet's periodic status report refreshes lastHeartbeatTime (and may reword a message) without
// changing what a health check evaluates: it must not start a round over every target.
func TestNodeConditionsChangedIgnoresHeartbeats(t *testing.T) {
	t0 := metav1.NewTime(time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC))
	t1 := metav1.NewTime(t0.Add(5 * time.Minute))
	ready := func(status corev1.ConditionStatus, transition, heartbeat metav1.Time, message string) corev1.NodeCondition {
		return corev1.NodeCondition{Type: corev1.NodeReady, Status: status, LastTransitionTime: transition, LastHeartbeatTime: heartbeat,
			Reason: "KubeletReady", Message: message}
	}
	pressure := corev1.NodeCondition{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse, LastTransitionTime: t0, LastHeartbeatTime: t0}
	node := func(conds ...corev1.NodeCondition) *corev1.Node {
		return &corev1.Node{Status: corev1.NodeStatus{Conditions: conds}}
	}
	old := node(pressure, ready(corev1.ConditionTrue, t0, t0, "kubelet is posting ready status"))
	tests := []struct {
		name string
		new  *corev1.Node
		want bool
	}{
		{"heartbeat only", node(pressure, ready(corev1.ConditionTrue, t0, t1, "kubelet is posting ready status")), false},
		{"message reworded", node(pressure, ready(corev1.ConditionTrue, t0, t1, "kubelet is posting ready status, again")), false},
		{"status changed", node(pressure, ready(corev1.ConditionFalse, t1, t1, "kubelet stopped posting")), true},
		{"status unknown", node(pressure, ready(corev1.ConditionUnknown, t1, t1, "")), true},
		{"transition time changed", node(pressure, ready(corev1.ConditionTrue, t1, t1, "kubelet is posting ready status")), true},
		{"condition removed", node(ready(corev1.ConditionTrue, t0, t0, "kubelet is posting ready status")), true},
		{"condition added", node(pressure, ready(corev1.ConditionTrue, t0, t0, "kubelet is posting ready status"),
			corev1.NodeCondition{Type: "NetworkUnavailable", Status: corev1.ConditionFalse}), true},
		{"condition type replaced", node(corev1.NodeCondition{Type: corev1.NodeDiskPressure, Status: corev1.ConditionFalse, LastTransitionTime: t0},
			ready(corev1.ConditionTrue, t0, t0, "kubelet is posting ready status")), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := nodeConditionsChanged(old, tt.new); got != tt.want {
				t.Errorf("nodeConditionsChanged = %v, want %v", got, tt.want)
			}
		})
	}
}
