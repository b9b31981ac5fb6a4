package etcdutil

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestReceivedBytes(t *testing.T) {
	const header = "# HELP etcd_network_peer_received_bytes_total The total number of bytes received from peers.\n# TYPE etcd_network_peer_received_bytes_total counter\n"
	for _, tc := range []struct {
		name    string
		metrics string
		want    map[uint64]float64
		err     string
	}{{
		name: "two peers; link heartbeats under From 0 name no sender",
		metrics: header +
			`etcd_network_peer_received_bytes_total{From="0"} 240` + "\n" +
			`etcd_network_peer_received_bytes_total{From="91bc3c398fb3c146"} 8748` + "\n" +
			`etcd_network_peer_received_bytes_total{From="fd422379fda50e48"} 819` + "\n",
		want: map[uint64]float64{0x91bc3c398fb3c146: 8748, 0xfd422379fda50e48: 819},
	}, {
		name: "other metrics around, a timestamp",
		metrics: "# TYPE etcd_server_has_leader gauge\netcd_server_has_leader 1\n" + header +
			`etcd_network_peer_received_bytes_total{From="a"} 12 1700000000000` + "\n" +
			"# TYPE etcd_network_active_peers gauge\n" +
			`etcd_network_active_peers{Local="8e9e05c52164694d",Remote="a"} 1` + "\n",
		want: map[uint64]float64{0xa: 12},
	}, {
		name:    "untyped",
		metrics: `etcd_network_peer_received_bytes_total{From="a"} 3` + "\n",
		want:    map[uint64]float64{0xa: 3},
	}, {
		name:    "no such metric",
		metrics: "# TYPE etcd_server_has_leader gauge\netcd_server_has_leader 1\n",
		err:     "the etcd metrics have no etcd_network_peer_received_bytes_total",
	}, {
		name:    "empty",
		metrics: "",
		err:     "the etcd metrics have no etcd_network_peer_received_bytes_total",
	}, {
		name:    "a From that is no member ID",
		metrics: header + `etcd_network_peer_received_bytes_total{From="n2"} 1` + "\n",
		err:     `label From "n2" is not a member ID`,
	}, {
		name:    "no From label",
		metrics: header + `etcd_network_peer_received_bytes_total 1` + "\n",
		err:     `label From "" is not a member ID`,
	}, {
		name:    "not the text format",
		metrics: "<html>not metrics</html>",
		err:     "parsing etcd metrics",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			got, err := receivedBytes([]byte(tc.metrics))
			if tc.err != "" {
				g.Expect(err).To(MatchError(ContainSubstring(tc.err)))
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(got).To(Equal(tc.want))
		})
	}
}

// member is a voting member n<id> as probe leaves it: reachable and following a leader, or not.
func member(id uint64, reachable bool) MemberStatus {
	m := MemberStatus{ID: id, Name: fmt.Sprintf("n%d", id), Reachable: reachable}
	if reachable {
		m.Healthy, m.Votes = true, true
	} else {
		m.Problem = "unreachable"
	}
	return m
}

// fakeMetrics serves each node's metrics from a list, one reading per read, the last one repeated
// (an empty list or "" fails the read); it cannot connect.
type fakeMetrics struct {
	mu    sync.Mutex
	reads map[string][]string
	count map[string]int
}

func newFakeMetrics(reads map[string][]string) *fakeMetrics {
	return &fakeMetrics{reads: reads, count: map[string]int{}}
}

func (*fakeMetrics) Connect(context.Context, string) (*clientv3.Client, error) {
	return nil, errors.New("not connected in this test")
}

func (f *fakeMetrics) Metrics(_ context.Context, node string) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	list := f.reads[node]
	if len(list) == 0 {
		return nil, errors.New("refused")
	}
	body := list[min(f.count[node], len(list)-1)]
	f.count[node]++
	if body == "" {
		return nil, errors.New("refused")
	}
	return []byte(body), nil
}

// received renders what the leader has received from each peer (ID → bytes).
func received(from map[uint64]int) string {
	var b strings.Builder
	b.WriteString("# TYPE etcd_network_peer_received_bytes_total counter\n")
	for id, n := range from {
		fmt.Fprintf(&b, "etcd_network_peer_received_bytes_total{From=\"%x\"} %d\n", id, n)
	}
	return b.String()
}

