package etcdutil_test

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/capr-io/capr/etcdutil"
	capienv "github.com/capr-io/capr/test/envtest"
	"github.com/capr-io/capr/test/sandbox"
)

// These tests run against a real etcd cluster: one process per member, built from
// go.etcd.io/etcd/server/v3 by `make envtest-assets`.

func startCluster(t *testing.T, members ...string) *sandbox.EtcdCluster {
	t.Helper()
	g := NewWithT(t)
	assets, err := capienv.AssetsDir()
	g.Expect(err).NotTo(HaveOccurred())
	c, err := sandbox.NewEtcdCluster(t.TempDir(), filepath.Join(assets, "etcd"))
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(c.Stop)
	ctx := context.Background()
	g.Expect(c.StartFirst(ctx, members[0])).To(Succeed())
	for _, m := range members[1:] {
		g.Expect(c.Join(ctx, m)).To(Succeed())
	}
	return c
}

func inspector(c *sandbox.EtcdCluster) *etcdutil.Cluster {
	return &etcdutil.Cluster{Connector: c.Direct(), CallTimeout: 2 * time.Second}
}

func TestInspectHealthyCluster(t *testing.T) {
	g := NewWithT(t)
	c := startCluster(t, "n1", "n2", "n3")
	state, err := inspector(c).Inspect(context.Background(), []string{"n1", "n2", "n3"})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(state.Members).To(HaveLen(3))
	g.Expect(state.Counts()).To(Equal(etcdutil.Counts{Voting: 3, Healthy: 3, QuorumProven: true}))
	g.Expect(state.LeaderID).NotTo(BeZero())
	g.Expect(state.ByID(state.LeaderID)).NotTo(BeNil())
	g.Expect(state.Serializable).To(BeFalse())
	for _, n := range []string{"n1", "n2", "n3"} {
		g.Expect(state.ByName(n).Healthy).To(BeTrue(), n)
	}
}

func TestInspectDeadMemberAndLostQuorum(t *testing.T) {
	g := NewWithT(t)
	c := startCluster(t, "n1", "n2", "n3")
	ctx := context.Background()
	c.Kill("n2")
	state, err := inspector(c).Inspect(ctx, []string{"n2", "n1", "n3"}) // the dead one first: skipped
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(state.Counts()).To(Equal(etcdutil.Counts{Voting: 3, Healthy: 2, Unreachable: 1, QuorumProven: true}))
	g.Expect(state.ByName("n2").Problem).To(MatchRegexp(`^unreachable \(the leader n[13] received nothing from it in 2s\)$`))
	g.Expect(etcdutil.QuorumPresent(state.Counts())).To(BeTrue())

	c.Kill("n3")
	// Two of three down: no linearizable member list anywhere; the local view still says who is down.
	g.Eventually(func(g Gomega) {
		state, err = inspector(c).Inspect(ctx, []string{"n1", "n2", "n3"})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(state.Serializable).To(BeTrue())
		g.Expect(etcdutil.QuorumPresent(state.Counts())).To(BeFalse())
		g.Expect(state.Unhealthy()).To(ContainElements(HavePrefix("n2"), HavePrefix("n3")))
	}, 20*time.Second, 200*time.Millisecond).Should(Succeed())
}

