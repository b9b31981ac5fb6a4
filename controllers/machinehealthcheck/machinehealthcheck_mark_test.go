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

// TestApplyMarkWithAnEarlierCAPRsAnnotation: an earlier CAPR marked with the annotation and the
// condition. Its annotation, when it carries this health check's name, is this health check's mark:
// setting the mark again is an update (no second event or metric), not a new mark, and leaves the
// annotation; clearing the mark removes it, so that it is not taken later for a person's request.
func TestApplyMarkWithAnEarlierCAPRsAnnotation(t *testing.T) {
	const checker = "ns/hc"
	unhealthy := evaluation{verdict: verdictUnhealthy, reason: caprv1.MachineCAPRHealthCheckUnhealthyNodeReason, message: "Node not ready"}
	withCondition := func(m *clusterv1.Machine) {
		conditions.Set(m, metav1.Condition{Type: caprv1.MachineCAPRHealthCheckSucceededCondition, Status: metav1.ConditionFalse,
			Reason: unhealthy.reason, Message: "older", LastTransitionTime: metav1.NewTime(now.Add(-10 * time.Minute))})
	}
	withAnnotation := func(m *clusterv1.Machine) {
		rec := caprv1.MarkRecord{Reason: unhealthy.reason, Message: "older", Since: metav1.NewTime(now.Add(-time.Hour)), Checker: checker}
		value, err := rec.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		m.Annotations = map[string]string{caprv1.UnhealthyAnnotation: value}
	}
	for _, tc := range []struct {
		name               string
		m                  *clusterv1.Machine
		wantSet, wantClear markChange
		annotatedAfterSet  bool
	}{
		{name: "nothing", m: machine(), wantSet: markSet, wantClear: markCleared},
		{name: "condition", m: machine(withCondition), wantSet: markUpdated, wantClear: markCleared},
		{name: "annotation only", m: machine(withAnnotation), wantSet: markUpdated, wantClear: markCleared, annotatedAfterSet: true},
		{name: "both", m: machine(withCondition, withAnnotation), wantSet: markUpdated, wantClear: markCleared, annotatedAfterSet: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			g.Expect(setMark(tc.m, unhealthy, checker)).To(Equal(tc.wantSet))
			g.Expect(isMarked(tc.m, checker)).To(BeTrue())
			c := conditions.Get(tc.m, caprv1.MachineCAPRHealthCheckSucceededCondition)
			g.Expect(c).To(HaveField("Status", metav1.ConditionFalse))
			g.Expect(c.Message).To(Equal(unhealthy.message))
			_, annotated := tc.m.Annotations[caprv1.UnhealthyAnnotation]
			g.Expect(annotated).To(Equal(tc.annotatedAfterSet))

			g.Expect(clearMark(tc.m, checker)).To(Equal(tc.wantClear))
			g.Expect(isMarked(tc.m, checker)).To(BeFalse())
			g.Expect(tc.m.Annotations).NotTo(HaveKey(caprv1.UnhealthyAnnotation))
		})
	}
}
