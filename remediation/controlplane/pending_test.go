package controlplane

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// skipAddedReader is the live view of a Machine that was given CAPI's skip-remediation after the
// cache's copy was read.
type skipAddedReader struct {
	client.Reader
	machine string
}

func (r skipAddedReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if err := r.Reader.Get(ctx, key, obj, opts...); err != nil {
		return err
	}
	if m, ok := obj.(*clusterv1.Machine); ok && m.Name == r.machine {
		if m.Annotations == nil {
			m.Annotations = map[string]string{}
		}
		m.Annotations[clusterv1.MachineSkipRemediationAnnotation] = ""
	}
	return nil
}

// TestStartDecidesSkipRemediationOnALiveRead: the cached Machine does not show the
// skip-remediation set a moment ago; the start reads the Machine live and withdraws the request
// instead of starting it.
func TestStartDecidesSkipRemediationOnALiveRead(t *testing.T) {
	g := NewWithT(t)
	w := newWorld(t)
	w.s.mr.Status = caprv1.MachineRemediationStatus{Phase: caprv1.MachineRemediationPhasePending}
	g.Expect(w.client.Status().Update(t.Context(), w.s.mr)).To(Succeed())
	w.s.base = w.s.mr.DeepCopy()
	w.s.cluster.Status.Initialization.ControlPlaneInitialized = ptr.To(true)
	w.r.APIReader = skipAddedReader{Reader: w.client, machine: "m-b"}

	_, err := w.r.reconcilePending(t.Context(), w.s)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(w.s.mr.Status.Phase).NotTo(Equal(caprv1.MachineRemediationPhaseRunning), "%+v", w.s.mr.Status.Conditions)
	g.Expect(apierrors.IsNotFound(w.client.Get(t.Context(), client.ObjectKeyFromObject(w.s.mr), &caprv1.MachineRemediation{}))).To(BeTrue(), "the request is withdrawn")
	g.Expect(w.replicas(g)).To(BeEquivalentTo(3))
}
