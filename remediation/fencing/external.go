package fencing

import (
	"context"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// The External fencing contract (docs/user/fencing.md, Fencing backends): for a backend
// {type: External, templateRef: {apiVersion, kind: <Kind>Template, name}} CAPR creates, in the
// Machine's namespace of the management cluster, a <Kind> named after the Machine, whose spec is the
// template's spec.template.spec, labelled with the Cluster's name and ManagedByLabel=capr, and
// annotated with the Machine's and the Node's names and the MachineRemediation's UID (owned.go: CAPR
// confirms only that object, with the template's spec; any other object of the name is replaced).
// The provider fences the node (e.g. powers it off through its BMC) and sets the condition
// Fenced=True in status.conditions (metav1.Condition). CAPR deletes the object to
// unfence, once the Machine is gone or the remediation is undone; a provider that must act on
// unfence holds the deletion with a finalizer of its own. The object has no owner: garbage
// collection must never unfence a node CAPR has not released.
const (
	// ExternalFencedCondition is the condition a provider sets on the object once the node is fenced.
	ExternalFencedCondition = "Fenced"
	// ExternalFenceMachineAnnotation and ExternalFenceNodeAnnotation name the Machine and its Node.
	ExternalFenceMachineAnnotation = NetworkFenceMachineAnnotation
	ExternalFenceNodeAnnotation    = NetworkFenceNodeAnnotation
)

// ExternalBackend fences through another controller, following the External fencing contract.
type ExternalBackend struct {
	// Client writes the objects in the management cluster.
	Client client.Client
	// APIReader reads templates and objects live (a cache would need a watch on every kind).
	APIReader client.Reader
}

var (
	_ Backend         = &ExternalBackend{}
	_ BackendUnfencer = &ExternalBackend{}
)

// ExternalFenceKey is the object the External backend spec creates for a Machine: its kind (the
// template's without the Template suffix), namespace and name.
func ExternalFenceKey(spec caprv1.FencingBackend, machine *clusterv1.Machine) (*unstructured.Unstructured, error) {
	if spec.TemplateRef == nil {
		return nil, fmt.Errorf("%w: the External backend has no templateRef", ErrNotAvailable)
	}
	gv, err := schema.ParseGroupVersion(spec.TemplateRef.APIVersion)
	if err != nil {
		return nil, fmt.Errorf("invalid templateRef.apiVersion %q: %w", spec.TemplateRef.APIVersion, err)
	}
	obj := &unstructured.Unstructured{}
	obj.SetGroupVersionKind(gv.WithKind(strings.TrimSuffix(spec.TemplateRef.Kind, clusterv1.TemplateSuffix)))
	obj.SetNamespace(machine.Namespace)
	obj.SetName(machine.Name)
	return obj, nil
}

// Fence implements Backend.
func (b *ExternalBackend) Fence(ctx context.Context, req Request, spec caprv1.FencingBackend) (bool, string, error) {
	if req.Remediation == "" {
		return false, "", errNoRemediation
	}
	obj, err := ExternalFenceKey(spec, req.Machine)
	if err != nil {
		return false, "", err
	}
	what := obj.GetKind() + " " + obj.GetName()
	err = b.APIReader.Get(ctx, client.ObjectKeyFromObject(obj), obj)
	switch {
	case meta.IsNoMatchError(err):
		return false, "", fmt.Errorf("%w: the management cluster has no %s %s", ErrNotAvailable, obj.GetAPIVersion(), obj.GetKind())
	case apierrors.IsNotFound(err):
		return b.create(ctx, req, spec, what)
	case err != nil:
		return false, "", fmt.Errorf("reading %s: %w", what, err)
	}
	if !obj.GetDeletionTimestamp().IsZero() {
		return false, fmt.Sprintf("%s of an earlier unfence is being deleted; fencing again once it is gone", what), nil
	}
	if node := obj.GetAnnotations()[ExternalFenceNodeAnnotation]; node != req.Node && obj.GetLabels()[ManagedByLabel] == ManagedBy {
		// CAPR's fence of another node (the Machine's name was reused): releasing it could unfence a
		// node whose remediation still relies on it, so it is neither believed nor replaced.
		return false, fmt.Sprintf("%s exists for node %q, not %s: it is not this fence; delete it to fence again", what, node, req.Node), nil
	}
	why, unknown, err := b.notThisFence(ctx, obj, req, spec)
	switch {
	case err != nil:
		return false, "", err
	case len(why) > 0:
		msg, err := replace(ctx, b.Client, obj, what, why)
		return false, msg, err
	case unknown != "":
		return false, fmt.Sprintf("%s cannot be confirmed: %s", what, unknown), nil
	}
	c := fencedCondition(obj)
	switch {
	case c == nil:
		return false, fmt.Sprintf("%s created, waiting for its %s condition", what, ExternalFencedCondition), nil
	case c.Status == metav1.ConditionTrue:
		return true, fmt.Sprintf("%s: %s", what, c.Message), nil
	}
	return false, fmt.Sprintf("%s: %s=%s %s: %s", what, ExternalFencedCondition, c.Status, c.Reason, c.Message), nil
}

func (b *ExternalBackend) create(ctx context.Context, req Request, spec caprv1.FencingBackend, what string) (bool, string, error) {
	tmpl, missing, err := b.templateSpec(ctx, req, spec)
	switch {
	case err != nil:
		return false, "", err
	case missing != "":
		return false, fmt.Sprintf("%s; %s not created", missing, what), nil
	}
	obj, err := ExternalFenceKey(spec, req.Machine)
	if err != nil {
		return false, "", err
	}
	obj.SetLabels(map[string]string{clusterv1.ClusterNameLabel: req.Cluster.Name})
	obj.SetAnnotations(map[string]string{ExternalFenceMachineAnnotation: req.Machine.Name})
	markOwned(obj, req)
	if tmpl != nil {
		obj.Object["spec"] = tmpl
	}
	switch err := b.Client.Create(ctx, obj); {
	case apierrors.IsAlreadyExists(err):
		// Made meanwhile by someone else: not recorded, so replaced when read next (owned.go).
	case err != nil:
		return false, "", fmt.Errorf("creating %s: %w", what, err)
	default:
		created(req, obj)
	}
	ref := spec.TemplateRef
	return false, fmt.Sprintf("%s created from %s %s, waiting for its %s condition", what, ref.Kind, ref.Name, ExternalFencedCondition), nil
}

// Unfence implements BackendUnfencer: the object is deleted, and unfencing is done once it is gone
// (the provider may hold the deletion while it unfences).
func (b *ExternalBackend) Unfence(ctx context.Context, req Request, spec caprv1.FencingBackend) (bool, string, error) {
	obj, err := ExternalFenceKey(spec, req.Machine)
	if err != nil {
		return true, "", nil //nolint:nilerr // nothing can have been created from an invalid reference
	}
	what := obj.GetKind() + " " + obj.GetName()
	err = b.APIReader.Get(ctx, client.ObjectKeyFromObject(obj), obj)
	switch {
	case apierrors.IsNotFound(err) || meta.IsNoMatchError(err):
		return true, fmt.Sprintf("no %s left", what), nil
	case err != nil:
		return false, "", fmt.Errorf("reading %s: %w", what, err)
	case obj.GetAnnotations()[ExternalFenceNodeAnnotation] != req.Node || ofAnotherRemediation(obj, req):
		return true, fmt.Sprintf("%s is not the fence of node %s by this remediation: left alone", what, req.Node), nil
	case !obj.GetDeletionTimestamp().IsZero():
		return false, fmt.Sprintf("%s is being deleted (the provider unfences)", what), nil
	}
	if err := b.Client.Delete(ctx, obj); err != nil && !apierrors.IsNotFound(err) {
		return false, "", fmt.Errorf("deleting %s: %w", what, err)
	}
	return false, fmt.Sprintf("%s deleted, waiting for it to go", what), nil
}

// notThisFence lists why obj is not the object CAPR creates for req (none when it is): its marks
// (notMarkedFor) and its spec, which must hold every field of the template's spec.template.spec with
// the template's value (fields the provider's defaulting adds are allowed). unknown says why the spec
// cannot be checked (the template is gone): then the fence cannot be confirmed either.
func (b *ExternalBackend) notThisFence(ctx context.Context, obj *unstructured.Unstructured, req Request, spec caprv1.FencingBackend) (why []string, unknown string, err error) {
	why = notMarkedFor(obj, req)
	want, missing, err := b.templateSpec(ctx, req, spec)
	if err != nil || missing != "" {
		return why, missing, err
	}
	have, _, _ := unstructured.NestedMap(obj.Object, "spec")
	if !equality.Semantic.DeepDerivative(want, have) {
		why = append(why, fmt.Sprintf("spec is not the spec.template.spec of %s %s", spec.TemplateRef.Kind, spec.TemplateRef.Name))
	}
	return why, "", nil
}

// templateSpec reads the template's spec.template.spec; missing says so when the template is gone.
func (b *ExternalBackend) templateSpec(ctx context.Context, req Request, spec caprv1.FencingBackend) (tmpl map[string]any, missing string, err error) {
	ref := spec.TemplateRef
	template := &unstructured.Unstructured{}
	template.SetAPIVersion(ref.APIVersion)
	template.SetKind(ref.Kind)
	if err := b.APIReader.Get(ctx, client.ObjectKey{Namespace: req.Machine.Namespace, Name: ref.Name}, template); err != nil {
		if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
			return nil, fmt.Sprintf("template %s %s not found in namespace %s", ref.Kind, ref.Name, req.Machine.Namespace), nil
		}
		return nil, "", fmt.Errorf("reading template %s %s: %w", ref.Kind, ref.Name, err)
	}
	tmpl, _, _ = unstructured.NestedMap(template.Object, "spec", "template", "spec")
	return tmpl, "", nil
}

// fencedCondition returns the object's Fenced condition (nil when absent or unreadable).
func fencedCondition(obj *unstructured.Unstructured) *metav1.Condition {
	list, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
	for _, item := range list {
		m, ok := item.(map[string]any)
		if !ok || m["type"] != ExternalFencedCondition {
			continue
		}
		c := &metav1.Condition{Type: ExternalFencedCondition}
		c.Status = metav1.ConditionStatus(fmt.Sprint(m["status"]))
		c.Reason, _ = m["reason"].(string)
		c.Message, _ = m["message"].(string)
		return c
	}
	return nil
}
