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
			g.Expect(caprv1.MarkEntriesFromMessage(c.Message)).To(Equal(caprv1.MarkEntries{{Checker: checker, Reason: unhealthy.reason, Message: unhealthy.message}}))
			_, annotated := tc.m.Annotations[caprv1.UnhealthyAnnotation]
			g.Expect(annotated).To(Equal(tc.annotatedAfterSet))

			g.Expect(clearMark(tc.m, checker)).To(Equal(tc.wantClear))
			g.Expect(isMarked(tc.m, checker)).To(BeFalse())
			g.Expect(tc.m.Annotations).NotTo(HaveKey(caprv1.UnhealthyAnnotation))
		})
	}
}

// TestOverlappingMarks: two health checks over one Machine each write and clear only their own entry
// of the mark; the Machine stays marked (the condition at False, since kept) while any entry is left,
// and a health check that finds it healthy leaves another's mark alone without writing. A mark
// written before marks named their health checks is taken by whichever health check comes first.
func TestOverlappingMarks(t *testing.T) {
	const a, b = "ns/a", "ns/b"
	since := metav1.NewTime(now.Add(-time.Hour))
	entryA := caprv1.MarkEntry{Checker: a, Reason: caprv1.MachineCAPRHealthCheckUnhealthyNodeReason, Message: "Ready=Unknown"}
	entryB := caprv1.MarkEntry{Checker: b, Reason: caprv1.MachineCAPRHealthCheckUnhealthyMachineReason, Message: "DiskPressure"}
	marked := func(entries ...caprv1.MarkEntry) func(*clusterv1.Machine) {
		return func(m *clusterv1.Machine) {
			message, err := caprv1.MarkEntries(entries).Marshal()
			if err != nil {
				t.Fatal(err)
			}
			conditions.Set(m, metav1.Condition{Type: caprv1.MachineCAPRHealthCheckSucceededCondition, Status: metav1.ConditionFalse,
				Reason: entries[0].Reason, Message: message, LastTransitionTime: since})
		}
	}
	unparsed := func(m *clusterv1.Machine) {
		conditions.Set(m, metav1.Condition{Type: caprv1.MachineCAPRHealthCheckSucceededCondition, Status: metav1.ConditionFalse,
			Reason: caprv1.MachineCAPRHealthCheckUnhealthyNodeReason, Message: "Node not ready", LastTransitionTime: since})
	}
	healthy := func(m *clusterv1.Machine) {
		conditions.Set(m, metav1.Condition{Type: caprv1.MachineCAPRHealthCheckSucceededCondition, Status: metav1.ConditionTrue,
			Reason: caprv1.MachineCAPRHealthCheckSucceededReason, LastTransitionTime: since})
	}
	unhealthyA := evaluation{verdict: verdictUnhealthy, reason: entryA.Reason, message: entryA.Message}
	for _, tc := range []struct {
		name string
		m    *clusterv1.Machine
		ev   evaluation // of health check a
		want markChange
		// wantEntries nil: the condition is True (healthy).
		wantEntries caprv1.MarkEntries
		wantWrite   bool // needsWrite
		sinceKept   bool
	}{
		{name: "a marks a healthy Machine", m: machine(healthy), ev: unhealthyA, want: markSet, wantEntries: caprv1.MarkEntries{entryA}, wantWrite: true},
		{name: "a marks a Machine b marked: b's entry and since kept", m: machine(marked(entryB)), ev: unhealthyA, want: markSet,
			wantEntries: caprv1.MarkEntries{entryB, entryA}, wantWrite: true, sinceKept: true},
		{name: "a finds healthy a Machine only b marked: nothing to write", m: machine(marked(entryB)), ev: evaluation{verdict: verdictHealthy},
			want: markUnchanged, wantEntries: caprv1.MarkEntries{entryB}, sinceKept: true},
		{name: "a clears its entry, b's stays", m: machine(marked(entryB, entryA)), ev: evaluation{verdict: verdictHealthy}, want: markCleared,
			wantEntries: caprv1.MarkEntries{entryB}, wantWrite: true, sinceKept: true},
		{name: "a clears the first entry: the reason becomes b's", m: machine(marked(entryA, entryB)), ev: evaluation{verdict: verdictHealthy},
			want: markCleared, wantEntries: caprv1.MarkEntries{entryB}, wantWrite: true, sinceKept: true},
		{name: "a's entry unchanged", m: machine(marked(entryB, entryA)), ev: unhealthyA, want: markUnchanged,
			wantEntries: caprv1.MarkEntries{entryB, entryA}, wantWrite: true, sinceKept: true},
		{name: "a's entry updated in place", m: machine(marked(entryA, entryB)),
			ev: evaluation{verdict: verdictUnhealthy, reason: caprv1.MachineCAPRHealthCheckNodeDeletedReason, message: "gone"}, want: markUpdated,
			wantEntries: caprv1.MarkEntries{{Checker: a, Reason: caprv1.MachineCAPRHealthCheckNodeDeletedReason, Message: "gone"}, entryB},
			wantWrite:   true, sinceKept: true},
		{name: "a clears the last entry", m: machine(marked(entryA)), ev: evaluation{verdict: verdictHealthy}, want: markCleared, wantWrite: true},
		{name: "pending leaves both", m: machine(marked(entryB, entryA)), ev: evaluation{verdict: verdictPending}, want: markUnchanged,
			wantEntries: caprv1.MarkEntries{entryB, entryA}, sinceKept: true},
		{name: "an unparsed mark is a's to clear", m: machine(unparsed), ev: evaluation{verdict: verdictHealthy}, want: markCleared, wantWrite: true},
		{name: "an unparsed mark is a's to replace", m: machine(unparsed), ev: unhealthyA, want: markUpdated,
			wantEntries: caprv1.MarkEntries{entryA}, wantWrite: true, sinceKept: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			g.Expect(needsWrite(tc.m, tc.ev, a, nil)).To(Equal(tc.wantWrite), "needsWrite")
			g.Expect(applyMark(tc.m, tc.ev, a)).To(Equal(tc.want))
			c := conditions.Get(tc.m, caprv1.MachineCAPRHealthCheckSucceededCondition)
			g.Expect(c).NotTo(BeNil())
			if tc.wantEntries == nil {
				g.Expect(c.Status).To(Equal(metav1.ConditionTrue))
				return
			}
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Reason).To(Equal(tc.wantEntries[0].Reason))
			g.Expect(caprv1.MarkEntriesFromMessage(c.Message)).To(Equal(tc.wantEntries))
			g.Expect(c.LastTransitionTime.Equal(&since)).To(Equal(tc.sinceKept), "since")
			g.Expect(markedByOthers(tc.m, a)).To(Equal(len(tc.wantEntries.Without(a)) > 0))
		})
	}
}

