package sandbox_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/etcdutil"
	capienv "github.com/capr-io/capr/test/envtest"
	"github.com/capr-io/capr/test/sandbox"
)

var sb *sandbox.Sandbox

func TestMain(m *testing.M) {
	os.Exit(sandbox.RunTests(m, func(s *sandbox.Sandbox) {
		if ready := os.Getenv(interruptChildEnv); ready != "" {
			waitForInterrupt(ready) // the child of TestInterruptStopsTheSandbox; never returns
		}
		sb = s
	}))
}

// TestPortForwardPathToRealEtcd reaches every member through the API server's pods/portforward and
// the Node's kubelet stand-in, as KCP and CAPR do in production, then stops a follower's kubelet: that
// member keeps running (the direct view says healthy) but is unreachable through the API server; the
// leader's metrics, read through its own tunnel, show it receiving the member's raft messages, so it
// counts as alive. Then the leader's kubelet: unreachable too, but the remaining follower follows it,
// so it counts as alive; the first follower is then not known alive (only the leader hears from
// followers), and says so.
func TestPortForwardPathToRealEtcd(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns, err := capienv.CreateNamespace(ctx, sb.Client, "pf")
	g.Expect(err).NotTo(HaveOccurred())
	wc, err := sb.CreateCluster(ctx, sandbox.ClusterSpec{Namespace: ns, Name: "pf", ControlPlane: 3, Workers: 1})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { sb.DestroyCluster(ctx, wc) })
	machines, err := sb.ControlPlaneMachines(ctx, wc)
	g.Expect(err).NotTo(HaveOccurred())
	nodes := make([]string, 0, len(machines))
	for _, m := range machines {
		nodes = append(nodes, m.Status.NodeRef.Name)
	}
	viaAPIServer := &etcdutil.Cluster{CallTimeout: 3 * time.Second, Connector: &etcdutil.PortForward{
		RESTConfig: sb.Env.Config, TLS: wc.Etcd.ClientTLS(), DialTimeout: 3 * time.Second,
	}}
	state, err := viaAPIServer.Inspect(ctx, nodes)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(state.Counts()).To(Equal(etcdutil.Counts{Voting: 3, Healthy: 3, QuorumProven: true}))

	truth, err := sb.EtcdState(ctx, wc)
	g.Expect(err).NotTo(HaveOccurred())
	leader := truth.ByID(truth.LeaderID).Name
	var followers []string
	for _, n := range nodes {
		if n != leader {
			followers = append(followers, n)
		}
	}
	g.Expect(followers).To(HaveLen(2))

	g.Expect(sb.StopKubelet(ctx, wc, followers[0])).To(Succeed())
	state, err = viaAPIServer.Inspect(ctx, nodes)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(state.ByName(followers[0]).Reachable).To(BeFalse())
	g.Expect(state.ByName(followers[0]).Healthy).To(BeTrue(), state.ByName(followers[0]).Problem)
	g.Expect(state.ByName(followers[0]).Note).To(HavePrefix("unreachable through its node, but alive: the leader " + leader + " received its raft messages"))
	g.Expect(state.Counts()).To(Equal(etcdutil.Counts{Voting: 3, Healthy: 3, Unreachable: 1, QuorumProven: true}))
	truth, err = sb.EtcdState(ctx, wc)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(truth.Counts()).To(Equal(etcdutil.Counts{Voting: 3, Healthy: 3, QuorumProven: true}), "the member itself is still healthy")

	g.Expect(sb.StopKubelet(ctx, wc, leader)).To(Succeed())
	state, err = viaAPIServer.Inspect(ctx, nodes)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(state.ByName(leader).Reachable).To(BeFalse())
	g.Expect(state.ByName(leader).Healthy).To(BeTrue(), "followed by %s", followers[1])
	g.Expect(state.ByName(followers[0]).Up()).To(BeFalse(), state.ByName(followers[0]).Note)
	g.Expect(state.ByName(followers[0]).Problem).To(Equal("unreachable (only the leader hears from its followers, and it cannot be asked)"))
	g.Expect(state.Counts()).To(Equal(etcdutil.Counts{Voting: 3, Healthy: 2, Unreachable: 2, QuorumProven: true}))
}

