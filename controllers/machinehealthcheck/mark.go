package machinehealthcheck

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	kerrors "k8s.io/apimachinery/pkg/util/errors"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
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

// applyMark sets the mark of a Machine from its evaluation, in memory, and says what changed.
// Pending targets keep whatever they have: a timeout still running neither marks nor clears.
//
// The mark is the condition MachineCAPRHealthCheckSucceededCondition at False: its message has one
// entry per health check that finds the Machine unhealthy (caprv1.MarkEntries, naming the health
// check, its reason and message), its reason is the first entry's and its lastTransitionTime since
// when the Machine is marked. A health check writes and clears only its own entry, so two health
// checks over one Machine (CAPI forbids that but does not enforce it: overlap.go
// reports it) do not undo each other's marks, and the Machine stays marked while any of them finds
// it unhealthy. It is one write to the Machine's status, as CAPI's MachineHealthCheck's mark is (its
// HealthCheckSucceeded and OwnerRemediated conditions, sigs.k8s.io/cluster-api
// core/reconcilers/machinehealthcheck machinehealthcheck_targets.go). A mark whose message is not a
// list of entries was written before marks named their health checks: every health check that
// selects the Machine takes it for its own, as it did then, and replaces it with its entry.
//
// The UnhealthyAnnotation is not written: it is how a person or another tool requests remediation
// (evaluate), and this health check never touches one it did not write. One carrying this health
// check's name was written by an earlier CAPR, whose mark was the annotation and the condition; it
// still counts as this health check's mark and is removed when the mark clears.
func applyMark(m *clusterv1.Machine, ev evaluation, checker string) (markChange, error) {
	switch ev.verdict {
	case verdictUnhealthy:
		return setMark(m, ev, checker)
	case verdictHealthy:
		return clearMark(m, checker)
	default:
		return markUnchanged, nil
	}
}

func setMark(m *clusterv1.Machine, ev evaluation, checker string) (markChange, error) {
	wasMarked := isMarked(m, checker)
	entries, _ := markEntriesOf(m) // an unparsed mark is replaced
	cond, err := markCondition(entries.With(caprv1.MarkEntry{Checker: checker, Reason: ev.reason, Message: ev.message}))
	if err != nil {
		return markUnchanged, fmt.Errorf("marking Machine %s: %w", m.Name, err)
	}
	return transition(setMachineCondition(m, cond), wasMarked, markUpdated, markSet), nil
}

func clearMark(m *clusterv1.Machine, checker string) (markChange, error) {
	wasMarked := isMarked(m, checker)
	changed := false
	if hasOwnAnnotation(m, checker) {
		delete(m.Annotations, caprv1.UnhealthyAnnotation)
		changed = true
	}
	entries, _ := markEntriesOf(m) // an unparsed mark is cleared
	cond, err := markCondition(entries.Without(checker))
	if err != nil {
		return markUnchanged, fmt.Errorf("clearing the mark of Machine %s: %w", m.Name, err)
	}
	changed = setMachineCondition(m, cond) || changed
	return transition(changed, wasMarked, markCleared, markUpdated), nil
}

// unmark removes checker's mark from the Machine, in memory, when its health check is deleted: its
// entry (the condition is removed with the last entry), an unparsed mark when selected (see
// applyMark), and the annotation an earlier CAPR wrote with its name. It reports whether it changed
// anything.
func unmark(m *clusterv1.Machine, checker string, selected bool) (bool, error) {
	changed := false
	if hasOwnAnnotation(m, checker) {
		delete(m.Annotations, caprv1.UnhealthyAnnotation)
		changed = true
	}
	entries, unparsed := markEntriesOf(m)
	if entries.Index(checker) < 0 && (!unparsed || !selected) {
		return changed, nil
	}
	rest := entries.Without(checker)
	if len(rest) == 0 {
		conditions.Delete(m, caprv1.MachineCAPRHealthCheckSucceededCondition)
		return true, nil
	}
	cond, err := markCondition(rest)
	if err != nil {
		return changed, fmt.Errorf("removing the mark of %s from Machine %s: %w", checker, m.Name, err)
	}
	conditions.Set(m, cond)
	return true, nil
}

