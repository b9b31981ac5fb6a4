package scenarios_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/test/sandbox"
	sbcontrolplanev1 "github.com/capr-io/capr/test/sandbox/api/controlplane/v1alpha1"
)

// undoWaitMessage is what a request's Progressing condition says while its undo waits for the
// provider to observe the replicas set back (remediation/controlplane/undo.go, waitForProvider).
const undoWaitMessage = "waiting for the control-plane provider to observe them"

// undoWatch watches, through the API server and not through any record of CAPR's, the cluster's
// SandboxControlPlane and the requests of its namespace, every version of each: what an undo after a
// surge promises (remediation/controlplane/undo.go). The sandbox's provider, like KCP, records
// status.observedGeneration at the end of each reconcile; the undo sets the replicas back and keeps
// the control plane (CAPR's lock) until the provider has observed that spec, so that a reconcile
// which read the surge's replicas has ended, its Machine created, before the live read that marks it.
type undoWatch struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	// held: a version with CAPR's lock was seen; letGo is the first version without it after that.
	held  bool
	letGo *sbcontrolplanev1.SandboxControlPlane
	// waited are the requests seen saying that their undo waits for the provider.
	waited map[string]bool
	err    error
}

// watchUndo starts watching; it returns once both watches are established.
func watchUndo(t *testing.T, wc *sandbox.WorkloadCluster) *undoWatch {
	t.Helper()
	g := NewWithT(t)
	wcli, err := client.NewWithWatch(sb.Env.Config, client.Options{Scheme: sb.Env.Scheme})
	g.Expect(err).NotTo(HaveOccurred())
	wctx, cancel := context.WithCancel(ctx)
	w := &undoWatch{cancel: cancel, done: make(chan struct{}), waited: map[string]bool{}}
	t.Cleanup(w.stop)
	cps := &sbcontrolplanev1.SandboxControlPlaneList{}
	g.Expect(wcli.List(ctx, cps, client.InNamespace(wc.Namespace))).To(Succeed())
	cpWatch, err := wcli.Watch(wctx, &sbcontrolplanev1.SandboxControlPlaneList{}, client.InNamespace(wc.Namespace),
		&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: cps.ResourceVersion}})
	g.Expect(err).NotTo(HaveOccurred())
	mrs := &caprv1.MachineRemediationList{}
	g.Expect(wcli.List(ctx, mrs, client.InNamespace(wc.Namespace))).To(Succeed())
	mrWatch, err := wcli.Watch(wctx, &caprv1.MachineRemediationList{}, client.InNamespace(wc.Namespace),
		&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: mrs.ResourceVersion}})
	g.Expect(err).NotTo(HaveOccurred())
	for i := range cps.Items {
		w.controlPlane(&cps.Items[i])
	}
	go func() {
		defer close(w.done)
		defer cpWatch.Stop()
		defer mrWatch.Stop()
		for {
			var ev watch.Event
			var ok bool
			select {
			case ev, ok = <-cpWatch.ResultChan():
			case ev, ok = <-mrWatch.ResultChan():
			}
			if !ok || ev.Type == watch.Error {
				if wctx.Err() == nil {
					w.fail(fmt.Errorf("a watch ended before the test stopped it (%v): versions may be missed", ev.Object))
				}
				return
			}
			switch o := ev.Object.(type) {
			case *sbcontrolplanev1.SandboxControlPlane:
				w.controlPlane(o)
			case *caprv1.MachineRemediation:
				if strings.Contains(conditions.GetMessage(o, caprv1.MachineRemediationProgressingCondition), undoWaitMessage) {
					w.mu.Lock()
					w.waited[o.Name] = true
					w.mu.Unlock()
				}
			}
		}
	}()
	return w
}

func (w *undoWatch) controlPlane(cp *sbcontrolplanev1.SandboxControlPlane) {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, locked := cp.Annotations[caprv1.ControlPlaneLockAnnotation]
	switch {
	case locked:
		w.held = true
	case w.held && w.letGo == nil:
		w.letGo = cp.DeepCopy()
	}
}

func (w *undoWatch) fail(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.err = err
}

func (w *undoWatch) stop() {
	w.cancel()
	<-w.done
}

// expectWaitedForTheProvider checks, once the undo of request is over, that the request said it waited
// for the provider and that the control plane was let go only once the provider had observed its spec
// (the replicas set back were the last change of it before the lock went).
func (w *undoWatch) expectWaitedForTheProvider(t *testing.T, request string) {
	t.Helper()
	w.stop()
	g := NewWithT(t)
	w.mu.Lock()
	defer w.mu.Unlock()
	g.Expect(w.err).NotTo(HaveOccurred())
	g.Expect(w.letGo).NotTo(BeNil(), "the control plane was never held and let go while watched")
	g.Expect(w.letGo.Status.ObservedGeneration).To(BeNumerically(">=", w.letGo.Generation),
		"the lock went before the provider observed the spec (generation %d, replicas %d)", w.letGo.Generation, *w.letGo.Spec.Replicas)
	g.Expect(w.waited).To(HaveKey(request), "request %s never said it waited for the provider", request)
}
