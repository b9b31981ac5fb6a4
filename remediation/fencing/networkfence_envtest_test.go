//go:build envtest

package fencing_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/remediation/fencing"
	capienv "github.com/capr-io/capr/test/envtest"
)

// The strings csi-addons v0.14.0 writes (api/csiaddons/v1alpha1/networkfence_types.go): the tests
// write them as its NetworkFence controller would.
const (
	fencedMessage   = "fencing operation successful"
	unfencedMessage = "unfencing operation successful"
)

// fixture is one test's workload cluster view: a Cluster name of its own (NetworkFences are
// cluster-scoped and named per Cluster), a victim Machine and its Node.
type fixture struct {
	t       *testing.T
	g       Gomega
	cluster *clusterv1.Cluster
	machine *clusterv1.Machine
	node    string
	// remediation is the UID of the MachineRemediation the fence is for (fencing.Request.Remediation).
	remediation types.UID
	backend     *fencing.NetworkFenceBackend
	// objects are the fence objects the backends reported created, as the request's status records
	// them (fencing.Request.Objects).
	objects []caprv1.FencingObject
}

func newFixture(t *testing.T, nodeAddresses ...corev1.NodeAddress) *fixture {
	t.Helper()
	g := NewWithT(t)
	ns, err := capienv.CreateNamespace(ctx, k8sClient, "fencing")
	g.Expect(err).NotTo(HaveOccurred())
	name := strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	if len(name) > 40 {
		name = name[len(name)-40:]
	}
	name = strings.Trim(name, "-")
	f := &fixture{t: t, g: g,
		cluster: &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "wc"}},
		machine: &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "m-" + name}},
		node:    "node-" + name, remediation: types.UID("uid-" + name),
		backend: &fencing.NetworkFenceBackend{Workload: func(_ context.Context, key client.ObjectKey) (client.Client, error) {
			return k8sClient, nil
		}},
	}
	if len(nodeAddresses) > 0 {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: f.node}}
		g.Expect(k8sClient.Create(ctx, node)).To(Succeed())
		node.Status.Addresses = nodeAddresses
		g.Expect(k8sClient.Status().Update(ctx, node)).To(Succeed())
	}
	return f
}

func (f *fixture) request(classes ...string) (fencing.Request, caprv1.FencingBackend) {
	spec := caprv1.FencingBackend{Type: caprv1.FencingBackendNetworkFence, NetworkFenceClassNames: classes}
	return fencing.Request{Cluster: f.cluster, Machine: f.machine, Node: f.node, Remediation: f.remediation,
		Spec:    &caprv1.FencingSpec{Policy: caprv1.FencingRequired, Backends: []caprv1.FencingBackend{spec}},
		Objects: slices.Clone(f.objects), Created: f.record}, spec
}

// record keeps a fence object a backend created, as the request's status would.
func (f *fixture) record(o caprv1.FencingObject) {
	f.objects = append(f.objects, o)
}

// policyFence asks pf to fence for classes, recording the objects its backends created.
func (f *fixture) policyFence(pf *fencing.PolicyFencer, classes ...string) fencing.Result {
	f.t.Helper()
	req, _ := f.request(classes...)
	res, err := pf.Fence(ctx, req)
	f.g.Expect(err).NotTo(HaveOccurred())
	for _, b := range res.Backends {
		f.objects = append(f.objects, b.Objects...)
	}
	return res
}

func (f *fixture) fence(classes ...string) (bool, string) {
	f.t.Helper()
	req, spec := f.request(classes...)
	done, msg, err := f.backend.Fence(ctx, req, spec)
	f.g.Expect(err).NotTo(HaveOccurred())
	return done, msg
}

func (f *fixture) unfence(classes ...string) (bool, string) {
	f.t.Helper()
	req, spec := f.request(classes...)
	done, msg, err := f.backend.Unfence(ctx, req, spec)
	f.g.Expect(err).NotTo(HaveOccurred())
	return done, msg
}

func (f *fixture) name(class string) string {
	return fencing.NetworkFenceName(client.ObjectKeyFromObject(f.cluster), f.node, class)
}

// get reads the NetworkFence of class (nil when there is none).
func (f *fixture) get(class string) *unstructured.Unstructured {
	f.t.Helper()
	nf := &unstructured.Unstructured{}
	nf.SetGroupVersionKind(fencing.NetworkFenceGVK)
	err := k8sClient.Get(ctx, client.ObjectKey{Name: f.name(class)}, nf)
	if apierrors.IsNotFound(err) {
		return nil
	}
	f.g.Expect(err).NotTo(HaveOccurred())
	return nf
}

