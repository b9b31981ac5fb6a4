//go:build envtest

package fencing_test

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/remediation/fencing"
)

// realVersion reads the workload cluster's version from its discovery, as the manager does.
var realVersion = fencing.DiscoveryServerVersion(func(context.Context, client.ObjectKey) (*rest.Config, error) {
	return testEnv.Config, nil
})

func oosBackend(version func(context.Context, client.ObjectKey) (string, error)) *fencing.OutOfServiceTaintBackend {
	return &fencing.OutOfServiceTaintBackend{
		Workload:      func(context.Context, client.ObjectKey) (client.Client, error) { return k8sClient, nil },
		ServerVersion: version,
	}
}

func oosRequest(f *fixture) (fencing.Request, caprv1.FencingBackend) {
	spec := caprv1.FencingBackend{Type: caprv1.FencingBackendOutOfServiceTaint}
	return fencing.Request{Cluster: f.cluster, Machine: f.machine, Node: f.node,
		Spec: &caprv1.FencingSpec{Policy: caprv1.FencingRequired, Backends: []caprv1.FencingBackend{
			{Type: caprv1.FencingBackendExternal, TemplateRef: &caprv1.TemplateReference{APIVersion: "fencing.example.com/v1alpha1", Kind: "PowerFenceTemplate", Name: "x"}}, spec}}}, spec
}

// attach creates a VolumeAttachment of a volume on node (what the attach/detach controller does).
func attach(g Gomega, name, node string) *storagev1.VolumeAttachment {
	va := &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: storagev1.VolumeAttachmentSpec{
		Attacher: "csi.example.com", NodeName: node, Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: ptr.To("pv-" + name)}}}
	g.Expect(k8sClient.Create(ctx, va)).To(Succeed())
	return va
}

// taints returns the Node's taints. CAPR's out-of-service taint records when it was added (the pod
// deletion tells a taint-eviction controller about to act from none by it): that is checked here and
// left out of what is returned, so that the taint compares equal to fencing.OutOfServiceTaint.
func taints(g Gomega, node string) []corev1.Taint {
	n := &corev1.Node{}
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Name: node}, n)).To(Succeed())
	for i := range n.Spec.Taints {
		if t := &n.Spec.Taints[i]; t.MatchTaint(&fencing.OutOfServiceTaint) {
			g.Expect(t.TimeAdded).NotTo(BeNil(), "CAPR's out-of-service taint records when it was added")
			t.TimeAdded = nil
		}
	}
	return n.Spec.Taints
}

func TestOutOfServiceTaintWaitsForDetachAndIsRemovedAfterwards(t *testing.T) {
	f := newFixture(t, addresses("10.0.8.7")...)
	other := corev1.Taint{Key: "example.com/keep", Value: "x", Effect: corev1.TaintEffectNoSchedule}
	n := &corev1.Node{}
	f.g.Expect(k8sClient.Get(ctx, client.ObjectKey{Name: f.node}, n)).To(Succeed())
	n.Spec.Taints = []corev1.Taint{other}
	f.g.Expect(k8sClient.Update(ctx, n)).To(Succeed())
	va := attach(f.g, "va-"+f.node, f.node)
	attach(f.g, "va-elsewhere-"+f.node, "another-node")

	b := oosBackend(realVersion)
	req, spec := oosRequest(f)
	done, msg, err := b.Fence(ctx, req, spec)
	f.g.Expect(err).NotTo(HaveOccurred())
	f.g.Expect(done).To(BeFalse())
	f.g.Expect(msg).To(ContainSubstring("waiting for kube-controller-manager to detach 1 volume(s): [va-" + f.node + "]"))
	f.g.Expect(taints(f.g, f.node)).To(ConsistOf(other, fencing.OutOfServiceTaint))

	done, _, err = b.Fence(ctx, req, spec) // asked again: tainted once
	f.g.Expect(err).NotTo(HaveOccurred())
	f.g.Expect(done).To(BeFalse())
	f.g.Expect(taints(f.g, f.node)).To(HaveLen(2))
	f.g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(va), va)).To(Succeed(), "never deletes a VolumeAttachment")

	f.g.Expect(k8sClient.Delete(ctx, va)).To(Succeed()) // kube-controller-manager detached it
	done, msg, err = b.Fence(ctx, req, spec)
	f.g.Expect(err).NotTo(HaveOccurred())
	f.g.Expect(done).To(BeTrue(), msg)

	done, _, err = b.Unfence(ctx, req, spec)
	f.g.Expect(err).NotTo(HaveOccurred())
	f.g.Expect(done).To(BeTrue())
	f.g.Expect(taints(f.g, f.node)).To(ConsistOf(other), "only the out-of-service taint is removed")
}

func TestOutOfServiceTaintNeedsKubernetes128(t *testing.T) {
	for _, tc := range []struct {
		version string
		ok      bool
	}{{"v1.27.16", false}, {"v1.26.0-eks-1", false}, {"v1.28.0", true}, {"v1.36.3", true}} {
		t.Run(tc.version, func(t *testing.T) {
			f := newFixture(t, addresses("10.0.9.7")...)
			b := oosBackend(func(context.Context, client.ObjectKey) (string, error) { return tc.version, nil })
			req, spec := oosRequest(f)
			_, _, err := b.Fence(ctx, req, spec)
			if tc.ok {
				f.g.Expect(err).NotTo(HaveOccurred())
				f.g.Expect(taints(f.g, f.node)).To(ContainElement(fencing.OutOfServiceTaint))
				return
			}
			f.g.Expect(err).To(MatchError(fencing.ErrNotAvailable))
			f.g.Expect(err).To(MatchError(ContainSubstring(tc.version)))
			f.g.Expect(taints(f.g, f.node)).NotTo(ContainElement(fencing.OutOfServiceTaint), "never tainted on a workload cluster older than 1.28")
		})
	}
}

func TestOutOfServiceTaintNodeGone(t *testing.T) {
	f := newFixture(t) // no Node
	b := oosBackend(realVersion)
	req, spec := oosRequest(f)
	va := attach(f.g, "va-"+f.node, f.node)
	done, msg, err := b.Fence(ctx, req, spec)
	f.g.Expect(err).NotTo(HaveOccurred())
	f.g.Expect(done).To(BeFalse(), "its volumes are still waited for")
	f.g.Expect(msg).To(ContainSubstring("detach 1 volume"))
	f.g.Expect(k8sClient.Delete(ctx, va)).To(Succeed())
	done, _, err = b.Fence(ctx, req, spec)
	f.g.Expect(err).NotTo(HaveOccurred())
	f.g.Expect(done).To(BeTrue())
	done, _, err = b.Unfence(ctx, req, spec)
	f.g.Expect(err).NotTo(HaveOccurred())
	f.g.Expect(done).To(BeTrue())
}
