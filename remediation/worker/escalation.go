package worker

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
)

// MachineAnnotation on an escalation object names the Machine it remediates.
const MachineAnnotation = "remediation.cluster.x-k8s.io/machine"

// Escalation (spec.escalation, medik8s NodeHealthCheck's semantics): each step creates an object
// from its template and waits for the Machine's health mark to go away (the remediation then ends,
// nothing deleted) or for its timeout (the object is deleted, the next step follows). The kinds are
// the user's: CAPR is granted them through a ClusterRole labelled
// remediation.cluster.x-k8s.io/aggregate-to-manager, never a wildcard.

// marked reports whether the Machine still carries a health mark: CAPR's annotation or condition, or
// CAPI's HealthCheckSucceeded=False (a request from CAPI's MachineHealthCheck).
func marked(m *clusterv1.Machine) bool {
	if _, ok := m.Annotations[caprv1.UnhealthyAnnotation]; ok {
		return true
	}
	return conditions.IsFalse(m, caprv1.MachineCAPRHealthCheckSucceededCondition) ||
		conditions.IsFalse(m, clusterv1.MachineHealthCheckSucceededCondition)
}

// escalationIndex returns the index in spec.escalation of an escalation step (-1 for other steps).
func escalationIndex(mr *caprv1.MachineRemediation, step caprv1.StepName) int {
	for i := range mr.Spec.Escalation {
		if caprv1.EscalationStepName(i) == step {
			return i
		}
	}
	return -1
}

// escalationTimeout is a step's timeout (EscalationTimeout overrides the conversion in tests).
func (r *Reconciler) escalationTimeout(step caprv1.EscalationStep) time.Duration {
	if r.EscalationTimeout != nil {
		return r.EscalationTimeout(step.TimeoutSeconds)
	}
	return time.Duration(step.TimeoutSeconds) * time.Second
}

// stepEscalate runs one escalation step. The chain is skipped when, as it begins, the Machine
// carries no mark to watch (e.g. a manual request): recovery could not be seen.
func (r *Reconciler) stepEscalate(ctx context.Context, s *scope, rec *caprv1.RemediationStep) (stepResult, error) {
	i := escalationIndex(s.mr, rec.Name)
	if i < 0 {
		return stepResult{}, fmt.Errorf("unknown step %s", rec.Name)
	}
	first := s.mr.Status.Step(caprv1.EscalationStepName(0))
	if (i == 0 && rec.Message == "" && !marked(s.machine)) || (i > 0 && first != nil && first.Outcome == caprv1.StepOutcomeSkipped) {
		return stepResult{done: true, skipped: true, message: "the Machine carries no health mark whose removal would show a recovery: escalation skipped"}, nil
	}
	esc := s.mr.Spec.Escalation[i]
	kind := strings.TrimSuffix(esc.TemplateRef.Kind, clusterv1.TemplateSuffix)
	what := fmt.Sprintf("%s %s", kind, s.mr.Name)
	timeout := r.escalationTimeout(esc)
	elapsed := time.Since(rec.StartTime.Time)

	if !marked(s.machine) {
		if err := r.deleteEscalationObject(ctx, s.mr, esc); err != nil {
			return stepResult{}, err
		}
		return stepResult{recovered: true, message: fmt.Sprintf("Machine %s is healthy again after %s (escalation step %d): nothing deleted", s.mr.Name, what, i+1)}, nil
	}
	if elapsed > timeout {
		if err := r.deleteEscalationObject(ctx, s.mr, esc); err != nil {
			return stepResult{}, err
		}
		return stepResult{done: true, failed: true, message: fmt.Sprintf("Machine %s not healthy within %s of %s: deleted it", s.mr.Name, timeout, what)}, nil
	}
	requeue := min(timeout-elapsed+100*time.Millisecond, waitLong)
	if err := r.ensureEscalationObject(ctx, s, esc); err != nil {
		return stepResult{waitReason: caprv1.MachineRemediationWaitingForPreconditionsReason, requeue: requeue,
			message: fmt.Sprintf("cannot create %s (the step times out after %s): %v", what, timeout, err)}, nil
	}
	return stepResult{requeue: requeue, message: fmt.Sprintf("created %s; waiting up to %s for Machine %s to be healthy again", what, timeout, s.mr.Name)}, nil
}

