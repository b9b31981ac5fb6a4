package adversarial_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/cluster-api/util/secret"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/remediation/fencing"
	"github.com/capr-io/capr/test/builder"
	capienv "github.com/capr-io/capr/test/envtest"
)

const (
	// eventually bounds what CAPR does within its own timeouts (1 s health checks, fences polled every
	// few seconds) on a loaded 2-core machine: generous, not a claim about speed.
	eventually = 90 * time.Second
	poll       = 200 * time.Millisecond
	// quiet is how long a Consistently check watches for what must not happen.
	quiet = 3 * time.Second
	// poolLabel sorts a tenant's Machines into the pools its health checks select.
	poolLabel = "pool"
)

// tenant is one team's namespace of the management cluster: a Cluster "c1" (both tenants use the
// name) whose workload cluster is the envtest API server, a MachineSet "ms" that owns its worker
// Machines (what the worker remediator needs before it deletes one), and a NetworkFenceClass of its own.
type tenant struct {
	ns      string
	cluster *clusterv1.Cluster
	ms      *clusterv1.MachineSet
	class   string
	// subnet numbers the InternalIPs of the tenant's Nodes (10.<subnet>.0.<n>).
	subnet int
	nodes  int
}

func newTenant(t *testing.T, g *WithT, prefix string, subnet int) *tenant {
	t.Helper()
	ns, err := capienv.CreateNamespace(ctx, k8sClient, prefix)
	g.Expect(err).NotTo(HaveOccurred())
	tn := &tenant{ns: ns, class: ns + "-class", subnet: subnet}
	tn.cluster = tn.newCluster(g, "c1", clusterv1.ContractVersionedObjectReference{}, nil)
	tn.ms = builder.MachineSet(ns, "c1", "ms", map[string]string{clusterv1.ClusterNameLabel: "c1"})
	g.Expect(k8sClient.Create(ctx, tn.ms)).To(Succeed())
	fc := &unstructured.Unstructured{}
	fc.SetGroupVersionKind(fencing.NetworkFenceClassGVK)
	fc.SetName(tn.class)
	fc.Object["spec"] = map[string]any{"provisioner": "csi.example.com"}
	g.Expect(k8sClient.Create(ctx, fc)).To(Succeed())
	return tn
}

// newCluster creates a Cluster of the tenant, initialized, with a kubeconfig Secret pointing at the
// envtest API server.
func (tn *tenant) newCluster(g *WithT, name string, cp clusterv1.ContractVersionedObjectReference, annotations map[string]string) *clusterv1.Cluster {
	c := capienv.NewCluster(tn.ns, name, cp)
	c.Annotations = annotations
	g.Expect(k8sClient.Create(ctx, c)).To(Succeed())
	g.Expect(capienv.SetClusterReady(ctx, k8sClient, c, capienv.ControlPlaneInitialized)).To(Succeed())
	g.Expect(capienv.CreateKubeconfigSecret(ctx, k8sClient, testEnv.Config, c)).To(Succeed())
	return c
}

// etcdCA writes the Cluster's etcd CA Secret, as KCP would, so that CAPR gets as far as dialling
// its members.
func etcdCA(g *WithT, cluster *clusterv1.Cluster) {
	ca := &secret.Certificate{Purpose: secret.EtcdCA}
	g.Expect(ca.Generate()).To(Succeed())
	g.Expect(k8sClient.Create(ctx, ca.AsSecret(client.ObjectKeyFromObject(cluster), metav1.OwnerReference{
		APIVersion: clusterv1.GroupVersion.String(), Kind: "Cluster", Name: cluster.Name, UID: cluster.UID,
	}))).To(Succeed())
}

func (tn *tenant) node(machine string) string { return tn.ns + "-" + machine }

// machineSpec is what tenant.machine creates.
type machineSpec struct {
	cluster     string
	pool        string
	ready       corev1.ConditionStatus
	annotations map[string]string
	// controlPlane makes a control-plane Machine, owned by nothing (its provider plays no part).
	controlPlane bool
}

// machine creates a Machine of the tenant and its Node (Ready as spec says since an hour ago, with an
// InternalIP of the tenant's subnet); a worker is owned by the MachineSet "ms".
func (tn *tenant) machine(g *WithT, name string, spec machineSpec) {
	if spec.cluster == "" {
		spec.cluster = tn.cluster.Name
	}
	b := builder.Machine(tn.ns, spec.cluster, name).WithLabels(map[string]string{poolLabel: spec.pool}).WithAnnotations(spec.annotations)
	if spec.controlPlane {
		b.ControlPlane()
	} else {
		b.OwnedByMachineSet(tn.ms)
	}
	m := b.Build()
	g.Expect(k8sClient.Create(ctx, m)).To(Succeed())
	tn.nodes++
	node := builder.Node(tn.node(name)).Ready(spec.ready, time.Now().Add(-time.Hour)).Build()
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: fmt.Sprintf("10.%d.0.%d", tn.subnet, tn.nodes)}}
	g.Expect(capienv.CreateNode(ctx, k8sClient, node)).To(Succeed())
	g.Expect(capienv.SetMachineNode(ctx, k8sClient, m, node.Name)).To(Succeed())
}

