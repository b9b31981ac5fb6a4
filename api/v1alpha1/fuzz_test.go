package v1alpha1_test

import (
	"strconv"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// The annotation codecs read text anyone who can annotate a Machine or a control-plane object may
// write. Each fuzz target checks that parsing never panics and that whatever parses round-trips:
// parse(marshal(parse(v))) equals parse(v), and marshalling it again gives the same text (CAPR never
// writes a value it cannot read back). The seeds are the values CAPR and people write; make fuzz
// (hack/fuzz.sh) runs each target for FUZZTIME, and go test runs the seeds and testdata/fuzz.

func FuzzMarkRecordFromAnnotation(f *testing.F) {
	for _, seed := range []string{
		`{"reason":"UnhealthyNode","message":"Node failed","since":"2026-03-01T10:00:00Z","checker":"default/workers"}`,
		`{"reason":"ManualRequest","checker":"manual"}`,
		`{"reason":"EtcdMemberUnhealthy","since":null}`,
		`{"reason":"X","since":"9999-12-31T23:59:59-01:00"}`,
		`please remediate, disk is failing`,
		``, `{}`, `null`, `[]`, `{"reason":1}`,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, value string) {
		rec, err := caprv1.MarkRecordFromAnnotation(value)
		if err != nil {
			return
		}
		out, err := rec.Marshal()
		if err != nil {
			if rec.Reason != "" {
				t.Fatalf("a parsed mark with reason %q does not marshal: %v", rec.Reason, err)
			}
			return
		}
		again, err := caprv1.MarkRecordFromAnnotation(out)
		if err != nil {
			t.Fatalf("CAPR's own mark %q does not parse: %v", out, err)
		}
		if again.Reason != rec.Reason || again.Message != rec.Message || again.Checker != rec.Checker || !sameSecond(again.Since, rec.Since) {
			t.Fatalf("mark %q parsed as %+v, marshalled as %q, parsed back as %+v", value, rec, out, again)
		}
		if out2, err := again.Marshal(); err != nil || out2 != out {
			t.Fatalf("mark marshalled as %q, then as %q (%v)", out, out2, err)
		}
	})
}

func FuzzRemediationRecordFromAnnotation(f *testing.F) {
	for _, seed := range []string{
		`{"machine":"cp-abcde","timestamp":"2026-03-01T10:00:00Z","retryCount":1}`,
		`{"machine":"cp-abcde","timestamp":"2026-03-01T10:00:00.5+02:00","retryCount":0}`,
		`{"machine":"m","timestamp":"0000-01-01T00:00:00+01:00","retryCount":-1}`,
		`{"machine":"m","retryCount":2147483648}`,
		`{"machine":""}`, ``, `{}`, `null`,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, value string) {
		roundTrip(t, value, caprv1.RemediationRecordFromAnnotation, (*caprv1.RemediationRecord).Marshal,
			func(a, b *caprv1.RemediationRecord) bool {
				return a.Machine == b.Machine && a.RetryCount == b.RetryCount && sameSecond(a.Timestamp, b.Timestamp)
			})
	})
}

func FuzzControlPlaneLockFromAnnotation(f *testing.F) {
	for _, seed := range []string{
		`{"machineRemediation":"cp-abcde-x7k2p","desiredReplicas":3}`,
		`{"machineRemediation":"r","desiredReplicas":-5}`,
		`{"machineRemediation":"r","desiredReplicas":1e3}`,
		`{"MachineRemediation":"r"}`,
		`{"machineRemediation":""}`, ``, `{}`, `null`, `cp-abcde-x7k2p`,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, value string) {
		roundTrip(t, value, caprv1.ControlPlaneLockFromAnnotation, (*caprv1.ControlPlaneLock).Marshal,
			func(a, b *caprv1.ControlPlaneLock) bool { return *a == *b })
	})
}