// report writes the status csi-addons' NetworkFence controller writes after an operation.
func (f *fixture) report(class, result, message string) {
	f.t.Helper()
	nf := f.get(class)
	f.g.Expect(nf).NotTo(BeNil())
	f.g.Expect(unstructured.SetNestedField(nf.Object, result, "status", "result")).To(Succeed())
	f.g.Expect(unstructured.SetNestedField(nf.Object, message, "status", "message")).To(Succeed())
	f.g.Expect(k8sClient.Status().Update(ctx, nf)).To(Succeed())
}

func fenceState(nf *unstructured.Unstructured) string {
	s, _, _ := unstructured.NestedString(nf.Object, "spec", "fenceState")
	return s
}

// createClass creates a NetworkFenceClass (cluster-scoped) once per name.
func createClass(g Gomega, name string) {
	fc := &unstructured.Unstructured{}
	fc.SetGroupVersionKind(fencing.NetworkFenceClassGVK)
	fc.SetName(name)
	fc.Object["spec"] = map[string]any{"provisioner": "csi.example.com"}
	if err := k8sClient.Create(ctx, fc); !apierrors.IsAlreadyExists(err) {
		g.Expect(err).NotTo(HaveOccurred())
	}
}

func addresses(ips ...string) []corev1.NodeAddress {
	out := make([]corev1.NodeAddress, 0, len(ips))
	for _, ip := range ips {
		out = append(out, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip})
	}
	return out
}

func TestNetworkFenceFencesEveryClassAndConfirmsOnCSIAddonsSuccess(t *testing.T) {
	f := newFixture(t, append(addresses("10.0.0.7", "fd00::7"), corev1.NodeAddress{Type: corev1.NodeHostName, Address: "n1"})...)
	createClass(f.g, "ceph")
	createClass(f.g, "nfs")

	done, msg := f.fence("ceph", "nfs")
	f.g.Expect(done).To(BeFalse())
	f.g.Expect(msg).To(ContainSubstring("waiting for csi-addons"))
	for _, class := range []string{"ceph", "nfs"} {
		nf := f.get(class)
		f.g.Expect(nf).NotTo(BeNil(), "one NetworkFence per class")
		f.g.Expect(nf.Object["spec"]).To(Equal(map[string]any{
			"networkFenceClassName": class, "fenceState": "Fenced", "cidrs": []any{"10.0.0.7/32", "fd00::7/128"},
		}), "only upstream fields: the host name is no address to fence")
		f.g.Expect(nf.GetAnnotations()).To(HaveKeyWithValue(fencing.NetworkFenceNodeAnnotation, f.node))
		f.g.Expect(nf.GetAnnotations()).To(HaveKeyWithValue(fencing.NetworkFenceMachineAnnotation, f.machine.Namespace+"/"+f.machine.Name))
	}

	// A crash after the create: asking again creates nothing new.
	done, _ = f.fence("ceph", "nfs")
	f.g.Expect(done).To(BeFalse())
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(fencing.NetworkFenceGVK)
	f.g.Expect(k8sClient.List(ctx, list)).To(Succeed())
	mine := 0
	for _, nf := range list.Items {
		if nf.GetAnnotations()[fencing.NetworkFenceNodeAnnotation] == f.node {
			mine++
		}
	}
	f.g.Expect(mine).To(Equal(2))

	f.report("ceph", "Succeeded", fencedMessage)
	done, msg = f.fence("ceph", "nfs")
	f.g.Expect(done).To(BeFalse(), "one class of two confirmed is not fenced")
	f.g.Expect(msg).To(ContainSubstring("class nfs"))
	f.g.Expect(msg).NotTo(ContainSubstring("class ceph"))

	f.report("nfs", "Failed", "rpc error: code = Internal desc = fence failed")
	done, msg = f.fence("ceph", "nfs")
	f.g.Expect(done).To(BeFalse())
	f.g.Expect(msg).To(ContainSubstring("Failed: rpc error"), "csi-addons' failure is passed on")

	f.report("nfs", "Succeeded", fencedMessage)
	done, _ = f.fence("ceph", "nfs")
	f.g.Expect(done).To(BeTrue())
}

func TestNetworkFenceUnfencesBeforeItDeletes(t *testing.T) {
	f := newFixture(t, addresses("10.0.1.7")...)
	createClass(f.g, "ceph")
	f.fence("ceph")
	f.report("ceph", "Succeeded", fencedMessage)
	done, _ := f.fence("ceph")
	f.g.Expect(done).To(BeTrue())

	done, msg := f.unfence("ceph")
	f.g.Expect(done).To(BeFalse())
	f.g.Expect(msg).To(ContainSubstring("set to Unfenced"))
	f.g.Expect(fenceState(f.get("ceph"))).To(Equal("Unfenced"))

	// The old result stays until csi-addons acts (the API has no observedGeneration): not deleted.
	done, msg = f.unfence("ceph")
	f.g.Expect(done).To(BeFalse())
	f.g.Expect(msg).To(ContainSubstring("waiting for csi-addons to unfence"))
	f.g.Expect(f.get("ceph")).NotTo(BeNil(), "deleting a NetworkFence does not unfence: kept until csi-addons confirms")

	f.report("ceph", "Succeeded", unfencedMessage)
	done, _ = f.unfence("ceph")
	f.g.Expect(done).To(BeFalse(), "the delete is issued, the object may still be finalized by csi-addons")
	f.g.Expect(f.get("ceph")).To(BeNil())
	done, _ = f.unfence("ceph")
	f.g.Expect(done).To(BeTrue())
}

