//go:build envtest

package worker_test

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/test/builder"
	capienv "github.com/capr-io/capr/test/envtest"
)

const (
	eventually = 20 * time.Second
	poll       = 100 * time.Millisecond
	// quiet is how long a Consistently check watches for something that must not happen, once the
	// test has made sure that the remediator looked (a watch event it reacts to within a reconcile).
	quiet = 2 * time.Second
	// twoLooks is longer than two looks of a step the remediator polls every 2 s (its waitShort:
	// the unfencing, which watches no workload Node).
	twoLooks = 5 * time.Second
	// nextLook bounds waiting for the remediator's next look at a waiting step: longer than its
	// longest requeue (15 s) on a loaded machine.
	nextLook = 45 * time.Second
)

// fixture is one namespace with one Cluster, a MachineDeployment and its MachineSet.
type fixture struct {
	ns      string
	cluster *clusterv1.Cluster
	md      *clusterv1.MachineDeployment
	ms      *clusterv1.MachineSet
}

// newFixture creates the Cluster, a MachineDeployment with the given maxInFlight (nil: unset) and a
// MachineSet controlled by it. No CAPI controller runs: the remediator reads them only.
func newFixture(t *testing.T, g *WithT, maxInFlight *intstr.IntOrString) *fixture {
	t.Helper()
	ns, err := capienv.CreateNamespace(ctx, k8sClient, "worker")
	g.Expect(err).NotTo(HaveOccurred())
	f := &fixture{ns: ns}
	f.cluster = capienv.NewCluster(ns, "c1", clusterv1.ContractVersionedObjectReference{})
	g.Expect(k8sClient.Create(ctx, f.cluster)).To(Succeed())
	g.Expect(capienv.SetClusterReady(ctx, k8sClient, f.cluster, capienv.ControlPlaneInitialized)).To(Succeed())
	g.Expect(capienv.CreateKubeconfigSecret(ctx, k8sClient, testEnv.Config, f.cluster)).To(Succeed())

	labels := map[string]string{"pool": "a"}
	template := clusterv1.MachineTemplateSpec{
		ObjectMeta: clusterv1.ObjectMeta{Labels: labels},
		Spec:       builder.Machine(ns, "c1", "template").Build().Spec,
	}
	f.md = &clusterv1.MachineDeployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "md"},
		Spec: clusterv1.MachineDeploymentSpec{
			ClusterName: "c1", Replicas: ptr.To[int32](3),
			Selector:    metav1.LabelSelector{MatchLabels: labels},
			Template:    template,
			Remediation: clusterv1.MachineDeploymentRemediationSpec{MaxInFlight: maxInFlight},
		},
	}
	g.Expect(k8sClient.Create(ctx, f.md)).To(Succeed())
	f.ms = &clusterv1.MachineSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "md-ms", OwnerReferences: []metav1.OwnerReference{{
			APIVersion: clusterv1.GroupVersion.String(), Kind: "MachineDeployment", Name: f.md.Name, UID: f.md.UID, Controller: ptr.To(true),
		}}},
		Spec: clusterv1.MachineSetSpec{
			ClusterName: "c1", Replicas: ptr.To[int32](3),
			Selector: metav1.LabelSelector{MatchLabels: labels},
			Template: template,
		},
	}
	g.Expect(k8sClient.Create(ctx, f.ms)).To(Succeed())
	return f
}

// ownedBy returns a controller owner reference.
func ownedBy(kind, name string, uid types.UID) []metav1.OwnerReference {
	return []metav1.OwnerReference{{
		APIVersion: clusterv1.GroupVersion.String(), Kind: kind, Name: name, UID: uid, Controller: ptr.To(true),
	}}
}

// workerOfMachineSet creates a worker Machine controlled by the fixture's MachineSet, with a Node.
func (f *fixture) workerOfMachineSet(g *WithT, name string, mutate ...func(*clusterv1.Machine)) *clusterv1.Machine {
	return f.machine(g, name, append([]func(*clusterv1.Machine){func(m *clusterv1.Machine) {
		m.OwnerReferences = ownedBy("MachineSet", f.ms.Name, f.ms.UID)
	}}, mutate...)...)
}

