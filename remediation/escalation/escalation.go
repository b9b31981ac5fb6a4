package escalation

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/remediation"
)

// MachineAnnotation on an escalation object names the Machine it remediates.
const MachineAnnotation = "remediation.cluster.x-k8s.io/machine"

// Event reasons on the MachineRemediation.
const (
	// EventCreated: a step's object was created.
	EventCreated = "EscalationCreated"
	// EventObjectLeft (Warning): an object under the name of a step's object was left in place when
	// the step ended: not the one CAPR created for this remediation (never deleted), or CAPR's own
	// that its role does not let it delete.
	EventObjectLeft = "EscalationObjectLeft"
)

// maxRequeue bounds the wait between two looks at a step (watches bring the remediator back sooner).
const maxRequeue = 15 * time.Second

// Marked reports whether the Machine still carries a health mark: CAPR's condition at False, the
// unhealthy annotation (a person's request, or the mark of an earlier CAPR), or CAPI's
// HealthCheckSucceeded=False (a request from CAPI's MachineHealthCheck).
func Marked(m *clusterv1.Machine) bool {
	if _, ok := m.Annotations[caprv1.UnhealthyAnnotation]; ok {
		return true
	}
	return conditions.IsFalse(m, caprv1.MachineCAPRHealthCheckSucceededCondition) ||
		conditions.IsFalse(m, clusterv1.MachineHealthCheckSucceededCondition)
}

// Steps returns the names of the request's escalation steps, in order.
func Steps(mr *caprv1.MachineRemediation) []caprv1.StepName {
	out := make([]caprv1.StepName, 0, len(mr.Spec.Escalation))
	for i := range mr.Spec.Escalation {
		out = append(out, caprv1.EscalationStepName(i))
	}
	return out
}

// Index returns the index in spec.escalation of an escalation step (-1 for other steps).
func Index(mr *caprv1.MachineRemediation, step caprv1.StepName) int {
	for i := range mr.Spec.Escalation {
		if caprv1.EscalationStepName(i) == step {
			return i
		}
	}
	return -1
}

// Result is what one attempt at an escalation step found: the remediators' step result
// (remediation.StepResult), so that both run an escalation step as any other.
type Result = remediation.StepResult

// Runner runs escalation steps.
type Runner struct {
	Client client.Client
	// APIReader reads templates and the step objects live (a cache would need a watch on every kind).
	APIReader client.Reader
	// Timeout, when set, turns a step's timeoutSeconds into its timeout (tests: the API's minimum of
	// 60 s is too long to wait for).
	Timeout func(timeoutSeconds int32) time.Duration
	// Event records an event on the MachineRemediation.
	Event func(mr *caprv1.MachineRemediation, eventType, reason, msg string)
}

// Gate says why a step's object may not be created now (waitReason and message; "" = it may). It is
// asked only before the object exists: once created, the step's action is under way.
type Gate func(ctx context.Context) (waitReason, message string, err error)

// StepTimeout is a step's timeout.
func (r *Runner) StepTimeout(step caprv1.EscalationStep) time.Duration {
	if r.Timeout != nil {
		return r.Timeout(step.TimeoutSeconds)
	}
	return time.Duration(step.TimeoutSeconds) * time.Second
}

