package machinehealthcheck

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
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
// when the Machine is marked. A health check writes and clears only its own entry, into the entries
// of the version of the Machine it read (updateMark), so two health checks over one Machine (CAPI
// forbids that but does not enforce it: overlap.go reports it) do not undo each other's marks, and
// the Machine stays marked while any of them finds it unhealthy. It is one write to the Machine's
// status, as CAPI's MachineHealthCheck's mark is (its HealthCheckSucceeded and OwnerRemediated
// conditions, sigs.k8s.io/cluster-api core/reconcilers/machinehealthcheck
// machinehealthcheck_targets.go). A mark whose message is not a
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

// updateMark changes the mark of Machine m (change, applied to a copy, reports whether it changed
// anything) and writes what changed, conditional on the version of m it was computed from. Health
// checks over one Machine share its mark, each writing its own entry into the entries it read: a
// write computed from a copy older than another health check's write (its cache not showing that
// write yet) would put back the entries of that copy, dropping the other's entry, which that health
// check would only write again, as a new mark, in its next round. So when the Machine changed since
// m was read, it is read again from the API server and the change is computed again, as
// retry.DefaultRetry allows. It returns the Machine as written, or as read last when nothing was to
// change, and a NotFound error when the Machine is gone (or was replaced under its name).
func (r *Reconciler) updateMark(ctx context.Context, m *clusterv1.Machine, change func(*clusterv1.Machine) (bool, error)) (*clusterv1.Machine, error) {
	current, result := m, m
	reread := false
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if reread {
			fresh := &clusterv1.Machine{}
			if err := r.liveReader().Get(ctx, client.ObjectKeyFromObject(m), fresh); err != nil {
				return fmt.Errorf("reading Machine %s again after a conflict: %w", m.Name, err)
			}
			if fresh.UID != m.UID {
				return apierrors.NewNotFound(clusterv1.GroupVersion.WithResource("machines").GroupResource(), m.Name)
			}
			current = fresh
		}
		reread = true
		after := current.DeepCopy()
		changed, err := change(after)
		if err != nil || !changed {
			result = current
			return err
		}
		if err := patchMark(ctx, r.Client, current, after); err != nil {
			return err
		}
		result = after
		return nil
	})
	if err != nil {
		return m, err
	}
	return result, nil
}

// liveReader reads from the API server, not from the cache.
func (r *Reconciler) liveReader() client.Reader {
	if r.APIReader != nil {
		return r.APIReader
	}
	return r.Client
}

// patchMark writes what changed of the Machine's mark from before to after, conditional on the
// resourceVersion of before (when it has one; the annotation's write on the one the condition's write
// left): a Machine changed since before was read fails it with a Conflict (updateMark computes the
// mark again). The condition is applied server-side as
// the one entry of status.conditions (a list map keyed by type) that CAPR's health check owns, so
// that CAPI's conditions on the same Machine are never overwritten; when a mark clears, the
// annotation an earlier CAPR wrote is then removed (a JSON merge patch of that one key). A crash
// between the two leaves that annotation, which the next round removes. after carries the
// resourceVersion written.
func patchMark(ctx context.Context, c client.Client, before, after *clusterv1.Machine) error {
	var err error
	cond, prev := conditions.Get(after, caprv1.MachineCAPRHealthCheckSucceededCondition), conditions.Get(before, caprv1.MachineCAPRHealthCheckSucceededCondition)
	switch {
	case cond != nil && !sameCondition(prev, cond):
		err = applyMarkCondition(ctx, c, after, cond)
	case cond == nil && prev != nil:
		// Removed when the health check is deleted: rare, and the entry may have been written by
		// another field manager (an older CAPR), which an apply would not remove.
		err = removeMarkCondition(ctx, c, before, after)
	}
	if err == nil && before.Annotations[caprv1.UnhealthyAnnotation] != after.Annotations[caprv1.UnhealthyAnnotation] {
		err = patchMarkAnnotation(ctx, c, after)
	}
	if err != nil {
		if apierrors.IsNotFound(err) {
			return apierrors.NewNotFound(clusterv1.GroupVersion.WithResource("machines").GroupResource(), after.Name)
		}
		return fmt.Errorf("patching mark on Machine %s: %w", after.Name, err)
	}
	return nil
}

// removeMarkCondition removes the health check's condition with a JSON merge patch of
// status.conditions, which sends the whole list: it is conditional on before's resourceVersion, so
// it never drops what another writer added since.
func removeMarkCondition(ctx context.Context, c client.Client, before, after *clusterv1.Machine) error {
	withoutMetadata := after.DeepCopy()
	withoutMetadata.ObjectMeta = *before.ObjectMeta.DeepCopy() // the annotation is patched on its own
	var opts []client.MergeFromOption
	if before.ResourceVersion != "" {
		opts = append(opts, client.MergeFromWithOptimisticLock{})
	}
	if err := c.Status().Patch(ctx, withoutMetadata, client.MergeFromWithOptions(before, opts...)); err != nil {
		return err
	}
	setWrittenVersion(after, withoutMetadata.ResourceVersion)
	return nil
}

// setWrittenVersion records on m the resourceVersion a write answered (none from some fakes).
func setWrittenVersion(m *clusterv1.Machine, resourceVersion string) {
	if resourceVersion != "" {
		m.ResourceVersion = resourceVersion
	}
}

// sameCondition reports whether a (possibly nil) is b in every field.
func sameCondition(a, b *metav1.Condition) bool {
	return a != nil && a.Status == b.Status && a.Reason == b.Reason && a.Message == b.Message &&
		a.LastTransitionTime.Equal(&b.LastTransitionTime) && a.ObservedGeneration == b.ObservedGeneration
}

// patchMarkAnnotation sets or removes (when after has none) the mark annotation, conditional on
// after's resourceVersion.
func patchMarkAnnotation(ctx context.Context, c client.Client, after *clusterv1.Machine) error {
	var value any // JSON null removes the key
	if v, ok := after.Annotations[caprv1.UnhealthyAnnotation]; ok {
		value = v
	}
	// The UID makes the patch fail on a Machine deleted and created again under the same name since
	// the round's read (metadata.uid is immutable).
	metadata := map[string]any{"uid": after.UID, "annotations": map[string]any{caprv1.UnhealthyAnnotation: value}}
	if after.ResourceVersion != "" {
		metadata["resourceVersion"] = after.ResourceVersion
	}
	body, err := json.Marshal(map[string]any{"metadata": metadata})
	if err != nil {
		return fmt.Errorf("encoding the mark annotation: %w", err)
	}
	patched := after.DeepCopy()
	if err := c.Patch(ctx, patched, client.RawPatch(types.MergePatchType, body)); err != nil {
		return err
	}
	setWrittenVersion(after, patched.ResourceVersion)
	return nil
}

// applyMarkCondition applies the health check's condition as its one owned entry of
// status.conditions, conditional on m's resourceVersion, and records the one written on m.
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
	metadata := map[string]any{"name": m.Name, "namespace": m.Namespace, "uid": string(m.UID)}
	if m.ResourceVersion != "" {
		metadata["resourceVersion"] = m.ResourceVersion // a precondition of the apply
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": clusterv1.GroupVersion.String(),
		"kind":       "Machine",
		"metadata":   metadata,
		"status":     map[string]any{"conditions": []any{entry}},
	}}
	if err := c.Status().Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(markFieldManager), client.ForceOwnership); err != nil {
		return err
	}
	setWrittenVersion(m, u.GetResourceVersion())
	return nil
}