// watchedCluster creates a workload cluster of three control-plane Machines in a new namespace and
// starts a QuorumWatcher on it; both go with the test.
func watchedCluster(t *testing.T, g *WithT, prefix string) (*sandbox.WorkloadCluster, []clusterv1.Machine, *sandbox.QuorumWatcher) {
	ctx := context.Background()
	ns, err := capienv.CreateNamespace(ctx, sb.Client, prefix)
	g.Expect(err).NotTo(HaveOccurred())
	wc, err := sb.CreateCluster(ctx, sandbox.ClusterSpec{Namespace: ns, Name: "q", ControlPlane: 3})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { sb.DestroyCluster(ctx, wc) })
	machines, err := sb.ControlPlaneMachines(ctx, wc)
	g.Expect(err).NotTo(HaveOccurred())
	w := sb.WatchQuorum(ctx, wc)
	t.Cleanup(func() { w.Stop() })
	return wc, machines, w
}

// TestQuorumWatcherSeesQuorumLoss: the oracle every scenario relies on fires. One member of three
// killed is a failure margin of 0 and no loss; a second one killed is a loss.
func TestQuorumWatcherSeesQuorumLoss(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	wc, machines, w := watchedCluster(t, g, "quorum")

	sb.KillEtcdMember(wc, machines[0].Status.NodeRef.Name)
	g.Eventually(func(g Gomega) {
		margin, _, _ := w.Margin()
		g.Expect(margin).To(Equal(0))
	}, 30*time.Second, 100*time.Millisecond).Should(Succeed())
	g.Expect(w.Lost()).To(BeEmpty())

	sb.KillEtcdMember(wc, machines[1].Status.NodeRef.Name)
	g.Eventually(w.Lost, 30*time.Second, 100*time.Millisecond).ShouldNot(BeEmpty())

	// A cluster that does not come up says which member processes died (their data is deleted with
	// the cluster, so the error is all that is left of them).
	err := sb.WaitForControlPlane(ctx, wc, 3, time.Second)
	g.Expect(err).To(HaveOccurred())
	g.Expect(err.Error()).To(ContainSubstring("etcd member processes:"))
	for i, m := range machines {
		state := "running"
		if i < 2 {
			state = "exited (signal: killed)"
		}
		g.Expect(err.Error()).To(MatchRegexp(`%s: client port \d+, peer port \d+, %s`, m.Status.NodeRef.Name, regexp.QuoteMeta(state)))
	}
}

// TestQuorumWatcherCountsAVoterThatNeverStarted: the watcher counts the voters in etcd's own member
// list, not the processes the sandbox started. A voter added but never started (no
// process, no name yet) lowers the margin of three running members from 1 to 0; one member killed
// then leaves 2 of 4 voters, which is no quorum although 2 of the 3 processes the sandbox knows run.
func TestQuorumWatcherCountsAVoterThatNeverStarted(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	wc, machines, w := watchedCluster(t, g, "voter")
	g.Eventually(func(g Gomega) {
		margin, _, _ := w.Margin()
		g.Expect(margin).To(Equal(1))
	}, 30*time.Second, 100*time.Millisecond).Should(Succeed())

	cli, err := wc.Etcd.Client(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = cli.Close() }()
	ports, err := capienv.FreePorts(1)
	g.Expect(err).NotTo(HaveOccurred())
	// etcd refuses a membership change for a few seconds after the members connected ("unhealthy
	// cluster"): retried. Nothing listens on the peer URL, so the voter never starts.
	g.Eventually(func() error {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := cli.MemberAdd(actx, []string{fmt.Sprintf("http://127.0.0.1:%d", ports[0])})
		return err
	}, 60*time.Second, 500*time.Millisecond).Should(Succeed())
	g.Eventually(func(g Gomega) {
		margin, when, _ := w.Margin()
		g.Expect(margin).To(Equal(0), when)
		g.Expect(when).To(HaveSuffix("3 of 4 voting members running"))
	}, 30*time.Second, 100*time.Millisecond).Should(Succeed())
	g.Expect(w.Lost()).To(BeEmpty())

	sb.KillEtcdMember(wc, machines[0].Status.NodeRef.Name)
	g.Eventually(w.Lost, 30*time.Second, 100*time.Millisecond).Should(ContainElement(HaveSuffix("2 of 4 voting members running")))
}