func TestMarkAlive(t *testing.T) {
	ctx := context.Background()
	three := func() *State {
		return &State{QuorumProven: true, LeaderID: 1, Members: []MemberStatus{member(1, true), member(2, true), member(3, false)}}
	}
	// window ends the watch of a follower never heard. A follower heard ends the watch at once, so
	// heardCluster's longer window is never waited for: it keeps a loaded machine from ending the
	// watch before the readings that make the follower heard.
	const window = 400 * time.Millisecond
	cluster := func(reads map[string][]string) (*Cluster, *fakeMetrics) {
		f := newFakeMetrics(reads)
		return &Cluster{Connector: f, LivenessWindow: window}, f
	}
	heardCluster := func(reads map[string][]string) (*Cluster, *fakeMetrics) {
		f := newFakeMetrics(reads)
		return &Cluster{Connector: f, LivenessWindow: 2 * time.Second}, f
	}
	// The leader n1 hears from n2 throughout, and from n3 as given.
	hears := func(n3 ...int) map[string][]string {
		list := make([]string, 0, len(n3))
		for i, n := range n3 {
			list = append(list, received(map[uint64]int{2: 100 * (i + 1), 3: n}))
		}
		return map[string][]string{"n1": list}
	}

	t.Run("a follower the leader hears from", func(t *testing.T) {
		g := NewWithT(t)
		state := three()
		c, f := heardCluster(hears(819, 819, 900))
		c.markAlive(ctx, state, []uint64{1, 1, 0})
		m := state.ByName("n3")
		g.Expect(m.Reachable).To(BeFalse())
		g.Expect(m.Healthy).To(BeTrue())
		g.Expect(m.Problem).To(BeEmpty())
		g.Expect(m.Note).To(Equal("unreachable through its node, but alive: the leader n1 received its raft messages within 2s"))
		g.Expect(state.Counts()).To(Equal(Counts{Voting: 3, Healthy: 3, Unreachable: 1, QuorumProven: true}))
		g.Expect(f.count["n1"]).To(Equal(3), "the watch ends once every follower was heard")
		g.Expect(f.count).NotTo(HaveKey("n2"), "only the leader is asked")
	})
	t.Run("an alarmed follower votes and keeps its alarm as the problem", func(t *testing.T) {
		g := NewWithT(t)
		state := three()
		state.Members[2].Alarms = []string{"NOSPACE"}
		c, _ := heardCluster(hears(1, 2))
		c.markAlive(ctx, state, []uint64{1, 1, 0})
		m := state.ByName("n3")
		g.Expect(m.Healthy).To(BeFalse())
		g.Expect(m.Up()).To(BeTrue())
		g.Expect(m.Problem).To(Equal("alarmed (NOSPACE)"))
	})
	t.Run("a follower the leader hears nothing from says why: dead, frozen or cut off", func(t *testing.T) {
		g := NewWithT(t)
		state := three()
		c, f := cluster(hears(819))
		c.markAlive(ctx, state, []uint64{1, 1, 0})
		m := state.ByName("n3")
		g.Expect(m.Up()).To(BeFalse())
		g.Expect(m.Problem).To(Equal("unreachable (the leader n1 received nothing from it in 400ms)"))
		g.Expect(m.Note).To(BeEmpty())
		g.Expect(f.count["n1"]).To(BeNumerically(">=", 2), "read again within the window")
	})
	t.Run("a follower never heard has no series: not alive", func(t *testing.T) {
		g := NewWithT(t)
		state := three()
		c, _ := cluster(map[string][]string{"n1": {received(map[uint64]int{2: 1}), received(map[uint64]int{2: 2})}})
		c.markAlive(ctx, state, []uint64{1, 1, 0})
		g.Expect(state.ByName("n3").Up()).To(BeFalse())
	})
	t.Run("a first read that fails is unknown, never alive", func(t *testing.T) {
		g := NewWithT(t)
		state := three()
		c, _ := cluster(map[string][]string{"n1": {"", received(map[uint64]int{3: 1}), received(map[uint64]int{3: 2})}})
		c.markAlive(ctx, state, []uint64{1, 1, 0})
		g.Expect(state.ByName("n3").Up()).To(BeFalse())
		g.Expect(state.ByName("n3").Problem).To(Equal("unreachable (what the leader n1 receives from it could not be read)"))
	})
	t.Run("a later read that fails is tried again", func(t *testing.T) {
		g := NewWithT(t)
		state := three()
		c, _ := heardCluster(map[string][]string{"n1": {received(map[uint64]int{3: 1}), "", received(map[uint64]int{3: 2})}})
		c.markAlive(ctx, state, []uint64{1, 1, 0})
		g.Expect(state.ByName("n3").Up()).To(BeTrue(), state.ByName("n3").Problem)
	})
	t.Run("a watch cut short by its caller knows nothing of the followers not heard", func(t *testing.T) {
		g := NewWithT(t)
		state := three()
		cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		f := newFakeMetrics(hears(819))
		(&Cluster{Connector: f, LivenessWindow: time.Minute}).markAlive(cctx, state, []uint64{1, 1, 0})
		g.Expect(state.ByName("n3").Up()).To(BeFalse())
		g.Expect(state.ByName("n3").Problem).To(Equal("unreachable (what the leader n1 receives from it could not be read)"))
	})
	t.Run("a connector without metrics knows nothing more", func(t *testing.T) {
		g := NewWithT(t)
		state := three()
		(&Cluster{Connector: connectOnly{}}).markAlive(ctx, state, []uint64{1, 1, 0})
		g.Expect(state.ByName("n3").Up()).To(BeFalse())
		g.Expect(state.ByName("n3").Problem).To(Equal("unreachable (what the leader n1 receives from it could not be read)"))
	})
	t.Run("without a proven quorum nothing is read", func(t *testing.T) {
		g := NewWithT(t)
		state := three()
		state.QuorumProven, state.Serializable = false, true
		c, f := cluster(hears(1, 2))
		c.markAlive(ctx, state, []uint64{1, 1, 0})
		g.Expect(state.ByName("n3").Up()).To(BeFalse())
		g.Expect(state.ByName("n3").Problem).To(Equal("unreachable"))
		g.Expect(f.count).To(BeEmpty())
	})
	t.Run("5 voters, two unreachable followers: each as the leader hears it", func(t *testing.T) {
		g := NewWithT(t)
		state := &State{QuorumProven: true, LeaderID: 1, Members: []MemberStatus{member(1, true), member(2, true), member(3, true), member(4, false), member(5, false)}}
		c, _ := cluster(map[string][]string{"n1": {received(map[uint64]int{4: 1, 5: 1}), received(map[uint64]int{4: 2, 5: 1})}})
		c.LivenessWindow = time.Second // n4 is heard at the first reading after the first
		c.markAlive(ctx, state, []uint64{1, 1, 1, 0, 0})
		g.Expect(state.ByName("n4").Up()).To(BeTrue())
		g.Expect(state.ByName("n5").Up()).To(BeFalse())
		g.Expect(state.Counts()).To(Equal(Counts{Voting: 5, Healthy: 4, Unreachable: 2, QuorumProven: true}))
	})
	t.Run("the leader followed by the others, without metrics", func(t *testing.T) {
		g := NewWithT(t)
		state := &State{QuorumProven: true, LeaderID: 1, Members: []MemberStatus{member(1, false), member(2, true), member(3, true)}}
		c, _ := cluster(nil)
		c.markAlive(ctx, state, []uint64{0, 1, 1})
		g.Expect(state.ByName("n1").Healthy).To(BeTrue())
		g.Expect(state.ByName("n1").Note).To(ContainSubstring("it leads (2 reachable member(s) follow it"))
	})
	t.Run("with the leader unreachable, another unreachable follower is not known alive", func(t *testing.T) {
		g := NewWithT(t)
		state := &State{QuorumProven: true, LeaderID: 1, Members: []MemberStatus{member(1, false), member(2, true), member(3, false)}}
		c, f := cluster(map[string][]string{"n2": {received(map[uint64]int{1: 1, 3: 1}), received(map[uint64]int{1: 2, 3: 2})}})
		c.markAlive(ctx, state, []uint64{0, 1, 0})
		g.Expect(state.ByName("n1").Up()).To(BeTrue(), "the leader n2 follows")
		g.Expect(state.ByName("n3").Up()).To(BeFalse())
		g.Expect(state.ByName("n3").Problem).To(Equal("unreachable (only the leader hears from its followers, and it cannot be asked)"))
		g.Expect(f.count).To(BeEmpty(), "a follower's counters name only the leader")
	})
	t.Run("a leader not named by every reachable member is not known alive by leading", func(t *testing.T) {
		g := NewWithT(t)
		state := &State{QuorumProven: true, LeaderID: 1, Members: []MemberStatus{member(1, false), member(2, true), member(3, true)}}
		c, _ := cluster(nil)
		c.markAlive(ctx, state, []uint64{0, 1, 3})
		g.Expect(state.ByName("n1").Up()).To(BeFalse())
	})
}

// connectOnly is a Connector that cannot read metrics.
type connectOnly struct{}

func (connectOnly) Connect(context.Context, string) (*clientv3.Client, error) {
	return nil, errors.New("not connected in this test")
}