// machine creates a Machine of the fixture's Cluster with nodeRef <namespace>-<name>.
func (f *fixture) machine(g *WithT, name string, mutate ...func(*clusterv1.Machine)) *clusterv1.Machine {
	m := builder.Machine(f.ns, f.cluster.Name, name).WithLabels(pool).Build()
	for _, mu := range mutate {
		mu(m)
	}
	g.Expect(k8sClient.Create(ctx, m)).To(Succeed())
	g.Expect(capienv.SetMachineNode(ctx, k8sClient, m, f.node(name))).To(Succeed())
	return m
}

// pool labels a Machine into the pool of the fixture's MachineDeployment and health checks.
var pool = map[string]string{"pool": "a"}

func (f *fixture) node(machine string) string { return f.ns + "-" + machine }

// request creates the MachineRemediation of m the way CAPR's health checker does (named after the
// Machine, owned by it, labelled with the Cluster).
func (f *fixture) request(g *WithT, m *clusterv1.Machine, fencingSpec *caprv1.FencingSpec, source caprv1.RemediationSource, mutate ...func(*caprv1.MachineRemediation)) {
	mr := builder.MachineRemediation(f.ns, f.cluster.Name, m.Name).OwnedByMachine(m).Source(source).Fencing(fencingSpec).Build()
	for _, mu := range mutate {
		mu(mr)
	}
	g.Expect(k8sClient.Create(ctx, mr)).To(Succeed())
}

// required is a Required fencing policy through the test backend.
func required() *caprv1.FencingSpec {
	return &caprv1.FencingSpec{
		Policy:   caprv1.FencingRequired,
		Backends: []caprv1.FencingBackend{{Type: caprv1.FencingBackendNetworkFence, NetworkFenceClassNames: []string{"test"}}},
	}
}

func getRemediation(g Gomega, ns, name string) *caprv1.MachineRemediation {
	mr := &caprv1.MachineRemediation{}
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, mr)).To(Succeed())
	return mr
}

// progressing returns the Progressing condition's reason and message.
func progressing(g Gomega, ns, name string) (string, string) {
	mr := getRemediation(g, ns, name)
	return conditions.GetReason(mr, caprv1.MachineRemediationProgressingCondition), conditions.GetMessage(mr, caprv1.MachineRemediationProgressingCondition)
}

func phase(g Gomega, ns, name string) caprv1.RemediationPhase {
	return getRemediation(g, ns, name).Status.Phase
}

func machineExists(g Gomega, ns, name string) bool {
	err := k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &clusterv1.Machine{})
	if apierrors.IsNotFound(err) {
		return false
	}
	g.Expect(err).NotTo(HaveOccurred())
	return true
}

func remediationExists(g Gomega, ns, name string) bool {
	err := k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &caprv1.MachineRemediation{})
	if apierrors.IsNotFound(err) {
		return false
	}
	g.Expect(err).NotTo(HaveOccurred())
	return true
}

// eventReasons returns the reasons of the events recorded on the MachineRemediation.
func eventReasons(g Gomega, ns, name string) []string {
	list := &eventsv1.EventList{}
	g.Expect(k8sClient.List(ctx, list, client.InNamespace(ns))).To(Succeed())
	var out []string
	for _, e := range list.Items {
		if e.Regarding.Kind == "MachineRemediation" && e.Regarding.Name == name {
			out = append(out, e.Reason)
		}
	}
	return out
}

func getMachine(g Gomega, ns, name string) *clusterv1.Machine {
	m := &clusterv1.Machine{}
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, m)).To(Succeed())
	return m
}

func patchMachine(g Gomega, ns, name string, mutate func(*clusterv1.Machine)) {
	m := getMachine(g, ns, name)
	base := m.DeepCopy()
	mutate(m)
	g.Expect(k8sClient.Patch(ctx, m, client.MergeFrom(base))).To(Succeed())
}
