package machinehealthcheck

import (
	"testing"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/cluster-api/util/conditions"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// TestDisjointSelectors: only selectors that require one label with different values are known not to
// meet without looking at the Machines.
func TestDisjointSelectors(t *testing.T) {
	hc := func(matchLabels map[string]string) *caprv1.MachineHealthCheck {
		var labels map[string]caprv1.LabelValue
		for k, v := range matchLabels {
			if labels == nil {
				labels = map[string]caprv1.LabelValue{}
			}
			labels[k] = caprv1.LabelValue(v)
		}
		return &caprv1.MachineHealthCheck{Spec: caprv1.MachineHealthCheckSpec{Selector: caprv1.MachineSelector{MatchLabels: labels}}}
	}
	for _, tc := range []struct {
		name string
		a, b map[string]string
		want bool
	}{
		{name: "same pool", a: map[string]string{"pool": "a"}, b: map[string]string{"pool": "a"}},
		{name: "other pool", a: map[string]string{"pool": "a"}, b: map[string]string{"pool": "b"}, want: true},
		{name: "other keys", a: map[string]string{"pool": "a"}, b: map[string]string{"zone": "1"}},
		{name: "one selects all", a: nil, b: map[string]string{"pool": "b"}},
		{name: "one key differs among several", a: map[string]string{"pool": "a", "zone": "1"}, b: map[string]string{"zone": "2"}, want: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			g.Expect(disjoint(hc(tc.a), hc(tc.b))).To(Equal(tc.want))
			g.Expect(disjoint(hc(tc.b), hc(tc.a))).To(Equal(tc.want), "symmetric")
		})
	}
}

// TestTargetsOverlapCondition: a full pass sets TargetsOverlap either way; a round over some targets
// only sets it when it finds an overlap not reported yet, and clears it only when no other health
// check may overlap; the Warning event is recorded once per transition to True, however many rounds
// see the overlap.
func TestTargetsOverlapCondition(t *testing.T) {
	g := NewWithT(t)
	recorder := events.NewFakeRecorder(10)
	r := &Reconciler{recorder: recorder}
	mhc := &caprv1.MachineHealthCheck{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a", UID: "uid-a"}}
	overlap := func() *metav1.Condition { return conditions.Get(mhc, caprv1.MachineHealthCheckTargetsOverlapCondition) }

	r.setTargetsOverlap(mhc, overlapping{possible: true}, false)
	g.Expect(overlap()).To(BeNil(), "a partial round without overlap says nothing")
	r.setTargetsOverlap(mhc, overlapping{possible: true}, true)
	g.Expect(overlap()).To(HaveField("Reason", caprv1.MachineHealthCheckNoTargetsOverlapReason))
	g.Expect(overlap().Status).To(Equal(metav1.ConditionFalse))

	r.setTargetsOverlap(mhc, overlapping{machines: map[string]string{"b": "m1"}, possible: true}, false)
	g.Expect(overlap().Status).To(Equal(metav1.ConditionTrue))
	g.Expect(overlap().Message).To(ContainSubstring("b (Machine m1)"))
	r.setTargetsOverlap(mhc, overlapping{machines: map[string]string{"c": "m2"}, possible: true}, false)
	g.Expect(overlap().Message).To(ContainSubstring("b (Machine m1)"), "a partial round does not rewrite what is reported")
	r.setTargetsOverlap(mhc, overlapping{machines: map[string]string{"c": "m2", "b": "m1"}, possible: true}, true)
	g.Expect(overlap().Message).To(ContainSubstring("b (Machine m1), c (Machine m2)"))
	r.setTargetsOverlap(mhc, overlapping{possible: true}, false)
	g.Expect(overlap().Status).To(Equal(metav1.ConditionTrue), "only a full pass clears it")
	g.Expect(recorder.Events).To(HaveLen(1), "one Warning while the overlap lasts")
	g.Expect(<-recorder.Events).To(And(HavePrefix("Warning "+caprv1.EventTargetsOverlap), ContainSubstring("b (Machine m1)")))

	r.setTargetsOverlap(mhc, overlapping{possible: true}, true)
	g.Expect(overlap().Status).To(Equal(metav1.ConditionFalse))
	r.setTargetsOverlap(mhc, overlapping{machines: map[string]string{"b": "m1"}, possible: true}, true)
	g.Expect(recorder.Events).To(HaveLen(1), "a new overlap is reported again")
	// The other health check is deleted: a partial round that finds no other health check that may
	// overlap clears the condition without waiting for a full pass.
	r.setTargetsOverlap(mhc, overlapping{}, false)
	g.Expect(overlap().Status).To(Equal(metav1.ConditionFalse))
}
