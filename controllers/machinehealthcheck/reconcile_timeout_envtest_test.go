//go:build envtest

package machinehealthcheck_test

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/controllers"
)

// roundTripperFunc is an http.RoundTripper made of a function.
type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestABlockedReadDoesNotHoldAWorkerForever: a second CAPR manager, for one namespace only, with one
// health-check worker and a short reconcile timeout, makes a read that its API server never answers
// (an aggregated API or a webhook that hangs is the same to CAPR); nothing but the reconcile's context
// bounds it. The reconcile timeout ends the reconcile, the worker returns, and the health check is
// reconciled again: the read is made a second time, which the only worker could not do while it was
// held. Without a reconcile timeout the read is made once and the worker never comes back.
//
// The blocked read is the template (read before the round) or the list of the health check's
// remediation requests (in the round, after the workload cluster was reached).
func TestABlockedReadDoesNotHoldAWorkerForever(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		// blocked is the path of the read that is never answered, in namespace ns.
		blocked  func(ns string) string
		template caprv1.TemplateReference
	}{{
		name: "template",
		blocked: func(ns string) string {
			return fmt.Sprintf("/apis/%s/namespaces/%s/machineremediationtemplates/hangs", caprv1.GroupVersion, ns)
		},
		template: caprv1.TemplateReference{APIVersion: caprv1.GroupVersion.String(), Kind: "MachineRemediationTemplate", Name: "hangs"},
	}, {
		name: "requests",
		blocked: func(ns string) string {
			return fmt.Sprintf("/apis/bootstrap.cluster.x-k8s.io/v1beta2/namespaces/%s/kubeadmconfigs", ns)
		},
		template: forbiddenTemplate,
	}} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			g := NewWithT(t)
			f := newFixture(t, g, 0)
			blocked := tt.blocked(f.ns)
			var attempts atomic.Int32
			cfg := rest.CopyConfig(testEnv.ManagerConfig)
			cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
				return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
					if r.Method == http.MethodGet && r.URL.Path == blocked {
						attempts.Add(1)
						<-r.Context().Done() // never answered: only the caller's context ends it
						return nil, r.Context().Err()
					}
					return rt.RoundTrip(r)
				})
			})
			stop := startManager(t, g, cfg, f.ns, controllers.Options{
				HealthCheckConcurrency:  1,
				ReconcileTimeout:        2 * time.Second,
				ConnectionRetryInterval: 2 * time.Second,
				EtcdMembers:             fakeEtcd,
			})
			defer stop()

			f.machine(g, "m")
			f.healthCheck(g, func(mhc *caprv1.MachineHealthCheck) { mhc.Spec.Remediation.TemplateRef = ptr.To(tt.template) })
			g.Eventually(attempts.Load, eventually, poll).Should(BeNumerically(">=", 1), "the read is made")
			// Made again after the backoff of the failed reconcile (and, for the template,
			// templateRetry: 10 s), long after the timeout ended the first reconcile.
			g.Eventually(attempts.Load, time.Minute, poll).Should(BeNumerically(">=", 2), "the worker came back and the health check was reconciled again")
		})
	}
}

// startManager starts a CAPR manager of namespace ns alone with cfg and opts, beside the suite's, and
// returns what stops it.
func startManager(t *testing.T, g *WithT, cfg *rest.Config, ns string, opts controllers.Options) (stop func()) {
	t.Helper()
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  testEnv.Scheme,
		Metrics:                 metricsserver.Options{BindAddress: "0"},
		Cache:                   controllers.ManagerCacheOptionsNamed(testEnv.Scheme, "capr-manager-"+ns, ns, 10*time.Minute),
		Client:                  controllers.ManagerClientOptions(),
		Controller:              config.Controller{SkipNameValidation: ptr.To(true)},
		GracefulShutdownTimeout: ptr.To(time.Minute),
	})
	g.Expect(err).NotTo(HaveOccurred())
	mgrCtx, cancel := context.WithCancel(ctx)
	_, err = controllers.SetupWithManager(mgrCtx, mgr, opts)
	g.Expect(err).NotTo(HaveOccurred())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mgrCtx) }()
	return func() {
		cancel()
		g.Expect(<-done).To(Succeed())
	}
}
