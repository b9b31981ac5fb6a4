package controllers

import (
	"time"

	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/controller"
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
func controllerOptions(concurrency int, reconcileTimeout time.Duration) controller.Options {
	return controller.Options{MaxConcurrentReconciles: concurrency, UsePriorityQueue: ptr.To(false), ReconciliationTimeout: reconcileTimeout}
}