// ensureEscalationObject creates the step's object from its template unless it exists.
func (r *Reconciler) ensureEscalationObject(ctx context.Context, s *scope, esc caprv1.EscalationStep) error {
	ref := esc.TemplateRef
	gv, err := schema.ParseGroupVersion(ref.APIVersion)
	if err != nil {
		return fmt.Errorf("invalid templateRef.apiVersion %q: %w", ref.APIVersion, err)
	}
	existing := &unstructured.Unstructured{}
	existing.SetGroupVersionKind(gv.WithKind(strings.TrimSuffix(ref.Kind, clusterv1.TemplateSuffix)))
	err = r.APIReader.Get(ctx, client.ObjectKey{Namespace: s.mr.Namespace, Name: s.mr.Name}, existing)
	if err == nil {
		return nil
	}
	if !apierrors.IsNotFound(err) {
		return fmt.Errorf("reading %s %s: %w", existing.GetKind(), s.mr.Name, err)
	}
	template := &unstructured.Unstructured{}
	template.SetGroupVersionKind(gv.WithKind(ref.Kind))
	if err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: s.mr.Namespace, Name: ref.Name}, template); err != nil {
		if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
			return fmt.Errorf("template %s %s not found: %w", ref.Kind, ref.Name, err)
		}
		return fmt.Errorf("reading template %s %s: %w", ref.Kind, ref.Name, err)
	}
	obj := escalationObject(template, s.mr, s.cluster.Name)
	if err := r.Client.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating %s %s: %w", obj.GetKind(), obj.GetName(), err)
	}
	r.event(s.mr, corev1.EventTypeNormal, EventEscalationCreated, fmt.Sprintf("Created %s %s from %s %s", obj.GetKind(), obj.GetName(), ref.Kind, ref.Name))
	return nil
}

// escalationObject builds the object of an escalation step: the template's spec.template.spec as its
// spec, kind without the Template suffix, named after the Machine, owned by the MachineRemediation,
// annotated with the Machine's name.
func escalationObject(template *unstructured.Unstructured, mr *caprv1.MachineRemediation, clusterName string) *unstructured.Unstructured {
	obj := &unstructured.Unstructured{Object: map[string]any{}}
	obj.SetAPIVersion(template.GetAPIVersion())
	obj.SetKind(strings.TrimSuffix(template.GetKind(), clusterv1.TemplateSuffix))
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

// deleteEscalationObject deletes a step's object (gone already is fine).
func (r *Reconciler) deleteEscalationObject(ctx context.Context, mr *caprv1.MachineRemediation, esc caprv1.EscalationStep) error {
	gv, err := schema.ParseGroupVersion(esc.TemplateRef.APIVersion)
	if err != nil {
		return nil //nolint:nilerr // nothing can have been created from an invalid reference
	}
	obj := &unstructured.Unstructured{}
	obj.SetGroupVersionKind(gv.WithKind(strings.TrimSuffix(esc.TemplateRef.Kind, clusterv1.TemplateSuffix)))
	obj.SetNamespace(mr.Namespace)
	obj.SetName(mr.Name)
	if err := r.Client.Delete(ctx, obj); err != nil && !apierrors.IsNotFound(err) && !meta.IsNoMatchError(err) {
		return fmt.Errorf("deleting %s %s: %w", obj.GetKind(), obj.GetName(), err)
	}
	return nil
}

// deleteStartedEscalationObjects deletes the objects of every escalation step started (abort, or the
// Machine gone): nothing created for a remediation outlives it.
func (r *Reconciler) deleteStartedEscalationObjects(ctx context.Context, mr *caprv1.MachineRemediation) error {
	for i, esc := range mr.Spec.Escalation {
		if mr.Status.Step(caprv1.EscalationStepName(i)) == nil {
			continue
		}
		if err := r.deleteEscalationObject(ctx, mr, esc); err != nil {
			return err
		}
	}
	return nil
}
