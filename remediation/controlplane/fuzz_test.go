package controlplane

import (
	"testing"

	kcpreconciler "sigs.k8s.io/cluster-api/controlplane/kubeadm/reconcilers/kubeadmcontrolplane"
)

// FuzzKCPRemediationDataFromAnnotation checks CAPR's codec of KCP's remediation-in-progress value
// against KCP's own (RemediationDataFromAnnotation and RemediationData.Marshal, the oracle): on any
// text both accept or both refuse, and read the same data; and what CAPR writes, KCP reads back as
// written (to the second, as metav1.Time stores it), whenever the time is one RFC 3339 can carry.
func FuzzKCPRemediationDataFromAnnotation(f *testing.F) {
	for _, seed := range []string{
		`{"machine":"cp-abcde","timestamp":"2026-03-01T10:00:00Z","retryCount":0}`,
		`{"machine":"cp-abcde","timestamp":"2026-03-01T10:00:00.123+05:30","retryCount":3}`,
		`{"machine":"m","timestamp":"9999-12-31T23:59:59-01:00","retryCount":-1}`,
		`{"machine":"m","retryCount":1e2}`,
		`{"Machine":"m","TIMESTAMP":null}`,
		``, `{}`, `null`, `cp-abcde`,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, value string) {
		capr, err := kcpRemediationDataFromAnnotation(value)
		kcp, kcpErr := kcpreconciler.RemediationDataFromAnnotation(value)
		if (err == nil) != (kcpErr == nil) {
			t.Fatalf("%q: CAPR's codec says %v, KCP's says %v", value, err, kcpErr)
		}
		if err != nil {
			return
		}
		if capr.Machine != kcp.Machine || capr.RetryCount != kcp.RetryCount || !capr.Timestamp.Equal(&kcp.Timestamp) {
			t.Fatalf("%q: CAPR reads %+v, KCP reads %+v", value, capr, kcp)
		}
		if y := capr.Timestamp.UTC().Year(); y < 0 || y > 9999 {
			return // KCP writes such a time as text it cannot read either; CAPR writes only now.
		}
		out, err := capr.marshal()
		if err != nil {
			t.Fatalf("%+v does not marshal: %v", capr, err)
		}
		back, err := kcpreconciler.RemediationDataFromAnnotation(out)
		if err != nil {
			t.Fatalf("KCP cannot read CAPR's %q: %v", out, err)
		}
		want := capr.Timestamp.Rfc3339Copy()
		if back.Machine != capr.Machine || back.RetryCount != capr.RetryCount || !back.Timestamp.Equal(&want) {
			t.Fatalf("CAPR wrote %+v as %q, KCP reads %+v", capr, out, back)
		}
	})
}