// markEntriesOf returns the entries of the Machine's mark (none when it is not marked) and whether
// the mark's message is not a list of entries (a mark written before marks named their health
// checks: see applyMark).
func markEntriesOf(m *clusterv1.Machine) (entries caprv1.MarkEntries, unparsed bool) {
	c := conditions.Get(m, caprv1.MachineCAPRHealthCheckSucceededCondition)
	if c == nil || c.Status != metav1.ConditionFalse {
		return nil, false
	}
	entries, err := caprv1.MarkEntriesFromMessage(c.Message)
	if err != nil {
		return nil, true
	}
	return entries, false
}

// markCondition is the condition of a mark with these entries: False with the first entry's reason,
// or True when there is none.
func markCondition(entries caprv1.MarkEntries) (metav1.Condition, error) {
	if len(entries) == 0 {
		return metav1.Condition{Type: caprv1.MachineCAPRHealthCheckSucceededCondition, Status: metav1.ConditionTrue,
			Reason: caprv1.MachineCAPRHealthCheckSucceededReason}, nil
	}
	message, err := entries.Marshal()
	if err != nil {
		return metav1.Condition{}, err
	}
	return metav1.Condition{Type: caprv1.MachineCAPRHealthCheckSucceededCondition, Status: metav1.ConditionFalse,
		Reason: entries[0].Reason, Message: message}, nil
}

// markedByOthers reports whether another health check's entry marks the Machine.
func markedByOthers(m *clusterv1.Machine, checker string) bool {
	entries, _ := markEntriesOf(m)
	return len(entries.Without(checker)) > 0
}

// setMachineCondition sets the condition unless the Machine already has it (same status, reason,
// message); it reports whether it changed anything.
func setMachineCondition(m *clusterv1.Machine, cond metav1.Condition) bool {
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

// isMarked reports whether the Machine carries this health check's mark: its entry, a mark not
// parsed (see applyMark), or the annotation an earlier CAPR wrote with its name.
func isMarked(m *clusterv1.Machine, checker string) bool {
	if hasOwnAnnotation(m, checker) {
		return true
	}
	entries, unparsed := markEntriesOf(m)
	return unparsed || entries.Index(checker) >= 0
}

func hasSameCondition(m *clusterv1.Machine, want metav1.Condition) bool {
	c := conditions.Get(m, want.Type)
	return c != nil && c.Status == want.Status && c.Reason == want.Reason && c.Message == want.Message
}

// hasOwnAnnotation reports whether the Machine carries the annotation written by checker (an earlier
// CAPR: see applyMark).
func hasOwnAnnotation(m *clusterv1.Machine, checker string) bool {
	value, ok := m.Annotations[caprv1.UnhealthyAnnotation]
	if !ok {
		return false
	}
	rec, err := caprv1.MarkRecordFromAnnotation(value)
	return err == nil && rec.Checker == checker
}

// markFieldManager is the field manager of the mark's condition (server-side apply).
const markFieldManager = "capr-machinehealthcheck"

// patchMark writes what changed of the Machine's mark: the condition, applied server-side as the
// one entry of status.conditions (a list map keyed by type) that CAPR's health check owns, so that
// CAPI's conditions on the same Machine are never overwritten and no read is needed first; and,
// when a mark clears, the annotation an earlier CAPR wrote (a JSON merge patch of that one key, sent
// at the same time: neither request carries a resourceVersion, so they cannot conflict). A crash
// between the two leaves that annotation, which the next round removes.
func patchMark(ctx context.Context, c client.Client, before, after *clusterv1.Machine) error {
	var (
		wg                sync.WaitGroup
		annotErr, condErr error
	)
	if before.Annotations[caprv1.UnhealthyAnnotation] != after.Annotations[caprv1.UnhealthyAnnotation] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			annotErr = patchMarkAnnotation(ctx, c, after)
		}()
	}
	cond, prev := conditions.Get(after, caprv1.MachineCAPRHealthCheckSucceededCondition), conditions.Get(before, caprv1.MachineCAPRHealthCheckSucceededCondition)
	switch {
	case cond != nil && !sameCondition(prev, cond):
		condErr = applyMarkCondition(ctx, c, after, cond)
	case cond == nil && prev != nil:
		// Removed when the health check is deleted: rare, and the entry may have been written by
		// another field manager (an older CAPR), so it goes through the patch helper.
		condErr = removeMarkCondition(ctx, c, before, after)
	}
	wg.Wait()
	if err := kerrors.NewAggregate([]error{annotErr, condErr}); err != nil {
		if apierrors.IsNotFound(annotErr) || apierrors.IsNotFound(condErr) {
			return apierrors.NewNotFound(clusterv1.GroupVersion.WithResource("machines").GroupResource(), after.Name)
		}
		return fmt.Errorf("patching mark on Machine %s: %w", after.Name, err)
	}
	return nil
}

