package controlplane

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/etcdutil"
	"github.com/capr-io/capr/remediation/fencing"
)

// The fakes behind the step tests (steps_test.go and the tests of each step family): a workload etcd cluster, an EtcdProvider, a
// Fencer, and a world (a fake API server with a Cluster, its control-plane object and Machines, and
// a running MachineRemediation) in which a step is run exactly as runStep runs it.

const testNamespace = "ns"

// --- etcd -----------------------------------------------------------------------------------------

// fakeMember is one member of a fakeEtcd.
type fakeMember struct {
	name        string
	id          uint64
	leader      bool
	learner     bool
	down        bool // Healthy false, with a Problem
	unreachable bool // Reachable false (and so unhealthy)
}

// memberOption configures a fakeMember.
type memberOption func(*fakeMember)

// asLeader makes the member the leader.
func asLeader() memberOption { return func(m *fakeMember) { m.leader = true } }

// asLearner makes the member a learner (healthy, not voting).
func asLearner() memberOption { return func(m *fakeMember) { m.learner = true } }

// asDown makes the member unhealthy but reachable (e.g. its process answers with an alarm).
func asDown() memberOption { return func(m *fakeMember) { m.down = true } }

// asUnreachable makes the member unreachable through its Node (and so unhealthy).
func asUnreachable() memberOption { return func(m *fakeMember) { m.unreachable = true } }

// withMemberID sets the member's ID (the default is derived from its name).
func withMemberID(id uint64) memberOption { return func(m *fakeMember) { m.id = id } }

// member returns a healthy voting member named after its Node.
func member(node string, opts ...memberOption) fakeMember {
	m := fakeMember{name: node, id: memberID(node)}
	for _, o := range opts {
		o(&m)
	}
	return m
}

// memberID is the ID a member named node gets by default (stable, non-zero).
func memberID(node string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(node))
	return h.Sum64() | 1
}

type moveLeaderCall struct {
	leaderNode string
	to         uint64
}

type removeMemberCall struct {
	id  uint64
	via []string
}

// fakeEtcd is a workload etcd cluster: Inspect reports its members, MoveLeader and RemoveMember are
// recorded and, unless told to fail, change the membership as etcd would.
type fakeEtcd struct {
	members []fakeMember

	inspectErr      error
	moveLeaderErr   error
	removeMemberErr error

	inspected     [][]string // the nodes of every Inspect call
	moveLeaders   []moveLeaderCall
	removeMembers []removeMemberCall
}

var _ EtcdCluster = &fakeEtcd{}

func newFakeEtcd(members ...fakeMember) *fakeEtcd {
	return &fakeEtcd{members: members}
}

// Inspect implements EtcdCluster.
func (f *fakeEtcd) Inspect(_ context.Context, nodes []string) (*etcdutil.State, error) {
	f.inspected = append(f.inspected, slices.Clone(nodes))
	if f.inspectErr != nil {
		return nil, f.inspectErr
	}
	state := &etcdutil.State{ClusterID: 1}
	for _, m := range f.members {
		s := etcdutil.MemberStatus{ID: m.id, Name: m.name, IsLearner: m.learner, Reachable: !m.unreachable, Healthy: !m.down && !m.unreachable}
		switch {
		case m.unreachable:
			s.Problem = "unreachable"
		case m.down:
			s.Problem = "unhealthy"
		}
		if m.leader {
			state.LeaderID = m.id
		}
		state.Members = append(state.Members, s)
	}
	return state, nil
}

// MoveLeader implements EtcdCluster.
func (f *fakeEtcd) MoveLeader(_ context.Context, leaderNode string, to uint64) error {
	f.moveLeaders = append(f.moveLeaders, moveLeaderCall{leaderNode: leaderNode, to: to})
	if f.moveLeaderErr != nil {
		return f.moveLeaderErr
	}
	for i := range f.members {
		f.members[i].leader = f.members[i].id == to
	}
	return nil
}

// RemoveMember implements EtcdCluster.
func (f *fakeEtcd) RemoveMember(_ context.Context, id uint64, via []string) error {
	f.removeMembers = append(f.removeMembers, removeMemberCall{id: id, via: slices.Clone(via)})
	if f.removeMemberErr != nil {
		return f.removeMemberErr
	}
	f.members = slices.DeleteFunc(f.members, func(m fakeMember) bool { return m.id == id })
	return nil
}

// fakeEtcdProvider returns its cluster, or its error, for every Cluster.
type fakeEtcdProvider struct {
	cluster EtcdCluster
	err     error
	calls   int
}

