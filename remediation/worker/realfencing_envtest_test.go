//go:build envtest

package worker_test

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/remediation/fencing"
	capienv "github.com/capr-io/capr/test/envtest"
)

// These tests run the worker remediator with the manager's own fencer (controllers.NewFencer) and its
// shipped RBAC: the NetworkFence and OutOfServiceTaint backends act on the workload cluster, which is
// the same API server, with csi-addons' own CRDs (v0.14.0). No csi-addons controller runs here: the
// tests write the NetworkFence status csi-addons writes (test/storage runs the real one).

const fenceClass = "nf-class"

// realFencingWorker is a worker Machine of a MachineSet whose Cluster uses the manager's fencer, with
// its Node (one InternalIP) in the workload cluster, and its request with the given fencing.
func realFencingWorker(t *testing.T, g *WithT, spec *caprv1.FencingSpec) (*fixture, string) {
	t.Helper()
	f := newFixture(t, g, nil)
	base := f.cluster.DeepCopy()
	if f.cluster.Labels == nil {
		f.cluster.Labels = map[string]string{}
	}
	f.cluster.Labels[realFencingLabel] = "true"
	g.Expect(k8sClient.Patch(ctx, f.cluster, client.MergeFrom(base))).To(Succeed())
	m := f.workerOfMachineSet(g, "w1")
	node := capienv.NewNode(f.node("w1"), corev1.ConditionFalse, time.Now())
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.9.8.7"}}
	g.Expect(capienv.CreateNode(ctx, k8sClient, node)).To(Succeed())
	t.Cleanup(func() { _ = k8sClient.Delete(ctx, node) })
	// The Cluster exists before its kubeconfig Secret, so the ClusterCache's first connection fails and
	// is retried 2 s later: without waiting, a fencing timeout of 2 s can run out on "connection down"
	// before any backend is reached.
	g.Eventually(func() error {
		_, err := workloadClusters.GetUncachedClient(ctx, client.ObjectKeyFromObject(f.cluster))
		return err
	}, eventually, poll).Should(Succeed())
	f.request(g, m, spec, caprv1.MachineRemediationSourceHealthCheck)
	return f, node.Name
}

func networkFenceSpec(policy caprv1.FencingPolicy, backends ...caprv1.FencingBackendType) *caprv1.FencingSpec {
	spec := &caprv1.FencingSpec{Policy: policy, TimeoutSeconds: ptr.To[int32](2)}
	for _, b := range backends {
		fb := caprv1.FencingBackend{Type: b}
		if b == caprv1.FencingBackendNetworkFence {
			fb.NetworkFenceClassNames = []string{fenceClass}
		}
		spec.Backends = append(spec.Backends, fb)
	}
	return spec
}

func createFenceClass(g Gomega) {
	fc := &unstructured.Unstructured{}
	fc.SetGroupVersionKind(fencing.NetworkFenceClassGVK)
	fc.SetName(fenceClass)
	fc.Object["spec"] = map[string]any{"provisioner": "csi.example.com"}
	if err := k8sClient.Create(ctx, fc); !apierrors.IsAlreadyExists(err) {
		g.Expect(err).NotTo(HaveOccurred())
	}
}

// networkFence returns the node's NetworkFence of fenceClass, nil when there is none.
func networkFence(g Gomega, f *fixture, node string) *unstructured.Unstructured {
	nf := &unstructured.Unstructured{}
	nf.SetGroupVersionKind(fencing.NetworkFenceGVK)
	err := k8sClient.Get(ctx, client.ObjectKey{Name: fencing.NetworkFenceName(client.ObjectKeyFromObject(f.cluster), node, fenceClass)}, nf)
	if apierrors.IsNotFound(err) {
		return nil
	}
	g.Expect(err).NotTo(HaveOccurred())
	return nf
}

func outOfService(g Gomega, node string) bool {
	n := &corev1.Node{}
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Name: node}, n)).To(Succeed())
	for _, t := range n.Spec.Taints {
		if t.MatchTaint(&fencing.OutOfServiceTaint) {
			return true
		}
	}
	return false
}

