//go:build envtest

package v1alpha1_test

import (
	"fmt"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// selectorSamples are label keys and values at the edges of Kubernetes' label syntax
// (k8s.io/apimachinery pkg/util/validation IsQualifiedName and IsValidLabelValue).
var (
	selectorKeys = []string{
		"app", "a", "A_b.c-d", "example.com/role", "x.y.z/a", strings.Repeat("a", 63), strings.Repeat("a", 64),
		strings.Repeat("a", 253) + "/k", strings.Repeat("a", 254) + "/k", "bad key!", "-a", "a-", "/a", "a/", "a/b/c",
		"Example.com/a", "ex_ample.com/a", ".a", "a.",
	}
	selectorValues = []string{
		"", "v", "worker", "a.b_c-d", strings.Repeat("v", 63), strings.Repeat("v", 64), "-v", "v-", "_v", "v_", "with space", "a/b", "ü",
	}
)

// TestSelectorAdmissionAgreesWithLabelSelectorAsSelector: the CRD refuses a selector key or value
// exactly when metav1.LabelSelectorAsSelector (what the health checker parses the selector with, and
// CAPI's MachineHealthCheck webhook validates with) would, in matchLabels and in matchExpressions,
// and names the field. Before the CRD checked label values and expression keys, a health check with
// an unparsable selector was stored and only reported when reconciled.
func TestSelectorAdmissionAgreesWithLabelSelectorAsSelector(t *testing.T) {
	i := 0
	try := func(t *testing.T, sel caprv1.MachineSelector, field string) {
		t.Helper()
		g := NewWithT(t)
		_, parseErr := metav1.LabelSelectorAsSelector(sel.LabelSelector())
		i++
		mhc := validHealthCheck(fmt.Sprintf("selector-%d", i))
		mhc.Spec.Selector = sel
		err := testEnv.Client.Create(ctx, mhc)
		if parseErr == nil {
			g.Expect(err).NotTo(HaveOccurred(), "selector %+v parses, but admission refused it", sel)
			g.Expect(testEnv.Client.Delete(ctx, mhc)).To(Succeed())
			return
		}
		g.Expect(err).To(HaveOccurred(), "selector %+v does not parse (%v), but admission accepted it", sel, parseErr)
		g.Expect(apierrors.IsInvalid(err)).To(BeTrue(), "want Invalid, got %v", err)
		g.Expect(err.Error()).To(ContainSubstring(field))
	}
	for _, k := range selectorKeys {
		t.Run("matchLabels key "+k, func(t *testing.T) {
			try(t, caprv1.MachineSelector{MatchLabels: map[string]caprv1.LabelValue{k: "v"}}, "spec.selector.matchLabels")
		})
		t.Run("matchExpressions key "+k, func(t *testing.T) {
			try(t, caprv1.MachineSelector{MatchExpressions: []caprv1.MachineSelectorRequirement{{Key: k, Operator: metav1.LabelSelectorOpExists}}},
				"spec.selector.matchExpressions[0].key")
		})
	}
	for _, v := range selectorValues {
		t.Run("matchLabels value "+v, func(t *testing.T) {
			try(t, caprv1.MachineSelector{MatchLabels: map[string]caprv1.LabelValue{"app": caprv1.LabelValue(v)}}, "spec.selector.matchLabels")
		})
		t.Run("matchExpressions value "+v, func(t *testing.T) {
			try(t, caprv1.MachineSelector{MatchExpressions: []caprv1.MachineSelectorRequirement{{Key: "app", Operator: metav1.LabelSelectorOpIn, Values: []string{"ok", v}}}},
				"spec.selector.matchExpressions[0].values[1]")
		})
	}
}
