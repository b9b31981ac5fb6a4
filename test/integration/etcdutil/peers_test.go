package etcdutil_test

import (
	"context"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/etcdutil"
	"github.com/capr-io/capr/remediation/controlplane"
	capienv "github.com/capr-io/capr/test/envtest"
	"github.com/capr-io/capr/test/sandbox"
)

// refusing accepts TCP connections and closes each at once: the path to a member through a node
// whose kubelet is stopped (the API server's port-forward to it fails), while the member runs.
func refusing(t *testing.T) string {
	t.Helper()
	l, err := capienv.Listen()
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			_ = conn.Close()
		}
	})
	t.Cleanup(func() {
		_ = l.Close()
		wg.Wait()
	})
	return l.Addr().String()
}

// kubeletStopped returns a Connector that reaches every member at its real address except the one on
// node, whose path refuses every connection (its kubelet is stopped), and that Connector's Cluster.
func kubeletStopped(t *testing.T, c *sandbox.EtcdCluster, node string) *etcdutil.Cluster {
	direct := c.Direct()
	direct.Endpoints[node] = refusing(t)
	return &etcdutil.Cluster{Connector: direct, CallTimeout: 2 * time.Second}
}

// roles reads the leader and a follower of a healthy cluster through the real addresses.
func roles(g *WithT, c *sandbox.EtcdCluster, nodes []string) (leader, follower string) {
	state, err := inspector(c).Inspect(context.Background(), nodes)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(state.Counts()).To(Equal(etcdutil.Counts{Voting: 3, Healthy: 3, QuorumProven: true}))
	leader = state.ByID(state.LeaderID).Name
	for _, n := range nodes {
		if n != leader {
			follower = n
		}
	}
	return leader, follower
}

// orderFor is the order decision of a remediation of node's Machine on state, everything else
// neutral (a provider that accepts any scale up or down, one Machine per surge, voting joins).
func orderFor(state *etcdutil.State, node string) controlplane.OrderDecision {
	in := controlplane.OrderInput{Policy: caprv1.ControlPlaneOrderAuto, Initialized: true,
		Counts: state.Counts(), Unreachable: state.UnreachableNames(), Victim: controlplane.VictimUnhealthy}
	if m := state.ByName(node); m != nil && m.Up() {
		in.Victim, in.VictimProblem = controlplane.VictimHealthy, m.Problem
	}
	return controlplane.ChooseOrder(in)
}

// TestInspectFollowerAliveBehindAStoppedKubelet: a follower's kubelet stops; its etcd member runs and
// votes, but nothing can be sent to it through its node. Before, it was "unreachable" and not counted
// up, so the remediation of its Machine removed a voting member before its replacement existed
// (margin 0 on real nodes for about 48 s). The leader keeps receiving its raft messages, so it
// counts as up, says how that is known, and its Machine is replaced scale-up
// first. The oracle is the process itself: running, and healthy when asked at its real address.
func TestInspectFollowerAliveBehindAStoppedKubelet(t *testing.T) {
	g := NewWithT(t)
	c := startCluster(t, "n1", "n2", "n3")
	ctx := context.Background()
	nodes := []string{"n1", "n2", "n3"}
	leader, victim := roles(g, c, nodes)
	ec := kubeletStopped(t, c, victim)

	check := func(g Gomega) {
		g.Expect(c.Running(victim)).To(BeTrue())
		state, err := ec.Inspect(ctx, nodes)
		g.Expect(err).NotTo(HaveOccurred())
		m := state.ByName(victim)
		g.Expect(m.Reachable).To(BeFalse(), "nothing can be sent to it")
		g.Expect(m.Up()).To(BeTrue(), "problem: %s", m.Problem)
		g.Expect(m.Healthy).To(BeTrue())
		now := state.ByID(state.LeaderID) // not necessarily the first one: an election may have come between
		g.Expect(now).NotTo(BeNil())
		g.Expect(m.Note).To(HavePrefix("unreachable through its node, but alive: the leader " + now.Name + " received its raft messages"))
		g.Expect(state.LeaderID).NotTo(Equal(m.ID))
		g.Expect(state.Counts()).To(Equal(etcdutil.Counts{Voting: 3, Healthy: 3, Unreachable: 1, QuorumProven: true}))
		d := orderFor(state, victim)
		g.Expect(d.Order).To(Equal(caprv1.ControlPlaneOrderScaleUpFirst), "%s%s", d.Reason, d.WaitMessage)
	}
	g.Eventually(check, 20*time.Second, 200*time.Millisecond).Should(Succeed())
	g.Consistently(check, 3*time.Second, 200*time.Millisecond).Should(Succeed())

	// The leader behind a stopped kubelet is still known alive because the others follow it.
	state, err := kubeletStopped(t, c, leader).Inspect(ctx, nodes)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(state.ByName(leader).Up()).To(BeTrue(), state.ByName(leader).Problem)
	g.Expect(state.ByName(leader).Note).To(ContainSubstring("leads"))
}