// Step runs one escalation step of mr (rec is its record, started). The chain is skipped when, as it
// begins, the Machine carries no mark to watch (e.g. a manual request): recovery could not be seen.
func (r *Runner) Step(ctx context.Context, mr *caprv1.MachineRemediation, machine *clusterv1.Machine, clusterName string,
	rec *caprv1.RemediationStep, gate Gate, now time.Time) (Result, error) {
	i := Index(mr, rec.Name)
	if i < 0 {
		return Result{}, fmt.Errorf("unknown step %s", rec.Name)
	}
	first := mr.Status.Step(caprv1.EscalationStepName(0))
	if (i == 0 && rec.Message == "" && !Marked(machine)) || (i > 0 && first != nil && first.Outcome == caprv1.StepOutcomeSkipped) {
		return Result{Done: true, Skipped: true, Message: "the Machine carries no health mark whose removal would show a recovery: escalation skipped"}, nil
	}
	esc := mr.Spec.Escalation[i]
	what := fmt.Sprintf("%s %s", objectKind(esc.TemplateRef.Kind), mr.Name)
	timeout := r.StepTimeout(esc)
	elapsed := now.Sub(rec.StartTime.Time)

	if !Marked(machine) {
		// Nothing follows a recovery on this Machine: an object that cannot be deleted is left (and said).
		rel, err := r.release(ctx, mr, esc)
		if err != nil {
			return Result{}, err
		}
		msg := fmt.Sprintf("Machine %s is healthy again after %s (escalation step %d): nothing deleted", mr.Name, what, i+1)
		return Result{Recovered: true, Message: r.leave(mr, msg, rel.left())}, nil
	}
	if elapsed > timeout {
		rel, err := r.release(ctx, mr, esc)
		if err != nil {
			return Result{}, err
		}
		if rel.refused != "" && elapsed <= 2*timeout {
			// The next action on the Machine must not run beside this one while that can be
			// helped: the delete is retried for one more timeout, then the step ends without it.
			return Result{WaitReason: caprv1.MachineRemediationEscalationObjectNotDeletedReason, Requeue: min(2*timeout-elapsed+100*time.Millisecond, maxRequeue),
				Message: fmt.Sprintf("Machine %s not healthy within %s of %s, and %s; retried until %s after the step began, then the remediation goes on without it",
					mr.Name, timeout, what, rel.refused, 2*timeout)}, nil
		}
		msg := fmt.Sprintf("Machine %s not healthy within %s of %s", mr.Name, timeout, what)
		if rel.deleted {
			msg += ": deleted it"
		}
		return Result{Done: true, Failed: true, Message: r.leave(mr, msg, rel.left())}, nil
	}
	requeue := min(timeout-elapsed+100*time.Millisecond, maxRequeue)
	obj, err := r.lookup(ctx, mr, esc)
	switch {
	case apierrors.IsForbidden(err):
		return Result{WaitReason: caprv1.MachineRemediationWaitingForPreconditionsReason, Requeue: requeue,
			Message: fmt.Sprintf("cannot read %s (the step times out after %s): %v", what, timeout, err)}, nil
	case err != nil:
		return Result{}, err
	case obj != nil && !createdFor(obj, mr):
		return Result{WaitReason: caprv1.MachineRemediationEscalationObjectNotOwnedReason, Requeue: requeue,
			Message: fmt.Sprintf("%s exists but is not the object CAPR created for this remediation (%s): it is left alone, never deleted; waiting up to %s for Machine %s to be healthy again",
				what, notCreatedFor(obj, mr), timeout, mr.Name)}, nil
	case obj == nil:
		if gate != nil {
			reason, msg, err := gate(ctx)
			if err != nil {
				return Result{}, err
			}
			if reason != "" {
				return Result{WaitReason: reason, Requeue: min(requeue, 2*time.Second),
					Message: fmt.Sprintf("%s not created yet (the step times out after %s): %s", what, timeout, msg)}, nil
			}
		}
		created, err := r.createObject(ctx, mr, esc, clusterName)
		if err != nil {
			return Result{WaitReason: caprv1.MachineRemediationWaitingForPreconditionsReason, Requeue: requeue,
				Message: fmt.Sprintf("cannot create %s (the step times out after %s): %v", what, timeout, err)}, nil
		}
		if !created {
			// Someone else's object took the name since it was read: the next look judges it.
			return Result{Requeue: min(requeue, 100*time.Millisecond), Message: fmt.Sprintf("%s appeared before CAPR could create it: looking again", what)}, nil
		}
	}
	return Result{Requeue: requeue, Message: fmt.Sprintf("created %s; waiting up to %s for Machine %s to be healthy again", what, timeout, mr.Name)}, nil
}

// leave ends a step's message with what was left in place (said also in a Warning event): an object
// of the step's name CAPR did not create, or its own that it may not delete.
func (r *Runner) leave(mr *caprv1.MachineRemediation, msg, left string) string {
	if left == "" {
		return msg
	}
	if r.Event != nil {
		r.Event(mr, corev1.EventTypeWarning, EventObjectLeft, left)
	}
	if msg == "" {
		return left
	}
	return msg + "; " + left
}

// objectKind is the kind of the objects created from a template kind.
func objectKind(templateKind string) string {
	return strings.TrimSuffix(templateKind, clusterv1.TemplateSuffix)
}