// FuzzMarkEntriesFromMessage checks the codec of the mark's entries, the message of
// MachineCAPRHealthCheckSucceededCondition at False, which anyone who may write a Machine's status
// writes and which embeds the messages of Node conditions and of hand-written marks. It never panics,
// and it models what a health check does with it (setMark): read the entries of the message, put its
// own entry in (With) and write them (Marshal). What is written parses back to the same entries, each
// message without its trailing newlines (the one thing the format does not keep), and writing those
// again gives the same text: otherwise two health checks over one Machine would each find the other's
// write different from their own and write the Machine's status without end.
func FuzzMarkEntriesFromMessage(f *testing.F) {
	for _, seed := range []struct{ message, checker, reason, entryMessage string }{
		{"* ns/a (UnhealthyNode): Node n is not ready", "ns/b", "UnhealthyNode", "Condition DiskPressure on Node is reporting status True"},
		{"* ns/a (ManualRequest): first\n  * ns/b (X): not an item\n    indented\n* ns/b (UnhealthyMachine): x (y): z", "ns/a", "NodeDeleted", ""},
		{"* ns/a (NodeDeleted)", "ns/a", "ManualRequest", "disk is failing\n\n"},
		{"* ns/a (ManualRequest): disk is failing\n  ", "ns/b", "ManualRequest", "disk is failing\n\n"},
		{"* ns/a (ManualRequest)\n  ", "ns/b", "ManualRequest", "\n"},
		{"* ns/a (UnhealthyNode): ): ( ) a (b): c", "ns/c", "EtcdMemberUnhealthy", "  * ns/a (X)\n* ns/d (Y): z"},
		{"Condition Ready on Node is reporting status False", "ns/a", "UnhealthyNode", "x"},
		{"* ns/a (A): x\n* ns/a (B): y", "ns/a", "A", "x"},
		{"", "", "", ""}, {"* (R)", "ns/a b", "R)", "m"},
	} {
		f.Add(seed.message, seed.checker, seed.reason, seed.entryMessage)
	}
	f.Fuzz(func(t *testing.T, message, checker, reason, entryMessage string) {
		entries, err := caprv1.MarkEntriesFromMessage(message)
		if err != nil {
			entries = nil // an unparsed mark is replaced (setMark)
		} else if len(entries) == 0 {
			t.Fatalf("%q parsed to no entry", message)
		}
		entry := caprv1.MarkEntry{Checker: checker, Reason: reason, Message: entryMessage}
		written := entries.With(entry)
		out, err := written.Marshal()
		if err != nil {
			// The parsed entries are valid: only the new one may be refused.
			if _, alone := (caprv1.MarkEntries{entry}).Marshal(); alone == nil {
				t.Fatalf("%q parsed as %#v, which does not marshal with the valid entry %#v: %v", message, entries, entry, err)
			}
			return
		}
		back, err := caprv1.MarkEntriesFromMessage(out)
		if err != nil {
			t.Fatalf("%#v marshalled as %q, which does not parse: %v", written, out, err)
		}
		if len(back) != len(written) {
			t.Fatalf("%#v marshalled as %q, parsed back as %#v", written, out, back)
		}
		for i := range back {
			want := written[i]
			want.Message = strings.TrimRight(want.Message, "\n")
			if back[i] != want {
				t.Fatalf("%#v marshalled as %q, parsed back as %#v: entry %d is %#v, want %#v", written, out, back, i, back[i], want)
			}
		}
		if out2, err := back.Marshal(); err != nil || out2 != out {
			t.Fatalf("%#v marshalled as %q; parsed back and marshalled again as %q (%v)", written, out, out2, err)
		}
	})
}

// FuzzEtcdLearnerJoinsFromAnnotation checks the codec of EtcdLearnerJoinsAnnotation, which anyone
// who may annotate the control-plane object writes: it never panics, accepts exactly the text
// strconv.FormatBool writes (the oracle) and reads it as strconv.ParseBool does, and any other text
// is an error naming the annotation (taken as voting joins, the stricter model).
func FuzzEtcdLearnerJoinsFromAnnotation(f *testing.F) {
	for _, seed := range []string{"true", "false", "True", "TRUE", "1", "t", "yes", " true", "true\n", "", `"true"`} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, value string) {
		learners, err := caprv1.EtcdLearnerJoinsFromAnnotation(value)
		oracle, oerr := strconv.ParseBool(value)
		canonical := oerr == nil && strconv.FormatBool(oracle) == value
		switch {
		case err != nil && canonical:
			t.Fatalf("%q refused: %v", value, err)
		case err != nil && !strings.Contains(err.Error(), caprv1.EtcdLearnerJoinsAnnotation):
			t.Fatalf("%q: error %q does not name the annotation", value, err)
		case err == nil && !canonical:
			t.Fatalf("%q accepted as %v", value, learners)
		case err == nil && learners != oracle:
			t.Fatalf("%q read as %v", value, learners)
		}
	})
}

// roundTrip checks one annotation value: when it parses, what it parses to marshals, parses back to
// the same (equal) record and marshals to the same text again.
func roundTrip[T any](t *testing.T, value string, parse func(string) (*T, error), marshal func(*T) (string, error), equal func(a, b *T) bool) {
	t.Helper()
	rec, err := parse(value)
	if err != nil {
		return
	}
	out, err := marshal(rec)
	if err != nil {
		t.Fatalf("%q parsed as %+v, which does not marshal: %v", value, rec, err)
	}
	again, err := parse(out)
	if err != nil {
		t.Fatalf("%q parsed as %+v, marshalled as %q, which does not parse: %v", value, rec, out, err)
	}
	if !equal(again, rec) {
		t.Fatalf("%q parsed as %+v, marshalled as %q, parsed back as %+v", value, rec, out, again)
	}
	if out2, err := marshal(again); err != nil || out2 != out {
		t.Fatalf("%q marshalled as %q, then as %q (%v)", value, out, out2, err)
	}
}

// sameSecond compares times as metav1.Time stores them: RFC 3339 to the second.
func sameSecond(a, b metav1.Time) bool {
	c := b.Rfc3339Copy()
	return a.Equal(&c)
}

// TestCodecsNameTheBadField checks the refusals the fuzz targets led to: each error names the field.
func TestCodecsNameTheBadField(t *testing.T) {
	for _, c := range []struct {
		parse func(string) error
		value string
		field string
	}{
		{func(v string) error { _, err := caprv1.MarkRecordFromAnnotation(v); return err },
			`{"reason":"X","since":"9999-12-31T23:59:59-01:00"}`, "since"},
		{func(v string) error { _, err := caprv1.RemediationRecordFromAnnotation(v); return err },
			`{"machine":"m","timestamp":"0000-01-01T00:00:00+01:00"}`, "timestamp"},
		{func(v string) error { _, err := caprv1.RemediationRecordFromAnnotation(v); return err },
			`{"machine":"m","retryCount":-1}`, "retryCount"},
		{func(v string) error { _, err := caprv1.ControlPlaneLockFromAnnotation(v); return err },
			`{"machineRemediation":"r","desiredReplicas":-3}`, "desiredReplicas"},
	} {
		err := c.parse(c.value)
		if err == nil || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%s: got error %v, want one naming %s", c.value, err, c.field)
		}
	}
}