// ForCluster implements EtcdProvider.
func (p *fakeEtcdProvider) ForCluster(context.Context, *clusterv1.Cluster) (EtcdCluster, error) {
	p.calls++
	if p.err != nil {
		return nil, p.err
	}
	return p.cluster, nil
}

// --- fencing ----------------------------------------------------------------------------------------

// fakeFencer returns its result (or error) and records every request; Unfence answers unfenceErr.
type fakeFencer struct {
	result     fencing.Result
	err        error
	requests   []fencing.Request
	unfenceErr error
	unfences   []fencing.Request
}

// Unfence implements fencing.Unfencer.
func (f *fakeFencer) Unfence(_ context.Context, req fencing.Request) error {
	f.unfences = append(f.unfences, req)
	return f.unfenceErr
}

// Fence implements fencing.Fencer.
func (f *fakeFencer) Fence(_ context.Context, req fencing.Request) (fencing.Result, error) {
	f.requests = append(f.requests, req)
	return f.result, f.err
}

// --- Machines ---------------------------------------------------------------------------------------

// machineOption configures a control-plane Machine.
type machineOption func(*clusterv1.Machine)

// withoutNode leaves the Machine without a Node (still provisioning).
func withoutNode() machineOption {
	return func(m *clusterv1.Machine) { m.Status.NodeRef = clusterv1.MachineNodeReference{} }
}

// beingDeleted gives the Machine a deletion timestamp (held by a finalizer).
func beingDeleted() machineOption {
	return func(m *clusterv1.Machine) {
		m.Finalizers = append(m.Finalizers, "test.capr.io/hold")
		m.DeletionTimestamp = ptr.To(metav1.Now())
	}
}

// withFinalizer holds the Machine's deletion (as CAPI's Machine controller's finalizer does), so a
// deleted Machine is still there, being deleted.
func withFinalizer() machineOption {
	return func(m *clusterv1.Machine) { m.Finalizers = append(m.Finalizers, "test.capr.io/hold") }
}

// withMachineAnnotation sets an annotation on the Machine.
func withMachineAnnotation(key, value string) machineOption {
	return func(m *clusterv1.Machine) {
		if m.Annotations == nil {
			m.Annotations = map[string]string{}
		}
		m.Annotations[key] = value
	}
}

// nodeUnreachable gives the Machine CAPI's NodeReady condition of a Node whose kubelet is silent.
func nodeUnreachable() machineOption {
	return func(m *clusterv1.Machine) {
		m.Status.Conditions = append(m.Status.Conditions, metav1.Condition{Type: clusterv1.MachineNodeReadyCondition,
			Status: metav1.ConditionUnknown, Reason: "NodeStatusUnknown", Message: "Kubelet stopped posting node status"})
	}
}

// markedBy gives the Machine the mark of CAPR's health check "ns/cp" with reason (controllers/
// machinehealthcheck mark.go).
func markedBy(reason string) machineOption {
	return func(m *clusterv1.Machine) {
		msg, err := caprv1.MarkEntries{{Checker: testNamespace + "/cp", Reason: reason, Message: "for more than 1m0s"}}.Marshal()
		if err != nil {
			panic(err)
		}
		m.Status.Conditions = append(m.Status.Conditions, metav1.Condition{Type: caprv1.MachineCAPRHealthCheckSucceededCondition,
			Status: metav1.ConditionFalse, Reason: reason, Message: msg})
	}
}

// kcpHealthy gives the Machine the conditions KCP reads as fully healthy.
func kcpHealthy() machineOption {
	return func(m *clusterv1.Machine) { m.Status.Conditions = kcpMachine(m.Name).Status.Conditions }
}

// nodeOf is the Node (and etcd member) name of a test Machine.
func nodeOf(machine string) string { return machine + "-node" }

// cpMachine returns a control-plane Machine of cluster "wc" with a Node named nodeOf(name).
func cpMachine(name string, opts ...machineOption) *clusterv1.Machine {
	m := &clusterv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: testNamespace, Name: name, Labels: map[string]string{
			clusterv1.ClusterNameLabel: "wc", clusterv1.MachineControlPlaneLabel: "",
		}},
		Spec: clusterv1.MachineSpec{ClusterName: "wc"},
	}
	m.Status.NodeRef = clusterv1.MachineNodeReference{Name: nodeOf(name)}
	for _, o := range opts {
		o(m)
	}
	return m
}

// --- the world ----------------------------------------------------------------------------------------

// testControlPlaneGVK is a control-plane kind no adapter knows: it gets the Generic adapter.
var testControlPlaneGVK = schema.GroupVersionKind{Group: "controlplane.cluster.x-k8s.io", Version: "v1beta2", Kind: "TestControlPlane"}

