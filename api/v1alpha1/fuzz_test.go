package v1alpha1_test

import (
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
