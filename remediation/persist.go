package remediation

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// Persist writes what changed in the MachineRemediation since base (the request as last read or
// written): the metadata in one merge patch, then the whole status, conditions included, in one
// more. Both carry base's resourceVersion (optimistic locking), so a write based on an outdated view
// fails with a conflict instead of undoing a newer one, and the reconcile starts again from a fresh
// read. The status is one request, where CAPI's patch helper sends the conditions and the rest of
// the status separately (util/patch Helper.Patch): a request's status is written only by the
// remediator that owns it, which decides from a copy no older than its own last write (read live,
// or cached when SeenVersions knows it current). It sets status.observedGeneration and the
// block-move annotation (SyncBlockMove) first. Both remediators call it before issuing an action,
// so that the action is recorded before it happens. It returns gone when the write removed the last
// finalizer of a deleted request. base is updated to what was written.
func Persist(ctx context.Context, c client.Client, base, mr *caprv1.MachineRemediation) (gone bool, _ error) {
	mr.Status.ObservedGeneration = mr.Generation
	SyncBlockMove(mr)
	if !equality.Semantic.DeepEqual(base.ObjectMeta, mr.ObjectMeta) {
		// The reply carries the stored status, not the one this reconcile decided: keep ours.
		status := mr.Status.DeepCopy()
		if err := c.Patch(ctx, mr, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
			if apierrors.IsNotFound(err) && !base.DeletionTimestamp.IsZero() {
				return true, nil // the last finalizer was removed: the object is gone
			}
			return false, fmt.Errorf("writing MachineRemediation metadata: %w", err)
		}
		mr.Status = *status
		base.ObjectMeta = *mr.ObjectMeta.DeepCopy()
		if !mr.DeletionTimestamp.IsZero() && len(mr.Finalizers) == 0 {
			return true, nil // deleted by this write
		}
	}
	if !equality.Semantic.DeepEqual(base.Status, mr.Status) {
		status := mr.Status.DeepCopy()
		if err := c.Status().Patch(ctx, mr, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
			return false, fmt.Errorf("writing MachineRemediation status: %w", err)
		}
		mr.Status = *status
	}
	mr.DeepCopyInto(base)
	return false, nil
}