// TestRunningWatcherSeesTwoRunning: the "one control-plane remediation per cluster" oracle fires:
// two requests of one namespace Running at once are a violation, one is not, and it
// counts its samples.
func TestRunningWatcherSeesTwoRunning(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns, err := capienv.CreateNamespace(ctx, sb.Client, "running")
	g.Expect(err).NotTo(HaveOccurred())
	run := func(name string) {
		mr := &caprv1.MachineRemediation{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		g.Expect(sb.Client.Create(ctx, mr)).To(Succeed())
		mr.Status.Phase = caprv1.MachineRemediationPhaseRunning
		g.Expect(sb.Client.Status().Update(ctx, mr)).To(Succeed())
	}
	w := sb.WatchRunning(ctx, &sandbox.WorkloadCluster{Namespace: ns})
	run("a")
	g.Eventually(func() int { ok, _ := w.Samples(); return ok }, 30*time.Second, 50*time.Millisecond).Should(BeNumerically(">=", 3))
	ok, failed := w.Samples()
	g.Expect(failed).To(BeZero())
	g.Expect(ok).To(BeNumerically(">", 0))
	g.Expect(w.Stop()).To(BeEmpty(), "one Running request is no violation")

	w = sb.WatchRunning(ctx, &sandbox.WorkloadCluster{Namespace: ns})
	run("b")
	g.Eventually(func() int { ok, _ := w.Samples(); return ok }, 30*time.Second, 50*time.Millisecond).Should(BeNumerically(">=", 3))
	g.Expect(w.Stop()).To(ContainElement(ContainSubstring("[a b] Running")))

	// Too few samples is a violation of its own: a watcher stopped before it could look.
	g.Expect(sb.WatchRunning(ctx, &sandbox.WorkloadCluster{Namespace: ns}).Stop()).To(ContainElement(ContainSubstring("too few to tell")))
}

// TestConcurrentProvisioningFormsOneEtcdCluster: three control-plane Nodes provisioned at once (as the
// provider's four workers do when several Machines appear together) get one etcd cluster of three
// voting members, never a second one-member cluster. The first call is held between its decision and
// its action: no other call may decide meanwhile. Then every member's own view is asked, so a member
// that started a cluster of its own would show up as a second cluster ID.
func TestConcurrentProvisioningFormsOneEtcdCluster(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ec := newEtcdCluster(g, t)

	var decided atomic.Int32
	release := make(chan struct{})
	starting := func(bool) {
		if decided.Add(1) == 1 {
			<-release
		}
	}
	names := []string{"cp-a", "cp-b", "cp-c"}
	var wg sync.WaitGroup
	firsts := make([]bool, len(names))
	errs := make([]error, len(names))
	for i, n := range names {
		wg.Go(func() { firsts[i], errs[i] = ec.Provision(ctx, n, starting) })
	}
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unblock)
	g.Eventually(decided.Load).Should(BeNumerically(">=", 1))
	g.Consistently(decided.Load, time.Second, 10*time.Millisecond).Should(BeEquivalentTo(1), "a second call decided while the first had not acted")
	unblock()
	wg.Wait()
	g.Expect(errs).To(HaveEach(BeNil()))
	g.Expect(firsts).To(ConsistOf(true, false, false), "exactly one call starts the cluster")

	clusterIDs := map[uint64]bool{}
	for _, n := range names {
		func() {
			cli, err := ec.Direct().Connect(ctx, n)
			g.Expect(err).NotTo(HaveOccurred())
			defer func() { _ = cli.Close() }()
			// Linearizable: a serializable list is the member's own applied state, which may not
			// yet hold the last promotion the leader committed (seen in CI: cp-c a learner in cp-b's
			// list after every Provision had returned).
			list, err := cli.MemberList(ctx)
			g.Expect(err).NotTo(HaveOccurred())
			clusterIDs[list.Header.GetClusterId()] = true
			g.Expect(list.Members).To(HaveLen(3), "member list of %s", n)
			for _, m := range list.Members {
				g.Expect(m.IsLearner).To(BeFalse(), "member %s of %s's list", m.Name, n)
			}
		}()
	}
	g.Expect(clusterIDs).To(HaveLen(1))
}

