package fencing

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// taintConfirms is an OutOfServiceTaint stand-in that is still waiting (for the volumes to detach),
// whether or not the taint is on: fenceConfirmed reads the taint from the Node.
type taintConfirms struct{}

func (taintConfirms) Fence(context.Context, Request, caprv1.FencingBackend) (bool, string, error) {
	return false, "waiting for kube-controller-manager to detach 1 volume(s)", nil
}

// TestFencedPodsDeletedOnlyOnceConfirmed: the fenced Node's pods (mirror pods aside) are force-deleted
// by FenceRecorded only once every backend confirmed the fence (an OutOfServiceTaint backend once its
// taint is on the Node); never under Disabled, while a backend waits, or once BestEffort gave up; pods
// of other Nodes never. Done, it is recorded and not done again.
func TestFencedPodsDeletedOnlyOnceConfirmed(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	nf := caprv1.FencingBackend{Type: caprv1.FencingBackendNetworkFence, NetworkFenceClassNames: []string{"c"}}
	taint := caprv1.FencingBackend{Type: caprv1.FencingBackendOutOfServiceTaint}
	spec := func(p caprv1.FencingPolicy, b ...caprv1.FencingBackend) *caprv1.FencingSpec {
		return &caprv1.FencingSpec{Policy: p, Backends: b, TimeoutSeconds: ptr.To[int32](60)}
	}
	confirms := map[caprv1.FencingBackendType]Backend{caprv1.FencingBackendNetworkFence: fakeBackend{done: true}, caprv1.FencingBackendOutOfServiceTaint: taintConfirms{}}
	pending := map[caprv1.FencingBackendType]Backend{caprv1.FencingBackendNetworkFence: fakeBackend{}, caprv1.FencingBackendOutOfServiceTaint: taintConfirms{}}
	tests := []struct {
		name        string
		spec        *caprv1.FencingSpec
		backends    map[caprv1.FencingBackendType]Backend
		tainted     bool
		elapsed     time.Duration
		wantDeleted bool
	}{
		{"required, NetworkFence confirmed", spec(caprv1.FencingRequired, nf), confirms, false, 0, true},
		{"best effort, NetworkFence confirmed", spec(caprv1.FencingBestEffort, nf), confirms, false, 0, true},
		{"required, NetworkFence confirmed, Node tainted out-of-service", spec(caprv1.FencingRequired, nf, taint), confirms, true, 0, true},
		{"required, NetworkFence confirmed, taint not on the Node yet", spec(caprv1.FencingRequired, nf, taint), confirms, false, 0, false},
		{"required, NetworkFence not confirmed", spec(caprv1.FencingRequired, nf), pending, false, time.Hour, false},
		{"required, backend not available", spec(caprv1.FencingRequired, nf), nil, false, 0, false},
		{"best effort, not confirmed within the timeout: gave up", spec(caprv1.FencingBestEffort, nf), pending, false, 61 * time.Second, false},
		{"best effort gave up with the taint on the Node", spec(caprv1.FencingBestEffort, nf, taint), pending, true, 61 * time.Second, false},
		{"disabled", spec(caprv1.FencingDisabled), confirms, true, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			ctx := context.Background()
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}}
			if tt.tainted {
				node.Spec.Taints = []corev1.Taint{OutOfServiceTaint}
			}
			pod := func(name, node string, annotations map[string]string) *corev1.Pod {
				return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: name, UID: types.UID("uid-" + name), Annotations: annotations},
					Spec: corev1.PodSpec{NodeName: node}}
			}
			workload := fake.NewClientBuilder().
				WithObjects(node, pod("db-0", "n", nil), pod("web-1", "n", nil), pod("db-1", "other", nil),
					pod("kube-proxy-n", "n", map[string]string{corev1.MirrorPodAnnotationKey: "x"})).
				WithIndex(&corev1.Pod{}, nodeNameField, func(o client.Object) []string { return []string{o.(*corev1.Pod).Spec.NodeName} }).
				Build()
			wl := func(context.Context, client.ObjectKey) (client.Client, error) { return workload, nil }
			p := &PolicyFencer{Workload: wl, Backends: tt.backends, Now: func() time.Time { return start.Add(tt.elapsed) },
				Pods: &PodDeleter{Workload: wl}}
			mr := &caprv1.MachineRemediation{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m", UID: "mr-uid"},
				Spec: caprv1.MachineRemediationSpec{Fencing: tt.spec}}
			req := Request{Cluster: &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c"}},
				Machine: &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m"}}, Node: "n", Spec: tt.spec, Started: start}
			_, err := FenceRecorded(ctx, p, mr, req, start.Add(tt.elapsed), func(context.Context) error { return nil })
			g.Expect(err).NotTo(HaveOccurred())

			left := func() []string {
				pods := &corev1.PodList{}
				g.Expect(workload.List(ctx, pods)).To(Succeed())
				names := make([]string, 0, len(pods.Items))
				for _, p := range pods.Items {
					names = append(names, p.Name)
				}
				return names
			}
			if !tt.wantDeleted {
				g.Expect(left()).To(ConsistOf("db-0", "web-1", "db-1", "kube-proxy-n"))
				if mr.Status.Fencing != nil {
					g.Expect(mr.Status.Fencing.Pods).To(BeNil())
				}
				return
			}
			g.Expect(left()).To(ConsistOf("db-1", "kube-proxy-n"), "only the fenced Node's pods, mirror pods aside")
			rec := mr.Status.Fencing.Pods
			g.Expect(rec).NotTo(BeNil())
			g.Expect(rec.DeletedTime).NotTo(BeNil())
			g.Expect(rec.Deleted).To(BeEquivalentTo(2))
			g.Expect(rec.Message).To(ContainSubstring("app/db-0"))

			// Recorded: a later Fence call (the taint backend still waiting) deletes nothing more.
			g.Expect(workload.Create(ctx, pod("db-0", "n", nil))).To(Succeed())
			_, err = FenceRecorded(ctx, p, mr, req, start.Add(tt.elapsed), func(context.Context) error { return nil })
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(left()).To(ContainElement("db-0"))
			g.Expect(mr.Status.Fencing.Pods.Deleted).To(BeEquivalentTo(2))
		})
	}
}
