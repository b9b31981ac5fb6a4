package worker

import (
	"math"
	"strconv"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/intstr"
)

// FuzzMaxInFlight checks the scaling of a MachineDeployment's spec.remediation.maxInFlight (an
// integer or a percentage, as the user writes it) to its replicas: it never panics, never reads as
// Unlimited or as a negative limit, and an integer or a percentage of at most 100% means what it
// says (the integer; at most the replicas, rounded up as CAPI rounds).
func FuzzMaxInFlight(f *testing.F) {
	for _, seed := range []struct {
		value    string
		replicas int
	}{
		{"1", 3}, {"0", 3}, {"-1", 3}, {"2147483647", 1},
		{"50%", 3}, {"100%", 10}, {"0%", 10}, {"-10%", 10}, {"150%", 4},
		{"9223372036854775807%", 1000}, {"%", 3}, {"1.5%", 3}, {"abc", 3}, {"", 3}, {"50%", -1},
	} {
		f.Add(seed.value, seed.replicas)
	}
	f.Fuzz(func(t *testing.T, value string, replicas int) {
		v := intstr.Parse(value) // an integer when the text is one, else the text: what YAML gives
		n, err := maxInFlightOf(&v, replicas)
		if err != nil {
			return
		}
		if n < 0 || n == Unlimited {
			t.Fatalf("maxInFlight %q of %d replicas read as %d", value, replicas, n)
		}
		if v.Type == intstr.Int && n != int(v.IntVal) {
			t.Fatalf("maxInFlight %d read as %d", v.IntVal, n)
		}
		if p, perr := strconv.Atoi(strings.TrimSuffix(value, "%")); v.Type == intstr.String && perr == nil && p >= 0 && p <= 100 && replicas >= 0 && replicas < math.MaxInt32 {
			if n > replicas || (p > 0 && replicas > 0 && n == 0) {
				t.Fatalf("maxInFlight %q of %d replicas read as %d", value, replicas, n)
			}
		}
	})
}