// TestEtcdAlarmMarksOneMember: a NOSPACE alarm raised for one member (AlarmEtcdMember, the
// "etcd member degraded" fault of compare-kcp) leaves its process running and answering, makes
// only that member unhealthy in etcd's own view (the alarm list names its ID), and caps the whole
// cluster: every member then refuses puts (etcd's applierV3Capped), also once the member is removed,
// which docs/design/kcp-comparison.md states.
func TestEtcdAlarmMarksOneMember(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ec := newEtcdCluster(g, t)
	names := []string{"cp-a", "cp-b", "cp-c"}
	for _, n := range names {
		_, err := ec.Provision(ctx, n, func(bool) {})
		g.Expect(err).NotTo(HaveOccurred())
	}
	wc := &sandbox.WorkloadCluster{Namespace: "alarm", Name: "alarm", Etcd: ec}
	g.Expect(sb.AlarmEtcdMember(ctx, wc, "cp-b")).To(Succeed())

	g.Expect(ec.Running("cp-b")).To(BeTrue())
	state, err := sb.EtcdState(ctx, wc)
	g.Expect(err).NotTo(HaveOccurred())
	for _, n := range names {
		m := state.ByName(n)
		g.Expect(m).NotTo(BeNil(), n)
		g.Expect(m.Reachable).To(BeTrue(), n)
		if n == "cp-b" {
			g.Expect(m.Healthy).To(BeFalse())
			g.Expect(m.Alarms).To(Equal([]string{"NOSPACE"}))
			continue
		}
		g.Expect(m.Healthy).To(BeTrue(), n)
		g.Expect(m.Alarms).To(BeEmpty(), n)
	}
	cli, err := ec.Direct().Connect(ctx, "cp-a")
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = cli.Close() }()
	_, err = cli.Put(ctx, "k", "v")
	g.Expect(err).To(MatchError(ContainSubstring("database space exceeded")))

	// Removing the member (what either remediation ends with) lifts neither: etcd keeps the removed
	// member's alarm until someone disarms it.
	g.Expect(ec.Leave(ctx, "cp-b")).To(Succeed())
	alarms, err := cli.AlarmList(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(alarms.Alarms).To(HaveLen(1))
	_, err = cli.Put(ctx, "k", "v")
	g.Expect(err).To(MatchError(ContainSubstring("database space exceeded")))
}

// newEtcdCluster is an empty etcd cluster of the envtest assets' etcd, stopped when the test ends.
func newEtcdCluster(g Gomega, t *testing.T) *sandbox.EtcdCluster {
	assets, err := capienv.AssetsDir()
	g.Expect(err).NotTo(HaveOccurred())
	ec, err := sandbox.NewEtcdCluster(t.TempDir(), filepath.Join(assets, "etcd"))
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(ec.Stop)
	return ec
}
