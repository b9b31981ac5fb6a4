package fencing

import (
	"context"
	"fmt"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

type fakeBackend struct{ done bool }

func (f fakeBackend) Fence(context.Context, Request, caprv1.FencingBackend) (bool, string, error) {
	return f.done, "waiting for confirmation", nil
}

func TestPolicyFencer(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	nf := caprv1.FencingBackend{Type: caprv1.FencingBackendNetworkFence, NetworkFenceClassNames: []string{"c"}}
	spec := func(p caprv1.FencingPolicy) *caprv1.FencingSpec {
		return &caprv1.FencingSpec{Policy: p, Backends: []caprv1.FencingBackend{nf}, TimeoutSeconds: ptr.To[int32](60)}
	}
	tests := []struct {
		name     string
		spec     *caprv1.FencingSpec
		node     string
		backends map[caprv1.FencingBackendType]Backend
		elapsed  time.Duration
		want     Outcome
	}{
		{"no spec: disabled", nil, "n", nil, 0, Skipped},
		{"disabled", spec(caprv1.FencingDisabled), "n", nil, 0, Skipped},
		{"best effort, no node", spec(caprv1.FencingBestEffort), "", nil, 0, Skipped},
		{"required, backend confirms", spec(caprv1.FencingRequired), "n", map[caprv1.FencingBackendType]Backend{caprv1.FencingBackendNetworkFence: fakeBackend{done: true}}, 0, Fenced},
		{"required, backend pending, timed out: still waits", spec(caprv1.FencingRequired), "n", map[caprv1.FencingBackendType]Backend{caprv1.FencingBackendNetworkFence: fakeBackend{}}, time.Hour, Waiting},
		{"required, backend not available: waits, never deletes unfenced", spec(caprv1.FencingRequired), "n", nil, time.Hour, Waiting},
		{"best effort, pending within timeout", spec(caprv1.FencingBestEffort), "n", map[caprv1.FencingBackendType]Backend{caprv1.FencingBackendNetworkFence: fakeBackend{}}, 30 * time.Second, Waiting},
		{"best effort, timed out: gives up", spec(caprv1.FencingBestEffort), "n", nil, 61 * time.Second, GaveUp},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			p := &PolicyFencer{Backends: tt.backends, Now: func() time.Time { return start.Add(tt.elapsed) }}
			r, err := p.Fence(context.Background(), Request{Node: tt.node, Spec: tt.spec, Started: start})
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(r.Outcome).To(Equal(tt.want), r.Message)
			g.Expect(r.Message).NotTo(BeEmpty())
			if tt.backends == nil && tt.spec != nil && tt.spec.Policy != caprv1.FencingDisabled && tt.node != "" {
				g.Expect(r.Message).To(ContainSubstring("not available"))
			}
		})
	}
}

