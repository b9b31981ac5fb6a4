package controllers

import (
	"context"
	"fmt"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// TestControllersStopUnderLoad stops managers whose controllers, built with CAPR's controller
// options, are busy with a stream of short reconciles, as the integration suites' managers are when
// their tests end. Every manager must stop well within its graceful-shutdown timeout. With
// controller-runtime v0.24.1's priority queue (UsePriorityQueue true) workers deadlock in
// GetWithPriority within a few rounds (see controllerOptions).
func TestControllersStopUnderLoad(t *testing.T) {
	g := NewWithT(t)
	for round := range 30 {
		mgr, err := ctrl.NewManager(&rest.Config{Host: "https://127.0.0.1:1"}, ctrl.Options{
			Scheme:                  runtime.NewScheme(),
			Metrics:                 metricsserver.Options{BindAddress: "0"},
			Controller:              config.Controller{SkipNameValidation: ptr.To(true)},
			GracefulShutdownTimeout: ptr.To(20 * time.Second),
		})
		g.Expect(err).NotTo(HaveOccurred())
		events := make(chan event.GenericEvent)
		c, err := controller.New(fmt.Sprintf("stop-under-load-%d", round), mgr, withReconciler(controllerOptions(20, DefaultReconcileTimeout),
			reconcile.Func(func(context.Context, reconcile.Request) (reconcile.Result, error) {
				return reconcile.Result{}, nil
			})))
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(c.Watch(source.Channel(events, &handler.EnqueueRequestForObject{}))).To(Succeed())

		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- mgr.Start(ctx) }()
		// Distinct names keep every worker busy; the stream runs until the manager is told to stop.
		for i := range 2000 {
			m := &clusterv1.Machine{}
			m.SetNamespace("ns")
			m.SetName(fmt.Sprintf("m-%d", i))
			events <- event.GenericEvent{Object: m}
		}
		cancel()
		var stopErr error
		g.Eventually(done, 30*time.Second).Should(Receive(&stopErr), "round %d: the manager did not stop", round)
		g.Expect(stopErr).NotTo(HaveOccurred(), "round %d", round)
	}
}

func withReconciler(o controller.Options, r reconcile.Reconciler) controller.Options {
	o.Reconciler = r
	return o
}

// TestFailureBackoffIsCapped: a reconcile that keeps failing is retried with backoff that doubles
// from 5 ms, as controller-runtime's default does, but never waits longer than 15 s (the default
// grows to 1000 s); another object's first failure is not held back by it.
func TestFailureBackoffIsCapped(t *testing.T) {
	g := NewWithT(t)
	limiter := failureRateLimiter()
	failing := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "failing"}}
	g.Expect(limiter.When(failing)).To(Equal(5 * time.Millisecond))
	g.Expect(limiter.When(failing)).To(Equal(10 * time.Millisecond))
	for range 30 {
		limiter.When(failing)
	}
	g.Expect(limiter.When(failing)).To(Equal(15 * time.Second))
	other := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "other"}}
	g.Expect(limiter.When(other)).To(BeNumerically("<=", 5*time.Millisecond))
	limiter.Forget(failing)
	g.Expect(limiter.When(failing)).To(BeNumerically("<=", 5*time.Millisecond), "a success starts again from 5 ms")
}
