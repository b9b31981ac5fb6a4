package machinehealthcheck

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/external"
	"sigs.k8s.io/cluster-api/util/annotations"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/remediation/escalation"
)

// HealthCheckLabel is set on the remediation requests a MachineHealthCheck creates, with the health
// check's name as value: it only ever withdraws requests carrying its own label.
const HealthCheckLabel = "remediation.cluster.x-k8s.io/machine-health-check"

// requestGVK is the kind of remediation request this health check creates.
func requestGVK(mhc *caprv1.MachineHealthCheck) (schema.GroupVersionKind, error) {
	ref := mhc.Spec.Remediation.TemplateRef
	if ref == nil {
		return caprv1.GroupVersion.WithKind("MachineRemediation"), nil
	}
	gv, err := schema.ParseGroupVersion(ref.APIVersion)
	if err != nil {
		return schema.GroupVersionKind{}, fmt.Errorf("invalid spec.remediation.templateRef.apiVersion %q: %w", ref.APIVersion, err)
	}
	return gv.WithKind(strings.TrimSuffix(ref.Kind, clusterv1.TemplateSuffix)), nil
}

// requestScopeOf is the kind and namespace of the health check's requests.
func requestScopeOf(mhc *caprv1.MachineHealthCheck) (requestScope, error) {
	gvk, err := requestGVK(mhc)
	if err != nil {
		return requestScope{}, err
	}
	return requestScope{kind: gvk.GroupKind().String(), namespace: mhc.Namespace}, nil
}

// listRequests returns the remediation requests of the health check's kind in its namespace, by
// name (= Machine name). One List per reconcile, from the cache for CAPR's own kind (live for any
// other: a kind the user chose is never cached, controllers.ManagerClientOptions), instead of one
// read per target; the requests this process created that the cache does not show yet stand in for
// the cache's copies (created.go). It also reports whether one did: the round is
// to run again after standInRecheck. The requests are the cache's own objects, not copies (every
// round lists the namespace's requests, and copying each was a tenth of the process's CPU with 100
// health checks at N=10,000): they are only read, and deleted by name.
func (r *Reconciler) listRequests(ctx context.Context, mhc *caprv1.MachineHealthCheck) (map[string]client.Object, bool, error) {
	gvk, err := requestGVK(mhc)
	if err != nil {
		return nil, false, err
	}
	scope, err := requestScopeOf(mhc)
	if err != nil {
		return nil, false, err
	}
	out := map[string]client.Object{}
	if gvk == caprv1.GroupVersion.WithKind("MachineRemediation") {
		list := &caprv1.MachineRemediationList{}
		if err := r.Client.List(ctx, list, client.InNamespace(mhc.Namespace), client.UnsafeDisableDeepCopy); err != nil {
			return nil, false, fmt.Errorf("listing MachineRemediations: %w", err)
		}
		for i := range list.Items {
			out[list.Items[i].Name] = &list.Items[i]
		}
	} else {
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
		if err := r.Client.List(ctx, list, client.InNamespace(mhc.Namespace), client.UnsafeDisableDeepCopy); err != nil {
			if unlistable(err) {
				return nil, false, &requestsUnlistableError{kind: gvk.Kind, namespace: mhc.Namespace, err: err}
			}
			return nil, false, fmt.Errorf("listing %s: %w", gvk.Kind, err)
		}
		for i := range list.Items {
			out[list.Items[i].GetName()] = &list.Items[i]
		}
	}
	return out, r.state.created.standIn(scope, out, time.Now()), nil
}

// requestsUnlistableError says the requests of a health check's kind cannot be listed: the kind
// its templateRef names does not exist, or CAPR may not list it. Nothing about them can be known, so
// none is created or withdrawn; the marks, which are the health check's answer, are written all the
// same (applyMarksAndRequests), the problem is reported in RemediationTemplatesValid
// (checkRequestsListable), and a health check being deleted is released (reconcileDelete).
type requestsUnlistableError struct {
	kind, namespace string
	err             error
}

func (e *requestsUnlistableError) Error() string {
	return fmt.Sprintf("%s requests in %s cannot be listed: %v", e.kind, e.namespace, e.err)
}

func (e *requestsUnlistableError) Unwrap() error { return e.err }

// unlistable reports whether a List failed because of the kind itself (no such kind, or no role for
// it), which retrying does not change until someone does, rather than for a passing reason.
func unlistable(err error) bool {
	return apierrors.IsForbidden(err) || apierrors.IsNotFound(err) || meta.IsNoMatchError(err)
}

