package storage_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/remediation/fencing"
	capienv "github.com/capr-io/capr/test/envtest"
	"github.com/capr-io/capr/test/storage"
)

var (
	testEnv *capienv.Environment
	stack   *storage.Stack
	ctx     = context.Background()
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	var err error
	crds, err := storage.CRDDir()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if testEnv, err = capienv.Start(capienv.Options{WithoutManagerIdentity: true, ExtraCRDDirs: []string{crds}}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = testEnv.Stop() }()
	if stack, err = storage.StartStack(ctx, testEnv); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer stack.Stop()
	code := m.Run()
	if code != 0 {
		fmt.Fprint(os.Stderr, stack.Logs(30))
	}
	return code
}

// TestFencedFailoverMovesTheVolumeWithoutASecondWriter: a pod with a ReadWriteOnce volume runs on
// node A; A's kubelet stops. Without fencing the volume stays attached to A (its pod cannot finish
// terminating without a kubelet, and kube-controller-manager waits for the unmount). CAPR's policy
// fencer with the backends a user configures, NetworkFence then OutOfServiceTaint, asked as the
// remediators ask it (fencing.FenceRecorded), fences A's address through csi-addons' real controller
// (the storage system, here the stand-in sidecar, refuses A) and only then taints A and force-deletes
// A's pod (fencing.PodDeleter); the real kube-controller-manager detaches the volume, the fence is
// confirmed once no VolumeAttachment names A, and the pod's replacement on B gets the volume, never
// while A had it. Unfencing removes the taint, has
// csi-addons unfence the address and deletes the NetworkFence.
func TestFencedFailoverMovesTheVolumeWithoutASecondWriter(t *testing.T) {
	g := NewWithT(t)
	ns, err := capienv.CreateNamespace(ctx, testEnv.Client, "failover")
	g.Expect(err).NotTo(HaveOccurred())
	w := storage.Workload{C: testEnv.Client, NS: ns}
	g.Expect(w.Node(ctx, "node-a", "10.1.0.1")).To(Succeed())
	g.Expect(w.Node(ctx, "node-b", "10.1.0.2")).To(Succeed())
	class := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"provisioner": storage.DriverName}}}
	class.SetGroupVersionKind(fencing.NetworkFenceClassGVK)
	class.SetName("fake-storage")
	g.Expect(testEnv.Client.Create(ctx, class)).To(Succeed())
	handle, err := w.Volume(ctx, "data")
	g.Expect(err).NotTo(HaveOccurred())
	attachedTo := func(g Gomega) []string {
		nodes, err := w.AttachedTo(ctx, w.PV("data"))
		g.Expect(err).NotTo(HaveOccurred())
		return nodes
	}

	web, err := w.Pod(ctx, "web-0", "data", "node-a")
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(attachedTo, time.Minute, 200*time.Millisecond).Should(Equal([]string{"node-a"}))
	g.Expect(stack.Driver.PublishedTo(handle)).To(Equal("node-a"))
	g.Expect(w.RunningOn(ctx, web, "node-a", handle)).To(Succeed())

	fault := time.Now()
	g.Expect(w.NotReady(ctx, "node-a")).To(Succeed())
	// Longer than pod GC's period (20 s): nothing frees the volume without fencing.
	g.Consistently(attachedTo, 22*time.Second, time.Second).Should(Equal([]string{"node-a"}))

	workload := func(context.Context, client.ObjectKey) (client.Client, error) { return testEnv.Client, nil }
	fencer := &fencing.PolicyFencer{Workload: workload, Backends: map[caprv1.FencingBackendType]fencing.Backend{
		caprv1.FencingBackendNetworkFence: &fencing.NetworkFenceBackend{Workload: workload},
		caprv1.FencingBackendOutOfServiceTaint: &fencing.OutOfServiceTaintBackend{Workload: workload,
			ServerVersion: fencing.DiscoveryServerVersion(func(context.Context, client.ObjectKey) (*rest.Config, error) { return testEnv.Config, nil })},
	}, Pods: &fencing.PodDeleter{Workload: workload}}
	req := fencing.Request{Cluster: &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "wc"}},
		Machine: &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "m-a"}}, Node: "node-a", Remediation: "failover-m-a",
		Spec: &caprv1.FencingSpec{Policy: caprv1.FencingRequired, Backends: []caprv1.FencingBackend{
			{Type: caprv1.FencingBackendNetworkFence, NetworkFenceClassNames: []string{"fake-storage"}},
			{Type: caprv1.FencingBackendOutOfServiceTaint},
		}}}
	tainted := func(g Gomega) bool {
		n := &corev1.Node{}
		g.Expect(testEnv.Client.Get(ctx, client.ObjectKey{Name: "node-a"}, n)).To(Succeed())
		for _, t := range n.Spec.Taints {
			if t.Key == corev1.TaintNodeOutOfService {
				return true
			}
		}
		return false
	}
	mr := &caprv1.MachineRemediation{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "m-a", UID: req.Remediation}, Spec: caprv1.MachineRemediationSpec{Fencing: req.Spec}}
	fenceStarted := time.Now()
	var fenced, taintSeen, podGone time.Time
	g.Eventually(func(g Gomega) {
		res, err := fencing.FenceRecorded(ctx, fencer, mr, req, time.Now(), func(context.Context) error { return nil })
		g.Expect(err).NotTo(HaveOccurred())
		if stack.Sidecar.Fenced("10.1.0.1/32") && fenced.IsZero() {
			fenced = time.Now()
		}
		if tainted(g) {
			if taintSeen.IsZero() {
				taintSeen = time.Now()
			}
			g.Expect(stack.Sidecar.Fenced("10.1.0.1/32")).To(BeTrue(), "tainted out-of-service before the storage system fenced the node")
		}
		if err := testEnv.Client.Get(ctx, client.ObjectKeyFromObject(web), &corev1.Pod{}); apierrors.IsNotFound(err) && podGone.IsZero() {
			podGone = time.Now()
			g.Expect(stack.Sidecar.Fenced("10.1.0.1/32")).To(BeTrue(), "the pod was deleted before the storage system fenced the node")
		}
		g.Expect(res.Outcome).To(Equal(fencing.Fenced), res.Message)
	}, 3*time.Minute, 200*time.Millisecond).Should(Succeed())
	detached := time.Now()
	g.Expect(stack.Driver.PublishedTo(handle)).To(BeEmpty(), "ControllerUnpublish reached the storage system")
	g.Expect(testEnv.Client.Get(ctx, client.ObjectKeyFromObject(web), &corev1.Pod{})).To(Satisfy(apierrors.IsNotFound),
		"CAPR force-deleted the pod of the fenced node")
	g.Expect(mr.Status.Fencing.Pods).NotTo(BeNil())
	g.Expect(mr.Status.Fencing.Pods.Message).To(ContainSubstring(ns + "/web-0"))

	moved, err := w.Pod(ctx, "web-0", "data", "node-b") // the StatefulSet's replacement, scheduled to B
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(attachedTo, time.Minute, 200*time.Millisecond).Should(Equal([]string{"node-b"}))
	attached := time.Now()
	g.Expect(w.RunningOn(ctx, moved, "node-b", handle)).To(Succeed())
	g.Expect(stack.Driver.PublishedTo(handle)).To(Equal("node-b"))
	g.Expect(stack.Driver.Refused()).To(BeEmpty(), "never asked to publish while published elsewhere")

	// Node A's Machine is deleted and CAPI deletes its Node: then the fence is released (never while
	// the Node exists: the old machine may still use the address).
	req.AfterDelete = true
	g.Expect(fencer.Unfence(ctx, req)).To(MatchError(ContainSubstring("Node node-a still exists")))
	g.Expect(stack.Sidecar.Fenced("10.1.0.1/32")).To(BeTrue())
	g.Expect(testEnv.Client.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}})).To(Succeed())
	g.Eventually(func() error { return fencer.Unfence(ctx, req) }, 2*time.Minute, 200*time.Millisecond).Should(Succeed())
	g.Expect(stack.Sidecar.Fenced("10.1.0.1/32")).To(BeFalse(), "csi-addons unfenced the address before the NetworkFence went")
	nfs := &unstructured.UnstructuredList{}
	nfs.SetGroupVersionKind(fencing.NetworkFenceGVK)
	g.Expect(testEnv.Client.List(ctx, nfs)).To(Succeed())
	g.Expect(nfs.Items).To(BeEmpty())

	since := func(t time.Time) time.Duration { return t.Sub(fault).Round(100 * time.Millisecond) }
	t.Logf("timeline from the fault (node-a Ready=Unknown): no detach for %s without fencing; fencing started +%s; address fenced by csi-addons +%s; tainted +%s; pod deleted +%s; detached from node-a (fence confirmed) +%s; attached to node-b +%s",
		since(fenceStarted), since(fenceStarted), since(fenced), since(taintSeen), since(podGone), since(detached), since(attached))
}