// TestRealNetworkFenceRequiredNeverConfirmedKeepsTheMachine: with Required and a NetworkFence that
// csi-addons never confirms, the fence is recorded in the request, the Machine is never deleted, past
// the fencing timeout too, and the condition says why.
func TestRealNetworkFenceRequiredNeverConfirmedKeepsTheMachine(t *testing.T) {
	g := NewWithT(t)
	createFenceClass(g)
	f, node := realFencingWorker(t, g, networkFenceSpec(caprv1.FencingRequired, caprv1.FencingBackendNetworkFence))

	g.Eventually(func(g Gomega) {
		nf := networkFence(g, f, node)
		g.Expect(nf).NotTo(BeNil())
		g.Expect(capienv.FenceState(nf)).To(Equal("Fenced"))
		cidrs, _, _ := unstructured.NestedStringSlice(nf.Object, "spec", "cidrs")
		g.Expect(cidrs).To(Equal([]string{"10.9.8.7/32"}))
		rec := getRemediation(g, f.ns, "w1").Status.Fencing
		g.Expect(rec).NotTo(BeNil())
		g.Expect(rec.NodeName).To(Equal(node))
		g.Expect(rec.Backends).To(HaveLen(1))
		g.Expect(rec.Backends[0].State).To(Equal(caprv1.FencingBackendFencing))
		g.Expect(rec.Backends[0].Message).To(ContainSubstring("no result from csi-addons yet"))
	}, eventually, poll).Should(Succeed())
	g.Eventually(func(g Gomega) {
		reason, msg := progressing(g, f.ns, "w1")
		g.Expect(reason).To(Equal(caprv1.MachineRemediationStepTimedOutReason))
		g.Expect(msg).To(ContainSubstring("fencing is Required and not confirmed, the Machine is not deleted"))
	}, eventually, poll).Should(Succeed())
	// The next look past the timeout would come 15 s later; a change of the Machine brings it now.
	patchMachine(g, f.ns, "w1", func(m *clusterv1.Machine) { metav1.SetMetaDataLabel(&m.ObjectMeta, "test.capr.io/touched", "true") })
	g.Consistently(func(g Gomega) bool { return machineExists(g, f.ns, "w1") }, quiet, poll).Should(BeTrue())
	g.Expect(getRemediation(g, f.ns, "w1").Status.Fencing.UnfencedTime).To(BeNil())
}

// TestRealFenceThenTaintUnfencedAfterMachineAndNodeGone: NetworkFence then OutOfServiceTaint. The taint
// comes only after csi-addons confirmed the NetworkFence; the Machine is deleted once both confirmed;
// the fence stays while the Node exists (its address may still be in use); once the Node is gone the
// NetworkFence is set Unfenced, deleted after csi-addons confirms, and the request Succeeds with the
// whole record.
func TestRealFenceThenTaintUnfencedAfterMachineAndNodeGone(t *testing.T) {
	g := NewWithT(t)
	createFenceClass(g)
	f, node := realFencingWorker(t, g, networkFenceSpec(caprv1.FencingRequired,
		caprv1.FencingBackendNetworkFence, caprv1.FencingBackendOutOfServiceTaint))

	var nf *unstructured.Unstructured
	g.Eventually(func(g Gomega) {
		nf = networkFence(g, f, node)
		g.Expect(nf).NotTo(BeNil())
	}, eventually, poll).Should(Succeed())
	g.Consistently(func(g Gomega) bool { return outOfService(g, node) }, quiet, poll).Should(BeFalse(), "tainted before the fence was confirmed")
	g.Expect(machineExists(g, f.ns, "w1")).To(BeTrue())

	g.Expect(capienv.ReportNetworkFence(ctx, k8sClient, nf, capienv.CSIAddonsFenced)).To(Succeed())
	g.Eventually(func(g Gomega) bool { return machineExists(g, f.ns, "w1") }, eventually, poll).Should(BeFalse())
	g.Expect(outOfService(g, node)).To(BeTrue())
	g.Eventually(func(g Gomega) {
		reason, msg := progressing(g, f.ns, "w1")
		g.Expect(reason).To(Equal(caprv1.MachineRemediationWaitingForUnfencingReason))
		g.Expect(msg).To(ContainSubstring("Node " + node + " still exists"))
	}, eventually, poll).Should(Succeed())
	g.Consistently(func(g Gomega) string { return capienv.FenceState(networkFence(g, f, node)) }, twoLooks, poll).Should(Equal("Fenced"))
	mr := getRemediation(g, f.ns, "w1")
	g.Expect(mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhaseRunning))
	g.Expect(mr.Status.Fencing.Backends).To(HaveLen(2))
	for _, b := range mr.Status.Fencing.Backends {
		g.Expect(b.State).To(Equal(caprv1.FencingBackendFenced), "%s", b.Type)
		g.Expect(b.FencedTime).NotTo(BeNil())
	}
	g.Expect(mr.Status.Fencing.Backends[1].FencedTime.Time).NotTo(BeTemporally("<", mr.Status.Fencing.Backends[0].FencedTime.Time))

	// CAPI's Machine controller deletes the Node after the Machine's drain.
	g.Expect(k8sClient.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}})).To(Succeed())
	g.Eventually(func(g Gomega) string {
		nf = networkFence(g, f, node)
		g.Expect(nf).NotTo(BeNil())
		return capienv.FenceState(nf)
	}, eventually, poll).Should(Equal("Unfenced"))
	g.Expect(phase(g, f.ns, "w1")).To(Equal(caprv1.MachineRemediationPhaseRunning), "not done before csi-addons confirms the unfence")
	g.Expect(capienv.ReportNetworkFence(ctx, k8sClient, nf, capienv.CSIAddonsUnfenced)).To(Succeed())
	g.Eventually(func(g Gomega) caprv1.RemediationPhase { return phase(g, f.ns, "w1") }, eventually, poll).
		Should(Equal(caprv1.MachineRemediationPhaseSucceeded))
	g.Expect(networkFence(g, f, node)).To(BeNil())
	mr = getRemediation(g, f.ns, "w1")
	g.Expect(mr.Status.Fencing.UnfencedTime).NotTo(BeNil())
	for _, b := range mr.Status.Fencing.Backends {
		g.Expect(b.State).To(Equal(caprv1.FencingBackendUnfenced), "%s", b.Type)
	}
}

