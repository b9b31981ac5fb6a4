package kcm_test

import (
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TestGarbageCollectorDeletesDependents: a ConfigMap owned by another ConfigMap is deleted by the
// garbage collector once its owner is deleted with background propagation.
func TestGarbageCollectorDeletesDependents(t *testing.T) {
	g := NewWithT(t)
	owner := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kcm-gc-owner", Namespace: metav1.NamespaceDefault}}
	g.Expect(k8sClient.Create(ctx, owner)).To(Succeed())
	dependent := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
		Name:      "kcm-gc-dependent",
		Namespace: metav1.NamespaceDefault,
		OwnerReferences: []metav1.OwnerReference{{
			APIVersion: "v1", Kind: "ConfigMap", Name: owner.Name, UID: owner.UID,
		}},
	}}
	g.Expect(k8sClient.Create(ctx, dependent)).To(Succeed())

	g.Expect(k8sClient.Delete(ctx, owner, client.PropagationPolicy(metav1.DeletePropagationBackground))).To(Succeed())
	deleted := time.Now()
	g.Eventually(func() error {
		return k8sClient.Get(ctx, client.ObjectKeyFromObject(dependent), &corev1.ConfigMap{})
	}).WithTimeout(time.Minute).WithPolling(200 * time.Millisecond).Should(Satisfy(apierrors.IsNotFound))
	t.Logf("dependent deleted %s after its owner", time.Since(deleted).Round(time.Millisecond))
}

// TestNodeLifecycleMarksSilentNodeUnreachable: a Node whose Lease is renewed stays Ready; once the
// renewals stop, the node lifecycle controller sets Ready=Unknown and taints it
// node.kubernetes.io/unreachable (NoSchedule and NoExecute).
func TestNodeLifecycleMarksSilentNodeUnreachable(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)

	// The controller neither taints nor evicts when every Node of the cluster is unready ("master
	// disruption mode"): a healthy peer keeps the cluster out of it.
	peer := createReadyNode(t, g, "kcm-lifecycle-peer")
	heartbeat(t, g, peer.Name)
	victim := createReadyNode(t, g, "kcm-lifecycle-victim")
	stopVictim := heartbeat(t, g, victim.Name)

	g.Consistently(func(g Gomega) {
		node := getNode(g, victim.Name)
		g.Expect(readyStatus(node)).To(Equal(corev1.ConditionTrue))
		g.Expect(unreachableTaints(node)).To(BeEmpty())
	}).WithTimeout(3 * gracePeriod).WithPolling(250 * time.Millisecond).Should(Succeed())

	stopVictim()
	silent := time.Now()
	g.Eventually(func(g Gomega) {
		g.Expect(readyStatus(getNode(g, victim.Name))).To(Equal(corev1.ConditionUnknown))
	}).WithTimeout(gracePeriod + time.Minute).WithPolling(250 * time.Millisecond).Should(Succeed())
	t.Logf("Ready=Unknown %s after the heartbeats stopped (Lease renewed every 1s, grace period %s)", time.Since(silent).Round(time.Millisecond), gracePeriod)
	g.Eventually(func(g Gomega) {
		g.Expect(unreachableTaints(getNode(g, victim.Name))).To(ConsistOf(corev1.TaintEffectNoSchedule, corev1.TaintEffectNoExecute))
	}).WithTimeout(time.Minute).WithPolling(250 * time.Millisecond).Should(Succeed())
	t.Logf("tainted unreachable (NoSchedule, NoExecute) %s after the heartbeats stopped", time.Since(silent).Round(time.Millisecond))

	peerNode := getNode(g, peer.Name)
	g.Expect(readyStatus(peerNode)).To(Equal(corev1.ConditionTrue))
	g.Expect(unreachableTaints(peerNode)).To(BeEmpty())
}

// TestPodGCDeletesPodsOfDeletedNode: the pod garbage collector deletes a Pod bound to a Node that
// no longer exists (after its 40s quarantine, checked every 20s: up to about 80s).
func TestPodGCDeletesPodsOfDeletedNode(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "kcm-podgc-node"}}
	g.Expect(k8sClient.Create(ctx, node)).To(Succeed())
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "kcm-podgc-pod", Namespace: metav1.NamespaceDefault},
		Spec: corev1.PodSpec{
			NodeName:   node.Name,
			Containers: []corev1.Container{{Name: "pause", Image: "registry.k8s.io/pause:3.10"}},
		},
	}
	g.Expect(k8sClient.Create(ctx, pod)).To(Succeed())
	g.Expect(k8sClient.Delete(ctx, node)).To(Succeed())
	deleted := time.Now()

	g.Eventually(func() error {
		return k8sClient.Get(ctx, client.ObjectKeyFromObject(pod), &corev1.Pod{})
	}).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Satisfy(apierrors.IsNotFound))
	t.Logf("orphaned Pod deleted %s after its Node", time.Since(deleted).Round(time.Millisecond))
}

// createReadyNode creates a Node whose status says Ready=True (as a kubelet would post it) and
// deletes it when the test ends.
func createReadyNode(t *testing.T, g *WithT, name string) *corev1.Node {
	t.Helper()
	now := metav1.Now()
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			LastHeartbeatTime: now, LastTransitionTime: now,
		}}},
	}
	g.Expect(k8sClient.Create(ctx, node)).To(Succeed())
	t.Cleanup(func() { _ = client.IgnoreNotFound(k8sClient.Delete(ctx, node)) })
	return node
}

// heartbeat creates the Node's Lease in kube-node-lease and renews it every second (the kubelet's
// heartbeat) until the returned stop is called or the test ends.
func heartbeat(t *testing.T, g *WithT, nodeName string) (stop func()) {
	t.Helper()
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: nodeName, Namespace: corev1.NamespaceNodeLease},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       ptr.To(nodeName),
			LeaseDurationSeconds: ptr.To[int32](int32(gracePeriod / time.Second)),
			RenewTime:            ptr.To(metav1.NowMicro()),
		},
	}
	g.Expect(k8sClient.Create(ctx, lease)).To(Succeed())

	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		ticker := time.NewTicker(time.Second)
		defer ticker.Stop()
		for {
			select {
			case <-done:
				return
			case <-ticker.C:
				base := lease.DeepCopy()
				lease.Spec.RenewTime = ptr.To(metav1.NowMicro())
				if err := k8sClient.Patch(ctx, lease, client.MergeFrom(base)); err != nil {
					t.Errorf("renewing Lease %s: %v", nodeName, err)
					return
				}
			}
		}
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			close(done)
			<-exited
		})
	}
	t.Cleanup(func() {
		stop()
		_ = client.IgnoreNotFound(k8sClient.Delete(ctx, lease))
	})
	return stop
}

func getNode(g Gomega, name string) *corev1.Node {
	node := &corev1.Node{}
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Name: name}, node)).To(Succeed())
	return node
}

func readyStatus(node *corev1.Node) corev1.ConditionStatus {
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status
		}
	}
	return ""
}

// unreachableTaints returns the effects of the node.kubernetes.io/unreachable taints.
func unreachableTaints(node *corev1.Node) []corev1.TaintEffect {
	var effects []corev1.TaintEffect
	for _, taint := range node.Spec.Taints {
		if taint.Key == corev1.TaintNodeUnreachable {
			effects = append(effects, taint.Effect)
		}
	}
	return effects
}