// controlPlaneObject returns a control-plane object of testControlPlaneGVK with spec.replicas.
func controlPlaneObject(replicas int32) *unstructured.Unstructured {
	cp := &unstructured.Unstructured{}
	cp.SetGroupVersionKind(testControlPlaneGVK)
	cp.SetNamespace(testNamespace)
	cp.SetName("wc-cp")
	_ = SetReplicas(cp, replicas)
	return cp
}

// worldOptions describe a world; the defaults are a 3-Machine control plane (m-a, m-b, m-c) with
// three healthy etcd members (m-a's leads), replicas 3, and a running scale-up-first remediation of
// m-b.
type worldOptions struct {
	machines     []*clusterv1.Machine
	controlPlane *unstructured.Unstructured
	etcd         *fakeEtcd
	etcdErr      error // returned by the EtcdProvider
	fence        fencing.Result
	fenceErr     error
	victim       string
	order        caprv1.ControlPlaneOrder
	desired      int32
	before       []string // MachinesBefore; the default is the names of the machines not added with withReplacement
	steps        []caprv1.RemediationStep
	memberID     string
	replacement  string
	surge        int32
	replacements int32
	// generations: the fake API server bumps the control-plane object's metadata.generation as the
	// real one does (withProviderGenerations).
	generations bool
	// requests are other MachineRemediations of the cluster (withRequests).
	requests []*caprv1.MachineRemediation
}

// worldOption configures newWorld. Options apply in order: withReplacement after withMachines,
// withReplicas after withControlPlaneObject.
type worldOption func(*worldOptions)

// withRequests adds other MachineRemediations (waitingRequest) beside the running one.
func withRequests(requests ...*caprv1.MachineRemediation) worldOption {
	return func(o *worldOptions) { o.requests = append(o.requests, requests...) }
}

// waitingRequest returns the Pending MachineRemediation of Machine name, made by CAPR's health check
// for its etcd member, changed by opts.
func waitingRequest(name string, opts ...func(*caprv1.MachineRemediation)) *caprv1.MachineRemediation {
	mr := &caprv1.MachineRemediation{ObjectMeta: metav1.ObjectMeta{Namespace: testNamespace, Name: name},
		Spec:   caprv1.MachineRemediationSpec{Source: caprv1.MachineRemediationSourceHealthCheck, Reason: caprv1.MachineCAPRHealthCheckUnhealthyEtcdMemberReason},
		Status: caprv1.MachineRemediationStatus{Phase: caprv1.MachineRemediationPhasePending}}
	for _, o := range opts {
		o(mr)
	}
	return mr
}

// withMachines replaces the control-plane Machines (they are all in MachinesBefore).
func withMachines(machines ...*clusterv1.Machine) worldOption {
	return func(o *worldOptions) { o.machines = machines }
}

// withReplacement adds a Machine created after the remediation started.
func withReplacement(m *clusterv1.Machine) worldOption {
	return func(o *worldOptions) {
		if o.before == nil { // a second replacement (a surge of two) keeps the first out of "before"
			o.before = machineNames(o.machines)
		}
		o.machines = append(o.machines, m)
	}
}

// withControlPlaneObject replaces the control-plane object (e.g. a KubeadmControlPlane).
func withControlPlaneObject(cp *unstructured.Unstructured) worldOption {
	return func(o *worldOptions) { o.controlPlane = cp }
}

// withReplicas sets the control-plane object's spec.replicas.
func withReplicas(n int32) worldOption {
	return func(o *worldOptions) { _ = SetReplicas(o.controlPlane, n) }
}

// withEtcd replaces the workload etcd.
func withEtcd(e *fakeEtcd) worldOption { return func(o *worldOptions) { o.etcd = e } }

// withEtcdProviderError makes the EtcdProvider fail (the workload cluster cannot be reached).
func withEtcdProviderError(err error) worldOption { return func(o *worldOptions) { o.etcdErr = err } }

// withFence sets what the Fencer answers.
func withFence(res fencing.Result, err error) worldOption {
	return func(o *worldOptions) { o.fence, o.fenceErr = res, err }
}

// withOrder sets the remediation's order.
func withOrder(order caprv1.ControlPlaneOrder) worldOption {
	return func(o *worldOptions) { o.order = order }
}

// withStep records a step of the remediation.
func withStep(name caprv1.StepName, outcome caprv1.StepOutcome, message string) worldOption {
	return func(o *worldOptions) {
		o.steps = append(o.steps, caprv1.RemediationStep{Name: name, Outcome: outcome, Message: message, StartTime: ptr.To(metav1.Now())})
	}
}

