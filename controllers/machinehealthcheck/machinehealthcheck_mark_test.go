package machinehealthcheck

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// TestSetMarkCompletesAHalfMark: the two halves of a mark are two requests, so a crash between them
// leaves one. Completing it is a new mark (its event and metric are not lost) whose annotation takes
// the condition's time; a mark with both halves is an update that keeps its since.
func TestSetMarkCompletesAHalfMark(t *testing.T) {
	const checker = "ns/hc"
	unhealthy := evaluation{verdict: verdictUnhealthy, reason: caprv1.MachineCAPRHealthCheckUnhealthyNodeReason, message: "Node not ready"}
	condSince := metav1.NewTime(now.Add(-10 * time.Minute))
	withCondition := func(m *clusterv1.Machine) {
		conditions.Set(m, metav1.Condition{Type: caprv1.MachineCAPRHealthCheckSucceededCondition, Status: metav1.ConditionFalse,
			Reason: unhealthy.reason, Message: "older", LastTransitionTime: condSince})
	}
	withAnnotation := func(since time.Time) func(*clusterv1.Machine) {
		return func(m *clusterv1.Machine) {
			rec := caprv1.MarkRecord{Reason: unhealthy.reason, Message: "older", Since: metav1.NewTime(since), Checker: checker}
			value, err := rec.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			m.Annotations = map[string]string{caprv1.UnhealthyAnnotation: value}
		}
	}
	for _, tc := range []struct {
		name      string
		m         *clusterv1.Machine
		want      markChange
		wantSince time.Time
	}{
		{name: "nothing", m: machine(), want: markSet, wantSince: now},
		{name: "condition only", m: machine(withCondition), want: markSet, wantSince: condSince.Time},
		{name: "annotation only", m: machine(withAnnotation(now.Add(-time.Hour))), want: markUpdated, wantSince: now.Add(-time.Hour)},
		{name: "both", m: machine(withCondition, withAnnotation(now.Add(-time.Hour))), want: markUpdated, wantSince: now.Add(-time.Hour)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			g.Expect(setMark(tc.m, unhealthy, checker, now)).To(Equal(tc.want))
			rec, ok := ownMark(tc.m, checker)
			g.Expect(ok).To(BeTrue())
			g.Expect(rec.Since.Time).To(BeTemporally("==", tc.wantSince))
			c := conditions.Get(tc.m, caprv1.MachineCAPRHealthCheckSucceededCondition)
			g.Expect(c).To(HaveField("Status", metav1.ConditionFalse))
			g.Expect(c.Message).To(Equal(unhealthy.message))
		})
	}
}
