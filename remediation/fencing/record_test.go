package fencing

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

func requiredSpec() *caprv1.FencingSpec {
	return &caprv1.FencingSpec{Policy: caprv1.FencingRequired, Backends: []caprv1.FencingBackend{
		{Type: caprv1.FencingBackendNetworkFence, NetworkFenceClassNames: []string{"c"}},
		{Type: caprv1.FencingBackendOutOfServiceTaint},
	}}
}

// countingFencer counts Fence calls and answers with its backends' states.
type countingFencer struct {
	calls  int
	states []caprv1.FencingBackendState
}

func (f *countingFencer) Fence(context.Context, Request) (Result, error) {
	f.calls++
	res := Result{Outcome: Waiting}
	for i, s := range f.states {
		res.Backends = append(res.Backends, BackendResult{Type: requiredSpec().Backends[i].Type, State: s, Message: string(s)})
	}
	return res, nil
}

// TestFenceIsRecordedBeforeAnyBackendActs: the record is written before the Fencer is asked; when
// writing it fails nothing is fenced (a crash there can leave no unrecorded fence), and asking again
// neither re-records nor loses the first start.
func TestFenceIsRecordedBeforeAnyBackendActs(t *testing.T) {
	g := NewWithT(t)
	mr := &caprv1.MachineRemediation{Spec: caprv1.MachineRemediationSpec{Fencing: requiredSpec()}}
	f := &countingFencer{states: []caprv1.FencingBackendState{caprv1.FencingBackendFenced, caprv1.FencingBackendFencing}}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	writeFails := errors.New("the API server is gone")

	_, err := FenceRecorded(context.Background(), f, mr, Request{Node: "n"}, t0, func(context.Context) error { return writeFails })
	g.Expect(err).To(MatchError(writeFails))
	g.Expect(f.calls).To(BeZero(), "asked to fence before the record was written")

	writes := 0
	persist := func(context.Context) error { writes++; return nil }
	mr.Status.Fencing = nil // the failed write never landed
	_, err = FenceRecorded(context.Background(), f, mr, Request{Node: "n"}, t0, persist)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(writes).To(Equal(1))
	g.Expect(f.calls).To(Equal(1))
	_, err = FenceRecorded(context.Background(), f, mr, Request{Node: "n"}, t0.Add(time.Minute), persist)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(writes).To(Equal(1), "recorded once")
	rec := mr.Status.Fencing
	g.Expect(rec.NodeName).To(Equal("n"))
	g.Expect(rec.StartTime.Time).To(Equal(t0))
	g.Expect(rec.Backends[0].State).To(Equal(caprv1.FencingBackendFenced))
	g.Expect(rec.Backends[0].FencedTime.Time).To(Equal(t0), "the first confirmation is kept")
	g.Expect(rec.Backends[1].State).To(Equal(caprv1.FencingBackendFencing))
	g.Expect(rec.Backends[1].FencedTime).To(BeNil())
	g.Expect(Owed(mr)).To(BeTrue())
}

// creatingFencer answers as a PolicyFencer whose first backend created a fence object per call,
// keeping the objects each call was given.
type creatingFencer struct {
	given [][]caprv1.FencingObject
}

func (f *creatingFencer) Fence(_ context.Context, req Request) (Result, error) {
	f.given = append(f.given, req.Objects)
	created := caprv1.FencingObject{Kind: "NetworkFence", Name: "nf", UID: fmt.Sprintf("uid-%d", len(f.given))}
	return Result{Outcome: Waiting, Backends: []BackendResult{
		{Type: caprv1.FencingBackendNetworkFence, State: caprv1.FencingBackendFencing, Objects: []caprv1.FencingObject{created}},
		{Type: caprv1.FencingBackendOutOfServiceTaint, State: caprv1.FencingBackendFencing},
	}}, nil
}

// TestCreatedFenceObjectsAreRecordedAndGivenBack: the objects a backend created are recorded in the
// status, one per kind and name (the latest replaces the one it replaced), and given to every later
// call for the same Node, never to the fence of another Node.
func TestCreatedFenceObjectsAreRecordedAndGivenBack(t *testing.T) {
	g := NewWithT(t)
	mr := &caprv1.MachineRemediation{Spec: caprv1.MachineRemediationSpec{Fencing: requiredSpec()}}
	f := &creatingFencer{}
	persist := func(context.Context) error { return nil }
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for range 2 {
		_, err := FenceRecorded(context.Background(), f, mr, Request{Node: "n"}, t0, persist)
		g.Expect(err).NotTo(HaveOccurred())
	}
	g.Expect(f.given).To(Equal([][]caprv1.FencingObject{nil, {{Kind: "NetworkFence", Name: "nf", UID: "uid-1"}}}))
	g.Expect(mr.Status.Fencing.Backends[0].Objects).To(Equal([]caprv1.FencingObject{{Kind: "NetworkFence", Name: "nf", UID: "uid-2"}}))
	g.Expect(mr.Status.Fencing.Backends[1].Objects).To(BeEmpty())

	_, err := FenceRecorded(context.Background(), f, mr, Request{Node: "other"}, t0, persist)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(f.given[2]).To(BeEmpty(), "the objects of another Node's fence")
}