// removeMarkCondition removes the health check's condition with CAPI's patch helper, which owns only
// that condition and retries on conflicts.
func removeMarkCondition(ctx context.Context, c client.Client, before, after *clusterv1.Machine) error {
	helper, err := patch.NewHelper(before, c)
	if err != nil {
		return fmt.Errorf("creating patch helper for Machine %s: %w", before.Name, err)
	}
	withoutMetadata := after.DeepCopy()
	withoutMetadata.ObjectMeta = *before.ObjectMeta.DeepCopy() // the annotation is patched on its own
	return helper.Patch(ctx, withoutMetadata, patch.WithOwnedConditions{Conditions: []string{caprv1.MachineCAPRHealthCheckSucceededCondition}})
}

// sameCondition reports whether a (possibly nil) is b in every field.
func sameCondition(a, b *metav1.Condition) bool {
	return a != nil && a.Status == b.Status && a.Reason == b.Reason && a.Message == b.Message &&
		a.LastTransitionTime.Equal(&b.LastTransitionTime) && a.ObservedGeneration == b.ObservedGeneration
}

// patchMarkAnnotation sets or removes (when after has none) the mark annotation.
func patchMarkAnnotation(ctx context.Context, c client.Client, after *clusterv1.Machine) error {
	var value any // JSON null removes the key
	if v, ok := after.Annotations[caprv1.UnhealthyAnnotation]; ok {
		value = v
	}
	// The UID makes the patch fail on a Machine deleted and created again under the same name since
	// the round's read (metadata.uid is immutable).
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"uid": after.UID,
		"annotations": map[string]any{caprv1.UnhealthyAnnotation: value}}})
	if err != nil {
		return fmt.Errorf("encoding the mark annotation: %w", err)
	}
	return c.Patch(ctx, after.DeepCopy(), client.RawPatch(types.MergePatchType, body))
}

// applyMarkCondition applies the health check's condition as its one owned entry of
// status.conditions.
func applyMarkCondition(ctx context.Context, c client.Client, m *clusterv1.Machine, cond *metav1.Condition) error {
	entry := map[string]any{
		"type":               cond.Type,
		"status":             string(cond.Status),
		"reason":             cond.Reason,
		"message":            cond.Message,
		"lastTransitionTime": cond.LastTransitionTime.UTC().Format(time.RFC3339),
	}
	if cond.ObservedGeneration != 0 {
		entry["observedGeneration"] = cond.ObservedGeneration
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": clusterv1.GroupVersion.String(),
		"kind":       "Machine",
		"metadata":   map[string]any{"name": m.Name, "namespace": m.Namespace, "uid": string(m.UID)},
		"status":     map[string]any{"conditions": []any{entry}},
	}}
	return c.Status().Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(markFieldManager), client.ForceOwnership)
}
