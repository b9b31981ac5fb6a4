package adversarial_test

import (
	"fmt"
	"net"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/etcdutil"
	"github.com/capr-io/capr/test/builder"
	capienv "github.com/capr-io/capr/test/envtest"
)

// startBlackHole starts a kubelet that accepts TCP connections and never answers: a powered-off node
// behind a load balancer, or a port-forward that hangs. The API server's pods/portforward to it waits
// for a TLS handshake that never comes, so every etcd dial CAPR makes through it costs its whole
// timeout.
func startBlackHole(t *testing.T, g *WithT) *countingListener {
	t.Helper()
	hole := &countingListener{hold: true}
	g.Expect(hole.start()).To(Succeed())
	t.Cleanup(hole.stop)
	return hole
}

// blackHoledHealthChecks is how many health checks read the black-holed cluster's etcd. Were each
// inspection to pay the whole 10 s dial of every black-holed node, 40 checks polling every 5 s would
// hold all ten health-check workers, and the honest tenant's first round would wait minutes (it did
// before etcdutil.ClientCache remembered failed dials); 15 would only delay it by seconds.
const blackHoledHealthChecks = 40

// markBound is how long after its Node went not Ready the honest Machine must be marked: its
// health check's 1 s timeout and a few seconds more for a loaded machine. A starved queue costs
// tens of seconds or minutes.
const markBound = 1*time.Second + 15*time.Second

// TestABlackHoledClusterDoesNotStarveAnHonestTenant runs one tenant's control-plane cluster whose
// every node is black-holed (its kubelet accepts and never answers, so no etcd member can be
// reached), read by blackHoledHealthChecks overlapping health checks with the etcd member check,
// beside an honest tenant whose worker's Node goes not Ready. The manager runs with the shipped
// etcd timeouts (10 s dial): the honest Machine must still be marked within markBound, measured by
// the test's own clock from the moment it set the Node not Ready.
func TestABlackHoledClusterDoesNotStarveAnHonestTenant(t *testing.T) {
	g := NewWithT(t)
	hole := startBlackHole(t, g)
	bad := newTenant(t, g, "blackholed", 90)
	cluster := bad.newCluster(g, "bh", clusterv1.ContractVersionedObjectReference{}, nil)
	etcdCA(g, cluster)
	for i := range 3 {
		name := fmt.Sprintf("bh-%d", i)
		bad.machine(g, name, machineSpec{cluster: cluster.Name, pool: "cp", ready: corev1.ConditionTrue, controlPlane: true})
		blackHoleNode(t, g, bad.node(name), hole)
	}
	for i := range blackHoledHealthChecks {
		mhc := builder.HealthCheck(bad.ns, fmt.Sprintf("etcd-%d", i), cluster.Name).NodeNotReadyFor(3600).Build()
		mhc.Spec.Selector = caprv1.MachineSelector{MatchLabels: map[string]caprv1.LabelValue{poolLabel: "cp"}}
		mhc.Spec.Checks.EtcdMember = &caprv1.EtcdMemberCheck{TimeoutSeconds: ptr.To[int32](3600)}
		g.Expect(k8sClient.Create(ctx, mhc)).To(Succeed())
	}
	var o *tenant
	t.Cleanup(func() {
		if t.Failed() {
			bad.logState(t)
			if o != nil {
				o.logState(t)
			}
		}
	})
	// The health checks' etcd reads reach the black hole: a dial through each node's kubelet.
	g.Eventually(hole.accepted.Load, eventually, poll).Should(BeNumerically(">=", 3), "the etcd reads reach the black-holed kubelets")

	o = newHonestTenant(t, g)
	g.Eventually(func(g Gomega) *int32 { return getHealthCheck(g, o.ns, "hc").Status.ExpectedMachines }, eventually, poll).
		Should(HaveValue(BeEquivalentTo(1)))
	// Still reading the black hole while the honest Node fails.
	before := hole.accepted.Load()
	g.Eventually(hole.accepted.Load, eventually, poll).Should(BeNumerically(">", before), "the etcd reads keep reaching the black hole")

	notReady := time.Now()
	g.Expect(capienv.SetNodeReady(ctx, k8sClient, o.node(honestTarget), corev1.ConditionFalse)).To(Succeed())
	var marked time.Time
	g.Eventually(func(g Gomega) {
		cond := conditions.Get(getMachine(g, o.ns, honestTarget), caprv1.MachineCAPRHealthCheckSucceededCondition)
		g.Expect(cond).NotTo(BeNil())
		g.Expect(cond.Status).To(Equal(metav1.ConditionFalse))
		marked = time.Now()
	}, 5*time.Minute, poll).Should(Succeed(), "the honest Machine is marked")
	t.Logf("the honest Machine was marked %.1f s after its Node went not Ready; the black hole took %d connections",
		marked.Sub(notReady).Seconds(), hole.accepted.Load())
	g.Expect(marked.Sub(notReady)).To(BeNumerically("<=", markBound),
		"the honest tenant's mark waited behind the black-holed cluster's etcd reads")
}

// blackHoleNode points the Node's kubelet at the black hole and gives it the etcd static pod
// kubeadm would run there, so that the API server's port-forward to etcd-<node> dials the hole.
func blackHoleNode(t *testing.T, g *WithT, name string, hole *countingListener) {
	t.Helper()
	node := &corev1.Node{}
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Name: name}, node)).To(Succeed())
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}}
	node.Status.DaemonEndpoints.KubeletEndpoint.Port = int32(hole.l.Addr().(*net.TCPAddr).Port)
	g.Expect(k8sClient.Status().Update(ctx, node)).To(Succeed())
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: etcdutil.PodName(name), Labels: map[string]string{"component": "etcd"}},
		Spec:       corev1.PodSpec{NodeName: name, Containers: []corev1.Container{{Name: "etcd", Image: "registry.k8s.io/etcd"}}},
	}
	g.Expect(k8sClient.Create(ctx, pod)).To(Succeed())
	t.Cleanup(func() { _ = k8sClient.Delete(ctx, pod) })
}
