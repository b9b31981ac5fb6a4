package machinehealthcheck

import (
	"fmt"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// FuzzMachineSelector checks the parsing of a health check's spec.selector (keys, values and
// operators as the user writes them): it never panics, an error names spec.selector, and a selector
// that parses selects a Machine that carries its matchLabels and the cluster's name, and only
// Machines of that cluster.
func FuzzMachineSelector(f *testing.F) {
	f.Add("cluster.x-k8s.io/control-plane", "", "pool", "In", "a")
	f.Add("pool", "a", "node-role.kubernetes.io/worker", "Exists", "")
	f.Add("example.com/role", "db", "zone", "NotIn", "us-east-1a")
	f.Add("bad key!", "x", "-a", "DoesNotExist", "")
	f.Add("a", "not a value!", "a/b/c", "Equals", "b")
	f.Add(clusterv1.ClusterNameLabel, "other", "k", "In", "")
	f.Fuzz(func(t *testing.T, labelKey, labelValue, exprKey, op, exprValue string) {
		mhc := &caprv1.MachineHealthCheck{}
		mhc.Spec.ClusterName = "c1"
		mhc.Spec.Selector.MatchLabels = map[string]caprv1.LabelValue{labelKey: caprv1.LabelValue(labelValue)}
		req := caprv1.MachineSelectorRequirement{Key: exprKey, Operator: metav1.LabelSelectorOperator(op)}
		if exprValue != "" {
			req.Values = []string{exprValue}
		}
		mhc.Spec.Selector.MatchExpressions = []caprv1.MachineSelectorRequirement{req}
		sel, err := machineSelector(mhc)
		if err != nil {
			if !strings.Contains(err.Error(), "spec.selector") {
				t.Fatalf("error %q does not name spec.selector", err)
			}
			return
		}
		if sel.Matches(labels.Set{labelKey: labelValue}) {
			t.Fatalf("%s selects a Machine without the cluster-name label", sel)
		}
		machine := labels.Set{labelKey: labelValue, clusterv1.ClusterNameLabel: "c1"}
		if labelKey == clusterv1.ClusterNameLabel {
			return // the health check's cluster wins over a matchLabels entry for it
		}
		satisfied := false
		switch metav1.LabelSelectorOperator(op) {
		case metav1.LabelSelectorOpIn:
			if exprKey != labelKey && exprKey != clusterv1.ClusterNameLabel {
				machine[exprKey] = exprValue
				satisfied = true
			}
		case metav1.LabelSelectorOpExists:
			if exprKey != clusterv1.ClusterNameLabel && exprKey != labelKey {
				machine[exprKey] = "x"
				satisfied = true
			}
		case metav1.LabelSelectorOpNotIn, metav1.LabelSelectorOpDoesNotExist:
			satisfied = exprKey != labelKey && exprKey != clusterv1.ClusterNameLabel
		}
		if satisfied && !sel.Matches(machine) {
			t.Fatalf("%s does not select %v", sel, machine)
		}
	})
}

// FuzzParseUnhealthyRange checks the parser of triggerIf.unhealthyInRange ("[min-max]"): it never
// panics, accepts exactly the text "[min-max]" of two integers with min <= max, and reads them back.
func FuzzParseUnhealthyRange(f *testing.F) {
	for _, seed := range []string{"[1-3]", "[0-0]", "[3-1]", "[1 - 3]", "[-1-3]", "[1-99999999999999999999]", "[01-2]", "1-3", "[]", ""} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, r string) {
		lo, hi, err := parseUnhealthyRange(r)
		if err != nil {
			if !strings.Contains(err.Error(), "unhealthyInRange") {
				t.Fatalf("%q: error %q does not name unhealthyInRange", r, err)
			}
			return
		}
		if lo < 0 || hi < lo {
			t.Fatalf("%q read as [%d-%d]", r, lo, hi)
		}
		if lo2, hi2, err := parseUnhealthyRange(fmt.Sprintf("[%d-%d]", lo, hi)); err != nil || lo2 != lo || hi2 != hi {
			t.Fatalf("%q read as [%d-%d], which reads back as [%d-%d] (%v)", r, lo, hi, lo2, hi2, err)
		}
	})
}

// FuzzTriggerIfDecision checks triggerIf.unhealthyLessThanOrEqualTo (an integer or a percentage, as
// the user writes it) applied to a health check's targets: it never panics, a bad value is an error
// naming the field, and a decision stays within its numbers (remaining never negative, allowed only
// when unhealthy is within the limit).
func FuzzTriggerIfDecision(f *testing.F) {
	for _, seed := range []struct {
		value              string
		expected, unhealth int
	}{
		{"40%", 10, 3}, {"100%", 3, 3}, {"0%", 5, 0}, {"2", 5, 3}, {"0", 5, 0}, {"-1", 5, 0},
		{"101%", 5, 5}, {"9223372036854775807%", 1000, 1}, {"%", 3, 1}, {"half", 3, 1}, {"", 3, 0},
	} {
		f.Add(seed.value, seed.expected, seed.unhealth)
	}
	f.Fuzz(func(t *testing.T, value string, expected, unhealthy int) {
		if expected < 0 || unhealthy < 0 || unhealthy > expected {
			return // counts, not user input
		}
		v := intstr.Parse(value)
		d, err := triggerIfDecision(&caprv1.MachineHealthCheckRemediationTriggerIf{UnhealthyLessThanOrEqualTo: &v}, expected, unhealthy)
		if err != nil {
			if !strings.Contains(err.Error(), "unhealthyLessThanOrEqualTo") {
				t.Fatalf("%q: error %q does not name unhealthyLessThanOrEqualTo", value, err)
			}
			return
		}
		if v.Type == intstr.String && d.limit < 0 {
			t.Fatalf("percentage %q of %d targets read as the negative limit %d", value, expected, d.limit)
		}
		if d.allowed != (unhealthy <= d.limit) || d.remaining < 0 || (d.allowed && d.remaining != d.limit-unhealthy) {
			t.Fatalf("%q with %d of %d unhealthy: %+v", value, unhealthy, expected, d)
		}
	})
}
