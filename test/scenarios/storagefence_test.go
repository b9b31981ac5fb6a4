package scenarios_test

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/remediation/fencing"
	"github.com/capr-io/capr/test/storage"
)

// TestControlPlaneFencedThroughCSIAddonsThenUnfencedAfterTheVictimIsGone: the manager's own fencer
// (the real NetworkFence and OutOfServiceTaint backends) on the sandbox with storage failover's real
// components (storage.StartStack: csi-addons' controller with the stand-in sidecar,
// kube-controller-manager, the CSI external-attacher). A control-plane Machine's kubelet stops: the
// remediation fences its address through csi-addons, taints its Node out-of-service only once the
// address is fenced, deletes it, and once its Node is gone unfences the address and removes the
// NetworkFence, recording all of it in the request.
func TestControlPlaneFencedThroughCSIAddonsThenUnfencedAfterTheVictimIsGone(t *testing.T) {
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
	startCAPR(t)
	victim := controlPlane(g, wc)[1]
	node := victim.Status.NodeRef.Name
	n := &corev1.Node{}
	g.Expect(sb.Client.Get(ctx, client.ObjectKey{Name: node}, n)).To(Succeed())
	g.Expect(n.Status.Addresses).NotTo(BeEmpty())
	cidr := n.Status.Addresses[0].Address + "/32"
	g.Expect(stack.Sidecar.Fenced(cidr)).To(BeFalse())

	g.Expect(sb.StopHeartbeat(ctx, wc, node)).To(Succeed())
	// Until the Delete step: the Node never carries the out-of-service taint while csi-addons has not
	// fenced its address.
	var fenced, tainted time.Time
	g.Eventually(func(g Gomega) {
		if stack.Sidecar.Fenced(cidr) && fenced.IsZero() {
			fenced = time.Now()
		}
		n := &corev1.Node{}
		if err := sb.Client.Get(ctx, client.ObjectKey{Name: node}, n); err == nil && hasOutOfServiceTaint(n) {
			if !stack.Sidecar.Fenced(cidr) {
				StopTrying("Node " + node + " was tainted out-of-service before csi-addons fenced " + cidr).Now()
			}
			if tainted.IsZero() {
				tainted = time.Now()
			}
		}
		mr := getRemediation(g, wc, victim.Name)
		g.Expect(mr.Status.Step(caprv1.StepDelete)).NotTo(BeNil(), "step %s: %v", mr.Status.CurrentStep, mr.Status.Conditions)
	}, remediationTimeout, 100*time.Millisecond).Should(Succeed())
	g.Expect(fenced.IsZero()).To(BeFalse())
	g.Expect(tainted.IsZero()).To(BeFalse())
	g.Expect(tainted).NotTo(BeTemporally("<", fenced))

	// From the Delete step on: the address is released only once the victim's Node is gone.
	g.Eventually(func(g Gomega) {
		if !stack.Sidecar.Fenced(cidr) {
			err := sb.Client.Get(ctx, client.ObjectKey{Name: node}, &corev1.Node{})
			if !apierrors.IsNotFound(err) {
				StopTrying(cidr + " was unfenced while Node " + node + " still existed").Now()
			}
		}
		g.Expect(getRemediation(g, wc, victim.Name).Status.Phase).To(Equal(caprv1.MachineRemediationPhaseSucceeded))
	}, remediationTimeout, 50*time.Millisecond).Should(Succeed())
	mr := waitRemediated(t, wc, victim.Name, 3)
	g.Expect(stack.Sidecar.Fenced(cidr)).To(BeFalse(), "csi-addons unfenced the address")
	nfs := &unstructured.UnstructuredList{}
	nfs.SetGroupVersionKind(fencing.NetworkFenceGVK)
	g.Expect(sb.Client.List(ctx, nfs)).To(Succeed())
	for _, nf := range nfs.Items {
		g.Expect(nf.GetAnnotations()[fencing.NetworkFenceNodeAnnotation]).NotTo(Equal(node), "NetworkFence %s left behind", nf.GetName())
	}
	rec := mr.Status.Fencing
	g.Expect(rec).NotTo(BeNil())
	g.Expect(rec.NodeName).To(Equal(node))
	g.Expect(rec.UnfencedTime).NotTo(BeNil())
	g.Expect(rec.Backends).To(HaveLen(2))
	for _, b := range rec.Backends {
		g.Expect(b.State).To(Equal(caprv1.FencingBackendUnfenced), "%s", b.Type)
		g.Expect(b.FencedTime).NotTo(BeNil(), "%s", b.Type)
	}
	g.Expect(rec.Backends[1].FencedTime.Time).NotTo(BeTemporally("<", rec.Backends[0].FencedTime.Time))
	check()
}

func hasOutOfServiceTaint(n *corev1.Node) bool {
	for _, t := range n.Spec.Taints {
		if t.MatchTaint(&fencing.OutOfServiceTaint) {
			return true
		}
	}
	return false
}
