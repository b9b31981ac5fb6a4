package fencing

import (
	"context"
	"errors"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// The fence of a remediation is recorded in its status (status.fencing), so that what was fenced is
// visible, a restart resumes, and the unfencing owed afterwards is never forgotten. Both remediators
// use these functions, so the record has one format and one set of rules:
//
//   - Begin before the first backend is asked (the caller persists the status when it changed);
//   - Observe after each answer;
//   - Owed while some fence may be left (from Begin until UnfenceRecorded finished);
//   - UnfenceRecorded undoes it: after the Machine and its Node are gone, or when a remediation is
//     aborted before its Machine is deleted.

// maxMessage is the API's limit on status.fencing.backends[].message.
const maxMessage = 1024

// Begin records that the Node is about to be fenced, unless there is no Node, fencing can only be
// skipped (HookNeeded) or it is recorded already. It reports whether the status changed: the caller
// then writes it before asking the Fencer, so a crash after a backend acted cannot lose the fence.
func Begin(mr *caprv1.MachineRemediation, node string, now time.Time) bool {
	if node == "" || !HookNeeded(SpecOf(mr), node) {
		return false
	}
	if f := mr.Status.Fencing; f != nil && f.NodeName == node && f.UnfencedTime == nil {
		return false
	}
	f := &caprv1.FencingStatus{NodeName: node, StartTime: ptr.To(metav1.NewTime(now))}
	for _, b := range SpecOf(mr).Backends {
		f.Backends = append(f.Backends, caprv1.FencingBackendStatus{Type: b.Type, State: caprv1.FencingBackendFencing})
	}
	mr.Status.Fencing = f
	return true
}

// Observe records the backends' answers of one Fence call.
func Observe(mr *caprv1.MachineRemediation, res Result, now time.Time) {
	f := mr.Status.Fencing
	if f == nil || f.UnfencedTime != nil {
		return
	}
	for i, r := range res.Backends {
		if i >= len(f.Backends) || f.Backends[i].Type != r.Type {
			return // the spec changed under the record: keep what was recorded
		}
		b := &f.Backends[i]
		b.State, b.Message = r.State, truncate(r.Message)
		for _, o := range r.Objects {
			b.Objects = recordObject(b.Objects, o)
		}
		if r.State == caprv1.FencingBackendFenced && b.FencedTime == nil {
			b.FencedTime = ptr.To(metav1.NewTime(now))
		}
	}
}

// FenceRecorded asks f to fence, recording the fence in mr's status: Begin, then persist when that
// changed the status (before any backend acts), then the answers (Observe), then, once the fence is
// confirmed, the force-deletion of the Node's pods (deleteFencedPods). The request is marked with
// mr's UID (Request.Remediation). While it waits, the message says when health checks raised the
// fencing above the request's own (Raised).
func FenceRecorded(ctx context.Context, f Fencer, mr *caprv1.MachineRemediation, req Request, now time.Time, persist func(context.Context) error) (Result, error) {
	req.Remediation = mr.UID
	if rec := mr.Status.Fencing; rec != nil && rec.NodeName == req.Node && rec.Pods != nil && rec.Pods.DeletedTime != nil {
		req.PodsDeletedAt = rec.Pods.DeletedTime.Time
	}
	if Begin(mr, req.Node, now) {
		if err := persist(ctx); err != nil {
			return Result{}, err
		}
	}
	if rec := mr.Status.Fencing; rec != nil && rec.NodeName == req.Node {
		for _, b := range rec.Backends {
			req.Objects = append(req.Objects, b.Objects...)
		}
	}
	res, err := f.Fence(ctx, req)
	if err != nil {
		return Result{}, err
	}
	Observe(mr, res, now)
	deleteFencedPods(ctx, f, mr, req, res, now)
	if rec := mr.Status.Fencing; res.Outcome == Waiting && rec != nil && rec.Pods != nil && rec.Pods.DeletedTime != nil {
		// The out-of-service taint follows the pods' deletion (pods.go): ask again when it may.
		if at := taintAllowedAt(rec.Pods.DeletedTime.Time); at.After(now) {
			res.AskAgainAt = at
		}
	}
	if note := Raised(mr); note != "" && res.Outcome == Waiting {
		// An operator must see why a request that says less waits for a fence.
		res.Message += "; " + note
	}
	return res, nil
}

// Owed reports whether the remediation may have left a fence that must be undone.
func Owed(mr *caprv1.MachineRemediation) bool {
	return mr.Status.Fencing != nil && mr.Status.Fencing.UnfencedTime == nil
}

// UnfenceRecorded undoes the recorded fence through f (when f can unfence) and records it: done is
// true once nothing is left (at once when nothing is owed); until then message says what is left.
// afterDelete is true when the Machine is gone: then the Node must be gone too first.
func UnfenceRecorded(ctx context.Context, f Fencer, mr *caprv1.MachineRemediation, req Request, now time.Time) (done bool, message string, err error) {
	if !Owed(mr) {
		return true, "", nil
	}
	req.Node, req.Spec, req.Remediation = mr.Status.Fencing.NodeName, SpecOf(mr), mr.UID
	if u, ok := f.(Unfencer); ok {
		err := u.Unfence(ctx, req)
		if errors.Is(err, ErrUnfencePending) {
			return false, err.Error(), nil
		}
		if err != nil {
			return false, "", fmt.Errorf("unfencing node %s: %w", req.Node, err)
		}
	}
	rec := mr.Status.Fencing
	rec.UnfencedTime = ptr.To(metav1.NewTime(now))
	for i := range rec.Backends {
		b := &rec.Backends[i]
		if b.State != caprv1.FencingBackendNotAvailable {
			b.State, b.UnfencedTime = caprv1.FencingBackendUnfenced, rec.UnfencedTime
		}
	}
	return true, fmt.Sprintf("node %s unfenced", req.Node), nil
}

func truncate(s string) string {
	r := []rune(s)
	if len(r) <= maxMessage {
		return s
	}
	return string(r[:maxMessage-3]) + "..."
}

// recordObject records o among a backend's objects: in place of the object of the same kind and
// name, which it replaced (owned.go), or added.
func recordObject(objects []caprv1.FencingObject, o caprv1.FencingObject) []caprv1.FencingObject {
	for i := range objects {
		if objects[i].Kind == o.Kind && objects[i].Name == o.Name {
			objects[i] = o
			return objects
		}
	}
	return append(objects, o)
}
