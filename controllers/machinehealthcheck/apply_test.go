package machinehealthcheck

import (
	"testing"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// needsWrite only filters out what applyMark would leave unchanged and what has no request to
// withdraw: it must never skip a write.
func TestNeedsWriteSkipsOnlyUnchangedTargets(t *testing.T) {
	const checker = "ns/hc"
	healthyCond := func(m *clusterv1.Machine) {
		m.Status.Conditions = []metav1.Condition{{Type: caprv1.MachineCAPRHealthCheckSucceededCondition, Status: metav1.ConditionTrue,
			Reason: caprv1.MachineCAPRHealthCheckSucceededReason}}
	}
	marked := func(m *clusterv1.Machine) {
		rec := caprv1.MarkRecord{Reason: "r", Message: "m", Since: metav1.NewTime(now), Checker: checker}
		value, err := rec.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		m.Annotations = map[string]string{caprv1.UnhealthyAnnotation: value}
	}
	tests := []struct {
		name     string
		m        *clusterv1.Machine
		verdict  verdict
		requests map[string]client.Object
		want     bool
	}{
		{name: "healthy, reported healthy, no request", m: machine(healthyCond), verdict: verdictHealthy, want: false},
		{name: "healthy, never reported", m: machine(), verdict: verdictHealthy, want: true},
		{name: "healthy, still marked", m: machine(healthyCond, marked), verdict: verdictHealthy, want: true},
		{name: "healthy, request to withdraw", m: machine(healthyCond), verdict: verdictHealthy,
			requests: map[string]client.Object{"m": &caprv1.MachineRemediation{}}, want: true},
		{name: "unhealthy", m: machine(healthyCond), verdict: verdictUnhealthy, want: true},
		{name: "pending", m: machine(), verdict: verdictPending, want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			ev := evaluation{verdict: tt.verdict, reason: "r", message: "m"}
			g.Expect(needsWrite(tt.m, ev, checker, tt.requests)).To(Equal(tt.want))
			if !tt.want {
				g.Expect(applyMark(tt.m.DeepCopy(), ev, checker)).To(Equal(markUnchanged))
			}
		})
	}
}

func TestForEachParallelCallsEachIndexOnceWithinTheLimit(t *testing.T) {
	g := NewWithT(t)
	const n, limit = 100, 4
	calls := make([]int, n)
	inFlight, most := make(chan struct{}, n), 0
	mu := make(chan struct{}, 1)
	forEachParallel(n, make(chan struct{}, limit), func(i int) {
		inFlight <- struct{}{}
		mu <- struct{}{}
		most = max(most, len(inFlight))
		calls[i]++
		<-mu
		<-inFlight
	})
	for i := range calls {
		g.Expect(calls[i]).To(Equal(1))
	}
	g.Expect(most).To(BeNumerically("<=", limit))
}
