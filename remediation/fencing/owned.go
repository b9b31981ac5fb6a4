package fencing

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// A fence object is found by a name anyone can use (NetworkFenceName, the Machine's name for
// External), so its name proves nothing: an object left by another remediation, or made by someone
// else, may carry the expected name and a status saying "fenced". A backend confirms only an object
// CAPR created for this fence: its UID recorded in the request's status when CAPR created it
// (Request.Objects), labelled managed-by CAPR, annotated with the MachineRemediation's UID and the
// Node, and with the spec CAPR would give it. The marks and the spec say what the object is for;
// only the UID proves who made it, since anyone who may create the kind can copy the rest. Any other
// object of that name is reported and replaced (deleted, then created anew once it is gone), never
// believed. An object CAPR created whose UID a crash kept from the status is replaced too: a fence
// made again, never one believed unproven.

// Marks of the fence objects CAPR creates.
const (
	// ManagedByLabel is the label, with value ManagedBy, on every fence object CAPR creates
	// (https://kubernetes.io/docs/reference/labels-annotations-taints/#app-kubernetes-io-managed-by).
	ManagedByLabel = NetworkFenceManagedByLabel
	ManagedBy      = "capr"
	// RemediationUIDAnnotation carries the UID of the MachineRemediation the fence object was created
	// for (Request.Remediation).
	RemediationUIDAnnotation = "remediation.cluster.x-k8s.io/remediation-uid"
)

// errNoRemediation is returned for a request that does not name its MachineRemediation: its fence
// objects could not be told from anyone else's.
var errNoRemediation = errors.New("the fencing request names no MachineRemediation (Request.Remediation): its fence objects could not be told from others")

// markOwned labels and annotates obj, about to be created, as the fence of req, keeping the labels
// and annotations already set on it.
func markOwned(obj *unstructured.Unstructured, req Request) {
	labels := obj.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	labels[ManagedByLabel] = ManagedBy
	obj.SetLabels(labels)
	annotations := obj.GetAnnotations()
	if annotations == nil {
		annotations = map[string]string{}
	}
	annotations[RemediationUIDAnnotation] = string(req.Remediation)
	annotations[NetworkFenceNodeAnnotation] = req.Node
	obj.SetAnnotations(annotations)
}

// created tells req's Created of obj, which a backend has just created for req.
func created(req Request, obj *unstructured.Unstructured) {
	if req.Created != nil {
		req.Created(caprv1.FencingObject{Kind: obj.GetKind(), Name: obj.GetName(), UID: string(obj.GetUID())})
	}
}

// notMarkedFor lists why obj is not known as the fence CAPR created for req (nil when it is): its UID
// not recorded (Request.Objects), or the marks markOwned gives it missing.
func notMarkedFor(obj metav1.Object, req Request) []string {
	var why []string
	if !slices.ContainsFunc(req.Objects, func(o caprv1.FencingObject) bool { return o.UID == string(obj.GetUID()) }) {
		why = append(why, fmt.Sprintf("its UID %s is not one CAPR recorded creating it (status.fencing.backends[].objects)", obj.GetUID()))
	}
	if v := obj.GetLabels()[ManagedByLabel]; v != ManagedBy {
		why = append(why, fmt.Sprintf("label %s is %q, not %q", ManagedByLabel, v, ManagedBy))
	}
	if v := obj.GetAnnotations()[RemediationUIDAnnotation]; v != string(req.Remediation) {
		why = append(why, fmt.Sprintf("annotation %s is %q, not this remediation's %q", RemediationUIDAnnotation, v, req.Remediation))
	}
	if v := obj.GetAnnotations()[NetworkFenceNodeAnnotation]; v != req.Node {
		why = append(why, fmt.Sprintf("annotation %s is %q, not %q", NetworkFenceNodeAnnotation, v, req.Node))
	}
	return why
}

// ofAnotherRemediation is true when obj carries the UID of a remediation other than req's: an unfence
// leaves it alone (it is that remediation's fence, or what replaced ours). An object without the
// annotation (made before CAPR marked its fences, or by someone else) is undone as before.
func ofAnotherRemediation(obj metav1.Object, req Request) bool {
	uid, ok := obj.GetAnnotations()[RemediationUIDAnnotation]
	return ok && req.Remediation != "" && uid != string(req.Remediation)
}

// replace deletes obj, which is not this fence (why), and returns the message reporting it: the
// caller creates the fence anew once obj is gone. The delete is conditional on obj's UID, so an
// object created meanwhile under the same name is not deleted unseen.
func replace(ctx context.Context, c client.Client, obj *unstructured.Unstructured, what string, why []string) (string, error) {
	ctrl.LoggerFrom(ctx).Info("Replacing a fence object CAPR did not make for this fence", "kind", obj.GetKind(),
		"object", klog.KObj(obj), "why", why)
	uid := obj.GetUID()
	if err := c.Delete(ctx, obj, client.Preconditions{UID: &uid}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return "", fmt.Errorf("deleting %s, which is not the fence CAPR made for this remediation: %w", what, err)
	}
	return fmt.Sprintf("%s is not the fence CAPR made for this remediation (%s): not believed; deleted, a new one is created once it is gone",
		what, strings.Join(why, "; ")), nil
}