// ensureRequest creates the remediation request of an unhealthy Machine if it does not exist yet.
// It returns true when it created one.
func (r *Reconciler) ensureRequest(ctx context.Context, mhc *caprv1.MachineHealthCheck, m *clusterv1.Machine, ev evaluation, existing map[string]client.Object) (bool, error) {
	if obj, ok := existing[m.Name]; ok {
		if !finishedWithMachineKept(obj, m) {
			return false, nil
		}
		// A finished remediation of a Machine that is still there (it recovered during the worker
		// remediator's escalation) and unhealthy again: a new request replaces the old record.
		err := r.Client.Delete(ctx, obj, client.Preconditions{UID: ptr.To(obj.GetUID()), ResourceVersion: ptr.To(obj.GetResourceVersion())})
		if client.IgnoreNotFound(err) != nil {
			return false, fmt.Errorf("replacing the finished remediation request %s: %w", m.Name, err)
		}
	}
	gvk, err := requestGVK(mhc)
	if err != nil {
		return false, err
	}
	scope, err := requestScopeOf(mhc)
	if err != nil {
		return false, err
	}
	var obj client.Object
	if ref := mhc.Spec.Remediation.TemplateRef; ref != nil {
		obj, err = r.requestFromTemplate(ctx, mhc, m, ref, ev)
		if err != nil {
			return false, err
		}
	} else {
		mr := &caprv1.MachineRemediation{
			ObjectMeta: metav1.ObjectMeta{Name: m.Name, Namespace: m.Namespace},
			Spec: caprv1.MachineRemediationSpec{
				Source:       requestSource(m),
				Reason:       ev.reason,
				Message:      cutUTF8(ev.message, 10240),
				Fencing:      mhc.Spec.Remediation.Fencing.DeepCopy(),
				ControlPlane: mhc.Spec.Remediation.ControlPlane.DeepCopy(),
				Escalation:   append([]caprv1.EscalationStep(nil), mhc.Spec.Remediation.Escalation...),
			},
		}
		obj = mr
	}
	labels := map[string]string{
		clusterv1.ClusterNameLabel: mhc.Spec.ClusterName,
		HealthCheckLabel:           mhc.Name,
	}
	if v, ok := mhc.Labels[clusterv1.WatchLabel]; ok {
		// With --watch-filter every controller only sees objects labelled with its value: the
		// request must carry the health check's, or no remediator (nor this health check's watch)
		// would ever see it.
		labels[clusterv1.WatchLabel] = v
	}
	obj.SetLabels(mergeLabels(obj.GetLabels(), labels))
	obj.SetOwnerReferences([]metav1.OwnerReference{machineOwnerRef(m)})

	if err := r.Client.Create(ctx, obj); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return false, nil
		}
		return false, fmt.Errorf("creating %s for Machine %s: %w", gvk.Kind, m.Name, err)
	}
	r.state.created.created(scope, obj, time.Now())
	ctrl.LoggerFrom(ctx).Info("Created remediation request", "kind", gvk.Kind, "Machine", klog.KObj(m))
	return true, nil
}

// finishedWithMachineKept reports whether a request is a Succeeded MachineRemediation that ended by
// recovery during its escalation, its Machine kept (an escalation step succeeds only that way):
// nothing is left to do for it. A remediation that deleted its Machine (a control-plane replacement,
// a worker's Delete step) is never replaced: the health checker's cache may still show that Machine
// for a moment, and the request is the only record of the remediation.
func finishedWithMachineKept(obj client.Object, m *clusterv1.Machine) bool {
	mr, ok := obj.(*caprv1.MachineRemediation)
	if !ok || mr.Status.Phase != caprv1.MachineRemediationPhaseSucceeded || !mr.DeletionTimestamp.IsZero() || !m.DeletionTimestamp.IsZero() {
		return false
	}
	if mr.Status.Step(caprv1.StepDelete) != nil {
		return false
	}
	for _, step := range escalation.Steps(mr) {
		if rec := mr.Status.Step(step); rec != nil && rec.Outcome == caprv1.StepOutcomeSucceeded {
			return true
		}
	}
	return false
}

// requestSource says who asks for the remediation of m: a person, through CAPI's remediate-machine
// annotation, or this health check. The remediator reads only the request, not the Machine.
func requestSource(m *clusterv1.Machine) caprv1.RemediationSource {
	if annotations.HasRemediateMachine(m) {
		return caprv1.MachineRemediationSourceManual
	}
	return caprv1.MachineRemediationSourceHealthCheck
}