// TestOverlappingMarksSettle: two health checks over one Machine that a person marked by hand (an
// UnhealthyAnnotation that is not JSON: its text is the entry's message, foreignMark) write the
// Machine once each, and from then on neither changes anything, also when the message ends with
// newlines (a YAML block scalar "|+"). Each writes its entry into the entries the other wrote, so
// text that does not read back as it was written would be rewritten by each in turn without end; it
// did when the mark's message kept one trailing newline of several (FuzzMarkEntriesFromMessage).
func TestOverlappingMarksSettle(t *testing.T) {
	for _, message := range []string{"disk is failing", "disk is failing\n", "disk is failing\n\n", "\n", "two\nlines\n\n\n"} {
		g := NewWithT(t)
		m := machine()
		ev := evaluation{verdict: verdictUnhealthy, reason: caprv1.MachineCAPRHealthCheckManualRequestReason, message: message}
		for round := range 4 {
			for _, checker := range []string{"ns/a", "ns/b"} {
				change, err := applyMark(m, ev, checker)
				g.Expect(err).NotTo(HaveOccurred())
				if round > 0 {
					g.Expect(change).To(Equal(markUnchanged), "message %q, round %d, %s rewrote the mark: %q", message, round, checker,
						conditions.Get(m, caprv1.MachineCAPRHealthCheckSucceededCondition).Message)
				}
			}
		}
	}
}