func TestInspectAlarmedMember(t *testing.T) {
	g := NewWithT(t)
	c := startCluster(t, "n1", "n2", "n3")
	ctx := context.Background()
	state, err := inspector(c).Inspect(ctx, []string{"n1"})
	g.Expect(err).NotTo(HaveOccurred())
	victim := state.ByName("n3").ID
	cli, err := c.Client(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = cli.Close() }()
	// Raise NOSPACE for n3 the way etcd itself does, through the maintenance API.
	_, err = pb.NewMaintenanceClient(cli.ActiveConnection()).Alarm(ctx, &pb.AlarmRequest{
		Action: pb.AlarmRequest_ACTIVATE, MemberID: victim, Alarm: pb.AlarmType_NOSPACE,
	})
	g.Expect(err).NotTo(HaveOccurred())
	state, err = inspector(c).Inspect(ctx, []string{"n1"})
	g.Expect(err).NotTo(HaveOccurred())
	n3 := state.ByName("n3")
	g.Expect(n3.Healthy).To(BeFalse())
	g.Expect(n3.Problem).To(ContainSubstring("NOSPACE"))
	// The alarm stops requests, not raft: n3 still follows the leader and votes, so the quorum math
	// counts it (a remediation keeps it until its replacement votes) and the table says ALARMED.
	g.Expect(n3.Up()).To(BeTrue())
	g.Expect(state.Counts().Healthy).To(Equal(3))
	g.Expect(state.Table()).To(MatchRegexp(`n3 +\S+ +\S+ +ALARMED +alarmed \(NOSPACE\)`))
}

func TestRemoveMemberIsIdempotentAndKeepsTheLastMember(t *testing.T) {
	g := NewWithT(t)
	c := startCluster(t, "n1", "n2")
	ctx := context.Background()
	ec := inspector(c)
	state, err := ec.Inspect(ctx, []string{"n1"})
	g.Expect(err).NotTo(HaveOccurred())
	n2 := state.ByName("n2").ID
	// Right after a join etcd refuses reconfiguration for a few seconds ("unhealthy cluster"): the
	// caller retries, as the remediator does on its next reconcile.
	g.Eventually(func() error { return ec.RemoveMember(ctx, n2, []string{"n1"}) }, 20*time.Second, 200*time.Millisecond).Should(Succeed())
	g.Expect(ec.RemoveMember(ctx, n2, []string{"n1"})).To(Succeed(), "already gone is success")
	state, err = ec.Inspect(ctx, []string{"n1"})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(state.Members).To(HaveLen(1))
	err = ec.RemoveMember(ctx, state.ByName("n1").ID, []string{"n1"})
	g.Expect(errors.Is(err, etcdutil.ErrLastMember)).To(BeTrue(), "got %v", err)
}

// TestRemoveMemberRightAfterAJoinGoesThroughAnOlderMember: a member promoted a moment ago refuses to
// remove a live voter ("unhealthy cluster": it has not been connected to the others for etcd's 5 s),
// while a member that was there before it accepts. The removal must not fail because the new member
// happened to answer the member list first (the replacement's own member did, and the
// remediation waited a retry for nothing).
func TestRemoveMemberRightAfterAJoinGoesThroughAnOlderMember(t *testing.T) {
	g := NewWithT(t)
	c := startCluster(t, "n1", "n2", "n3")
	ctx := context.Background()
	joining := time.Now()
	g.Expect(c.Join(ctx, "n4")).To(Succeed())
	state, err := inspector(c).Inspect(ctx, []string{"n1"})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(state.Counts()).To(Equal(etcdutil.Counts{Voting: 4, Healthy: 4, QuorumProven: true}))
	ec := &etcdutil.Cluster{Connector: &listedFirst{Connector: c.Direct(), first: "n4", second: "n1", answered: make(chan struct{})}, CallTimeout: 2 * time.Second}
	g.Expect(ec.RemoveMember(ctx, state.ByName("n3").ID, []string{"n4", "n1"})).To(Succeed(), "first call, %v after the join began", time.Since(joining))
	state, err = inspector(c).Inspect(ctx, []string{"n1"})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(state.ByName("n3")).To(BeNil())
	g.Expect(state.Counts()).To(Equal(etcdutil.Counts{Voting: 3, Healthy: 3, QuorumProven: true}))
}