func TestNetworkFenceWaitsForCSIAddonsFinalizer(t *testing.T) {
	f := newFixture(t, addresses("10.0.2.7")...)
	createClass(f.g, "ceph")
	f.fence("ceph")
	nf := f.get("ceph")
	nf.SetFinalizers([]string{"csiaddons.openshift.io/network-fence"}) // what csi-addons adds
	f.g.Expect(k8sClient.Update(ctx, nf)).To(Succeed())
	f.unfence("ceph")
	f.report("ceph", "Succeeded", unfencedMessage)
	f.unfence("ceph") // deletes

	done, msg := f.unfence("ceph")
	f.g.Expect(done).To(BeFalse())
	f.g.Expect(msg).To(ContainSubstring("being deleted"))

	// The node breaks again meanwhile: the object on its way out is left alone.
	done, msg = f.fence("ceph")
	f.g.Expect(done).To(BeFalse())
	f.g.Expect(msg).To(ContainSubstring("fencing again once it is gone"))
	f.g.Expect(fenceState(f.get("ceph"))).To(Equal("Unfenced"))

	nf = f.get("ceph")
	nf.SetFinalizers(nil)
	f.g.Expect(k8sClient.Update(ctx, nf)).To(Succeed())
	done, _ = f.unfence("ceph")
	f.g.Expect(done).To(BeTrue())

	f.fence("ceph")
	f.g.Expect(fenceState(f.get("ceph"))).To(Equal("Fenced"), "a new NetworkFence once the old one is gone")
}

func TestNetworkFenceAfterAnUnfinishedUnfenceFencesAgain(t *testing.T) {
	f := newFixture(t, addresses("10.0.3.7")...)
	createClass(f.g, "ceph")
	f.fence("ceph")
	f.report("ceph", "Succeeded", fencedMessage)
	f.unfence("ceph")
	f.report("ceph", "Succeeded", unfencedMessage)

	// The node is broken again before the unfenced object was deleted: the same object is fenced again.
	done, msg := f.fence("ceph")
	f.g.Expect(done).To(BeFalse())
	f.g.Expect(msg).To(ContainSubstring("set back to Fenced"))
	f.g.Expect(fenceState(f.get("ceph"))).To(Equal("Fenced"))
	done, _ = f.fence("ceph")
	f.g.Expect(done).To(BeFalse(), "csi-addons' last word is about the unfence: not fenced yet")
	f.report("ceph", "Succeeded", fencedMessage)
	done, _ = f.fence("ceph")
	f.g.Expect(done).To(BeTrue())
}

func TestNetworkFenceWithoutItsClassCreatesNothing(t *testing.T) {
	f := newFixture(t, addresses("10.0.4.7")...)
	done, msg := f.fence("missing-class")
	f.g.Expect(done).To(BeFalse())
	f.g.Expect(msg).To(ContainSubstring("NetworkFenceClass missing-class does not exist"))
	f.g.Expect(f.get("missing-class")).To(BeNil(), "csi-addons could neither fence nor finalize it")
}

func TestNetworkFenceAddressesWhenTheNodeIsGone(t *testing.T) {
	t.Run("from the Machine", func(t *testing.T) {
		f := newFixture(t) // no Node
		createClass(f.g, "ceph")
		f.machine.Status.Addresses = clusterv1.MachineAddresses{
			{Type: clusterv1.MachineExternalIP, Address: "192.0.2.9"}, {Type: clusterv1.MachineInternalDNS, Address: "m.internal"}}
		f.fence("ceph")
		cidrs, _, _ := unstructured.NestedStringSlice(f.get("ceph").Object, "spec", "cidrs")
		f.g.Expect(cidrs).To(Equal([]string{"192.0.2.9/32"}))
	})
	t.Run("none known: an error, nothing created", func(t *testing.T) {
		f := newFixture(t)
		createClass(f.g, "ceph")
		req, spec := f.request("ceph")
		_, _, err := f.backend.Fence(ctx, req, spec)
		f.g.Expect(err).To(MatchError(ContainSubstring("no IP address is known for node " + f.node)))
		f.g.Expect(f.get("ceph")).To(BeNil())
	})
}

