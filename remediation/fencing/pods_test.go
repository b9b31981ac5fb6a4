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
// by FenceRecorded only once every backend that fences confirmed the fence (all but an
// OutOfServiceTaint, which follows the pods' deletion); never under Disabled, while a backend waits,
// or once BestEffort gave up; pods of other Nodes never. Done, it is recorded and not done again.
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
		{"required, NetworkFence confirmed, taint not on the Node yet: the pods go first", spec(caprv1.FencingRequired, nf, taint), confirms, false, 0, true},
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

// TestTheTaintFollowsThePodsDeletion: with a fencer that deletes the Node's pods, the out-of-service
// taint is added only taintAfterPods after they were deleted (recorded in status.fencing.pods, in
// whole seconds: taintAllowedAt counts from the end of the recorded second), so
// that kube-controller-manager's taint-eviction controller never evicts, by name, what took their
// names (pods.go); without one it is added once the backends before it confirmed, as before.
func TestTheTaintFollowsThePodsDeletion(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	spec := &caprv1.FencingSpec{Policy: caprv1.FencingRequired, TimeoutSeconds: ptr.To[int32](60), Backends: []caprv1.FencingBackend{
		{Type: caprv1.FencingBackendNetworkFence, NetworkFenceClassNames: []string{"c"}}, {Type: caprv1.FencingBackendOutOfServiceTaint}}}
	tainted := func(c client.Client) bool {
		n := &corev1.Node{}
		g.Expect(c.Get(ctx, client.ObjectKey{Name: "n"}, n)).To(Succeed())
		return hasOutOfServiceTaint(n)
	}
	newWorkload := func() client.Client {
		return fake.NewClientBuilder().
			WithObjects(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}},
				&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "db-0", UID: "uid-db-0"}, Spec: corev1.PodSpec{NodeName: "n"}}).
			WithIndex(&corev1.Pod{}, nodeNameField, func(o client.Object) []string { return []string{o.(*corev1.Pod).Spec.NodeName} }).
			Build()
	}
	fencer := func(c client.Client, now *time.Time, pods bool) *PolicyFencer {
		wl := func(context.Context, client.ObjectKey) (client.Client, error) { return c, nil }
		p := &PolicyFencer{Workload: wl, Now: func() time.Time { return *now }, Backends: map[caprv1.FencingBackendType]Backend{
			caprv1.FencingBackendNetworkFence:      fakeBackend{done: true},
			caprv1.FencingBackendOutOfServiceTaint: &OutOfServiceTaintBackend{Workload: wl, ServerVersion: func(context.Context, client.ObjectKey) (string, error) { return "v1.36.3", nil }},
		}}
		if pods {
			p.Pods = &PodDeleter{Workload: wl}
		}
		return p
	}
	req := Request{Cluster: &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c"}},
		Machine: &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m"}}, Node: "n", Spec: spec, Started: start}

	c, now := newWorkload(), start
	p := fencer(c, &now, true)
	mr := &caprv1.MachineRemediation{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m", UID: "mr-uid"}, Spec: caprv1.MachineRemediationSpec{Fencing: spec}}
	res, err := FenceRecorded(ctx, p, mr, req, now, func(context.Context) error { return nil })
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Outcome).To(Equal(Waiting))
	g.Expect(res.Backends[1].Message).To(Equal("waits until the Node's pods are force-deleted"))
	g.Expect(mr.Status.Fencing.Pods.DeletedTime).NotTo(BeNil(), "the pods went in the same call")
	g.Expect(tainted(c)).To(BeFalse())
	// The Fence step asks again when the taint may follow, not at its usual pace.
	g.Expect(res.AskAgainAt).To(Equal(taintAllowedAt(start)))
	g.Expect(Judge(res, spec, start.Add(-10*time.Second), start).Requeue).To(Equal(taintAllowedAt(start).Sub(start)))

	now = taintAllowedAt(start).Add(-time.Millisecond)
	res, err = FenceRecorded(ctx, p, mr, req, now, func(context.Context) error { return nil })
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Backends[1].Message).To(ContainSubstring("after the Node's pods were force-deleted"))
	g.Expect(tainted(c)).To(BeFalse(), "not within taintAfterPods of the deletion")

	now = taintAllowedAt(start)
	_, err = FenceRecorded(ctx, p, mr, req, now, func(context.Context) error { return nil })
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(tainted(c)).To(BeTrue())

	// Without a pod deleter the pods are left to Kubernetes and the taint does not wait for them.
	c, now = newWorkload(), start
	mr = &caprv1.MachineRemediation{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m", UID: "mr-uid"}, Spec: caprv1.MachineRemediationSpec{Fencing: spec}}
	_, err = FenceRecorded(ctx, fencer(c, &now, false), mr, req, now, func(context.Context) error { return nil })
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(tainted(c)).To(BeTrue())
}

// TestEvictable: which pods of a Node that carries the out-of-service taint already go now (only
// those the taint-eviction controller marked terminating, unless it has not for evictionWait), which
// are left (they tolerate the taint, as Kubernetes leaves them), and that without the taint every pod
// goes.
func TestEvictable(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	taintAt := func(at time.Time) *corev1.Taint {
		t := OutOfServiceTaint
		t.TimeAdded = &metav1.Time{Time: at}
		return &t
	}
	terminating := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &metav1.Time{Time: now}}}
	running := &corev1.Pod{}
	tolerating := &corev1.Pod{Spec: corev1.PodSpec{Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}}}}
	tests := []struct {
		name  string
		pod   *corev1.Pod
		taint *corev1.Taint
		want  podVerdict
	}{
		{"no taint, running", running, nil, podDelete},
		{"no taint, tolerating", tolerating, nil, podDelete},
		{"taint just added, running", running, taintAt(now.Add(-time.Second)), podNotMarkedYet},
		{"taint just added, terminating", terminating, taintAt(now.Add(-time.Second)), podDelete},
		{"taint just added, tolerating", tolerating, taintAt(now.Add(-time.Second)), podLeft},
		{"taint added evictionWait ago, running: no taint-eviction controller", running, taintAt(now.Add(-evictionWait)), podDelete},
		{"taint without timeAdded, running", running, &OutOfServiceTaint, podDelete},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			NewWithT(t).Expect(evictable(tt.pod, tt.taint, now)).To(Equal(tt.want))
		})
	}
}

// TestTaintAllowedAt: the taint never follows the pods' deletion sooner than taintAfterPods, whatever
// part of a second the record lost.
func TestTaintAllowedAt(t *testing.T) {
	g := NewWithT(t)
	for _, deleted := range []time.Time{
		time.Date(2026, 1, 1, 0, 0, 5, 0, time.UTC),
		time.Date(2026, 1, 1, 0, 0, 5, 999_000_000, time.UTC),
		time.Date(2026, 1, 1, 0, 0, 5, 400_000_000, time.UTC),
	} {
		recorded := metav1.NewTime(deleted).Rfc3339Copy().Time // what reading the record back gives
		g.Expect(taintAllowedAt(recorded).Sub(deleted)).To(BeNumerically(">=", taintAfterPods), "deleted at %s", deleted)
		g.Expect(taintAllowedAt(recorded).Sub(deleted)).To(BeNumerically("<=", time.Second+taintAfterPods))
	}
}