// withRecordedMemberID sets status.controlPlane.memberID (hex), as recorded when the remediation started.
func withRecordedMemberID(id uint64) worldOption {
	return func(o *worldOptions) { o.memberID = fmt.Sprintf("%x", id) }
}

// withSurgeOfTwo sets status.controlPlane.surge to 2 (KCP with stacked etcd, as recorded before one
// replacement was asked for: two replacements).
func withSurgeOfTwo() worldOption { return func(o *worldOptions) { o.surge = 2 } }

// withOneReplacement sets status.controlPlane.surge to 2 and replacements to 1 (KCP with stacked
// etcd: the replicas return to N at the first replacement, firstreplacement.go).
func withOneReplacement() worldOption {
	return func(o *worldOptions) { o.surge, o.replacements = 2, 1 }
}

// withProviderGenerations gives the control-plane object metadata.generation and
// status.observedGeneration 5 (its provider has observed its spec), and makes the fake API server
// bump metadata.generation when a write changes the object's spec, as a real one does for a custom
// resource with a status subresource (the fake client keeps the generation as written).
func withProviderGenerations() worldOption {
	return func(o *worldOptions) {
		o.controlPlane.SetGeneration(5)
		_ = unstructured.SetNestedField(o.controlPlane.Object, int64(5), "status", "observedGeneration")
		o.generations = true
	}
}

// bumpGeneration is the interceptor of withProviderGenerations.
func bumpGeneration(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok || u.GroupVersionKind() != testControlPlaneGVK {
		return c.Patch(ctx, obj, patch, opts...)
	}
	before := u.DeepCopy()
	if err := c.Get(ctx, client.ObjectKeyFromObject(u), before); err != nil {
		return err
	}
	if err := c.Patch(ctx, obj, patch, opts...); err != nil {
		return err
	}
	if equality.Semantic.DeepEqual(before.Object["spec"], u.Object["spec"]) {
		return nil
	}
	u.SetGeneration(before.GetGeneration() + 1)
	return c.Update(ctx, u)
}

// withRecordedReplacement sets status.controlPlane.replacement.
func withRecordedReplacement(name string) worldOption {
	return func(o *worldOptions) { o.replacement = name }
}

// world is a fake management cluster with one running control-plane remediation, and the reconciler
// and scope a step runs with.
type world struct {
	t        *testing.T
	client   client.Client
	r        *Reconciler
	s        *scope
	etcd     *fakeEtcd
	provider *fakeEtcdProvider
	fencer   *fakeFencer
}

func newWorld(t *testing.T, opts ...worldOption) *world {
	t.Helper()
	g := NewWithT(t)
	o := worldOptions{
		machines:     []*clusterv1.Machine{cpMachine("m-a"), cpMachine("m-b"), cpMachine("m-c")},
		controlPlane: controlPlaneObject(3),
		etcd:         newFakeEtcd(member(nodeOf("m-a"), asLeader()), member(nodeOf("m-b")), member(nodeOf("m-c"))),
		fence:        fencing.Result{Outcome: fencing.Fenced, Message: "fenced"},
		victim:       "m-b",
		order:        caprv1.ControlPlaneOrderScaleUpFirst,
		desired:      3,
	}
	for _, opt := range opts {
		opt(&o)
	}
	if o.before == nil {
		o.before = machineNames(o.machines)
	}

	scheme := newTestScheme(g)
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: testNamespace, Name: "wc", UID: "wc-uid"}}
	objs := make([]client.Object, 0, len(o.machines)+3)
	objs = append(objs, cluster, o.controlPlane.DeepCopy())
	var victim *clusterv1.Machine
	for _, m := range o.machines {
		objs = append(objs, m.DeepCopy())
		if m.Name == o.victim {
			victim = m.DeepCopy()
		}
	}
	g.Expect(victim).NotTo(BeNil(), "the victim %s must be one of the Machines", o.victim)
	mr := &caprv1.MachineRemediation{
		ObjectMeta: metav1.ObjectMeta{Namespace: testNamespace, Name: o.victim},
		Status: caprv1.MachineRemediationStatus{
			Phase:     caprv1.MachineRemediationPhaseRunning,
			StartTime: ptr.To(metav1.NewTime(time.Now().Add(-time.Minute))),
			Steps:     o.steps,
			ControlPlane: &caprv1.ControlPlaneRemediationStatus{
				ClusterName: "wc", Order: o.order, DesiredReplicas: ptr.To(o.desired),
				MachinesBefore: o.before, MemberName: victim.Status.NodeRef.Name, MemberID: o.memberID,
				Replacement: o.replacement, Surge: o.surge, Replacements: o.replacements,
			},
		},
	}
	objs = append(objs, mr)
	for _, other := range o.requests {
		objs = append(objs, other.DeepCopy())
	}
	builder := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).WithStatusSubresource(&caprv1.MachineRemediation{})
	if o.generations {
		builder = builder.WithInterceptorFuncs(interceptor.Funcs{Patch: bumpGeneration})
	}
	c := builder.Build()

	w := &world{t: t, client: c, etcd: o.etcd, fencer: &fakeFencer{result: o.fence, err: o.fenceErr}}
	w.provider = &fakeEtcdProvider{cluster: o.etcd, err: o.etcdErr}
	w.r = &Reconciler{Client: c, APIReader: c, Etcd: w.provider, Fencer: w.fencer}
	cp := o.controlPlane.DeepCopy()
	g.Expect(c.Get(t.Context(), client.ObjectKeyFromObject(cp), cp)).To(Succeed())
	w.s = &scope{mr: mr, base: mr.DeepCopy(), machine: victim, cluster: cluster, cp: cp, adapter: AdapterFor(cp)}
	for _, m := range o.machines {
		w.s.machines = append(w.s.machines, m.DeepCopy())
	}
	slices.SortFunc(w.s.machines, func(a, b *clusterv1.Machine) int { return strings.Compare(a.Name, b.Name) })
	return w
}

