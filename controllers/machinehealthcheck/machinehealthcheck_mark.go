package machinehealthcheck

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/annotations"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/cluster-api/util/patch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// markChange is what applying an evaluation would change on a Machine.
type markChange int

const (
	markUnchanged markChange = iota
	markSet
	markUpdated
	markCleared
)

// applyMark sets the mark (annotation + condition) of a Machine from its evaluation, in memory, and
// says what changed. Pending targets keep whatever they have: a timeout still running neither marks
// nor clears. Marks written by someone else are never touched.
func applyMark(m *clusterv1.Machine, ev evaluation, checker string, now time.Time) markChange {
	switch ev.verdict {
	case verdictUnhealthy:
		return setMark(m, ev, checker, now)
	case verdictHealthy:
		return clearMark(m, checker)
	default:
		return markUnchanged
	}
}

func setMark(m *clusterv1.Machine, ev evaluation, checker string, now time.Time) markChange {
	wasMarked := isMarked(m, checker)
	changed := false

	// The annotation is ours to write unless a person (or another tool) wrote it.
	if _, foreign := foreignMark(m, checker); !foreign {
		since := metav1.NewTime(now.UTC().Truncate(time.Second))
		if current, ok := ownMark(m, checker); ok && !current.Since.IsZero() {
			since = current.Since
		}
		rec := caprv1.MarkRecord{Reason: ev.reason, Message: ev.message, Since: since, Checker: checker}
		if value, err := rec.Marshal(); err == nil && m.Annotations[caprv1.UnhealthyAnnotation] != value {
			changed = annotations.AddAnnotations(m, map[string]string{caprv1.UnhealthyAnnotation: value}) || changed
		}
	}
	changed = setCondition(m, metav1.Condition{
		Type:    caprv1.MachineCAPRHealthCheckSucceededCondition,
		Status:  metav1.ConditionFalse,
		Reason:  ev.reason,
		Message: ev.message,
	}) || changed
	return transition(changed, wasMarked, markUpdated, markSet)
}

func clearMark(m *clusterv1.Machine, checker string) markChange {
	wasMarked := isMarked(m, checker)
	changed := false
	if _, ok := ownMark(m, checker); ok {
		delete(m.Annotations, caprv1.UnhealthyAnnotation)
		changed = true
	}
	changed = setCondition(m, metav1.Condition{
		Type:   caprv1.MachineCAPRHealthCheckSucceededCondition,
		Status: metav1.ConditionTrue,
		Reason: caprv1.MachineCAPRHealthCheckSucceededReason,
	}) || changed
	return transition(changed, wasMarked, markCleared, markUpdated)
}

// setCondition sets the condition unless the Machine already has it (same status, reason, message);
// it reports whether it changed anything.
func setCondition(m *clusterv1.Machine, cond metav1.Condition) bool {
	if hasSameCondition(m, cond) {
		return false
	}
	conditions.Set(m, cond)
	return true
}

// transition classifies a write of the mark: nothing changed, or what it means given whether the
// Machine was marked before.
func transition(changed, wasMarked bool, ifWasMarked, ifWasNot markChange) markChange {
	switch {
	case !changed:
		return markUnchanged
	case wasMarked:
		return ifWasMarked
	default:
		return ifWasNot
	}
}

// isMarked reports whether the Machine carries this health check's mark (its annotation, or our
// condition at False).
func isMarked(m *clusterv1.Machine, checker string) bool {
	if _, ok := ownMark(m, checker); ok {
		return true
	}
	c := conditions.Get(m, caprv1.MachineCAPRHealthCheckSucceededCondition)
	return c != nil && c.Status == metav1.ConditionFalse
}

func hasSameCondition(m *clusterv1.Machine, want metav1.Condition) bool {
	c := conditions.Get(m, want.Type)
	return c != nil && c.Status == want.Status && c.Reason == want.Reason && c.Message == want.Message
}

// ownMark returns the mark on the Machine when it was written by checker.
func ownMark(m *clusterv1.Machine, checker string) (*caprv1.MarkRecord, bool) {
	value, ok := m.Annotations[caprv1.UnhealthyAnnotation]
	if !ok {
		return nil, false
	}
	rec, err := caprv1.MarkRecordFromAnnotation(value)
	if err != nil || rec.Checker != checker {
		return nil, false
	}
	return rec, true
}

// patchMark writes the Machine's mark; the patch helper only sends what changed, and owns only our
// qualified condition so that CAPI's conditions on the same Machine are never overwritten.
func patchMark(ctx context.Context, c client.Client, before, after *clusterv1.Machine) error {
	helper, err := patch.NewHelper(before, c)
	if err != nil {
		return fmt.Errorf("creating patch helper for Machine %s: %w", before.Name, err)
	}
	if err := helper.Patch(ctx, after, patch.WithOwnedConditions{Conditions: []string{caprv1.MachineCAPRHealthCheckSucceededCondition}}); err != nil {
		return fmt.Errorf("patching mark on Machine %s: %w", before.Name, err)
	}
	return nil
}
