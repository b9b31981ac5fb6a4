package controlplane

import (
	"context"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// TestPersistKeepsStatusAcrossTheMetadataWrite: a start changes metadata (owner, label) and status
// (Running) in one reconcile. The metadata write's reply carries the stored status; persist must
// still write the status this reconcile decided, or the request sits Pending while it holds the
// lock and starts a second time.
func TestPersistKeepsStatusAcrossTheMetadataWrite(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	sch := runtime.NewScheme()
	g.Expect(caprv1.AddToScheme(sch)).To(Succeed())
	g.Expect(clusterv1.AddToScheme(sch)).To(Succeed())
	mr := &caprv1.MachineRemediation{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m1"},
		Status:     caprv1.MachineRemediationStatus{Phase: caprv1.MachineRemediationPhasePending},
	}
	c := fake.NewClientBuilder().WithScheme(sch).WithObjects(mr).WithStatusSubresource(mr).Build()
	r := &Reconciler{Client: c, APIReader: c}

	live := &caprv1.MachineRemediation{}
	g.Expect(c.Get(ctx, client.ObjectKeyFromObject(mr), live)).To(Succeed())
	s := &scope{mr: live, base: live.DeepCopy()}
	live.Labels = map[string]string{clusterv1.ClusterNameLabel: "wc"}
	live.Status.Phase = caprv1.MachineRemediationPhaseRunning
	g.Expect(r.persist(ctx, s)).To(Succeed())

	stored := &caprv1.MachineRemediation{}
	g.Expect(c.Get(ctx, client.ObjectKeyFromObject(mr), stored)).To(Succeed())
	g.Expect(stored.Labels).To(HaveKeyWithValue(clusterv1.ClusterNameLabel, "wc"))
	g.Expect(stored.Status.Phase).To(Equal(caprv1.MachineRemediationPhaseRunning))
	g.Expect(s.mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhaseRunning), "the in-memory state must not be reset")
}
