package storage_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/remediation/fencing"
	capienv "github.com/capr-io/capr/test/envtest"
	"github.com/capr-io/capr/test/storage"
)

// evictionRacePods is how many pods the fenced node runs: each is one chance for the race, which
// the demo, with a single pod, lost in CI and in 1 of 8 runs (make demo SCENARIO=worker-stateful).
const evictionRacePods = 12

// TestTheReplacementOfAFencedNodesPodIsNeverEvicted: the out-of-service taint makes the real
// taint-eviction controller delete the fenced node's pods, by name and with no UID precondition,
// retrying a read that finds nothing. CAPR force-deleted the same pods right after the taint, so the
// controller could meet a StatefulSet's replacement, created at once under the same name on a
// healthy node, and delete it (the demo then waited forever for a pod its stand-in kubelet never
// terminated). CAPR now deletes the pods before the taint, which follows a second later
// (remediation/fencing, pods.go): a stand-in StatefulSet controller recreates every pod on node B
// the moment it is gone from node A, and no replacement is ever marked for deletion.
func TestTheReplacementOfAFencedNodesPodIsNeverEvicted(t *testing.T) {
	g := NewWithT(t)
	ns, err := capienv.CreateNamespace(ctx, testEnv.Client, "eviction")
	g.Expect(err).NotTo(HaveOccurred())
	w := storage.Workload{C: testEnv.Client, NS: ns}
	nodeA, nodeB := ns+"-a", ns+"-b"
	g.Expect(w.Node(ctx, nodeA, "10.2.0.1")).To(Succeed())
	g.Expect(w.Node(ctx, nodeB, "10.2.0.2")).To(Succeed())
	pod := func(name, node string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.PodSpec{
			NodeName: node, Containers: []corev1.Container{{Name: "app", Image: "app"}}}}
	}
	for i := range evictionRacePods {
		g.Expect(testEnv.Client.Create(ctx, pod(fmt.Sprintf("app-%d", i), nodeA))).To(Succeed())
	}

	// The StatefulSet controller's part: a pod of node A deleted is created again on node B at once.
	wc, err := client.NewWithWatch(testEnv.Config, client.Options{})
	g.Expect(err).NotTo(HaveOccurred())
	watcher, err := wc.Watch(ctx, &corev1.PodList{}, client.InNamespace(ns))
	g.Expect(err).NotTo(HaveOccurred())
	defer watcher.Stop()
	var mu sync.Mutex
	var recreateErrs []error
	recreated := map[string]bool{}
	go func() {
		for ev := range watcher.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok || ev.Type != watch.Deleted || p.Spec.NodeName != nodeA {
				continue
			}
			err := testEnv.Client.Create(ctx, pod(p.Name, nodeB))
			mu.Lock()
			recreated[p.Name] = true
			if err != nil {
				recreateErrs = append(recreateErrs, err)
			}
			mu.Unlock()
		}
	}()

	g.Expect(w.NotReady(ctx, nodeA)).To(Succeed())
	workload := func(context.Context, client.ObjectKey) (client.Client, error) { return testEnv.Client, nil }
	fencer := &fencing.PolicyFencer{Workload: workload, Backends: map[caprv1.FencingBackendType]fencing.Backend{
		caprv1.FencingBackendOutOfServiceTaint: &fencing.OutOfServiceTaintBackend{Workload: workload,
			ServerVersion: fencing.DiscoveryServerVersion(func(context.Context, client.ObjectKey) (*rest.Config, error) { return testEnv.Config, nil })},
	}, Pods: &fencing.PodDeleter{Workload: workload}}
	req := fencing.Request{Cluster: &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "wc"}},
		Machine: &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "m-a"}}, Node: nodeA,
		Spec: &caprv1.FencingSpec{Policy: caprv1.FencingRequired, Backends: []caprv1.FencingBackend{{Type: caprv1.FencingBackendOutOfServiceTaint}}}}
	mr := &caprv1.MachineRemediation{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "m-a", UID: "eviction-m-a"}, Spec: caprv1.MachineRemediationSpec{Fencing: req.Spec}}
	// As the Fence step asks while it waits: until the taint is on and no volume is attached.
	g.Eventually(func(g Gomega) {
		res, err := fencing.FenceRecorded(ctx, fencer, mr, req, time.Now(), func(context.Context) error { return nil })
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(res.Outcome).To(Equal(fencing.Fenced), res.Message)
	}, time.Minute, 500*time.Millisecond).Should(Succeed())
	g.Expect(mr.Status.Fencing.Pods).NotTo(BeNil())
	g.Expect(mr.Status.Fencing.Pods.DeletedTime).NotTo(BeNil(), mr.Status.Fencing.Pods.Message)

	replacements := func(g Gomega) []corev1.Pod {
		list := &corev1.PodList{}
		g.Expect(testEnv.Client.List(ctx, list, client.InNamespace(ns))).To(Succeed())
		return list.Items
	}
	g.Eventually(func(g Gomega) {
		mu.Lock()
		defer mu.Unlock()
		g.Expect(recreateErrs).To(BeEmpty())
		g.Expect(recreated).To(HaveLen(evictionRacePods))
	}, time.Minute, 100*time.Millisecond).Should(Succeed())
	// The taint-eviction controller's retries of a pod it did not find last 50 ms
	// (taint_eviction.go: retries); a replacement it met is marked at once.
	g.Consistently(func(g Gomega) {
		for _, p := range replacements(g) {
			g.Expect(p.Spec.NodeName).To(Equal(nodeB), "pod %s", p.Name)
			g.Expect(p.DeletionTimestamp).To(BeNil(), "the replacement %s on the healthy node was marked for deletion", p.Name)
		}
	}, 3*time.Second, 100*time.Millisecond).Should(Succeed())
	g.Expect(mr.Status.Fencing.Pods.Deleted).To(BeEquivalentTo(evictionRacePods), mr.Status.Fencing.Pods.Message)
}