// TestRequiredWithoutNode: under Required, a request without a Node is skipped only when the Machine
// provably never had one (no nodeRef, no Node in the workload cluster with its providerID); otherwise
// the fence cannot be confirmed and the step waits, saying why.
func TestRequiredWithoutNode(t *testing.T) {
	node := func(name, providerID string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{ProviderID: providerID}}
	}
	machine := func(providerID, nodeRef string) *clusterv1.Machine {
		m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m"}, Spec: clusterv1.MachineSpec{ProviderID: providerID}}
		m.Status.NodeRef.Name = nodeRef
		return m
	}
	unreachable := func(context.Context, client.ObjectKey) (client.Client, error) {
		return nil, fmt.Errorf("connection refused")
	}
	tests := []struct {
		name     string
		machine  *clusterv1.Machine
		nodes    []client.Object
		workload WorkloadClientFunc
		want     Outcome
		message  string
	}{
		{"no Node has its providerID: never had one", machine("p://m", ""), []client.Object{node("other", "p://other")}, nil, Skipped, `no Node has its providerID "p://m"`},
		{"no providerID: no Node can be linked to it", machine("", ""), []client.Object{node("other", "")}, nil, Skipped, "never had a Node"},
		{"a Node has its providerID: cannot confirm", machine("p://m", ""), []client.Object{node("other", "p://other"), node("late", "p://m")}, nil, Waiting,
			`Node late has the Machine's providerID "p://m" but the Machine has no nodeRef yet`},
		{"a nodeRef the caller did not pass: cannot confirm", machine("p://m", "n1"), nil, nil, Waiting, "Machine m has Node n1, but no Node was given to fence"},
		{"no Machine: cannot confirm", nil, nil, nil, Waiting, "no Machine was given"},
		{"workload cluster unreachable: cannot confirm", machine("p://m", ""), nil, unreachable, Waiting, "cannot tell whether a Node has the Machine's providerID"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			workload := tt.workload
			if workload == nil {
				c := fake.NewClientBuilder().WithObjects(tt.nodes...).Build()
				workload = func(context.Context, client.ObjectKey) (client.Client, error) { return c, nil }
			}
			var asked []caprv1.FencingBackendType
			p := &PolicyFencer{Workload: workload, Backends: map[caprv1.FencingBackendType]Backend{
				caprv1.FencingBackendNetworkFence: recordingBackend{done: true, fenced: &asked, kind: caprv1.FencingBackendNetworkFence}}}
			spec := &caprv1.FencingSpec{Policy: caprv1.FencingRequired, Backends: []caprv1.FencingBackend{{Type: caprv1.FencingBackendNetworkFence}}}
			r, err := p.Fence(context.Background(), Request{Cluster: &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c"}},
				Machine: tt.machine, Spec: spec})
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(r.Outcome).To(Equal(tt.want), r.Message)
			g.Expect(r.Message).To(ContainSubstring(tt.message))
			g.Expect(asked).To(BeEmpty(), "no backend can fence a Node that is not named")
			if tt.want == Waiting {
				g.Expect(r.Message).To(HavePrefix("fencing is Required and cannot be confirmed"))
			}
		})
	}
}

// TestJudge: what a Fence step makes of the Fencer's answer. Only Fenced, Skipped and GaveUp let the
// Machine go; a wait past the timeout says so and keeps waiting; a wait within it asks again no later
// than the timeout.
func TestJudge(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	spec := &caprv1.FencingSpec{Policy: caprv1.FencingRequired, TimeoutSeconds: ptr.To[int32](60)}
	tests := []struct {
		name    string
		res     Result
		spec    *caprv1.FencingSpec
		elapsed time.Duration
		want    Verdict
	}{
		{"fenced", Result{Outcome: Fenced, Message: "m"}, spec, 0, Verdict{Done: true, Message: "m"}},
		{"skipped", Result{Outcome: Skipped, Message: "m"}, spec, 0, Verdict{Done: true, Skipped: true, Message: "m"}},
		{"gave up", Result{Outcome: GaveUp, Message: "m"}, spec, time.Hour, Verdict{Done: true, GaveUp: true, Message: "m"}},
		{"waiting, early: asked again in 0.5 s", Result{Outcome: Waiting, Message: "m"}, spec, time.Second, Verdict{Message: "m", Requeue: 500 * time.Millisecond}},
		{"waiting 8 s: asked again in 2 s", Result{Outcome: Waiting, Message: "m"}, spec, 8 * time.Second, Verdict{Message: "m", Requeue: 2 * time.Second}},
		{"waiting long: asked again in 10 s at most", Result{Outcome: Waiting, Message: "m"}, nil, 100 * time.Second, Verdict{Message: "m", Requeue: 10 * time.Second}},
		{"waiting, 5 s before the timeout: asked again just after it", Result{Outcome: Waiting, Message: "m"}, spec, 55 * time.Second, Verdict{Message: "m", Requeue: 5*time.Second + 100*time.Millisecond}},
		{"waiting past the timeout: says so, keeps waiting", Result{Outcome: Waiting, Message: "m"}, spec, 61 * time.Second,
			Verdict{TimedOut: true, Message: "not confirmed within 1m0s, still waiting: m", Requeue: 15 * time.Second}},
		{"no spec: the default timeout", Result{Outcome: Waiting, Message: "m"}, nil, DefaultTimeout - time.Second, Verdict{Message: "m", Requeue: time.Second + 100*time.Millisecond}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			g.Expect(Judge(tt.res, tt.spec, start, start.Add(tt.elapsed))).To(Equal(tt.want))
		})
	}
}