// requestFromTemplate builds the request from spec.remediation.templateRef the way CAPI's
// MachineHealthCheck does (external.GenerateTemplate). For CAPR's own MachineRemediationTemplate the
// source and reason are filled in as well.
func (r *Reconciler) requestFromTemplate(ctx context.Context, mhc *caprv1.MachineHealthCheck, m *clusterv1.Machine, ref *caprv1.TemplateReference, ev evaluation) (client.Object, error) {
	template, err := external.Get(ctx, r.Client, &corev1.ObjectReference{
		APIVersion: ref.APIVersion, Kind: ref.Kind, Name: ref.Name, Namespace: mhc.Namespace,
	})
	if err != nil {
		return nil, fmt.Errorf("reading spec.remediation.templateRef %s %s: %w", ref.Kind, ref.Name, err)
	}
	owner := machineOwnerRef(m)
	obj, err := external.GenerateTemplate(&external.GenerateTemplateInput{
		Template:    template,
		TemplateRef: &corev1.ObjectReference{APIVersion: ref.APIVersion, Kind: ref.Kind, Name: ref.Name, Namespace: mhc.Namespace},
		Namespace:   m.Namespace,
		Name:        m.Name,
		ClusterName: mhc.Spec.ClusterName,
		OwnerRef:    &owner,
	})
	if err != nil {
		return nil, fmt.Errorf("generating remediation request from %s %s: %w", ref.Kind, ref.Name, err)
	}
	if obj.GroupVersionKind() == caprv1.GroupVersion.WithKind("MachineRemediation") {
		for field, value := range map[string]string{
			"source": string(requestSource(m)), "reason": ev.reason, "message": cutUTF8(ev.message, 10240),
		} {
			if err := unstructured.SetNestedField(obj.Object, value, "spec", field); err != nil {
				return nil, fmt.Errorf("setting spec.%s: %w", field, err)
			}
		}
	}
	return obj, nil
}

// errRequestChanged says that a withdrawal met a newer version of the request than the cache had.
// It is not a failure: the round looks again after requestChangedRequeue, without the work queue's
// growing per-item backoff (a remediator records every new request as Pending soon after it is
// created, so during a recovery many withdrawals meet it).
var errRequestChanged = errors.New("the request changed since it was read")

// requestChangedRequeue is how soon a round that met a changed request runs again: the cache
// receives the new version within milliseconds.
const requestChangedRequeue = 100 * time.Millisecond

// withdrawRequest deletes the request of a Machine that no longer needs it (why says why), but only a request this
// health check created and only while nothing irreversible was done: a MachineRemediation that left
// Pending is completed even if the Machine recovers (its etcd member may already be gone). The delete
// is conditional on the resourceVersion that was seen Pending, so a remediator starting at the same
// moment wins.
func (r *Reconciler) withdrawRequest(ctx context.Context, mhc *caprv1.MachineHealthCheck, m *clusterv1.Machine, existing map[string]client.Object, why string) error {
	obj, ok := existing[m.Name]
	if !ok || obj.GetLabels()[HealthCheckLabel] != mhc.Name || !obj.GetDeletionTimestamp().IsZero() {
		return nil
	}
	if mr, ok := obj.(*caprv1.MachineRemediation); ok && mr.Status.Phase != "" && mr.Status.Phase != caprv1.MachineRemediationPhasePending {
		return nil
	}
	scope, err := requestScopeOf(mhc)
	if err != nil {
		return err
	}
	err = r.Client.Delete(ctx, obj, client.Preconditions{UID: ptr.To(obj.GetUID()), ResourceVersion: ptr.To(obj.GetResourceVersion())})
	switch {
	case err == nil:
		r.state.created.deleted(scope, m.Name)
		ctrl.LoggerFrom(ctx).Info("Withdrew Pending remediation request", "Machine", klog.KObj(m), "why", why)
		return nil
	case apierrors.IsNotFound(err):
		r.state.created.deleted(scope, m.Name)
		return nil
	case apierrors.IsConflict(err):
		// It changed (a remediator may have started it, or only recorded it Pending after the
		// cache was read): look again once the cache has the new version.
		return fmt.Errorf("remediation request %s changed while being withdrawn: %w", m.Name, errRequestChanged)
	default:
		return fmt.Errorf("withdrawing remediation request %s: %w", m.Name, err)
	}
}

func machineOwnerRef(m *clusterv1.Machine) metav1.OwnerReference {
	return metav1.OwnerReference{
		APIVersion: clusterv1.GroupVersion.String(),
		Kind:       "Machine",
		Name:       m.Name,
		UID:        m.UID,
	}
}

func mergeLabels(a, b map[string]string) map[string]string {
	out := maps.Clone(a)
	if out == nil {
		out = map[string]string{}
	}
	maps.Copy(out, b)
	return out
}
