package etcdutil_test

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/capr-io/capr/etcdutil"
	"github.com/capr-io/capr/etcdutil/quorum"
	capienv "github.com/capr-io/capr/test/envtest"
)

// countingConnector counts the dials per node.
type countingConnector struct {
	inner etcdutil.Connector
	mu    sync.Mutex
	dials map[string]int
}

func (c *countingConnector) Connect(ctx context.Context, node string) (*clientv3.Client, error) {
	c.mu.Lock()
	if c.dials == nil {
		c.dials = map[string]int{}
	}
	c.dials[node]++
	c.mu.Unlock()
	return c.inner.Connect(ctx, node)
}

func (c *countingConnector) counts() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int{}
	for k, v := range c.dials {
		out[k] = v
	}
	return out
}

// blackhole accepts TCP connections and never answers: a member behind it is alive for etcd but
// cannot be reached (as behind a node whose kubelet is down); a dial to it hangs until its timeout.
func blackhole(t *testing.T) string {
	t.Helper()
	l, err := capienv.Listen()
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return l.Addr().String()
}

// Two of three members cannot be reached but run: the linearizable member list answered through the
// third proves quorum. The state must say so (never "quorum lost"), count the two as unreachable, and
// dial every node once although the unreachable ones are listed first.
func TestInspectQuorumProvenWithUnreachableMembers(t *testing.T) {
	g := NewWithT(t)
	c := startCluster(t, "n1", "n2", "n3")
	direct := c.Direct()
	hole := blackhole(t)
	direct.Endpoints["n2"], direct.Endpoints["n3"] = hole, hole
	direct.DialTimeout = time.Second
	conn := &countingConnector{inner: direct}
	ec := &etcdutil.Cluster{Connector: conn, CallTimeout: 2 * time.Second}

	state, err := ec.Inspect(context.Background(), []string{"n2", "n3", "n1"})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(state.QuorumProven).To(BeTrue())
	g.Expect(state.Serializable).To(BeFalse())
	g.Expect(state.Counts()).To(Equal(etcdutil.Counts{Voting: 3, Healthy: 1, Unreachable: 2, QuorumProven: true}))
	g.Expect(quorum.Present(state.Counts())).To(BeTrue(), "a linearizable read proves quorum")
	g.Expect(quorum.Lost(state.Counts())).To(BeFalse())
	g.Expect(state.UnreachableNames()).To(Equal([]string{"n2", "n3"}))
	// countingConnector reads no metrics: what the leader n1 receives from the others is not known here.
	g.Expect(state.ByName("n2").Problem).To(Equal("unreachable (what the leader n1 receives from it could not be read)"))
	g.Expect(state.ByName("n1").Healthy).To(BeTrue())
	// Parallel and remembered: each node dialled once (the old sequential code dialled the
	// unreachable nodes for the member list and again for their status).
	g.Expect(conn.counts()).To(Equal(map[string]int{"n1": 1, "n2": 1, "n3": 1}))
}

// Clients are shared through a ClientCache: repeated inspections dial each member once; Retain and
// Forget close the clients of Machines and clusters that are gone.
func TestClientCacheSharesClients(t *testing.T) {
	g := NewWithT(t)
	c := startCluster(t, "n1", "n2", "n3")
	conn := &countingConnector{inner: c.Direct()}
	cache := &etcdutil.ClientCache{}
	ec := &etcdutil.Cluster{Connector: cache.For("cluster-a", 1, conn), CallTimeout: 2 * time.Second}
	ctx := context.Background()
	for range 3 {
		state, err := ec.Inspect(ctx, []string{"n1", "n2", "n3"})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(state.Counts().Healthy).To(Equal(3))
	}
	g.Expect(conn.counts()).To(Equal(map[string]int{"n1": 1, "n2": 1, "n3": 1}))
	g.Expect(cache.Len()).To(Equal(3))

	// Another generation (a renewed certificate) replaces the clients.
	ec2 := &etcdutil.Cluster{Connector: cache.For("cluster-a", 2, conn), CallTimeout: 2 * time.Second}
	_, err := ec2.Inspect(ctx, []string{"n1"})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(conn.counts()).To(Equal(map[string]int{"n1": 2, "n2": 2, "n3": 2}))
	g.Expect(cache.Len()).To(Equal(3))

	cache.Retain("cluster-a", []string{"n1", "n2"})
	g.Expect(cache.Len()).To(Equal(2))
	cache.Forget("cluster-a")
	g.Expect(cache.Len()).To(Equal(0))

	// A member that dies: its client fails, is discarded, and the member shows unreachable.
	_, err = ec.Inspect(ctx, []string{"n1"})
	g.Expect(err).NotTo(HaveOccurred())
	c.Kill("n3")
	g.Eventually(func(g Gomega) {
		state, err := ec.Inspect(ctx, []string{"n1"})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(state.ByName("n3").Problem).To(HavePrefix("unreachable"))
	}, 20*time.Second, 200*time.Millisecond).Should(Succeed())
	g.Expect(cache.Len()).To(Equal(2), "the dead member's client is not kept")
}

