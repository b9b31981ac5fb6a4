package retention

import (
	"context"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	kerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/annotations"
	"sigs.k8s.io/cluster-api/util/predicates"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/metrics"
)

// +kubebuilder:rbac:groups=remediation.cluster.x-k8s.io,resources=machineremediations,verbs=get;list;watch;delete
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=clusters;machines,verbs=get;list;watch

// Forgetter drops what is kept in memory for a deleted Cluster (etcdutil.Workload).
type Forgetter interface {
	Forget(cluster types.UID)
}

// Reconciler deletes finished MachineRemediations of a Cluster as Settings say (Decide), and
// forgets a deleted Cluster's etcd clients.
type Reconciler struct {
	Client   client.Client
	Settings Settings
	// Etcd, when set, is told about every deleted Cluster.
	Etcd Forgetter
	// WatchFilterValue is the label value used to filter events prior to reconciliation.
	WatchFilterValue string
}

// SetupWithManager registers the controller with mgr. It reconciles Clusters: one reconcile
// decides over all the finished requests of a Cluster (the limit is per Cluster).
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager, options controller.Options) error {
	if r.Client == nil {
		return errors.New("client must not be nil")
	}
	if err := r.Settings.Validate(); err != nil {
		return err
	}
	log := ctrl.LoggerFrom(ctx)
	scheme := mgr.GetScheme()
	filter := predicates.ResourceHasFilterLabel(scheme, log, r.WatchFilterValue)
	err := ctrl.NewControllerManagedBy(mgr).
		Named("capr-remediation-retention").
		// Every Cluster once at start (create events), and again when it is unpaused.
		For(&clusterv1.Cluster{}, builder.WithPredicates(filter, predicate.Funcs{
			UpdateFunc: func(e event.UpdateEvent) bool {
				return annotations.HasPaused(e.ObjectOld) != annotations.HasPaused(e.ObjectNew) ||
					pausedSpec(e.ObjectOld) != pausedSpec(e.ObjectNew)
			},
			DeleteFunc: func(event.DeleteEvent) bool { return false },
		})).
		// A deleted Cluster's etcd clients and certificate are dropped (its requests go with it:
		// they are owned by it).
		Watches(&clusterv1.Cluster{}, handler.Funcs{DeleteFunc: r.clusterDeleted}, builder.WithPredicates(filter)).
		// A request that finishes or changes while finished (its fence undone, its retry
		// annotation removed) may be deleted now or later.
		Watches(&caprv1.MachineRemediation{}, handler.EnqueueRequestsFromMapFunc(requestToCluster),
			builder.WithPredicates(filter, finishedRequest())).
		// A Failed request (or one of a Machine being deleted) may go once its Machine is gone.
		Watches(&clusterv1.Machine{}, handler.EnqueueRequestsFromMapFunc(r.machineToCluster),
			builder.WithPredicates(filter, predicate.Funcs{
				CreateFunc:  func(event.CreateEvent) bool { return false },
				UpdateFunc:  func(event.UpdateEvent) bool { return false },
				GenericFunc: func(event.GenericEvent) bool { return false },
			})).
		WithOptions(options).
		Complete(r)
	if err != nil {
		return fmt.Errorf("setting up the remediation retention controller: %w", err)
	}
	return nil
}

func pausedSpec(o client.Object) bool {
	c, ok := o.(*clusterv1.Cluster)
	return ok && ptr.Deref(c.Spec.Paused, false)
}

// clusterDeleted forgets the deleted Cluster's etcd clients. The delete event carries the last
// known object (controller-runtime unwraps the informer's tombstones), hence its UID, which is what
// the clients are kept under; a reconcile of the deleted Cluster would only have its name.
func (r *Reconciler) clusterDeleted(ctx context.Context, e event.DeleteEvent, _ workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	if r.Etcd == nil || e.Object == nil {
		return
	}
	r.Etcd.Forget(e.Object.GetUID())
	ctrl.LoggerFrom(ctx).V(4).Info("Forgot the etcd clients of a deleted Cluster", "Cluster", klog.KObj(e.Object))
}

// finishedRequest passes the events of finished requests (a Pending or Running one is never
// deleted, and its finishing is an update event that passes).
func finishedRequest() predicate.Funcs {
	return predicate.NewPredicateFuncs(func(o client.Object) bool {
		mr, ok := o.(*caprv1.MachineRemediation)
		return ok && Finished(mr) && mr.DeletionTimestamp.IsZero()
	})
}