func TestNetworkFenceNamesAreValidAndDistinct(t *testing.T) {
	g := NewWithT(t)
	long := strings.Repeat("a", 250)
	names := map[string]bool{}
	for _, c := range []client.ObjectKey{{Namespace: "a", Name: "wc"}, {Namespace: "b", Name: "wc"}} {
		for _, node := range []string{"n1", long, long + "b"} {
			for _, class := range []string{"ceph", "nfs"} {
				n := fencing.NetworkFenceName(c, node, class)
				g.Expect(len(n)).To(BeNumerically("<=", 253))
				g.Expect(names).NotTo(HaveKey(n), "%s/%s %s %s", c.Namespace, c.Name, node, class)
				names[n] = true
			}
		}
	}
	// The API server accepts the longest as a name.
	f := newFixture(t)
	createClass(f.g, "ceph")
	f.node = long
	f.machine.Status.Addresses = clusterv1.MachineAddresses{{Type: clusterv1.MachineInternalIP, Address: "10.0.5.7"}}
	f.fence("ceph")
	g.Expect(f.get("ceph")).NotTo(BeNil())
}

// Without csi-addons in the workload cluster the backend says it is not available, and the policy
// fencer passes that on (it never counts as fenced).
func TestNetworkFenceNotInstalledIsNotAvailable(t *testing.T) {
	g := NewWithT(t)
	bare, err := capienv.Start(capienv.Options{WithoutManagerIdentity: true})
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { g.Expect(bare.Stop()).To(Succeed()) }()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	g.Expect(bare.Client.Create(ctx, node)).To(Succeed())
	node.Status.Addresses = addresses("10.0.6.7")
	node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
	g.Expect(bare.Client.Status().Update(ctx, node)).To(Succeed())

	backend := &fencing.NetworkFenceBackend{Workload: func(context.Context, client.ObjectKey) (client.Client, error) { return bare.Client, nil }}
	spec := caprv1.FencingBackend{Type: caprv1.FencingBackendNetworkFence, NetworkFenceClassNames: []string{"ceph"}}
	req := fencing.Request{Cluster: &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "wc"}},
		Machine: &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m"}}, Node: "n1", Remediation: "uid-m",
		Spec: &caprv1.FencingSpec{Policy: caprv1.FencingRequired, Backends: []caprv1.FencingBackend{spec}}}
	_, _, err = backend.Fence(ctx, req, spec)
	g.Expect(errors.Is(err, fencing.ErrNotAvailable)).To(BeTrue(), "%v", err)
	g.Expect(err).To(MatchError(ContainSubstring("csiaddons.openshift.io/v1alpha1 NetworkFence")))

	pf := &fencing.PolicyFencer{Workload: backend.Workload, Backends: map[caprv1.FencingBackendType]fencing.Backend{caprv1.FencingBackendNetworkFence: backend}}
	res, err := pf.Fence(ctx, req)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Outcome).To(Equal(fencing.Waiting))
	g.Expect(res.Message).To(ContainSubstring("not available"))
	g.Expect(pf.Unfence(ctx, req)).To(Succeed(), "nothing can have been fenced without csi-addons")
}

// The policy fencer unfences through the backend and says what is left until it is done (here a kept
// Machine whose Node is Ready again).
func TestPolicyFencerUnfencesThroughNetworkFence(t *testing.T) {
	f := newFixture(t, addresses("10.0.7.7")...)
	createClass(f.g, "ceph")
	node := &corev1.Node{}
	f.g.Expect(k8sClient.Get(ctx, client.ObjectKey{Name: f.node}, node)).To(Succeed())
	node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
	f.g.Expect(k8sClient.Status().Update(ctx, node)).To(Succeed())
	pf := &fencing.PolicyFencer{Workload: f.backend.Workload, Backends: map[caprv1.FencingBackendType]fencing.Backend{caprv1.FencingBackendNetworkFence: f.backend}}
	res := f.policyFence(pf, "ceph")
	f.g.Expect(res.Backends[0].Objects).To(ConsistOf(caprv1.FencingObject{Kind: "NetworkFence", Name: f.name("ceph"), UID: string(f.get("ceph").GetUID())}),
		"the object created is returned, for the status to record")
	f.report("ceph", "Succeeded", fencedMessage)
	res = f.policyFence(pf, "ceph")
	f.g.Expect(res.Outcome).To(Equal(fencing.Fenced), res.Message)

	req, _ := f.request("ceph")
	err := pf.Unfence(ctx, req)
	f.g.Expect(errors.Is(err, fencing.ErrUnfencePending)).To(BeTrue(), "%v", err)
	f.report("ceph", "Succeeded", unfencedMessage)
	f.g.Expect(errors.Is(pf.Unfence(ctx, req), fencing.ErrUnfencePending)).To(BeTrue(), "deleting")
	f.g.Expect(pf.Unfence(ctx, req)).To(Succeed())
	f.g.Expect(f.get("ceph")).To(BeNil())
}