// newTestScheme has what controllers.NewScheme registers (which this package cannot import: the
// controllers package imports it), plus the control-plane kinds of the tests as unstructured.
func newTestScheme(g Gomega) *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, clusterv1.AddToScheme, caprv1.AddToScheme} {
		g.Expect(add(s)).To(Succeed())
	}
	for _, gvk := range []schema.GroupVersionKind{testControlPlaneGVK, controlplanev1.GroupVersion.WithKind("KubeadmControlPlane")} {
		s.AddKnownTypeWithName(gvk, &unstructured.Unstructured{})
		s.AddKnownTypeWithName(gvk.GroupVersion().WithKind(gvk.Kind+"List"), &unstructured.UnstructuredList{})
	}
	return s
}

// run runs one step as a pass does (runStepOfPass), with the step's record from the remediation's status.
func (w *world) run(step caprv1.StepName) (stepResult, error) {
	w.t.Helper()
	rec := findStep(w.s.mr, step)
	if rec == nil {
		w.s.mr.Status.Steps = append(w.s.mr.Status.Steps, caprv1.RemediationStep{Name: step, Outcome: caprv1.StepOutcomeInProgress, StartTime: ptr.To(metav1.Now())})
		rec = findStep(w.s.mr, step)
	}
	return w.r.runStepOfPass(w.t.Context(), w.s, step, rec)
}

// replicas reads the control-plane object's spec.replicas from the API.
func (w *world) replicas(g Gomega) int32 {
	cp := &unstructured.Unstructured{}
	cp.SetGroupVersionKind(w.s.cp.GroupVersionKind())
	g.Expect(w.client.Get(w.t.Context(), client.ObjectKeyFromObject(w.s.cp), cp)).To(Succeed())
	n, err := Replicas(cp)
	g.Expect(err).NotTo(HaveOccurred())
	return n
}

// controlPlaneAnnotations reads the control-plane object's annotations from the API.
func (w *world) controlPlaneAnnotations(g Gomega) map[string]string {
	cp := &unstructured.Unstructured{}
	cp.SetGroupVersionKind(w.s.cp.GroupVersionKind())
	g.Expect(w.client.Get(w.t.Context(), client.ObjectKeyFromObject(w.s.cp), cp)).To(Succeed())
	return cp.GetAnnotations()
}

// machine reads a Machine from the API (nil when it does not exist).
func (w *world) machine(g Gomega, name string) *clusterv1.Machine {
	m := &clusterv1.Machine{}
	err := w.client.Get(w.t.Context(), client.ObjectKey{Namespace: testNamespace, Name: name}, m)
	if client.IgnoreNotFound(err) == nil && err != nil {
		return nil
	}
	g.Expect(err).NotTo(HaveOccurred())
	return m
}

// deleteVictim deletes the remediated Machine from the API (someone else deleted it).
func (w *world) deleteVictim(g Gomega) {
	victim := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: testNamespace, Name: w.s.machine.Name}}
	g.Expect(w.client.Delete(w.t.Context(), victim)).To(Succeed())
}

var errInjected = errors.New("injected failure")
