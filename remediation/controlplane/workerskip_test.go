package controlplane

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// countingReader counts live reads.
type countingReader struct {
	client.Reader
	reads int
}

func (c *countingReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	c.reads++
	return c.Reader.Get(ctx, key, obj, opts...)
}

// TestWorkerRequestLeftBeforeTheLiveRead: the request of an existing worker Machine is the worker
// remediator's whatever it says, so it is left without reading it live; a control-plane Machine's
// request is still read live.
func TestWorkerRequestLeftBeforeTheLiveRead(t *testing.T) {
	g := NewWithT(t)
	sch := newTestScheme(g)
	worker := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "w1"}, Spec: clusterv1.MachineSpec{ClusterName: "c"}}
	mr := &caprv1.MachineRemediation{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "w1"}}
	c := fake.NewClientBuilder().WithScheme(sch).WithObjects(worker, mr).WithStatusSubresource(mr).Build()
	live := &countingReader{Reader: c}
	r := &Reconciler{Client: c, APIReader: live}

	res, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(mr)})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res).To(Equal(ctrl.Result{}))
	g.Expect(live.reads).To(BeZero())
	stored := &caprv1.MachineRemediation{}
	g.Expect(c.Get(context.Background(), client.ObjectKeyFromObject(mr), stored)).To(Succeed())
	g.Expect(stored.Status).To(Equal(caprv1.MachineRemediationStatus{}), "nothing written")

	// A request whose Machine is not in the cache is read live (it may be a control-plane request).
	_, _ = r.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKey{Namespace: "ns", Name: "gone"}})
	g.Expect(live.reads).To(Equal(1))
}