// TestInspectDeadFollowerBehindAStoppedKubeletIsNotUp: the same follower, known alive through its
// leader, then its etcd process dies. The leader receives nothing more from it, and it must not be
// counted up any more: its Machine's remediation removes the member first, which costs no margin.
func TestInspectDeadFollowerBehindAStoppedKubeletIsNotUp(t *testing.T) {
	followerGoneIsNotUp(t, func(c *sandbox.EtcdCluster, victim string) {
		c.Kill(victim)
		NewWithT(t).Expect(c.Running(victim)).To(BeFalse())
	})
}

// TestInspectFrozenFollowerBehindAStoppedKubeletIsNotUp: the same follower, known alive through its
// leader, then its node freezes (docker pause; here SIGSTOP): the process exists and the kernel keeps
// its sockets open, but it neither reads, answers nor votes. On kind, CAPR took such a member for
// healthy (its peers still showed their raft streams to it connected: etcd_network_active_peers
// stays 1 for a frozen peer) and replaced its Machine scale-up first, with the frozen member counted
// in the quorum. It must not be counted up. The oracle is the process itself: stopped, and not
// answering when asked at its real address.
func TestInspectFrozenFollowerBehindAStoppedKubeletIsNotUp(t *testing.T) {
	followerGoneIsNotUp(t, func(c *sandbox.EtcdCluster, victim string) {
		g := NewWithT(t)
		c.Freeze(victim)
		t.Cleanup(func() { c.Thaw(victim) })
		g.Expect(c.Running(victim)).To(BeTrue(), "frozen, not ended")
		g.Eventually(func() error {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_, err := inspector(c).Inspect(ctx, []string{victim})
			return err
		}, 10*time.Second).ShouldNot(Succeed(), "the frozen member does not answer at its real address")
	})
}

// followerGoneIsNotUp stops a follower's kubelet, waits until its member is known alive through its
// leader, ends the member with gone, and expects it not up from then on, saying why, with its
// Machine's member removed first.
func followerGoneIsNotUp(t *testing.T, gone func(c *sandbox.EtcdCluster, victim string)) {
	g := NewWithT(t)
	c := startCluster(t, "n1", "n2", "n3")
	ctx := context.Background()
	nodes := []string{"n1", "n2", "n3"}
	_, victim := roles(g, c, nodes)
	ec := kubeletStopped(t, c, victim)
	g.Eventually(func(g Gomega) {
		state, err := ec.Inspect(ctx, nodes)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(state.ByName(victim).Up()).To(BeTrue())
	}, 20*time.Second, 200*time.Millisecond).Should(Succeed(), "known alive while it runs")

	gone(c, victim)
	notUp := func(g Gomega) {
		state, err := ec.Inspect(ctx, nodes)
		g.Expect(err).NotTo(HaveOccurred())
		m := state.ByName(victim)
		g.Expect(m.Up()).To(BeFalse(), "note: %s", m.Note)
		leader := state.ByID(state.LeaderID)
		g.Expect(leader).NotTo(BeNil())
		g.Expect(m.Problem).To(Equal("unreachable (the leader "+leader.Name+" received nothing from it in 2s)"), "the status says why it is not known alive")
		g.Expect(m.Note).To(BeEmpty())
		g.Expect(state.Counts()).To(Equal(etcdutil.Counts{Voting: 3, Healthy: 2, Unreachable: 1, QuorumProven: true}))
		d := orderFor(state, victim)
		g.Expect(d.Order).To(Equal(caprv1.ControlPlaneOrderRemoveMemberFirst), "%s%s", d.Reason, d.WaitMessage)
	}
	g.Eventually(notUp, 20*time.Second, 200*time.Millisecond).Should(Succeed())
	g.Consistently(notUp, 5*time.Second, 200*time.Millisecond).Should(Succeed())
}