// TestUnmark: a health check being deleted removes its entry only; the condition goes with the
// last entry, and an unparsed mark only from the Machines the health check selects.
func TestUnmark(t *testing.T) {
	const a, b = "ns/a", "ns/b"
	entryA := caprv1.MarkEntry{Checker: a, Reason: caprv1.MachineCAPRHealthCheckUnhealthyNodeReason, Message: "Ready=Unknown"}
	entryB := caprv1.MarkEntry{Checker: b, Reason: caprv1.MachineCAPRHealthCheckUnhealthyMachineReason, Message: "DiskPressure"}
	marked := func(message string) func(*clusterv1.Machine) {
		return func(m *clusterv1.Machine) {
			conditions.Set(m, metav1.Condition{Type: caprv1.MachineCAPRHealthCheckSucceededCondition, Status: metav1.ConditionFalse,
				Reason: caprv1.MachineCAPRHealthCheckUnhealthyNodeReason, Message: message})
		}
	}
	msg := func(entries ...caprv1.MarkEntry) string {
		s, err := caprv1.MarkEntries(entries).Marshal()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	for _, tc := range []struct {
		name        string
		m           *clusterv1.Machine
		selected    bool
		wantChanged bool
		// wantMessage "" means the condition is removed.
		wantMessage string
	}{
		{name: "b's entry stays", m: machine(marked(msg(entryA, entryB))), selected: true, wantChanged: true, wantMessage: msg(entryB)},
		{name: "the last entry takes the condition", m: machine(marked(msg(entryA))), selected: true, wantChanged: true},
		{name: "only b's: untouched", m: machine(marked(msg(entryB))), selected: true, wantMessage: msg(entryB)},
		{name: "a's entry on a Machine no longer selected", m: machine(marked(msg(entryB, entryA))), wantChanged: true, wantMessage: msg(entryB)},
		{name: "unparsed, selected", m: machine(marked("Node not ready")), selected: true, wantChanged: true},
		{name: "unparsed, not selected", m: machine(marked("Node not ready")), wantMessage: "Node not ready"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			g.Expect(unmark(tc.m, a, tc.selected)).To(Equal(tc.wantChanged))
			c := conditions.Get(tc.m, caprv1.MachineCAPRHealthCheckSucceededCondition)
			if tc.wantMessage == "" {
				g.Expect(c).To(BeNil())
				return
			}
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Message).To(Equal(tc.wantMessage))
		})
	}
}

func TestApplyMark(t *testing.T) {
	g := NewWithT(t)
	unhealthy := evaluation{verdict: verdictUnhealthy, reason: caprv1.MachineCAPRHealthCheckUnhealthyNodeReason, message: "Ready=False"}
	m := machine()
	mark := func() *metav1.Condition { return conditions.Get(m, caprv1.MachineCAPRHealthCheckSucceededCondition) }

	g.Expect(applyMark(m, unhealthy, "ns/hc")).To(Equal(markSet))
	g.Expect(mark()).To(HaveField("Status", metav1.ConditionFalse))
	g.Expect(mark().Reason).To(Equal(unhealthy.reason))
	g.Expect(caprv1.MarkEntriesFromMessage(mark().Message)).To(Equal(caprv1.MarkEntries{{Checker: "ns/hc", Reason: unhealthy.reason, Message: unhealthy.message}}))
	g.Expect(m.Annotations).NotTo(HaveKey(caprv1.UnhealthyAnnotation), "the mark is the condition alone: one write")
	since := metav1.NewTime(now.Add(-time.Hour))
	mark().LastTransitionTime = since
	// Same verdict later: nothing to write.
	g.Expect(applyMark(m, unhealthy, "ns/hc")).To(Equal(markUnchanged))
	// New reason: updated, since (the condition's lastTransitionTime) kept.
	g.Expect(applyMark(m, evaluation{verdict: verdictUnhealthy, reason: caprv1.MachineCAPRHealthCheckNodeDeletedReason, message: "gone"}, "ns/hc")).To(Equal(markUpdated))
	g.Expect(mark().Reason).To(Equal(caprv1.MachineCAPRHealthCheckNodeDeletedReason))
	g.Expect(mark().LastTransitionTime.Time).To(BeTemporally("==", since.Time))
	// Pending leaves the mark alone.
	g.Expect(applyMark(m, evaluation{verdict: verdictPending}, "ns/hc")).To(Equal(markUnchanged))
	// Healthy clears it.
	g.Expect(applyMark(m, evaluation{verdict: verdictHealthy}, "ns/hc")).To(Equal(markCleared))
	g.Expect(mark()).To(HaveField("Status", metav1.ConditionTrue))
	g.Expect(applyMark(m, evaluation{verdict: verdictHealthy}, "ns/hc")).To(Equal(markUnchanged))

	// Someone else's annotation is never rewritten nor cleared.
	foreign := machine(func(m *clusterv1.Machine) {
		m.Annotations = map[string]string{caprv1.UnhealthyAnnotation: `{"reason":"ManualRequest","checker":"alice"}`}
	})
	g.Expect(applyMark(foreign, unhealthy, "ns/hc")).Error().NotTo(HaveOccurred())
	g.Expect(applyMark(foreign, evaluation{verdict: verdictHealthy}, "ns/hc")).Error().NotTo(HaveOccurred())
	g.Expect(foreign.Annotations[caprv1.UnhealthyAnnotation]).To(Equal(`{"reason":"ManualRequest","checker":"alice"}`))
}