// healthCheck creates a health check over the tenant's Machines of pool, unhealthy once their Node
// is not Ready for 1 s, changed by mutate.
func (tn *tenant) healthCheck(g *WithT, name, pool string, mutate func(*caprv1.MachineHealthCheck)) {
	mhc := builder.HealthCheck(tn.ns, name, tn.cluster.Name).NodeNotReadyFor(1).Build()
	mhc.Spec.Selector = caprv1.MachineSelector{MatchLabels: map[string]caprv1.LabelValue{poolLabel: caprv1.LabelValue(pool)}}
	if mutate != nil {
		mutate(mhc)
	}
	g.Expect(k8sClient.Create(ctx, mhc)).To(Succeed())
}

// requiredNetworkFence is Required fencing through the tenant's NetworkFenceClass.
func (tn *tenant) requiredNetworkFence() *caprv1.FencingSpec {
	return &caprv1.FencingSpec{Policy: caprv1.FencingRequired, Backends: []caprv1.FencingBackend{
		{Type: caprv1.FencingBackendNetworkFence, NetworkFenceClassNames: []string{tn.class}},
	}}
}

// networkFence returns the NetworkFence under the name CAPR gives the fence of machine's Node (nil
// when there is none).
func (tn *tenant) networkFence(g Gomega, machine string) *unstructured.Unstructured {
	nf := &unstructured.Unstructured{}
	nf.SetGroupVersionKind(fencing.NetworkFenceGVK)
	err := k8sClient.Get(ctx, client.ObjectKey{Name: fencing.NetworkFenceName(client.ObjectKeyFromObject(tn.cluster), tn.node(machine), tn.class)}, nf)
	if apierrors.IsNotFound(err) {
		return nil
	}
	g.Expect(err).NotTo(HaveOccurred())
	return nf
}

func getHealthCheck(g Gomega, ns, name string) *caprv1.MachineHealthCheck {
	mhc := &caprv1.MachineHealthCheck{}
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, mhc)).To(Succeed())
	return mhc
}

func getRemediation(g Gomega, ns, name string) *caprv1.MachineRemediation {
	mr := &caprv1.MachineRemediation{}
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, mr)).To(Succeed())
	return mr
}

func getMachine(g Gomega, ns, name string) *clusterv1.Machine {
	m := &clusterv1.Machine{}
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, m)).To(Succeed())
	return m
}

func machineExists(g Gomega, ns, name string) bool {
	err := k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &clusterv1.Machine{})
	if apierrors.IsNotFound(err) {
		return false
	}
	g.Expect(err).NotTo(HaveOccurred())
	return true
}

// events returns the events of namespace ns about the object of kind and name with reason.
func events(g Gomega, ns, kind, name, reason string) []eventsv1.Event {
	list := &eventsv1.EventList{}
	g.Expect(k8sClient.List(ctx, list, client.InNamespace(ns))).To(Succeed())
	var out []eventsv1.Event
	for _, e := range list.Items {
		if e.Regarding.Kind == kind && e.Regarding.Name == name && e.Reason == reason {
			out = append(out, e)
		}
	}
	return out
}

// notes returns the notes of events.
func notes(evs []eventsv1.Event) string {
	out := make([]string, 0, len(evs))
	for _, e := range evs {
		out = append(out, e.Note)
	}
	return strings.Join(out, "\n")
}

// logState logs, for a failed test, where each of the tenant's requests and health checks stands.
func (tn *tenant) logState(t *testing.T) {
	t.Helper()
	requests := &caprv1.MachineRemediationList{}
	if err := k8sClient.List(ctx, requests, client.InNamespace(tn.ns)); err != nil {
		t.Logf("listing the MachineRemediations of %s: %v", tn.ns, err)
	}
	for _, mr := range requests.Items {
		c := conditions.Get(&mr, caprv1.MachineRemediationProgressingCondition)
		if c == nil {
			c = &metav1.Condition{}
		}
		t.Logf("MachineRemediation %s/%s: phase %q, step %q, Progressing %s %s: %s", tn.ns, mr.Name, mr.Status.Phase, mr.Status.CurrentStep, c.Status, c.Reason, c.Message)
	}
	checks := &caprv1.MachineHealthCheckList{}
	if err := k8sClient.List(ctx, checks, client.InNamespace(tn.ns)); err != nil {
		t.Logf("listing the MachineHealthChecks of %s: %v", tn.ns, err)
	}
	for _, mhc := range checks.Items {
		for _, c := range mhc.Status.Conditions {
			if c.Status != metav1.ConditionTrue && c.Type != clusterv1.PausedCondition && c.Type != caprv1.MachineHealthCheckTargetsOverlapCondition {
				t.Logf("MachineHealthCheck %s/%s: %s %s %s: %s", tn.ns, mhc.Name, c.Type, c.Status, c.Reason, c.Message)
			}
		}
	}
}
