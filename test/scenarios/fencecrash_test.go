package scenarios_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/controllers"
	"github.com/capr-io/capr/remediation/fencing"
	"github.com/capr-io/capr/test/sandbox"
	"github.com/capr-io/capr/test/storage"
)

// fenceCrashPoint is a fencing step boundary: the controller dies right after the first Fencer call
// whose answer matches.
type fenceCrashPoint struct {
	name string
	// fence matches a Fence answer; unfence (when fence is nil) matches an Unfence answer.
	fence   func(fencing.Result) bool
	unfence func(error) bool
}

var fenceCrashPoints = []fenceCrashPoint{
	{name: "NetworkFence created", fence: func(fencing.Result) bool { return true }},
	{name: "NetworkFence confirmed by csi-addons", fence: func(r fencing.Result) bool {
		return len(r.Backends) > 0 && r.Backends[0].State == caprv1.FencingBackendFenced
	}},
	{name: "every backend confirmed", fence: func(r fencing.Result) bool { return r.Outcome == fencing.Fenced }},
	{name: "unfence started", unfence: func(error) bool { return true }},
	{name: "unfence finished", unfence: func(err error) bool { return err == nil }},
}

// crashingFencer is the real backends (on the sandbox's API server, which is every workload cluster)
// in a controller that dies at a fencing step boundary: after the matching answer it trips the
// manager's crash switch and, as a dead process would, answers nothing more.
type crashingFencer struct {
	real  *fencing.PolicyFencer
	point fenceCrashPoint
	mu    sync.Mutex
	crash *sandbox.CrashSwitch
	dead  bool
}

var errDead = errors.New("the controller process is dead")

func (f *crashingFencer) Fence(ctx context.Context, req fencing.Request) (fencing.Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.dead {
		return fencing.Result{}, errDead
	}
	res, err := f.real.Fence(ctx, req)
	if err == nil && f.point.fence != nil && f.point.fence(res) {
		f.die()
	}
	return res, err
}

func (f *crashingFencer) Unfence(ctx context.Context, req fencing.Request) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.dead {
		return errDead
	}
	err := f.real.Unfence(ctx, req)
	if f.point.unfence != nil && f.point.unfence(err) {
		f.die()
	}
	return err
}

func (f *crashingFencer) die() {
	f.dead = true
	f.crash.Trip()
}

// sandboxFencer is the manager's fencer (controllers.NewFencer) with the sandbox's API server as the
// workload cluster, so that a test can hold it across controller restarts.
func sandboxFencer() *fencing.PolicyFencer {
	workload := func(context.Context, client.ObjectKey) (client.Client, error) { return sb.Client, nil }
	return &fencing.PolicyFencer{Workload: workload, Backends: map[caprv1.FencingBackendType]fencing.Backend{
		caprv1.FencingBackendNetworkFence: &fencing.NetworkFenceBackend{Workload: workload},
		caprv1.FencingBackendOutOfServiceTaint: &fencing.OutOfServiceTaintBackend{Workload: workload,
			ServerVersion: fencing.DiscoveryServerVersion(func(context.Context, client.ObjectKey) (*rest.Config, error) { return sb.Env.Config, nil })},
	}}
}

// TestFencingCrashSafety kills the controller at every fencing step boundary of a control-plane
// remediation in turn (NetworkFence through the real csi-addons, then the out-of-service taint),
// then starts a new one. Every run ends with the victim replaced, fenced before it was deleted, and
// nothing of its fence left: no NetworkFence, the address unfenced in the storage system, the
// record saying so.
func TestFencingCrashSafety(t *testing.T) {
	g := NewWithT(t)
	stack, err := storage.StartStack(ctx, sb.Env)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(stack.Logs(20))
		}
		stack.Stop()
	})
	class := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"provisioner": storage.DriverName}}}
	class.SetGroupVersionKind(fencing.NetworkFenceClassGVK)
	class.SetName("sandbox-storage")
	if err := sb.Client.Create(ctx, class); !apierrors.IsAlreadyExists(err) {
		g.Expect(err).NotTo(HaveOccurred())
	}
	wc := newCluster(t, withHealthCheck(func(mhc *caprv1.MachineHealthCheck) {
		mhc.Spec.Remediation.Fencing = &caprv1.FencingSpec{Policy: caprv1.FencingRequired, TimeoutSeconds: ptr.To[int32](300),
			Backends: []caprv1.FencingBackend{
				{Type: caprv1.FencingBackendNetworkFence, NetworkFenceClassNames: []string{"sandbox-storage"}},
				{Type: caprv1.FencingBackendOutOfServiceTaint},
			}}
	}))
	check := writeData(t, wc)
	for i, p := range fenceCrashPoints {
		t.Run(p.name, func(t *testing.T) {
			fenceCrashRun(t, wc, stack, i%3, p)
		})
		if t.Failed() {
			break
		}
	}
	check()
}

func fenceCrashRun(t *testing.T, wc *sandbox.WorkloadCluster, stack *storage.Stack, victimIndex int, p fenceCrashPoint) {
	g := NewWithT(t)
	victim := controlPlane(g, wc)[victimIndex]
	node := victim.Status.NodeRef.Name
	n := &corev1.Node{}
	g.Expect(sb.Client.Get(ctx, client.ObjectKey{Name: node}, n)).To(Succeed())
	cidr := n.Status.Addresses[0].Address + "/32"
	start := time.Now()
	deletions, taints := watchFenceOrder(t, wc)

	f := &crashingFencer{real: sandboxFencer(), point: p}
	c1, err := sb.StartCAPR(ctx, sandbox.CAPROptions{Options: controllers.Options{Fencer: f}})
	g.Expect(err).NotTo(HaveOccurred())
	f.mu.Lock()
	f.crash = c1.Crash
	f.mu.Unlock()
	g.Expect(sb.StopHeartbeat(ctx, wc, node)).To(Succeed())
	g.Eventually(func() bool { return c1.Stopped() }, remediationTimeout, 100*time.Millisecond).Should(BeTrue(), "the first controller never reached its crash point")
	c1.Stop()
	c2, err := sb.StartCAPR(ctx, sandbox.CAPROptions{Options: controllers.Options{Fencer: sandboxFencer()}})
	g.Expect(err).NotTo(HaveOccurred())
	defer c2.Stop()

	mr := waitRemediated(t, wc, victim.Name, 3)
	rec := mr.Status.Fencing
	g.Expect(rec).NotTo(BeNil())
	g.Expect(rec.UnfencedTime).NotTo(BeNil())
	g.Expect(rec.Backends).To(HaveLen(2))
	for _, b := range rec.Backends {
		g.Expect(b.State).To(Equal(caprv1.FencingBackendUnfenced), "%s", b.Type)
		g.Expect(b.FencedTime).NotTo(BeNil(), "%s", b.Type)
	}
	expectFencedBeforeDeleted(g, stack, deletions, taints, start, victim.Name, node, cidr)
	g.Expect(stack.Sidecar.Fenced(cidr)).To(BeFalse(), "the storage system still refuses %s", cidr)
	nfs := &unstructured.UnstructuredList{}
	nfs.SetGroupVersionKind(fencing.NetworkFenceGVK)
	g.Expect(sb.Client.List(ctx, nfs)).To(Succeed())
	for _, nf := range nfs.Items {
		g.Expect(nf.GetAnnotations()[fencing.NetworkFenceNodeAnnotation]).NotTo(Equal(node), "NetworkFence %s left behind", nf.GetName())
	}
}