// objectOf is the step's object, as far as its key: in the request's namespace, named after the Machine.
func objectOf(mr *caprv1.MachineRemediation, esc caprv1.EscalationStep) (*unstructured.Unstructured, error) {
	gv, err := schema.ParseGroupVersion(esc.TemplateRef.APIVersion)
	if err != nil {
		return nil, fmt.Errorf("invalid templateRef.apiVersion %q: %w", esc.TemplateRef.APIVersion, err)
	}
	obj := &unstructured.Unstructured{}
	obj.SetGroupVersionKind(gv.WithKind(objectKind(esc.TemplateRef.Kind)))
	obj.SetNamespace(mr.Namespace)
	obj.SetName(mr.Name)
	return obj, nil
}

// lookup reads, live, the object under the name of the step's object (nil when there is none, or no
// such kind). It may be someone else's: createdFor tells.
func (r *Runner) lookup(ctx context.Context, mr *caprv1.MachineRemediation, esc caprv1.EscalationStep) (*unstructured.Unstructured, error) {
	obj, err := objectOf(mr, esc)
	if err != nil {
		return nil, nil //nolint:nilerr // nothing can exist for an invalid reference; createObject says why
	}
	err = r.APIReader.Get(ctx, client.ObjectKeyFromObject(obj), obj)
	switch {
	case err == nil:
		return obj, nil
	case apierrors.IsNotFound(err) || meta.IsNoMatchError(err):
		return nil, nil
	default:
		return nil, fmt.Errorf("reading %s %s: %w", obj.GetKind(), mr.Name, err)
	}
}

// createdFor reports whether obj is the object CAPR created for this remediation: its controller is
// the MachineRemediation, by UID (Object sets that owner reference). The name proves nothing: anyone
// who may write the kind in the namespace can use it, and a step whose kind resolves to one CAPR
// manages otherwise (a Machine, the request itself) names an object CAPR never made.
func createdFor(obj metav1.Object, mr *caprv1.MachineRemediation) bool {
	ref := metav1.GetControllerOfNoCopy(obj)
	return ref != nil && ref.UID == mr.UID && ref.Kind == "MachineRemediation" && groupOf(ref.APIVersion) == caprv1.GroupVersion.Group
}

// notCreatedFor says why obj is not the object CAPR created for this remediation (createdFor).
func notCreatedFor(obj metav1.Object, mr *caprv1.MachineRemediation) string {
	ref := metav1.GetControllerOfNoCopy(obj)
	if ref == nil {
		return fmt.Sprintf("it has no controller; CAPR's is owned by MachineRemediation %s, UID %s", mr.Name, mr.UID)
	}
	return fmt.Sprintf("its controller is %s %s, UID %s; CAPR's is owned by MachineRemediation %s, UID %s", ref.Kind, ref.Name, ref.UID, mr.Name, mr.UID)
}

func groupOf(apiVersion string) string {
	gv, err := schema.ParseGroupVersion(apiVersion)
	if err != nil {
		return ""
	}
	return gv.Group
}

// createObject creates the step's object from its template; created is false when an object of its
// name appeared since it was read (not CAPR's for this remediation until looked at).
func (r *Runner) createObject(ctx context.Context, mr *caprv1.MachineRemediation, esc caprv1.EscalationStep, clusterName string) (created bool, err error) {
	ref := esc.TemplateRef
	if _, err := objectOf(mr, esc); err != nil {
		return false, err
	}
	template := &unstructured.Unstructured{}
	template.SetAPIVersion(ref.APIVersion)
	template.SetKind(ref.Kind)
	if err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: mr.Namespace, Name: ref.Name}, template); err != nil {
		if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
			return false, fmt.Errorf("template %s %s not found: %w", ref.Kind, ref.Name, err)
		}
		return false, fmt.Errorf("reading template %s %s: %w", ref.Kind, ref.Name, err)
	}
	obj := Object(template, mr, clusterName)
	if err := r.Client.Create(ctx, obj); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return false, nil
		}
		return false, fmt.Errorf("creating %s %s: %w", obj.GetKind(), obj.GetName(), err)
	}
	if r.Event != nil {
		r.Event(mr, corev1.EventTypeNormal, EventCreated, fmt.Sprintf("Created %s %s from %s %s", obj.GetKind(), obj.GetName(), ref.Kind, ref.Name))
	}
	return true, nil
}

