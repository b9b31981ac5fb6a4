package machinehealthcheck

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/event"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// A kubelet's periodic status report refreshes lastHeartbeatTime (and may reword a message) without
// changing what a health check evaluates: it must not start a round over every target.
func TestNodeEvaluationChangedIgnoresHeartbeats(t *testing.T) {
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
		{"deletion started (checks.nodeDeletingTimeoutSeconds)", func() *corev1.Node {
			n := node(pressure, ready(corev1.ConditionTrue, t0, t0, "kubelet is posting ready status"))
			n.DeletionTimestamp = ptr.To(t1)
			return n
		}(), true},
	}
	pred := nodeChanged() // what watchClusterNodes installs
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := pred.Update(event.UpdateEvent{ObjectOld: old, ObjectNew: tt.new}); got != tt.want {
				t.Errorf("Update event passes = %v, want %v", got, tt.want)
			}
		})
	}
	if !pred.Create(event.CreateEvent{Object: old}) || !pred.Delete(event.DeleteEvent{Object: old}) {
		t.Error("a Node created or deleted must start a round")
	}
}

// A round patches the health check's status; that update must not start another round over every
// target. Anything else a round depends on must.
func TestHealthCheckChangedIgnoresItsOwnStatus(t *testing.T) {
	now := metav1.Now()
	base := &caprv1.MachineHealthCheck{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "hc", Generation: 2,
		Labels: map[string]string{"cluster.x-k8s.io/cluster-name": "c1"}, Finalizers: []string{Finalizer},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "cluster.x-k8s.io/v1beta2", Kind: "Cluster", Name: "c1", UID: "u1"}}}}
	tests := []struct {
		name   string
		change func(*caprv1.MachineHealthCheck)
		want   bool
	}{
		{"status only", func(m *caprv1.MachineHealthCheck) {
			m.Status.CurrentHealthy = ptr.To[int32](3)
			m.Status.Conditions = []metav1.Condition{{Type: caprv1.MachineHealthCheckRemediationAllowedCondition, Status: metav1.ConditionTrue}}
			m.ResourceVersion = "2"
		}, false},
		{"spec (generation)", func(m *caprv1.MachineHealthCheck) { m.Generation = 3 }, true},
		{"paused annotation", func(m *caprv1.MachineHealthCheck) {
			m.Annotations = map[string]string{clusterv1.PausedAnnotation: ""}
		}, true},
		{"finalizer removed", func(m *caprv1.MachineHealthCheck) { m.Finalizers = nil }, true},
		{"label changed", func(m *caprv1.MachineHealthCheck) { m.Labels = map[string]string{"x": "y"} }, true},
		{"owner changed", func(m *caprv1.MachineHealthCheck) { m.OwnerReferences = nil }, true},
		{"deletion", func(m *caprv1.MachineHealthCheck) { m.DeletionTimestamp = &now }, true},
	}
	pred := healthCheckChanged()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := base.DeepCopy()
			tt.change(n)
			if got := pred.Update(event.UpdateEvent{ObjectOld: base, ObjectNew: n}); got != tt.want {
				t.Errorf("Update event passes = %v, want %v", got, tt.want)
			}
		})
	}
}