// gatedNode fails the first dial of node at once, as the dial of a black-holed node (powered off, or
// a port-forward that accepts and never answers) fails at its timeout; every later dial of it waits
// for release or for its context to end, then dials for real.
type gatedNode struct {
	etcdutil.Connector
	node    string
	release chan struct{}
	mu      sync.Mutex
	dials   int
}

func (gn *gatedNode) Connect(ctx context.Context, node string) (*clientv3.Client, error) {
	if node != gn.node {
		return gn.Connector.Connect(ctx, node)
	}
	gn.mu.Lock()
	gn.dials++
	first := gn.dials == 1
	gn.mu.Unlock()
	if first {
		return nil, errors.New("etcd dial timeout expired")
	}
	select {
	case <-gn.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return gn.Connector.Connect(ctx, node)
}

func (gn *gatedNode) dialCount() int {
	gn.mu.Lock()
	defer gn.mu.Unlock()
	return gn.dials
}

// TestClientCacheDoesNotWaitAgainForANodeWhoseDialFailed: a black-holed node costs its whole dial
// timeout, and every health check and remediation of the cluster paid it again on every inspection,
// each holding a worker that all tenants share. Once a node's dial has failed, an inspection waits
// for its next dial only briefly and answers with the remembered failure; that dial goes on in the
// background, one at a time however many inspections ask, and once it connects the member is
// reached again. Before, the second Inspect below waited for the dial until its 10-minute deadline.
func TestClientCacheDoesNotWaitAgainForANodeWhoseDialFailed(t *testing.T) {
	g := NewWithT(t)
	c := startCluster(t, "n1", "n2", "n3")
	gate := &gatedNode{Connector: c.Direct(), node: "n3", release: make(chan struct{})}
	cache := &etcdutil.ClientCache{}
	ec := &etcdutil.Cluster{Connector: cache.For("cluster-a", 1, gate), CallTimeout: 2 * time.Second, InspectTimeout: 10 * time.Minute}
	inspect := func() <-chan *etcdutil.State {
		done := make(chan *etcdutil.State, 1)
		go func() {
			state, err := ec.Inspect(context.Background(), []string{"n1", "n2", "n3"})
			if err != nil {
				t.Errorf("Inspect: %v", err)
			}
			done <- state
		}()
		return done
	}
	unreachable := etcdutil.Counts{Voting: 3, Healthy: 2, Unreachable: 1, QuorumProven: true}

	var state *etcdutil.State
	g.Eventually(inspect(), time.Minute).Should(Receive(&state))
	g.Expect(state.Counts()).To(Equal(unreachable), "the first dial failed")

	for range 2 {
		g.Eventually(inspect(), time.Minute).Should(Receive(&state), "Inspect waited again for the dial of a node whose dial failed")
		g.Expect(state.Counts()).To(Equal(unreachable))
	}
	g.Expect(gate.dialCount()).To(Equal(2), "one dial in the background, shared by the inspections that asked")

	close(gate.release)
	g.Eventually(func(g Gomega) {
		g.Eventually(inspect(), time.Minute).Should(Receive(&state))
		g.Expect(state.Counts()).To(Equal(etcdutil.Counts{Voting: 3, Healthy: 3, QuorumProven: true}))
	}, time.Minute, 200*time.Millisecond).Should(Succeed(), "the member is reached once its node answers again")
}

// hangingNode is a node whose dial answers only when its context ends, as the node of a member that
// is gone or dead does through its port-forward until the dial timeout; dialEnded is closed then.
type hangingNode struct {
	etcdutil.Connector
	node      string
	dialEnded chan struct{}
}

func (h hangingNode) Connect(ctx context.Context, node string) (*clientv3.Client, error) {
	if node != h.node {
		return h.Connector.Connect(ctx, node)
	}
	<-ctx.Done()
	close(h.dialEnded)
	return nil, ctx.Err()
}

// TestInspectDoesNotWaitForANodeItDoesNotNeed: the victim's member was removed (or is dead) while its
// Machine, and so its node, is still there: the member list is asked through every node at once,
// and that node's dial answers only at its timeout. The state comes from the others, and Inspect
// returns with it without waiting for that dial, which it ends (every Inspect of a
// remediation with a dead member took the whole dial timeout, 3 s on the sandbox, several times per
// remediation). Before, Inspect returned only when its own InspectTimeout ended the dial.
func TestInspectDoesNotWaitForANodeItDoesNotNeed(t *testing.T) {
	g := NewWithT(t)
	c := startCluster(t, "n1", "n2")
	hanging := hangingNode{Connector: c.Direct(), node: "gone", dialEnded: make(chan struct{})}
	ec := &etcdutil.Cluster{Connector: hanging, CallTimeout: 2 * time.Second, InspectTimeout: 10 * time.Minute}
	type result struct {
		state *etcdutil.State
		err   error
	}
	done := make(chan result, 1)
	go func() {
		state, err := ec.Inspect(context.Background(), []string{"n1", "n2", "gone"})
		done <- result{state, err}
	}()
	var res result
	g.Eventually(done, time.Minute).Should(Receive(&res), "Inspect waited for the dial of a node it did not need")
	g.Expect(res.err).NotTo(HaveOccurred())
	g.Expect(res.state.Counts()).To(Equal(etcdutil.Counts{Voting: 2, Healthy: 2, QuorumProven: true}))
	g.Eventually(hanging.dialEnded, time.Minute).Should(BeClosed(), "the pending dial is ended once Inspect returned")
}

// TestDeadMemberIsGivenUpWithoutTheDialTimeout: a member whose etcd process is dead refuses every
// connection; the dial gives up on it after a second of failed attempts, not at the dial timeout (10
// minutes here), so an Inspect of a cluster with a dead member returns with it unreachable (the
// order decision of every remediation with a dead member waited 3 s on the sandbox, 10 s by
// default, for that dial). Before, both calls below ran into the test's minute.
func TestDeadMemberIsGivenUpWithoutTheDialTimeout(t *testing.T) {
	g := NewWithT(t)
	c := startCluster(t, "n1", "n2", "n3")
	c.Kill("n2")
	direct := c.Direct()
	direct.DialTimeout = 10 * time.Minute

	dialed := make(chan error, 1)
	go func() {
		cli, err := direct.Connect(context.Background(), "n2")
		if cli != nil {
			_ = cli.Close()
		}
		dialed <- err
	}()
	var err error
	g.Eventually(dialed, time.Minute).Should(Receive(&err), "the dial of a dead member waited for its timeout")
	g.Expect(err).To(MatchError(ContainSubstring("every connection attempt failed")))

	ec := &etcdutil.Cluster{Connector: direct, CallTimeout: 2 * time.Second, InspectTimeout: 10 * time.Minute}
	inspected := make(chan *etcdutil.State, 1)
	go func() {
		state, err := ec.Inspect(context.Background(), []string{"n1", "n2", "n3"})
		if err != nil {
			t.Errorf("Inspect: %v", err)
		}
		inspected <- state
	}()
	var state *etcdutil.State
	g.Eventually(inspected, time.Minute).Should(Receive(&state), "Inspect waited for the dead member's dial timeout")
	g.Expect(state).NotTo(BeNil())
	g.Expect(state.Counts()).To(Equal(etcdutil.Counts{Voting: 3, Healthy: 2, Unreachable: 1, QuorumProven: true}))
	g.Expect(state.ByName("n2").Problem).To(MatchRegexp(`^unreachable \(the leader n[13] received nothing from it in 2s\)$`))
}

// TestFailedConnectionAttemptIsRetriedAtOnce: a member whose first connection attempts fail (a blip
// in the path to it) but then answers is reached, without gRPC's backoff of a second and more: the
// dial gives up on a member only when its attempts keep failing (refusedGrace in etcdutil/client.go),
// and retries at once meanwhile. Each of the first two connections to the proxy in front of the member
// is closed on accept.
func TestFailedConnectionAttemptIsRetriedAtOnce(t *testing.T) {
	g := NewWithT(t)
	c := startCluster(t, "n1")
	direct := c.Direct()
	direct.Endpoints["n1"] = flakyProxy(t, direct.Endpoints["n1"], 2)
	direct.DialTimeout = 10 * time.Minute

	cli, err := direct.Connect(context.Background(), "n1")
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = cli.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = cli.Status(ctx, cli.Endpoints()[0])
	g.Expect(err).NotTo(HaveOccurred())
}

// flakyProxy forwards TCP connections to target, closing the first fail ones as soon as they are
// accepted.
func flakyProxy(t *testing.T, target string, fail int) string {
	t.Helper()
	l, err := capienv.Listen()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for n := 0; ; n++ {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			if n < fail {
				_ = conn.Close()
				continue
			}
			go func() {
				defer func() { _ = conn.Close() }()
				up, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer func() { _ = up.Close() }()
				done := make(chan struct{}, 2)
				go func() { _, _ = io.Copy(up, conn); done <- struct{}{} }()
				go func() { _, _ = io.Copy(conn, up); done <- struct{}{} }()
				<-done
			}()
		}
	}()
	return l.Addr().String()
}
