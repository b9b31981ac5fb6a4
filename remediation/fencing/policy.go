package fencing

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// The fencing policy belongs to the Machine, not to whoever wrote the request: a request
// written by hand, or created by CAPI's MachineHealthCheck from a template without fencing, must not
// delete a Machine unfenced that a CAPR health check covering it says must be fenced. A remediation
// therefore applies the strictest of its own spec.fencing and the fencing of every CAPR health check
// covering its Machine, decided once when it starts (Decide) and kept in status.appliedFencing.

// Source is one fencing the applied fencing must honour: the request's own, or a health check's.
type Source struct {
	// HealthCheck is the health check's name ("" for the request's own spec.fencing).
	HealthCheck string
	Spec        *caprv1.FencingSpec
}

// maxBackends is the API's limit on a fencing's backends (FencingSpec.Backends, AppliedFencing.Backends).
const maxBackends = 8

// maxRaisedBy is the API's limit on status.appliedFencing.raisedBy.
const maxRaisedBy = 32

// strictness orders the policies: Required > BestEffort > Disabled (unset is Disabled).
func strictness(p caprv1.FencingPolicy) int {
	switch p {
	case caprv1.FencingRequired:
		return 2
	case caprv1.FencingBestEffort:
		return 1
	}
	return 0
}

// Strictest combines the request's spec.fencing (own, may be nil) with the fencing of the health
// checks covering its Machine (any order). Every source must be honoured, so nothing is weakened:
//   - the policy is the strictest (Required, then BestEffort, then Disabled);
//   - the backends are those of every source whose policy is not Disabled, each once: a source's
//     fence is what it asked for, and a backend the request adds cannot stand in for a health
//     check's (a request may name any backend, e.g. an External template its writer controls).
//     The request's come first, then the health checks' by name; OutOfServiceTaint goes last,
//     because it is only safe once the other backends confirmed the node no longer writes
//     (PolicyFencer.fenceOne);
//   - the timeout is the longest (BestEffort gives up later; Required only reports later); the
//     request's own, also a short one, stands when no health check asks for longer.
//
// raisedBy names the health checks that changed anything compared with own alone. An error names the
// field when the union exceeds the API's limit of backends: the remediation cannot apply it.
func Strictest(own *caprv1.FencingSpec, checks []Source) (*caprv1.AppliedFencing, error) {
	checks = slices.Clone(checks)
	slices.SortStableFunc(checks, func(a, b Source) int { return cmp.Compare(a.HealthCheck, b.HealthCheck) })
	applied := &caprv1.AppliedFencing{Policy: caprv1.FencingDisabled}
	if own != nil && strictness(own.Policy) > 0 {
		// The request's own fencing as written (its timeout too, also one shorter than the default).
		applied = (&caprv1.AppliedFencing{Policy: own.Policy, Backends: own.Backends, TimeoutSeconds: own.TimeoutSeconds}).DeepCopy()
	}
	for _, c := range checks {
		next := merge(applied.DeepCopy(), c.Spec)
		if !equality.Semantic.DeepEqual(next, applied) {
			next.RaisedBy = append(next.RaisedBy, c.HealthCheck)
		}
		applied = next
	}
	applied.Backends = taintLast(applied.Backends)
	if len(applied.RaisedBy) > maxRaisedBy {
		applied.RaisedBy = append(applied.RaisedBy[:maxRaisedBy-1], fmt.Sprintf("and %d more", len(applied.RaisedBy)-maxRaisedBy+1))
	}
	if n := len(applied.Backends); n > maxBackends {
		return nil, fmt.Errorf("spec.fencing.backends and spec.remediation.fencing.backends of MachineHealthChecks %s together name %d distinct backends, more than the %d one remediation can apply",
			strings.Join(applied.RaisedBy, ", "), n, maxBackends)
	}
	return applied, nil
}

// merge adds one source to a: the stricter policy, its backends not there yet, the longer timeout.
func merge(a *caprv1.AppliedFencing, s *caprv1.FencingSpec) *caprv1.AppliedFencing {
	if s == nil || strictness(s.Policy) == 0 {
		return a
	}
	if strictness(s.Policy) > strictness(a.Policy) {
		a.Policy = s.Policy
	}
	for _, b := range s.Backends {
		if !slices.ContainsFunc(a.Backends, func(have caprv1.FencingBackend) bool { return equality.Semantic.DeepEqual(have, b) }) {
			a.Backends = append(a.Backends, *b.DeepCopy())
		}
	}
	if t := Timeout(s); t > Timeout(a.Spec()) {
		a.TimeoutSeconds = ptr.To(int32(t.Seconds()))
	}
	return a
}