// TestRemoveMemberEndsAtARefusalOtherThanUnhealthy: only "unhealthy cluster", which depends on the
// connections of the member asked, sends the removal to the next member; any other refusal is the
// cluster's answer and ends the call without asking again. Here a third voter was added to two and
// never started, so removing a started one would leave fewer started voters than a quorum, which
// etcd refuses on every member ("not enough started members", its strict reconfiguration check;
// a second unstarted voter cannot be added at all: etcd refuses it as "unhealthy cluster").
func TestRemoveMemberEndsAtARefusalOtherThanUnhealthy(t *testing.T) {
	g := NewWithT(t)
	c := startCluster(t, "n1", "n2")
	ctx := context.Background()
	cli, err := c.Client(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = cli.Close() })
	// Refused as "unhealthy cluster" until the members have been connected for etcd's 5 s.
	g.Eventually(func() error {
		_, err := cli.MemberAdd(ctx, []string{"https://127.0.0.1:1"}) // never started
		return err
	}, 20*time.Second, 200*time.Millisecond).Should(Succeed())
	state, err := inspector(c).Inspect(ctx, []string{"n1"})
	g.Expect(err).NotTo(HaveOccurred())
	removes := &countRemoves{Connector: c.Direct(), calls: map[string]int{}}
	ec := &etcdutil.Cluster{Connector: removes, CallTimeout: 2 * time.Second}
	err = ec.RemoveMember(ctx, state.ByName("n1").ID, []string{"n1", "n2"})
	g.Expect(err).To(MatchError(rpctypes.ErrMemberNotEnoughStarted))
	g.Expect(removes.total()).To(Equal(1), "removals sent, by node: %v", removes.calls)
}

// countRemoves counts the MemberRemove calls sent through each node.
type countRemoves struct {
	etcdutil.Connector
	mu    sync.Mutex
	calls map[string]int
}

func (r *countRemoves) Connect(ctx context.Context, node string) (*clientv3.Client, error) {
	cli, err := r.Connector.Connect(ctx, node)
	if err == nil {
		cli.Cluster = removeCounter{Cluster: cli.Cluster, count: func() { r.mu.Lock(); r.calls[node]++; r.mu.Unlock() }}
	}
	return cli, err
}

func (r *countRemoves) total() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.calls {
		n += c
	}
	return n
}

type removeCounter struct {
	clientv3.Cluster
	count func()
}

func (c removeCounter) MemberRemove(ctx context.Context, id uint64) (*clientv3.MemberRemoveResponse, error) {
	c.count()
	return c.Cluster.MemberRemove(ctx, id)
}

// listedFirst dials node second only once node first has answered a member list, so that an
// operation through both reads the list through first.
type listedFirst struct {
	etcdutil.Connector
	first, second string
	answered      chan struct{}
	once          sync.Once
}