// Object builds the object of an escalation step: the template's spec.template.spec as its spec, kind
// without the Template suffix, named after the Machine, owned by the MachineRemediation, annotated
// with the Machine's name.
func Object(template *unstructured.Unstructured, mr *caprv1.MachineRemediation, clusterName string) *unstructured.Unstructured {
	obj := &unstructured.Unstructured{Object: map[string]any{}}
	obj.SetAPIVersion(template.GetAPIVersion())
	obj.SetKind(objectKind(template.GetKind()))
	obj.SetNamespace(mr.Namespace)
	obj.SetName(mr.Name)
	obj.SetLabels(map[string]string{clusterv1.ClusterNameLabel: clusterName})
	obj.SetAnnotations(map[string]string{MachineAnnotation: mr.Name})
	obj.SetOwnerReferences([]metav1.OwnerReference{{
		APIVersion: caprv1.GroupVersion.String(), Kind: "MachineRemediation", Name: mr.Name, UID: mr.UID,
		Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
	}})
	if spec, found, err := unstructured.NestedMap(template.Object, "spec", "template", "spec"); err == nil && found {
		obj.Object["spec"] = spec
	}
	return obj
}

// released is what release did with the object under the name of a step's object.
type released struct {
	// deleted: it was CAPR's for this remediation, and is deleted or being deleted.
	deleted bool
	// notOurs says it is not the object CAPR created for this remediation: left alone, never deleted.
	notOurs string
	// refused says CAPR's role does not let it delete (or read) it: it is left for now.
	refused string
}

// left says what was left in place ("" when nothing).
func (rel released) left() string { return rel.notOurs + rel.refused }

// release deletes the step's object if it is the one CAPR created for this remediation (gone already
// is fine); the caller decides whether what is left is waited on.
func (r *Runner) release(ctx context.Context, mr *caprv1.MachineRemediation, esc caprv1.EscalationStep) (released, error) {
	what := fmt.Sprintf("%s %s", objectKind(esc.TemplateRef.Kind), mr.Name)
	obj, err := r.lookup(ctx, mr, esc)
	switch {
	case apierrors.IsForbidden(err):
		return released{refused: fmt.Sprintf("%s cannot be read to be deleted (%v): %s", what, err, grantHint(esc))}, nil
	case err != nil:
		return released{}, err
	case obj == nil:
		return released{}, nil
	case !createdFor(obj, mr):
		return released{notOurs: fmt.Sprintf("%s is not the object CAPR created for this remediation (%s): left alone, not deleted", what, notCreatedFor(obj, mr))}, nil
	case !obj.GetDeletionTimestamp().IsZero():
		return released{deleted: true}, nil
	}
	// Conditional on the UID read: an object made meanwhile under the name is not deleted unseen.
	err = r.Client.Delete(ctx, obj, client.Preconditions{UID: ptr.To(obj.GetUID())})
	switch {
	case err == nil || apierrors.IsNotFound(err):
		return released{deleted: true}, nil
	case apierrors.IsConflict(err):
		return released{}, nil // another object under the name now: the next look judges it
	case apierrors.IsForbidden(err):
		return released{refused: fmt.Sprintf("%s, which CAPR created for this remediation, cannot be deleted (%v): %s", what, err, grantHint(esc))}, nil
	default:
		return released{}, fmt.Errorf("deleting %s: %w", what, err)
	}
}

// grantHint says how CAPR is given what it needs on an escalation kind (docs/user/escalation.md).
func grantHint(esc caprv1.EscalationStep) string {
	return fmt.Sprintf("grant CAPR get and delete on %s of %s through a ClusterRole labelled %s; left in place meanwhile, it goes with the request (owner reference)",
		objectKind(esc.TemplateRef.Kind), groupOf(esc.TemplateRef.APIVersion), aggregationLabel)
}

// aggregationLabel on a ClusterRole adds its rules to CAPR's manager role (config/rbac/aggregated_role.yaml).
const aggregationLabel = "remediation.cluster.x-k8s.io/aggregate-to-manager"

// DeleteStarted deletes the objects CAPR created for every escalation step started (abort, undo, or
// the Machine gone): nothing created for a remediation outlives it, and a step started again creates
// its object anew. Nothing follows on the Machine, so what cannot be deleted (its own object CAPR's
// role does not let it delete) or must not be (an object of the name CAPR did not create) is left,
// said in a Warning event and returned.
func (r *Runner) DeleteStarted(ctx context.Context, mr *caprv1.MachineRemediation) ([]string, error) {
	var out []string
	for i, esc := range mr.Spec.Escalation {
		if mr.Status.Step(caprv1.EscalationStepName(i)) == nil {
			continue
		}
		rel, err := r.release(ctx, mr, esc)
		if err != nil {
			return nil, err
		}
		if left := rel.left(); left != "" {
			out = append(out, r.leave(mr, "", left))
		}
	}
	return out, nil
}
