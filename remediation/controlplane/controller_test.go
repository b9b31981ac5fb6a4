package controlplane

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

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

// TestRunningWithoutControlPlaneRecordIsReportedNotRun: a control-plane request whose status says
// Running without status.controlPlane (written by hand: CAPR records both in one write) panicked the
// remediator. It is reported and left alone, and its deletion goes through.
func TestRunningWithoutControlPlaneRecordIsReportedNotRun(t *testing.T) {
	g := NewWithT(t)
	sch := newTestScheme(g)
	victim := cpMachine("m-b")
	mr := &caprv1.MachineRemediation{ObjectMeta: metav1.ObjectMeta{Namespace: testNamespace, Name: "m-b", Finalizers: []string{caprv1.MachineRemediationFinalizer}},
		Status: caprv1.MachineRemediationStatus{Phase: caprv1.MachineRemediationPhaseRunning}}
	c := fake.NewClientBuilder().WithScheme(sch).WithObjects(victim, mr).WithStatusSubresource(mr).Build()
	r := &Reconciler{Client: c, APIReader: c}
	key := client.ObjectKeyFromObject(mr)

	res, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: key})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res).To(Equal(ctrl.Result{}))
	stored := &caprv1.MachineRemediation{}
	g.Expect(c.Get(context.Background(), key, stored)).To(Succeed())
	g.Expect(stored.Status.Phase).To(Equal(caprv1.MachineRemediationPhaseRunning), "nothing is decided from a status CAPR did not write")
	g.Expect(stored.Status.Conditions).To(ContainElement(And(
		HaveField("Reason", caprv1.MachineRemediationWaitingForPreconditionsReason),
		HaveField("Message", ContainSubstring("status.controlPlane is missing")))))

	g.Expect(c.Delete(context.Background(), stored)).To(Succeed())
	_, err = r.Reconcile(context.Background(), ctrl.Request{NamespacedName: key})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(apierrors.IsNotFound(c.Get(context.Background(), key, &caprv1.MachineRemediation{}))).To(BeTrue(), "the finalizer was removed")
}

// TestStatusWrittenAfterTheReconcileTimeout: the reconcile timeout cut a reconcile short; what it
// decided (here: why it waits) is still written, and the error has it reconciled again. The client
// refuses a done context, as client-go does before it sends.
func TestStatusWrittenAfterTheReconcileTimeout(t *testing.T) {
	g := NewWithT(t)
	sch := newTestScheme(g)
	mr := &caprv1.MachineRemediation{ObjectMeta: metav1.ObjectMeta{Namespace: testNamespace, Name: "m-b", Finalizers: []string{caprv1.MachineRemediationFinalizer}},
		Status: caprv1.MachineRemediationStatus{Phase: caprv1.MachineRemediationPhaseRunning}}
	refuseDone := func(ctx context.Context) error { return ctx.Err() }
	c := fake.NewClientBuilder().WithScheme(sch).WithObjects(cpMachine("m-b"), mr).WithStatusSubresource(mr).WithInterceptorFuncs(interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			if err := refuseDone(ctx); err != nil {
				return err
			}
			return c.Patch(ctx, obj, patch, opts...)
		},
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			if err := refuseDone(ctx); err != nil {
				return err
			}
			return c.SubResource(sub).Patch(ctx, obj, patch, opts...)
		},
	}).Build()
	r := &Reconciler{Client: c, APIReader: c}
	key := client.ObjectKeyFromObject(mr)
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()

	_, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: key})
	g.Expect(err).To(MatchError(context.DeadlineExceeded), "reconciled again, with backoff")
	stored := &caprv1.MachineRemediation{}
	g.Expect(c.Get(context.Background(), key, stored)).To(Succeed())
	g.Expect(stored.Status.Conditions).To(ContainElement(HaveField("Message", ContainSubstring("status.controlPlane is missing"))))
}

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