// TestRealBestEffortDeletesAfterItsTimeoutWithAWarning: BestEffort with a NetworkFence that cannot be
// made (its class does not exist in the workload cluster) deletes the Machine after the fencing
// timeout, with a Warning event; nothing was created, so nothing is left once the Node is gone.
func TestRealBestEffortDeletesAfterItsTimeoutWithAWarning(t *testing.T) {
	g := NewWithT(t)
	spec := networkFenceSpec(caprv1.FencingBestEffort, caprv1.FencingBackendNetworkFence)
	spec.Backends[0].NetworkFenceClassNames = []string{"no-such-class"}
	f, node := realFencingWorker(t, g, spec)

	g.Eventually(func(g Gomega) bool { return machineExists(g, f.ns, "w1") }, eventually, poll).Should(BeFalse())
	g.Eventually(func(g Gomega) []string { return eventReasons(g, f.ns, "w1") }, eventually, poll).Should(ContainElement("FencingGaveUp"))
	mr := getRemediation(g, f.ns, "w1")
	g.Expect(mr.Status.Fencing.Backends[0].State).To(Equal(caprv1.FencingBackendFencing))
	g.Expect(mr.Status.Fencing.Backends[0].Message).To(ContainSubstring("NetworkFenceClass no-such-class does not exist"))
	g.Expect(k8sClient.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}})).To(Succeed())
	g.Eventually(func(g Gomega) caprv1.RemediationPhase { return phase(g, f.ns, "w1") }, eventually, poll).
		Should(Equal(caprv1.MachineRemediationPhaseSucceeded))
	g.Expect(getRemediation(g, f.ns, "w1").Status.Fencing.UnfencedTime).NotTo(BeNil())
}

// TestRealAbortBeforeDeleteUnfences: deleting the request while Required fencing waits keeps the
// Machine. Its fence stays while its Node is not Ready (unreachable but maybe alive, with its
// workloads possibly started elsewhere), with the hook holding any deletion meanwhile; once the Node
// is Ready the NetworkFence is set Unfenced and deleted after csi-addons confirms, and the request
// goes.
func TestRealAbortBeforeDeleteUnfences(t *testing.T) {
	g := NewWithT(t)
	createFenceClass(g)
	f, node := realFencingWorker(t, g, networkFenceSpec(caprv1.FencingRequired, caprv1.FencingBackendNetworkFence))
	var nf *unstructured.Unstructured
	g.Eventually(func(g Gomega) {
		nf = networkFence(g, f, node)
		g.Expect(nf).NotTo(BeNil())
	}, eventually, poll).Should(Succeed())
	g.Expect(k8sClient.Delete(ctx, &caprv1.MachineRemediation{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "w1"}})).To(Succeed())
	g.Eventually(func(g Gomega) string {
		_, msg := progressing(g, f.ns, "w1")
		return msg
	}, eventually, poll).Should(ContainSubstring("Node " + node + " is not Ready"))
	g.Consistently(func(g Gomega) {
		g.Expect(capienv.FenceState(networkFence(g, f, node))).To(Equal("Fenced"))
		g.Expect(getMachine(g, f.ns, "w1").Annotations).To(HaveKey(caprv1.FenceBeforeDeleteHookAnnotation))
		g.Expect(remediationExists(g, f.ns, "w1")).To(BeTrue())
	}, twoLooks, poll).Should(Succeed())

	n := &corev1.Node{}
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Name: node}, n)).To(Succeed())
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	g.Expect(k8sClient.Status().Update(ctx, n)).To(Succeed())
	g.Eventually(func(g Gomega) string {
		nf = networkFence(g, f, node)
		g.Expect(nf).NotTo(BeNil())
		return capienv.FenceState(nf)
	}, eventually, poll).Should(Equal("Unfenced"))
	g.Expect(remediationExists(g, f.ns, "w1")).To(BeTrue(), "the request stays until the unfence is confirmed")
	reason, _ := progressing(g, f.ns, "w1")
	g.Expect(reason).To(Equal(caprv1.MachineRemediationWaitingForUnfencingReason))
	g.Expect(capienv.ReportNetworkFence(ctx, k8sClient, nf, capienv.CSIAddonsUnfenced)).To(Succeed())
	g.Eventually(func(g Gomega) bool { return remediationExists(g, f.ns, "w1") }, eventually, poll).Should(BeFalse())
	g.Expect(networkFence(g, f, node)).To(BeNil())
	m := getMachine(g, f.ns, "w1")
	g.Expect(m.DeletionTimestamp.IsZero()).To(BeTrue())
	g.Expect(m.Annotations).NotTo(HaveKey(caprv1.FenceBeforeDeleteHookAnnotation))
}
