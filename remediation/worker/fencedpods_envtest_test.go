//go:build envtest

package worker_test

import (
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/remediation/fencing"
	capienv "github.com/capr-io/capr/test/envtest"
)

// Once every backend confirmed the fence, the manager's fencer force-deletes the fenced Node's pods
// (fencing.PodDeleter), so that their volumes are detached without waiting for kube-controller-manager's
// pod GC. These tests run it on a real API server, which is also the workload cluster.

// nodePods creates, in the workload cluster, pods db-0 and web-0 and mirror pod static-0 on node, and
// pod other-0 on another Node; it returns them in that order.
func nodePods(t *testing.T, g *WithT, ns, node string) []*corev1.Pod {
	t.Helper()
	mk := func(name, on string, annotations map[string]string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: annotations},
			Spec: corev1.PodSpec{NodeName: on, Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}}}
		g.Expect(k8sClient.Create(ctx, p)).To(Succeed())
		t.Cleanup(func() { _ = k8sClient.Delete(ctx, p, client.GracePeriodSeconds(0)) })
		return p
	}
	return []*corev1.Pod{mk("db-0", node, nil), mk("web-0", node, nil),
		mk("static-0", node, map[string]string{corev1.MirrorPodAnnotationKey: "x"}), mk("other-0", node+"-other", nil)}
}

func podExists(g Gomega, p *corev1.Pod) bool {
	err := k8sClient.Get(ctx, client.ObjectKeyFromObject(p), &corev1.Pod{})
	if apierrors.IsNotFound(err) {
		return false
	}
	g.Expect(err).NotTo(HaveOccurred())
	return true
}

func allExist(pods []*corev1.Pod) func(g Gomega) bool {
	return func(g Gomega) bool {
		for _, p := range pods {
			if !podExists(g, p) {
				return false
			}
		}
		return true
	}
}

// TestRealFenceConfirmedForceDeletesTheNodesPods: NetworkFence then OutOfServiceTaint. While
// csi-addons has not confirmed, no pod is touched; once it has, the Node's pods are force-deleted
// (mirror pods aside), then the Node is tainted, the other Node's pod is untouched, and the request
// records it with an event.
func TestRealFenceConfirmedForceDeletesTheNodesPods(t *testing.T) {
	g := NewWithT(t)
	createFenceClass(g)
	f, node := realFencingWorker(t, g, networkFenceSpec(caprv1.FencingRequired,
		caprv1.FencingBackendNetworkFence, caprv1.FencingBackendOutOfServiceTaint))
	pods := nodePods(t, g, f.ns, node)

	nf := networkFenceOf(g, f, node)
	g.Consistently(allExist(pods), quiet, poll).Should(BeTrue(), "a pod deleted before the fence was confirmed")

	g.Expect(capienv.ReportNetworkFence(ctx, k8sClient, nf, capienv.CSIAddonsFenced)).To(Succeed())
	g.Eventually(func(g Gomega) {
		g.Expect(podExists(g, pods[0])).To(BeFalse())
		g.Expect(podExists(g, pods[1])).To(BeFalse())
	}, eventually, poll).Should(Succeed())
	// The taint follows the pods' deletion (remediation/fencing, pods.go).
	g.Eventually(func(g Gomega) bool { return outOfService(g, node) }, eventually, poll).Should(BeTrue())
	g.Expect(podExists(g, pods[2])).To(BeTrue(), "mirror pod deleted")
	g.Expect(podExists(g, pods[3])).To(BeTrue(), "another Node's pod deleted")
	g.Eventually(func(g Gomega) {
		rec := getRemediation(g, f.ns, "w1").Status.Fencing
		g.Expect(rec).NotTo(BeNil())
		g.Expect(rec.Pods).NotTo(BeNil())
		g.Expect(rec.Pods.DeletedTime).NotTo(BeNil())
		g.Expect(rec.Pods.Deleted).To(BeEquivalentTo(2))
		g.Expect(rec.Pods.Message).To(ContainSubstring(f.ns + "/db-0"))
		events := &eventsv1.EventList{}
		g.Expect(k8sClient.List(ctx, events, client.InNamespace(f.ns))).To(Succeed())
		reasons := make([]string, 0, len(events.Items))
		for _, e := range events.Items {
			reasons = append(reasons, e.Reason)
		}
		g.Expect(reasons).To(ContainElement(fencing.EventPodsDeleted))
	}, eventually, poll).Should(Succeed())
}

// TestRealFencingDisabledLeavesThePods: with fencing Disabled the Machine is deleted unfenced and no
// pod of its Node is touched.
func TestRealFencingDisabledLeavesThePods(t *testing.T) {
	g := NewWithT(t)
	f, node := realFencingWorker(t, g, &caprv1.FencingSpec{Policy: caprv1.FencingDisabled})
	pods := nodePods(t, g, f.ns, node)
	g.Eventually(func(g Gomega) bool { return machineExists(g, f.ns, "w1") }, eventually, poll).Should(BeFalse())
	g.Consistently(allExist(pods), quiet, poll).Should(BeTrue())
	g.Expect(getRemediation(g, f.ns, "w1").Status.Fencing).To(BeNil())
}

// TestRealBestEffortGaveUpLeavesThePods: BestEffort with a NetworkFence csi-addons never confirms
// gives up after the timeout and deletes the Machine, but the Node is not proven fenced, so no pod of
// it is touched.
func TestRealBestEffortGaveUpLeavesThePods(t *testing.T) {
	g := NewWithT(t)
	createFenceClass(g)
	f, node := realFencingWorker(t, g, networkFenceSpec(caprv1.FencingBestEffort,
		caprv1.FencingBackendNetworkFence, caprv1.FencingBackendOutOfServiceTaint))
	pods := nodePods(t, g, f.ns, node)
	g.Eventually(func(g Gomega) bool { return machineExists(g, f.ns, "w1") }, nextLook, poll).Should(BeFalse())
	g.Consistently(allExist(pods), quiet, poll).Should(BeTrue())
	g.Expect(outOfService(g, node)).To(BeFalse())
	rec := getRemediation(g, f.ns, "w1").Status.Fencing
	g.Expect(rec).NotTo(BeNil())
	g.Expect(rec.Pods).To(BeNil())
}

// networkFenceOf waits for the node's NetworkFence and returns it.
func networkFenceOf(g *WithT, f *fixture, node string) *unstructured.Unstructured {
	var nf *unstructured.Unstructured
	g.Eventually(func(g Gomega) {
		nf = networkFence(g, f, node)
		g.Expect(nf).NotTo(BeNil())
	}, eventually, poll).Should(Succeed())
	return nf
}