// TestNothingRecordedWhenFencingCanOnlyBeSkipped: Disabled, or no Node, records nothing and owes
// nothing.
func TestNothingRecordedWhenFencingCanOnlyBeSkipped(t *testing.T) {
	g := NewWithT(t)
	for _, mr := range []*caprv1.MachineRemediation{
		{Spec: caprv1.MachineRemediationSpec{Fencing: &caprv1.FencingSpec{Policy: caprv1.FencingDisabled}}},
		{Spec: caprv1.MachineRemediationSpec{}},
	} {
		g.Expect(Begin(mr, "n", time.Now())).To(BeFalse())
		g.Expect(Owed(mr)).To(BeFalse())
	}
	mr := &caprv1.MachineRemediation{Spec: caprv1.MachineRemediationSpec{Fencing: requiredSpec()}}
	g.Expect(Begin(mr, "", time.Now())).To(BeFalse())
}

// unfenceRecorder is a backend that can unfence, done after a number of calls.
type unfenceRecorder struct {
	left *int
}

func (unfenceRecorder) Fence(context.Context, Request, caprv1.FencingBackend) (bool, string, error) {
	return true, "", nil
}

func (u unfenceRecorder) Unfence(context.Context, Request, caprv1.FencingBackend) (bool, string, error) {
	if *u.left > 0 {
		*u.left--
		return false, "csi-addons has not confirmed", nil
	}
	return true, "", nil
}

// TestUnfenceAfterDeleteWaitsForTheNode: after the delete, a fence is released only once the Node is
// gone; a pending backend keeps it owed; done, the record says so.
func TestUnfenceAfterDeleteWaitsForTheNode(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}}
	workload := fake.NewClientBuilder().WithObjects(node).WithStatusSubresource(node).Build()
	left := 1
	p := &PolicyFencer{
		Workload: func(context.Context, client.ObjectKey) (client.Client, error) { return workload, nil },
		Backends: map[caprv1.FencingBackendType]Backend{caprv1.FencingBackendNetworkFence: unfenceRecorder{left: &left}},
	}
	spec := &caprv1.FencingSpec{Policy: caprv1.FencingRequired, Backends: requiredSpec().Backends[:1]}
	mr := &caprv1.MachineRemediation{Spec: caprv1.MachineRemediationSpec{Fencing: spec}}
	g.Expect(Begin(mr, "n", time.Now())).To(BeTrue())
	req := Request{Cluster: &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c"}}, AfterDelete: true}

	done, msg, err := UnfenceRecorded(ctx, p, mr, req, time.Now())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(done).To(BeFalse())
	g.Expect(msg).To(ContainSubstring("Node n still exists"))
	g.Expect(left).To(Equal(1), "no backend asked to unfence while the Node exists")

	g.Expect(workload.Delete(ctx, node)).To(Succeed())
	done, msg, err = UnfenceRecorded(ctx, p, mr, req, time.Now())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(done).To(BeFalse())
	g.Expect(msg).To(ContainSubstring("csi-addons has not confirmed"))
	g.Expect(Owed(mr)).To(BeTrue())

	done, _, err = UnfenceRecorded(ctx, p, mr, req, time.Now())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(done).To(BeTrue())
	g.Expect(Owed(mr)).To(BeFalse())
	g.Expect(mr.Status.Fencing.UnfencedTime).NotTo(BeNil())
	g.Expect(mr.Status.Fencing.Backends[0].State).To(Equal(caprv1.FencingBackendUnfenced))

	// A kept Machine (an abort, a failure) keeps its fence while its Node is not Ready: it may be
	// unreachable but alive, with its workloads started elsewhere since. Ready, it is unfenced.
	left = 0
	mr2 := &caprv1.MachineRemediation{Spec: caprv1.MachineRemediationSpec{Fencing: spec}}
	kept := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}}
	g.Expect(workload.Create(ctx, kept)).To(Succeed())
	g.Expect(Begin(mr2, "n", time.Now())).To(BeTrue())
	req.AfterDelete = false
	done, msg, err = UnfenceRecorded(ctx, p, mr2, req, time.Now())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(done).To(BeFalse())
	g.Expect(msg).To(ContainSubstring("Node n is not Ready"))
	kept.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
	g.Expect(workload.Status().Update(ctx, kept)).To(Succeed())
	done, _, err = UnfenceRecorded(ctx, p, mr2, req, time.Now())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(done).To(BeTrue())
}
