package machinehealthcheck

import (
	"context"
	"maps"
	"reflect"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/clustercache"
	"sigs.k8s.io/cluster-api/util/index"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// healthCheckChanged lets through every health-check update but those of its status alone. Every
// round that changes something patches the status, and a round started by that patch would
// evaluate every target again for nothing; a round depends on the spec and the metadata
// (finalizers, labels, annotations such as paused, owner references, deletion), and on its own
// status only as this process left it.
func healthCheckChanged() predicate.Funcs {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, n := e.ObjectOld, e.ObjectNew
			if o == nil || n == nil {
				return true
			}
			return o.GetGeneration() != n.GetGeneration() ||
				!maps.Equal(o.GetLabels(), n.GetLabels()) ||
				!maps.Equal(o.GetAnnotations(), n.GetAnnotations()) ||
				!slices.Equal(o.GetFinalizers(), n.GetFinalizers()) ||
				!reflect.DeepEqual(o.GetOwnerReferences(), n.GetOwnerReferences()) ||
				o.GetDeletionTimestamp().IsZero() != n.GetDeletionTimestamp().IsZero()
		},
	}
}

// machineChanged lets through only Machine updates the health check depends on.
func machineChanged() predicate.Funcs {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, okOld := e.ObjectOld.(*clusterv1.Machine)
			n, okNew := e.ObjectNew.(*clusterv1.Machine)
			if !okOld || !okNew {
				return false
			}
			return o.Status.NodeRef.Name != n.Status.NodeRef.Name ||
				!maps.Equal(o.Labels, n.Labels) ||
				!maps.Equal(o.Annotations, n.Annotations) ||
				!reflect.DeepEqual(o.Status.Conditions, n.Status.Conditions) ||
				o.DeletionTimestamp.IsZero() != n.DeletionTimestamp.IsZero()
		},
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

// healthChecksFor returns the health checks of cluster in namespace that select machine (all of them
// when machine is nil). It runs for every watch event, so it reads the health checks from the cache
// without copies: a health check's status lists every target, and copying it per event made the
// mappers cost O(targets) per Node or Machine event (most of the process's CPU at N=10,000).
func (r *Reconciler) healthChecksFor(ctx context.Context, namespace, cluster string, machine *clusterv1.Machine) []reconcile.Request {
	list := &caprv1.MachineHealthCheckList{}
	if err := r.Client.List(ctx, list, client.InNamespace(namespace), client.UnsafeDisableDeepCopy); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Listing MachineHealthChecks for a watch event")
		r.state.evalCaches.invalidateAll() // the change cannot be recorded where it belongs
		return nil
	}
	var out []reconcile.Request
	for i := range list.Items {
		mhc := &list.Items[i]
		if mhc.Spec.ClusterName != cluster {
			continue
		}
		if machine != nil {
			sel, err := r.state.selectors.of(mhc)
			if err != nil || !sel.Matches(labels.Set(machine.Labels)) {
				continue
			}
		}
		out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: mhc.Namespace, Name: mhc.Name}})
	}
	return out
}

// machineChangedFor records Machine m as changed for each health check that selects it (its next round
// evaluates it, evalcache.go) and returns those health checks.
func (r *Reconciler) machineChangedFor(ctx context.Context, m *clusterv1.Machine) []reconcile.Request {
	out := r.healthChecksFor(ctx, m.Namespace, m.Spec.ClusterName, m)
	for _, req := range out {
		r.state.evalCaches.changed(req.NamespacedName, m.Name)
	}
	return out
}

// machineToHealthChecks maps a Machine event to its health checks. An update is mapped for the old
// and the new Machine, so a Machine no longer selected is recorded as changed too.
func (r *Reconciler) machineToHealthChecks(ctx context.Context, o client.Object) []reconcile.Request {
	m, ok := o.(*clusterv1.Machine)
	if !ok {
		return nil
	}
	return r.machineChangedFor(ctx, m)
}

