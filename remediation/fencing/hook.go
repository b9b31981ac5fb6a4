package fencing

import (
	"context"
	"fmt"
	"time"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/annotations"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/remediation"
)

// Fence before delete, whoever deletes. A running remediation keeps CAPI's pre-drain deletion hook
// caprv1.FenceBeforeDeleteHookAnnotation on its Machine until its Fence step has finished: the
// remediation's own Delete step is not the only way the Machine can go (a KCP rollout or a
// MachineSet scale-down picks it, a person deletes it), and CAPI's Machine controller drains and
// deletes a Machine only once every pre-drain hook is gone (sigs.k8s.io/cluster-api
// internal/controllers/machine, reconcileDelete). Both remediators use these functions, so the rule
// has one implementation.

// EnsureHook puts the hook, naming the MachineRemediation owner, on m unless it is there. It returns
// the Machine as patched (m itself when nothing changed).
func EnsureHook(ctx context.Context, c client.Client, m *clusterv1.Machine, owner string) (*clusterv1.Machine, error) {
	if _, ok := m.Annotations[caprv1.FenceBeforeDeleteHookAnnotation]; ok {
		return m, nil
	}
	patched := m.DeepCopy()
	annotations.AddAnnotations(patched, map[string]string{caprv1.FenceBeforeDeleteHookAnnotation: owner})
	if err := c.Patch(ctx, patched, client.MergeFrom(m)); err != nil {
		return nil, fmt.Errorf("adding the fence-before-delete hook to Machine %s: %w", m.Name, err)
	}
	return patched, nil
}

// RemoveHook takes the hook off the Machine key (fenced, or the remediation ended or undone): CAPI may
// then drain and delete it. The Machine is read through live: a cache may not show yet a hook added a
// moment ago (e.g. again, after a restart). It returns the Machine as it is now (nil when it is gone)
// and whether this call removed the hook.
func RemoveHook(ctx context.Context, c client.Client, live client.Reader, key client.ObjectKey) (*clusterv1.Machine, bool, error) {
	m, removed, err := remediation.RemoveMachineAnnotations(ctx, c, live, key, caprv1.FenceBeforeDeleteHookAnnotation)
	return m, len(removed) > 0, err
}

// HookNeeded is false when fencing can only be skipped (policy Disabled or unset, or no Node to
// fence under BestEffort): then nothing is worth holding a deletion for. Under Required a Machine
// without a Node is held too: its Node may register at any time, and only the Fencer can confirm it
// never had one (PolicyFencer.Fence).
func HookNeeded(spec *caprv1.FencingSpec, node string) bool {
	return spec != nil && spec.Policy != "" && spec.Policy != caprv1.FencingDisabled && (node != "" || spec.Policy == caprv1.FencingRequired)
}

// HeldDeletion reports whether m is being deleted by someone else while the hook holds it: the
// remediator must then fence it now (FenceHeld) rather than at its own Fence step, which may never
// come (the provider waits for the deletion before it acts again).
func HeldDeletion(m *clusterv1.Machine) bool {
	if m == nil || m.DeletionTimestamp.IsZero() {
		return false
	}
	_, ok := m.Annotations[caprv1.FenceBeforeDeleteHookAnnotation]
	return ok
}

// FenceHeld fences a Machine whose deletion the hook holds (HeldDeletion), counting the fencing
// timeout from the deletion and recording the fence in mr (FenceRecorded, with persist). When the
// fence is final (fenced, skipped by policy, or given up under BestEffort) the hook is removed, so
// the deletion proceeds; released is true when this call removed it. v is the verdict on the
// Fencer's answer (Judge).
func FenceHeld(ctx context.Context, f Fencer, c client.Client, live client.Reader, mr *caprv1.MachineRemediation, req Request, now time.Time,
	persist func(context.Context) error) (v Verdict, released bool, err error) {
	req.Started = req.Machine.DeletionTimestamp.Time
	res, err := FenceRecorded(ctx, f, mr, req, now, persist)
	if err != nil {
		return Verdict{}, false, fmt.Errorf("fencing Machine %s, which is being deleted: %w", req.Machine.Name, err)
	}
	v = Judge(res, req.Spec, req.Started, now)
	if !v.Done {
		return v, false, nil
	}
	_, released, err = RemoveHook(ctx, c, live, client.ObjectKeyFromObject(req.Machine))
	return v, released, err
}

// StepFinished is true once the remediation's Fence step succeeded or was skipped by policy: from
// then on the hook has no business holding a deletion.
func StepFinished(mr *caprv1.MachineRemediation) bool {
	fence := mr.Status.Step(caprv1.StepFence)
	return fence != nil && (fence.Outcome == caprv1.StepOutcomeSucceeded || fence.Outcome == caprv1.StepOutcomeSkipped)
}