// recordingBackend confirms when done and counts the calls (Fence and Unfence).
type recordingBackend struct {
	done             bool
	fenced, unfenced *[]caprv1.FencingBackendType
	kind             caprv1.FencingBackendType
}

func (b recordingBackend) Fence(context.Context, Request, caprv1.FencingBackend) (bool, string, error) {
	*b.fenced = append(*b.fenced, b.kind)
	return b.done, "pending", nil
}

func (b recordingBackend) Unfence(context.Context, Request, caprv1.FencingBackend) (bool, string, error) {
	*b.unfenced = append(*b.unfenced, b.kind)
	return b.done, "pending", nil
}

// TestOutOfServiceTaintOnlyAfterAConfirmedFence: the taint backend is not even asked while a
// backend before it has not confirmed; unfencing goes the other way round.
func TestOutOfServiceTaintOnlyAfterAConfirmedFence(t *testing.T) {
	spec := &caprv1.FencingSpec{Policy: caprv1.FencingRequired, Backends: []caprv1.FencingBackend{
		{Type: caprv1.FencingBackendNetworkFence, NetworkFenceClassNames: []string{"c"}},
		{Type: caprv1.FencingBackendOutOfServiceTaint},
	}}
	for _, fenced := range []bool{false, true} {
		t.Run(fmt.Sprintf("network fence confirmed: %v", fenced), func(t *testing.T) {
			g := NewWithT(t)
			var calls, uncalls []caprv1.FencingBackendType
			p := &PolicyFencer{Backends: map[caprv1.FencingBackendType]Backend{
				caprv1.FencingBackendNetworkFence:      recordingBackend{done: fenced, fenced: &calls, unfenced: &uncalls, kind: caprv1.FencingBackendNetworkFence},
				caprv1.FencingBackendOutOfServiceTaint: recordingBackend{done: true, fenced: &calls, unfenced: &uncalls, kind: caprv1.FencingBackendOutOfServiceTaint},
			}}
			r, err := p.Fence(context.Background(), Request{Node: "n", Spec: spec})
			g.Expect(err).NotTo(HaveOccurred())
			if !fenced {
				g.Expect(calls).To(Equal([]caprv1.FencingBackendType{caprv1.FencingBackendNetworkFence}), "the taint is never applied before the fence is confirmed")
				g.Expect(r.Outcome).To(Equal(Waiting))
				g.Expect(r.Message).To(ContainSubstring("waits until the backends before it confirm the fence"))
				return
			}
			g.Expect(calls).To(Equal([]caprv1.FencingBackendType{caprv1.FencingBackendNetworkFence, caprv1.FencingBackendOutOfServiceTaint}))
			g.Expect(r.Outcome).To(Equal(Fenced))
			ready := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{
				{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
			workload := fake.NewClientBuilder().WithObjects(ready).WithStatusSubresource(ready).Build()
			p.Workload = func(context.Context, client.ObjectKey) (client.Client, error) { return workload, nil }
			cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c"}}
			g.Expect(p.Unfence(context.Background(), Request{Cluster: cluster, Node: "n", Spec: spec})).To(Succeed())
			g.Expect(uncalls).To(Equal([]caprv1.FencingBackendType{caprv1.FencingBackendOutOfServiceTaint, caprv1.FencingBackendNetworkFence}), "the taint goes before the fence it relied on")
		})
	}
}
