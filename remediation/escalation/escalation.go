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

// EventCreated is the event reason on the MachineRemediation when a step's object is created.
const EventCreated = "EscalationCreated"

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
		if err := r.deleteObject(ctx, mr, esc); err != nil {
			return Result{}, err
		}
		return Result{Recovered: true, Message: fmt.Sprintf("Machine %s is healthy again after %s (escalation step %d): nothing deleted", mr.Name, what, i+1)}, nil
	}
	if elapsed > timeout {
		if err := r.deleteObject(ctx, mr, esc); err != nil {
			return Result{}, err
		}
		return Result{Done: true, Failed: true, Message: fmt.Sprintf("Machine %s not healthy within %s of %s: deleted it", mr.Name, timeout, what)}, nil
	}
	requeue := min(timeout-elapsed+100*time.Millisecond, maxRequeue)
	exists, err := r.objectExists(ctx, mr, esc)
	if err != nil {
		return Result{}, err
	}
	if !exists {
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
		if err := r.createObject(ctx, mr, esc, clusterName); err != nil {
			return Result{WaitReason: caprv1.MachineRemediationWaitingForPreconditionsReason, Requeue: requeue,
				Message: fmt.Sprintf("cannot create %s (the step times out after %s): %v", what, timeout, err)}, nil
		}
	}
	return Result{Requeue: requeue, Message: fmt.Sprintf("created %s; waiting up to %s for Machine %s to be healthy again", what, timeout, mr.Name)}, nil
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

// objectExists reports whether the step's object exists.
func (r *Runner) objectExists(ctx context.Context, mr *caprv1.MachineRemediation, esc caprv1.EscalationStep) (bool, error) {
	obj, err := objectOf(mr, esc)
	if err != nil {
		return false, nil //nolint:nilerr // nothing can exist for an invalid reference; createObject says why
	}
	err = r.APIReader.Get(ctx, client.ObjectKeyFromObject(obj), obj)
	switch {
	case err == nil:
		return true, nil
	case apierrors.IsNotFound(err) || meta.IsNoMatchError(err):
		return false, nil
	default:
		return false, fmt.Errorf("reading %s %s: %w", obj.GetKind(), mr.Name, err)
	}
}

// createObject creates the step's object from its template (already there is fine).
func (r *Runner) createObject(ctx context.Context, mr *caprv1.MachineRemediation, esc caprv1.EscalationStep, clusterName string) error {
	ref := esc.TemplateRef
	if _, err := objectOf(mr, esc); err != nil {
		return err
	}
	template := &unstructured.Unstructured{}
	template.SetAPIVersion(ref.APIVersion)
	template.SetKind(ref.Kind)
	if err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: mr.Namespace, Name: ref.Name}, template); err != nil {
		if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
			return fmt.Errorf("template %s %s not found: %w", ref.Kind, ref.Name, err)
		}
		return fmt.Errorf("reading template %s %s: %w", ref.Kind, ref.Name, err)
	}
	obj := Object(template, mr, clusterName)
	if err := r.Client.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating %s %s: %w", obj.GetKind(), obj.GetName(), err)
	}
	if r.Event != nil {
		r.Event(mr, corev1.EventTypeNormal, EventCreated, fmt.Sprintf("Created %s %s from %s %s", obj.GetKind(), obj.GetName(), ref.Kind, ref.Name))
	}
	return nil
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

// deleteObject deletes a step's object (gone already is fine).
func (r *Runner) deleteObject(ctx context.Context, mr *caprv1.MachineRemediation, esc caprv1.EscalationStep) error {
	obj, err := objectOf(mr, esc)
	if err != nil {
		return nil //nolint:nilerr // nothing can have been created from an invalid reference
	}
	if err := r.Client.Delete(ctx, obj); err != nil && !apierrors.IsNotFound(err) && !meta.IsNoMatchError(err) {
		return fmt.Errorf("deleting %s %s: %w", obj.GetKind(), obj.GetName(), err)
	}
	return nil
}

// DeleteStarted deletes the objects of every escalation step started (abort, undo, or the Machine
// gone): nothing created for a remediation outlives it, and a step started again creates its object
// anew.
func (r *Runner) DeleteStarted(ctx context.Context, mr *caprv1.MachineRemediation) error {
	for i, esc := range mr.Spec.Escalation {
		if mr.Status.Step(caprv1.EscalationStepName(i)) == nil {
			continue
		}
		if err := r.deleteObject(ctx, mr, esc); err != nil {
			return err
		}
	}
	return nil
}
