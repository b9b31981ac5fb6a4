package sandbox

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capr-io/capr/remediation/escalation"
)

// The sandbox's reboot operator: a stand-in for a remediation operator (nothing real can reboot a
// sandbox node). A SandboxReboot, created by CAPR from a SandboxRebootTemplate named in
// spec.remediation.escalation, "reboots" the node of the Machine it names: the kubelet's heartbeat
// restarts (Ready again), unless spec.fails says the fault is one a reboot cannot fix. The etcd member
// is left as it is. status.result says what happened.

// RebootGroupVersion is the API group and version of the reboot kinds.
var RebootGroupVersion = schema.GroupVersion{Group: "remediation.sandbox.capr.io", Version: "v1alpha1"}

// RebootTemplate returns a SandboxRebootTemplate; fails makes its reboots ineffective.
func RebootTemplate(namespace, name string, fails bool) *unstructured.Unstructured {
	t := &unstructured.Unstructured{Object: map[string]any{
		"spec": map[string]any{"template": map[string]any{"spec": map[string]any{"fails": fails}}},
	}}
	t.SetGroupVersionKind(RebootGroupVersion.WithKind("SandboxRebootTemplate"))
	t.SetNamespace(namespace)
	t.SetName(name)
	return t
}

// Reboot returns the key of the SandboxReboot of a Machine (named after it) as an empty object.
func Reboot(namespace, machine string) *unstructured.Unstructured {
	r := &unstructured.Unstructured{}
	r.SetGroupVersionKind(RebootGroupVersion.WithKind("SandboxReboot"))
	r.SetNamespace(namespace)
	r.SetName(machine)
	return r
}

type rebootReconciler struct {
	s *Sandbox
	c client.Client
}

func (r *rebootReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	reboot := Reboot(req.Namespace, req.Name)
	if err := r.c.Get(ctx, req.NamespacedName, reboot); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if result, _, _ := unstructured.NestedString(reboot.Object, "status", "result"); result != "" || !reboot.GetDeletionTimestamp().IsZero() {
		return ctrl.Result{}, nil
	}
	m := &clusterv1.Machine{}
	if err := r.c.Get(ctx, client.ObjectKey{Namespace: req.Namespace, Name: reboot.GetAnnotations()[escalation.MachineAnnotation]}, m); err != nil {
		return ctrl.Result{}, fmt.Errorf("reading the Machine of SandboxReboot %s: %w", req.Name, err)
	}
	wc := r.s.cluster(m.Namespace, m.Spec.ClusterName)
	if wc == nil || !m.Status.NodeRef.IsDefined() {
		return ctrl.Result{}, fmt.Errorf("SandboxReboot %s: Machine %s has no sandbox node", req.Name, m.Name)
	}
	node := m.Status.NodeRef.Name
	result := "Rebooted"
	if fails, _, _ := unstructured.NestedBool(reboot.Object, "spec", "fails"); fails {
		result = "NodeDidNotComeBack"
		r.s.Log.Add(wc.LogKey(), "node %s rebooted (SandboxReboot), but it does not come back", node)
	} else {
		r.s.Log.Add(wc.LogKey(), "node %s rebooted (SandboxReboot)", node)
		if err := r.s.ResumeHeartbeat(ctx, wc, node); err != nil {
			return ctrl.Result{}, err
		}
	}
	base := reboot.DeepCopy()
	if err := unstructured.SetNestedField(reboot.Object, result, "status", "result"); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{}, r.c.Patch(ctx, reboot, client.MergeFrom(base))
}