// requestToCluster maps a request to its Cluster (the label every remediator sets when it starts a
// request, and the health checker when it creates one).
func requestToCluster(_ context.Context, o client.Object) []reconcile.Request {
	name := o.GetLabels()[clusterv1.ClusterNameLabel]
	if name == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: o.GetNamespace(), Name: name}}}
}

// machineToCluster maps a deleted Machine to its Cluster when a finished request of the same name
// exists (it may have been kept for the Machine).
func (r *Reconciler) machineToCluster(ctx context.Context, o client.Object) []reconcile.Request {
	mr := &caprv1.MachineRemediation{}
	if err := r.Client.Get(ctx, client.ObjectKeyFromObject(o), mr); err != nil || !Finished(mr) {
		return nil
	}
	return requestToCluster(ctx, mr)
}

// Reconcile deletes the finished requests of a Cluster that Decide picks, and comes back when the
// next one expires.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	cluster := &clusterv1.Cluster{}
	if err := r.Client.Get(ctx, req.NamespacedName, cluster); err != nil {
		if apierrors.IsNotFound(err) {
			// Its requests are owned by it (the remediators re-own them when they start) and go
			// with it; its etcd clients went on its delete event (clusterDeleted).
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, fmt.Errorf("reading Cluster %s: %w", req.Name, err)
	}
	if annotations.IsPaused(cluster, cluster) {
		// CAPI's contract: nothing of a paused Cluster is changed (clusterctl move pauses the
		// Cluster, then copies and deletes its objects). The unpause brings it back.
		log.V(4).Info("Cluster is paused: finished remediation requests are left as they are")
		return ctrl.Result{}, nil
	}
	selector := client.MatchingLabels{clusterv1.ClusterNameLabel: cluster.Name}
	if r.WatchFilterValue != "" {
		selector[clusterv1.WatchLabel] = r.WatchFilterValue
	}
	list := &caprv1.MachineRemediationList{}
	// Read only (the requests are the cache's objects, not copies) and deleted by name.
	if err := r.Client.List(ctx, list, client.InNamespace(cluster.Namespace), selector, client.UnsafeDisableDeepCopy); err != nil {
		return ctrl.Result{}, fmt.Errorf("listing the MachineRemediations of Cluster %s: %w", cluster.Name, err)
	}
	byName := map[string]*caprv1.MachineRemediation{}
	var records []Record
	for i := range list.Items {
		mr := &list.Items[i]
		if !Finished(mr) || !mr.DeletionTimestamp.IsZero() {
			continue
		}
		m, err := r.machineOf(ctx, mr)
		if err != nil {
			return ctrl.Result{}, err
		}
		byName[mr.Name] = mr
		records = append(records, RecordOf(mr, m))
	}
	decision := Decide(records, time.Now(), r.Settings)
	var errs []error
	for _, d := range decision.Delete {
		mr := byName[d.Name]
		// Only the version decided on: a request changed since (a retry asked for) is decided
		// again on its update event.
		err := r.Client.Delete(ctx, mr, client.Preconditions{UID: ptr.To(mr.UID), ResourceVersion: ptr.To(mr.ResourceVersion)})
		switch {
		case err == nil:
			metrics.RequestDeleted(d.Reason)
			log.Info("Deleted finished remediation request", "MachineRemediation", klog.KObj(mr), "reason", d.Reason,
				"phase", mr.Status.Phase, "completionTime", mr.Status.CompletionTime)
		case apierrors.IsNotFound(err), apierrors.IsConflict(err):
			// Gone already, or changed: its events bring the Cluster back if it still has to go.
		default:
			errs = append(errs, fmt.Errorf("deleting finished MachineRemediation %s: %w", mr.Name, err))
		}
	}
	if len(errs) > 0 {
		return ctrl.Result{}, kerrors.NewAggregate(errs)
	}
	return ctrl.Result{RequeueAfter: decision.RequeueAfter}, nil
}

// machineOf reads the request's Machine (same name and namespace) from the cache; nil when it is
// gone.
func (r *Reconciler) machineOf(ctx context.Context, mr *caprv1.MachineRemediation) (*clusterv1.Machine, error) {
	m := &clusterv1.Machine{}
	if err := r.Client.Get(ctx, client.ObjectKeyFromObject(mr), m); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("reading Machine %s of MachineRemediation %s: %w", mr.Name, mr.Name, err)
	}
	return m, nil
}
