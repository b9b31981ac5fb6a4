package controllers

import (
	"time"

	"golang.org/x/time/rate"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// controllerOptions are the options of every controller CAPR's manager runs, its ClusterCache's
// included.
//
// The work queue is controller-runtime's rate-limiting queue, not its priority queue (on by default
// since v0.23). In controller-runtime v0.24.1 the priority queue can deadlock on shutdown:
// handleReadyItems (pkg/controller/priorityqueue/priorityqueue.go) hands an item to a waiting worker
// with an unguarded send on w.get while holding w.lock; a worker that left GetWithPriority through
// w.done never receives it, and every later GetWithPriority blocks on the lock. Workers then never
// return, and the manager outlives its graceful-shutdown timeout (it did in CI after every test had
// passed). TestControllersStopUnderLoad reproduces it. The fix (controller-runtime #3540) is only in
// v0.25, which requires the k8s.io v0.37 libraries; CAPI v1.14.2 is built on v0.36.
//
// Every reconcile is bounded by reconcileTimeout (DefaultReconcileTimeout): a call that never returns
// must not take a worker for good, or a few such objects stop the controller for everyone.
//
// A reconcile that returns an error is retried with controller-runtime's default rate limiter
// (client-go's DefaultTypedControllerRateLimiter: per object, 5 ms doubling on each failure; overall,
// 10 per second with bursts of 100), except that the per-object wait stops growing at
// maxFailureBackoff instead of 1000 s: a remediation step that fails while the control plane is at
// its failure margin is tried again within seconds, not a quarter of an hour later.
func controllerOptions(concurrency int, reconcileTimeout time.Duration) controller.Options {
	return controller.Options{MaxConcurrentReconciles: concurrency, UsePriorityQueue: ptr.To(false), ReconciliationTimeout: reconcileTimeout,
		RateLimiter: failureRateLimiter()}
}

// maxFailureBackoff is the longest wait before a reconcile that keeps failing is tried again: the
// remediators' own longest poll (waitLong in remediation/controlplane and remediation/worker).
const maxFailureBackoff = 15 * time.Second

func failureRateLimiter() workqueue.TypedRateLimiter[reconcile.Request] {
	return workqueue.NewTypedMaxOfRateLimiter(
		workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](5*time.Millisecond, maxFailureBackoff),
		&workqueue.TypedBucketRateLimiter[reconcile.Request]{Limiter: rate.NewLimiter(rate.Limit(10), 100)},
	)
}