func (l *listedFirst) Connect(ctx context.Context, node string) (*clientv3.Client, error) {
	if node == l.second {
		select {
		case <-l.answered:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	cli, err := l.Connector.Connect(ctx, node)
	if err == nil && node == l.first {
		cli.Cluster = listNotifier{Cluster: cli.Cluster, done: func() { l.once.Do(func() { close(l.answered) }) }}
	}
	return cli, err
}

type listNotifier struct {
	clientv3.Cluster
	done func()
}

func (n listNotifier) MemberList(ctx context.Context, opts ...clientv3.OpOption) (*clientv3.MemberListResponse, error) {
	defer n.done()
	return n.Cluster.MemberList(ctx, opts...)
}

func TestMoveLeader(t *testing.T) {
	g := NewWithT(t)
	c := startCluster(t, "n1", "n2", "n3")
	ctx := context.Background()
	ec := inspector(c)
	state, err := ec.Inspect(ctx, []string{"n1"})
	g.Expect(err).NotTo(HaveOccurred())
	leader := state.ByID(state.LeaderID)
	var target *etcdutil.MemberStatus
	for i := range state.Members {
		if state.Members[i].ID != state.LeaderID {
			target = &state.Members[i]
			break
		}
	}
	g.Expect(ec.MoveLeader(ctx, leader.Name, target.ID)).To(Succeed())
	g.Eventually(func(g Gomega) {
		s, err := ec.Inspect(ctx, []string{"n1"})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(s.LeaderID).To(Equal(target.ID))
	}, 10*time.Second, 100*time.Millisecond).Should(Succeed())
	// Only the leader may move leadership.
	g.Expect(ec.MoveLeader(ctx, leader.Name, target.ID)).NotTo(Succeed())
}

func TestUnreachableNodeIsBoundedByTimeouts(t *testing.T) {
	g := NewWithT(t)
	ec := &etcdutil.Cluster{Connector: &etcdutil.Direct{
		Endpoints: map[string]string{"gone": "127.0.0.1:1"}, DialTimeout: 500 * time.Millisecond,
	}, CallTimeout: time.Second}
	_, err := ec.Inspect(context.Background(), []string{"gone"})
	g.Expect(err).To(HaveOccurred())
	g.Expect(err.Error()).To(ContainSubstring("no etcd member could be reached"))
}

// blockedNode cannot reach one node, as when that node's kubelet is down while its etcd member runs.
type blockedNode struct {
	etcdutil.Connector
	node string
}

func (b blockedNode) Connect(ctx context.Context, node string) (*clientv3.Client, error) {
	if node == b.node {
		return nil, errors.New("kubelet down")
	}
	return b.Connector.Connect(ctx, node)
}

// TestInspectUnreachableLeaderIsAlive: a leader that cannot be reached through its node is counted
// healthy (alive: the others follow it and a linearizable read passed through it), and a leader that
// really died is not. blockedNode reads no metrics, so the leader is known alive without them, and a
// follower that cannot be reached is not known alive at all (with the leader's metrics:
// TestInspectFollowerAliveBehindAStoppedKubelet).
func TestInspectUnreachableLeaderIsAlive(t *testing.T) {
	g := NewWithT(t)
	c := startCluster(t, "n1", "n2", "n3")
	ctx := context.Background()
	nodes := []string{"n1", "n2", "n3"}
	state, err := inspector(c).Inspect(ctx, nodes)
	g.Expect(err).NotTo(HaveOccurred())
	leader := state.ByID(state.LeaderID).Name
	var follower string
	for _, n := range nodes {
		if n != leader {
			follower = n
		}
	}

	blockLeader := &etcdutil.Cluster{Connector: blockedNode{Connector: c.Direct(), node: leader}, CallTimeout: 2 * time.Second}
	state, err = blockLeader.Inspect(ctx, nodes)
	g.Expect(err).NotTo(HaveOccurred())
	m := state.ByName(leader)
	g.Expect(m.Reachable).To(BeFalse())
	g.Expect(m.Healthy).To(BeTrue(), m.Problem)
	g.Expect(m.Note).To(ContainSubstring("leads"))
	g.Expect(state.Counts()).To(Equal(etcdutil.Counts{Voting: 3, Healthy: 3, Unreachable: 1, QuorumProven: true}))

	blockFollower := &etcdutil.Cluster{Connector: blockedNode{Connector: c.Direct(), node: follower}, CallTimeout: 2 * time.Second}
	state, err = blockFollower.Inspect(ctx, nodes)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(state.ByName(follower).Healthy).To(BeFalse())
	// blockedNode reads no metrics: what the leader receives from the follower is not known here.
	g.Expect(state.ByName(follower).Problem).To(Equal("unreachable (what the leader " + leader + " receives from it could not be read)"))

	// The leader dies: the others elect a new one and stop naming it.
	c.Kill(leader)
	g.Eventually(func(g Gomega) {
		state, err := blockLeader.Inspect(ctx, nodes)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(state.LeaderID).NotTo(Equal(m.ID))
		g.Expect(state.ByName(leader).Healthy).To(BeFalse())
		g.Expect(state.Counts().Healthy).To(Equal(2))
	}, 20*time.Second, 200*time.Millisecond).Should(Succeed())
}
