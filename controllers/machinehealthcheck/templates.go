package machinehealthcheck

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/cluster-api/controllers/external"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// This file checks that the templates a health check refers to exist and are templates
// (spec.template.spec), as medik8s NodeHealthCheck does before it remediates: a typo in an escalation
// step would otherwise only show when a Machine reaches that step, possibly hours later. What it finds
// is reported in RemediationTemplatesValid (and a Warning event when it turns False); nothing else
// changes: a remediator still reports a missing template when it needs it. Templates are of any kind
// a user names, so they are read live (controllers.ManagerClientOptions): a kind CAPR may not read
// answers Forbidden at once, reported here, instead of a cache waiting forever to sync.

// templateRecheck is how long a successful check is trusted while the health check's spec is
// unchanged (a template deleted later is seen within it); templateRetry is how soon a problem is
// looked at again (templates are not watched).
const (
	templateRecheck = time.Minute
	templateRetry   = 10 * time.Second
)

// templateRefs lists the remediation templates of a health check's spec, with the field that names
// each. (The External fencing backend's template is not among them: its contract belongs to the
// fencing backends.)
func templateRefs(mhc *caprv1.MachineHealthCheck) (fields []string, refs []caprv1.TemplateReference) {
	rem := mhc.Spec.Remediation
	if rem.TemplateRef != nil {
		fields, refs = append(fields, "spec.remediation.templateRef"), append(refs, *rem.TemplateRef)
	}
	for i, e := range rem.Escalation {
		fields, refs = append(fields, fmt.Sprintf("spec.remediation.escalation[%d].templateRef", i)), append(refs, e.TemplateRef)
	}
	return fields, refs
}

// templateProblem says what is wrong with the object read for a template reference ("" when
// nothing is). A template must carry what is created from it in spec.template.spec.
func templateProblem(obj *unstructured.Unstructured) string {
	if _, found, err := unstructured.NestedMap(obj.Object, "spec", "template", "spec"); err != nil || !found {
		return "has no spec.template.spec"
	}
	return ""
}

// templateChecks remembers, per health check, the generation last checked and when, so that
// templates are read when the spec changes, while a problem lasts, and every templateRecheck.
type templateChecks struct {
	mu   sync.Mutex
	last map[types.UID]templateCheck
}

type templateCheck struct {
	generation int64
	at         time.Time
}

// due returns how long until the templates must be read again (0: now): at once when the spec
// changed, else templateRecheck after a good check and templateRetry after a bad one, so that a
// round triggered by every Node event does not read them each time.
func (c *templateChecks) due(mhc *caprv1.MachineHealthCheck, valid bool, now time.Time) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	last, ok := c.last[mhc.UID]
	if !ok || last.generation != mhc.Generation {
		return 0
	}
	every := templateRetry
	if valid {
		every = templateRecheck
	}
	return max(every-now.Sub(last.at), 0)
}

func (c *templateChecks) done(mhc *caprv1.MachineHealthCheck, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.last == nil {
		c.last = map[types.UID]templateCheck{}
	}
	c.last[mhc.UID] = templateCheck{generation: mhc.Generation, at: now}
}

func (c *templateChecks) forget(uid types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.last, uid)
}

// checkRequestsListable says why the requests of the kind spec.remediation.templateRef makes cannot be
// listed ("" when they can, or are CAPR's own): the rounds then write marks but no request
// (requestsUnlistableError). One List of at most one object, read live like the templates.
func (r *Reconciler) checkRequestsListable(ctx context.Context, mhc *caprv1.MachineHealthCheck) string {
	ref := mhc.Spec.Remediation.TemplateRef
	gvk, err := requestGVK(mhc)
	if ref == nil || err != nil || gvk == caprv1.GroupVersion.WithKind("MachineRemediation") {
		return "" // an apiVersion that does not parse is refused at admission
	}
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
	err = r.Client.List(ctx, list, client.InNamespace(mhc.Namespace), client.Limit(1))
	if err == nil || !unlistable(err) {
		return ""
	}
	return fmt.Sprintf("spec.remediation.templateRef: %s requests in %s cannot be listed, so none is created or withdrawn (grant CAPR list, watch, create and delete on them; see docs/user/install.md): %v",
		gvk.Kind, mhc.Namespace, err)
}

// checkTemplates sets RemediationTemplatesValid (removed when the spec names no template) and
// returns how soon to look again (0: no template to look at).
func (r *Reconciler) checkTemplates(ctx context.Context, mhc *caprv1.MachineHealthCheck, now time.Time) time.Duration {
	fields, refs := templateRefs(mhc)
	if len(refs) == 0 {
		meta.RemoveStatusCondition(&mhc.Status.Conditions, caprv1.MachineHealthCheckRemediationTemplatesValidCondition)
		return 0
	}
	valid := meta.IsStatusConditionTrue(mhc.Status.Conditions, caprv1.MachineHealthCheckRemediationTemplatesValidCondition)
	if wait := r.state.templates.due(mhc, valid, now); wait > 0 {
		return wait
	}
	var problems []string
	reason := caprv1.MachineHealthCheckRemediationTemplateInvalidReason
	for i, ref := range refs {
		obj, err := external.Get(ctx, r.Client, &corev1.ObjectReference{APIVersion: ref.APIVersion, Kind: ref.Kind, Name: ref.Name, Namespace: mhc.Namespace})
		switch {
		case apierrors.IsNotFound(err) || meta.IsNoMatchError(err):
			reason = caprv1.MachineHealthCheckRemediationTemplateNotFoundReason
			problems = append(problems, fmt.Sprintf("%s: %s %s/%s not found (%v)", fields[i], ref.Kind, mhc.Namespace, ref.Name, err))
		case apierrors.IsForbidden(err):
			problems = append(problems, fmt.Sprintf("%s: %s %s/%s cannot be read, grant CAPR get on it (see docs/user/install.md, Other control-plane providers): %v",
				fields[i], ref.Kind, mhc.Namespace, ref.Name, err))
		case err != nil:
			problems = append(problems, fmt.Sprintf("%s: reading %s %s/%s: %v", fields[i], ref.Kind, mhc.Namespace, ref.Name, err))
		default:
			if p := templateProblem(obj); p != "" {
				problems = append(problems, fmt.Sprintf("%s: %s %s/%s %s", fields[i], ref.Kind, mhc.Namespace, ref.Name, p))
			}
		}
	}
	if p := r.checkRequestsListable(ctx, mhc); p != "" {
		problems = append(problems, p)
	}
	r.state.templates.done(mhc, now)
	if len(problems) == 0 {
		r.setStatusCondition(mhc, metav1.Condition{Type: caprv1.MachineHealthCheckRemediationTemplatesValidCondition, Status: metav1.ConditionTrue,
			Reason: caprv1.MachineHealthCheckRemediationTemplatesValidReason})
		return templateRecheck
	}
	msg := "Remediation will fail where it needs these templates: " + strings.Join(problems, "; ")
	if r.setStatusCondition(mhc, metav1.Condition{Type: caprv1.MachineHealthCheckRemediationTemplatesValidCondition, Status: metav1.ConditionFalse,
		Reason: reason, Message: msg}) {
		r.recorder.Eventf(mhc, nil, corev1.EventTypeWarning, reason, "HealthCheck", "%s", msg)
	}
	return templateRetry
}