// taintLast moves OutOfServiceTaint after every other backend.
func taintLast(in []caprv1.FencingBackend) []caprv1.FencingBackend {
	out := slices.Clone(in)
	slices.SortStableFunc(out, func(a, b caprv1.FencingBackend) int {
		return cmp.Compare(boolInt(a.Type == caprv1.FencingBackendOutOfServiceTaint), boolInt(b.Type == caprv1.FencingBackendOutOfServiceTaint))
	})
	return out
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// SpecOf is the fencing a remediation applies: status.appliedFencing once decided, else spec.fencing
// (a request started by a CAPR before status.appliedFencing).
func SpecOf(mr *caprv1.MachineRemediation) *caprv1.FencingSpec {
	if mr.Status.AppliedFencing != nil {
		return mr.Status.AppliedFencing.Spec()
	}
	return mr.Spec.Fencing
}

// CoveringChecks reads (from c, a cache: health checks are CAPR's own kind and watched anyway) the
// fencing of every CAPR MachineHealthCheck in m's namespace whose cluster and selector select m, as
// the health checker selects its targets. A health check whose selector cannot be parsed (one
// stored before admission checked selectors) may cover m: it is an error naming it, so that the
// remediation waits rather than decide without it.
func CoveringChecks(ctx context.Context, c client.Reader, m *clusterv1.Machine) ([]Source, error) {
	list := &caprv1.MachineHealthCheckList{}
	// No deep copies: a health check's status lists every target; the fencing taken is copied.
	if err := c.List(ctx, list, client.InNamespace(m.Namespace), client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing the MachineHealthChecks of namespace %s: %w", m.Namespace, err)
	}
	var out []Source
	for i := range list.Items {
		mhc := &list.Items[i]
		if mhc.Spec.ClusterName != m.Spec.ClusterName {
			continue
		}
		sel, err := mhc.Spec.MachineSelector() // as the health checker selects its targets
		if err != nil {
			return nil, fmt.Errorf("cannot tell whether MachineHealthCheck %s covers Machine %s: %w", mhc.Name, m.Name, err)
		}
		if sel.Matches(labels.Set(m.Labels)) {
			out = append(out, Source{HealthCheck: mhc.Name, Spec: mhc.Spec.Remediation.Fencing.DeepCopy()})
		}
	}
	return out, nil
}

// Decide records in mr's status the fencing it applies (Strictest of its spec.fencing and the health
// checks covering m), unless decided already or a fence was begun under spec.fencing (by a CAPR
// before status.appliedFencing: the fence is undone with the backends it was made with). The
// caller persists the status. It returns a sentence for the condition and event when health checks
// raised the fencing ("" when spec.fencing applies as written).
func Decide(ctx context.Context, c client.Reader, mr *caprv1.MachineRemediation, m *clusterv1.Machine) (string, error) {
	if mr.Status.AppliedFencing != nil || mr.Status.Fencing != nil {
		return "", nil
	}
	checks, err := CoveringChecks(ctx, c, m)
	if err != nil {
		return "", err
	}
	applied, err := Strictest(mr.Spec.Fencing, checks)
	if err != nil {
		return "", fmt.Errorf("deciding the fencing of Machine %s: %w", m.Name, err)
	}
	mr.Status.AppliedFencing = applied
	return Raised(mr), nil
}

// Raised says, for the condition and event, how health checks raised the applied fencing above
// spec.fencing ("" when they did not).
func Raised(mr *caprv1.MachineRemediation) string {
	a := mr.Status.AppliedFencing
	if a == nil || len(a.RaisedBy) == 0 {
		return ""
	}
	own := caprv1.FencingDisabled
	if mr.Spec.Fencing != nil && mr.Spec.Fencing.Policy != "" {
		own = mr.Spec.Fencing.Policy
	}
	backends := make([]string, 0, len(a.Backends))
	for _, b := range a.Backends {
		backends = append(backends, string(b.Type))
	}
	return fmt.Sprintf("fencing %s with backends [%s] applies, from MachineHealthCheck(s) %s covering the Machine (the request's spec.fencing says %s)",
		a.Policy, strings.Join(backends, ", "), strings.Join(a.RaisedBy, ", "), own)
}
