package machinehealthcheck

import (
	"testing"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// TestSelectorsFollowTheHealthChecksVersion: a health check's selector is parsed again when the
// health check is another version (resourceVersion) or another object of the same name (UID), or
// was forgotten; an unstored health check is parsed every time. The oracle is which Machine labels
// the returned selector matches: a selector kept too long matches the old pool.
func TestSelectorsFollowTheHealthChecksVersion(t *testing.T) {
	hc := func(uid types.UID, rv, pool string) *caprv1.MachineHealthCheck {
		mhc := &caprv1.MachineHealthCheck{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "hc", UID: uid, ResourceVersion: rv}}
		mhc.Spec.ClusterName = "c"
		mhc.Spec.Selector = caprv1.MachineSelector{MatchLabels: map[string]caprv1.LabelValue{"pool": caprv1.LabelValue(pool)}}
		return mhc
	}
	machineOf := func(pool string) labels.Set { return labels.Set{"pool": pool, clusterv1.ClusterNameLabel: "c"} }
	tests := []struct {
		name     string
		first    *caprv1.MachineHealthCheck
		forget   bool
		second   *caprv1.MachineHealthCheck
		wantPool string // the pool the second selector matches
	}{
		{name: "same version", first: hc("u1", "1", "a"), second: hc("u1", "1", "a"), wantPool: "a"},
		{name: "edited: new resourceVersion", first: hc("u1", "1", "a"), second: hc("u1", "2", "b"), wantPool: "b"},
		{name: "recreated: new UID, same resourceVersion", first: hc("u1", "1", "a"), second: hc("u2", "1", "b"), wantPool: "b"},
		{name: "forgotten", first: hc("u1", "1", "a"), forget: true, second: hc("u1", "1", "b"), wantPool: "b"},
		{name: "never stored", first: hc("", "", "a"), second: hc("", "", "b"), wantPool: "b"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			var s selectors
			first, err := s.of(tt.first)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(first.Matches(machineOf(string(tt.first.Spec.Selector.MatchLabels["pool"])))).To(BeTrue())
			if tt.forget {
				s.forget(types.NamespacedName{Namespace: "ns", Name: "hc"})
			}
			second, err := s.of(tt.second)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(second.Matches(machineOf(tt.wantPool))).To(BeTrue())
			other := map[string]string{"a": "b", "b": "a"}[tt.wantPool]
			g.Expect(second.Matches(machineOf(other))).To(BeFalse())
		})
	}
}

// TestSelectorsKeepAnInvalidSelectorsError: a selector that does not parse gives its error for as
// long as that version is asked for.
func TestSelectorsKeepAnInvalidSelectorsError(t *testing.T) {
	g := NewWithT(t)
	mhc := &caprv1.MachineHealthCheck{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "hc", UID: "u1", ResourceVersion: "1"}}
	mhc.Spec.ClusterName = "c"
	mhc.Spec.Selector = caprv1.MachineSelector{MatchLabels: map[string]caprv1.LabelValue{"not a key!": "x"}}
	var s selectors
	for range 2 {
		_, err := s.of(mhc)
		g.Expect(err).To(MatchError(ContainSubstring("invalid spec.selector")))
	}
}