// clusterToHealthChecks maps a Cluster event to its health checks. It does not make their next round a
// full pass: CAPI updates a Cluster's status whenever its Machines change, and what a round reads of
// the Cluster is either part of what the evaluation cache is valid for (its facts, evalCacheKey), or read in every
// round (paused, the control-plane object).
func (r *Reconciler) clusterToHealthChecks(ctx context.Context, o client.Object) []reconcile.Request {
	return r.healthChecksFor(ctx, o.GetNamespace(), o.GetName(), nil)
}

// connectionToHealthChecks maps a change of the ClusterCache's connection to a workload cluster to its
// health checks, whose next round is a full pass: the Nodes may have changed while it was lost.
func (r *Reconciler) connectionToHealthChecks(ctx context.Context, o client.Object) []reconcile.Request {
	out := r.healthChecksFor(ctx, o.GetNamespace(), o.GetName(), nil)
	for _, req := range out {
		r.state.evalCaches.invalidate(req.NamespacedName)
	}
	return out
}

func (r *Reconciler) requestToHealthChecks(ctx context.Context, o client.Object) []reconcile.Request {
	m := &clusterv1.Machine{}
	if err := r.Client.Get(ctx, client.ObjectKeyFromObject(o), m, noCopy); err != nil {
		if !apierrors.IsNotFound(err) { // a request of a Machine that is gone changes no target
			ctrl.LoggerFrom(ctx).Error(err, "Reading the Machine of a remediation request for a watch event")
			r.state.evalCaches.invalidateAll()
		}
		return nil
	}
	return r.machineChangedFor(ctx, m)
}

// watchClusterNodes watches the workload cluster's Nodes; only changes of what the health check
// reads from a Node (nodeEvaluationChanged) enqueue.
func (r *Reconciler) watchClusterNodes(ctx context.Context, cluster *clusterv1.Cluster) error {
	key := client.ObjectKeyFromObject(cluster)
	return r.ClusterCache.Watch(ctx, key, clustercache.NewWatcher(clustercache.WatcherOptions{
		Name:    "capr-machinehealthcheck-nodes",
		Watcher: r.controller,
		Kind:    &corev1.Node{},
		EventHandler: handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			return r.nodeToHealthChecks(ctx, key, o)
		}),
		Predicates: []predicate.TypedPredicate[client.Object]{nodeChanged()},
	}))
}

// nodeChanged lets through only Node updates the health check depends on (nodeEvaluationChanged);
// creations and deletions always.
func nodeChanged() predicate.Funcs {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, okOld := e.ObjectOld.(*corev1.Node)
			n, okNew := e.ObjectNew.(*corev1.Node)
			return okOld && okNew && nodeEvaluationChanged(o, n)
		},
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

func (r *Reconciler) nodeToHealthChecks(ctx context.Context, cluster client.ObjectKey, o client.Object) []reconcile.Request {
	machines := &clusterv1.MachineList{}
	if err := r.Client.List(ctx, machines, client.InNamespace(cluster.Namespace),
		client.MatchingLabels{clusterv1.ClusterNameLabel: cluster.Name},
		client.MatchingFields{index.MachineNodeNameField: o.GetName()}, client.UnsafeDisableDeepCopy); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Listing Machines for a Node event")
		r.state.evalCaches.invalidateAll() // the change cannot be recorded where it belongs
		return nil
	}
	var out []reconcile.Request
	for i := range machines.Items {
		out = append(out, r.machineChangedFor(ctx, &machines.Items[i])...)
	}
	return out
}

// nodeEvaluationChanged reports whether a Node update changes what a health check evaluates: a
// condition's type, status or last transition, or the Node's deletion starting
// (checks.nodeDeletingTimeoutSeconds; evaluate). A kubelet's status report that only refreshes
// lastHeartbeatTime, a reason or a message changes none of them; letting it through would cost a whole
// round over every target of the Node's health checks for each such report.
func nodeEvaluationChanged(o, n *corev1.Node) bool {
	if len(o.Status.Conditions) != len(n.Status.Conditions) || !o.DeletionTimestamp.Equal(n.DeletionTimestamp) {
		return true
	}
	for i := range n.Status.Conditions {
		a, b := &o.Status.Conditions[i], &n.Status.Conditions[i]
		if a.Type != b.Type || a.Status != b.Status || !a.LastTransitionTime.Equal(&b.LastTransitionTime) {
			return true
		}
	}
	return false
}
