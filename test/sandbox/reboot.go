package sandbox

import (
	"context"
	"fmt"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capr-io/capr/remediation/escalation"
)

// The sandbox's reboot operator: a stand-in for a remediation operator (nothing real can reboot a
// sandbox node). A SandboxReboot, created by CAPR from a SandboxRebootTemplate named in
// spec.remediation.escalation, "reboots" the node of the Machine it names: the node's etcd member
// process stops for RebootDuration, as on a real reboot, and starts again with its data; then the
// kubelet's heartbeat restarts (Ready again), unless spec.fails says the fault is one a reboot cannot
// fix. status.result says what happened. A reboot once begun runs to its end even if its object is
// deleted meanwhile, as a real one would.

// RebootDuration is how long a sandbox reboot keeps the node's etcd member stopped.
const RebootDuration = 2 * time.Second

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

	mu sync.Mutex
	// running are the reboots begun and not ended, by SandboxReboot.
	running map[types.NamespacedName]*rebootRun
}

// rebootRun is one reboot under way.
type rebootRun struct {
	wc      *WorkloadCluster
	node    string
	fails   bool
	stopped bool // the etcd member ran and was stopped
	until   time.Time
}

func (r *rebootReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if run := r.running[req.NamespacedName]; run != nil {
		if wait := time.Until(run.until); wait > 0 {
			return ctrl.Result{RequeueAfter: wait}, nil
		}
		return ctrl.Result{}, r.end(ctx, req, run)
	}
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
	run := &rebootRun{wc: wc, node: m.Status.NodeRef.Name, until: time.Now().Add(RebootDuration)}
	run.fails, _, _ = unstructured.NestedBool(reboot.Object, "spec", "fails")
	if wc.Etcd.Running(run.node) {
		wc.Etcd.Kill(run.node)
		run.stopped = true
		r.s.setEtcdPod(ctx, wc, run.node, false)
	}
	r.s.Log.Add(wc.LogKey(), "node %s rebooting (SandboxReboot): its etcd member is stopped for %s", run.node, RebootDuration)
	if r.running == nil {
		r.running = map[types.NamespacedName]*rebootRun{}
	}
	r.running[req.NamespacedName] = run
	return ctrl.Result{RequeueAfter: RebootDuration}, nil
}

// end ends a reboot whose time is up: the etcd member starts again, the heartbeat resumes unless the
// reboot fails, and the SandboxReboot, if it still exists, gets its result.
func (r *rebootReconciler) end(ctx context.Context, req ctrl.Request, run *rebootRun) error {
	if run.stopped {
		if err := run.wc.Etcd.Restart(run.node); err != nil {
			return err
		}
		r.s.setEtcdPod(ctx, run.wc, run.node, true)
	}
	result := "Rebooted"
	if run.fails {
		result = "NodeDidNotComeBack"
		r.s.Log.Add(run.wc.LogKey(), "node %s rebooted (SandboxReboot), but it does not come back", run.node)
	} else {
		r.s.Log.Add(run.wc.LogKey(), "node %s rebooted (SandboxReboot)", run.node)
		if err := r.s.ResumeHeartbeat(ctx, run.wc, run.node); err != nil {
			return err
		}
	}
	delete(r.running, req.NamespacedName)
	reboot := Reboot(req.Namespace, req.Name)
	if err := r.c.Get(ctx, req.NamespacedName, reboot); err != nil {
		return client.IgnoreNotFound(err)
	}
	if !reboot.GetDeletionTimestamp().IsZero() {
		return nil
	}
	base := reboot.DeepCopy()
	if err := unstructured.SetNestedField(reboot.Object, result, "status", "result"); err != nil {
		return err
	}
	return r.c.Patch(ctx, reboot, client.MergeFrom(base))
}
