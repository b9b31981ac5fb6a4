package etcdutil

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestActivePeers(t *testing.T) {
	const header = "# HELP etcd_network_active_peers The current number of active peer connections.\n# TYPE etcd_network_active_peers gauge\n"
	const local = 0x8e9e05c52164694d
	for _, tc := range []struct {
		name    string
		metrics string
		want    map[uint64]bool
		err     string
	}{{
		name: "one peer connected, one not",
		metrics: header +
			`etcd_network_active_peers{Local="8e9e05c52164694d",Remote="91bc3c398fb3c146"} 1` + "\n" +
			`etcd_network_active_peers{Local="8e9e05c52164694d",Remote="fd422379fda50e48"} 0` + "\n",
		want: map[uint64]bool{0x91bc3c398fb3c146: true, 0xfd422379fda50e48: false},
	}, {
		name: "labels in another order, other metrics around, a timestamp",
		metrics: "# TYPE etcd_server_has_leader gauge\netcd_server_has_leader 1\n" + header +
			`etcd_network_active_peers{Remote="a",Local="8e9e05c52164694d"} 1 1700000000000` + "\n" +
			"# TYPE etcd_network_disconnected_peers_total counter\n" +
			`etcd_network_disconnected_peers_total{Local="8e9e05c52164694d",Remote="a"} 3` + "\n",
		want: map[uint64]bool{0xa: true},
	}, {
		name:    "untyped",
		metrics: `etcd_network_active_peers{Local="8e9e05c52164694d",Remote="a"} 1` + "\n",
		want:    map[uint64]bool{0xa: true},
	}, {
		name: "another member's series are not this member's view",
		metrics: header +
			`etcd_network_active_peers{Local="1",Remote="a"} 1` + "\n" +
			`etcd_network_active_peers{Local="8e9e05c52164694d",Remote="a"} 0` + "\n",
		want: map[uint64]bool{0xa: false},
	}, {
		name:    "only another member's series",
		metrics: header + `etcd_network_active_peers{Local="1",Remote="8e9e05c52164694d"} 1` + "\n",
		err:     "have no etcd_network_active_peers of that member",
	}, {
		name:    "no such metric",
		metrics: "# TYPE etcd_server_has_leader gauge\netcd_server_has_leader 1\n",
		err:     "have no etcd_network_active_peers of that member",
	}, {
		name:    "empty",
		metrics: "",
		err:     "have no etcd_network_active_peers of that member",
	}, {
		name:    "a Remote that is no member ID",
		metrics: header + `etcd_network_active_peers{Local="8e9e05c52164694d",Remote="n2"} 1` + "\n",
		err:     `label Remote "n2" is not a member ID`,
	}, {
		name:    "no Local label",
		metrics: header + `etcd_network_active_peers{Remote="a"} 1` + "\n",
		err:     `label Local "" is not a member ID`,
	}, {
		name:    "not the text format",
		metrics: "<html>not metrics</html>",
		err:     "parsing the metrics of etcd member 8e9e05c52164694d",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			got, err := activePeers([]byte(tc.metrics), local)
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

func TestPeersSeeAlive(t *testing.T) {
	sees := func(ids ...uint64) map[uint64]bool {
		v := map[uint64]bool{}
		for _, id := range ids {
			v[id] = true
		}
		return v
	}
	for _, tc := range []struct {
		name    string
		members []MemberStatus
		leader  uint64
		views   map[uint64]map[uint64]bool
		alive   bool
		why     string
	}{{
		name:    "3 voters: both others see it",
		members: []MemberStatus{member(1, true), member(2, true), member(3, false)},
		leader:  1, views: map[uint64]map[uint64]bool{1: sees(2, 3), 2: sees(1, 3)},
		alive: true, why: "n1, n2",
	}, {
		name:    "one observer sees no connection: it outweighs the other",
		members: []MemberStatus{member(1, true), member(2, true), member(3, false)},
		leader:  1, views: map[uint64]map[uint64]bool{1: sees(2, 3), 2: {1: true, 3: false}},
		why: "no raft connection to it from n2",
	}, {
		name:    "an observer with no series for it has never been connected",
		members: []MemberStatus{member(1, true), member(2, true), member(3, false)},
		leader:  1, views: map[uint64]map[uint64]bool{1: sees(2, 3), 2: sees(1)},
		why: "no raft connection to it from n2",
	}, {
		name:    "the leader's view is unread",
		members: []MemberStatus{member(1, true), member(2, true), member(3, false)},
		leader:  1, views: map[uint64]map[uint64]bool{2: sees(1, 3)},
		why: "the leader's view of it could not be read",
	}, {
		name:    "a follower's view is unread: the leader's and the member make a quorum",
		members: []MemberStatus{member(1, true), member(2, true), member(3, false)},
		leader:  1, views: map[uint64]map[uint64]bool{1: sees(2, 3)},
		alive: true, why: "n1",
	}, {
		name:    "nothing read",
		members: []MemberStatus{member(1, true), member(2, true), member(3, false)},
		leader:  1,
		why:     "its peers' view of it could not be read",
	}, {
		name:    "5 voters, two observers: a quorum with it",
		members: []MemberStatus{member(1, true), member(2, true), member(3, false), member(4, false), member(5, false)},
		leader:  1, views: map[uint64]map[uint64]bool{1: sees(2, 3, 4, 5), 2: sees(1, 3, 4, 5)},
		alive: true, why: "n1, n2",
	}, {
		name:    "5 voters, one observer: not a quorum with it",
		members: []MemberStatus{member(1, true), member(2, false), member(3, false), member(4, false), member(5, false)},
		leader:  1, views: map[uint64]map[uint64]bool{1: sees(2, 3, 4, 5)},
		why: "connected to n1 only: with it fewer than the quorum of 3",
	}, {
		name:    "the leader unreachable: the follower that can be asked sees it",
		members: []MemberStatus{member(1, false), member(2, true), member(3, false)},
		leader:  1, views: map[uint64]map[uint64]bool{2: sees(1, 3)},
		alive: true, why: "n2",
	}, {
		name: "a reachable member without a leader is not asked",
		members: []MemberStatus{member(1, true), member(2, true), member(3, false),
			{ID: 4, Name: "n4", Reachable: true, Problem: "has no leader"}, member(5, true)},
		leader: 1, views: map[uint64]map[uint64]bool{1: sees(3), 2: sees(3), 4: sees(), 5: sees(3)},
		alive: true, why: "n1, n2, n5",
	}, {
		name: "a learner is not asked, nor counted in the quorum",
		members: []MemberStatus{member(1, true), member(2, false), member(3, false),
			{ID: 4, Name: "n4", Reachable: true, IsLearner: true, Problem: "a learner"}},
		leader: 1, views: map[uint64]map[uint64]bool{1: sees(3), 4: sees()},
		alive: true, why: "n1",
	}, {
		name:    "an alarmed member still votes and is asked",
		members: []MemberStatus{member(1, true), {ID: 2, Name: "n2", Reachable: true, Votes: true, Alarms: []string{"NOSPACE"}}, member(3, false)},
		leader:  1, views: map[uint64]map[uint64]bool{1: sees(3), 2: {3: false}},
		why: "no raft connection to it from n2",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			state := &State{Members: tc.members, LeaderID: tc.leader, QuorumProven: true}
			alive, why := peersSeeAlive(state, tc.views, 3)
			g.Expect(alive).To(Equal(tc.alive), why)
			g.Expect(why).To(Equal(tc.why))
		})
	}
}

// fakeMetrics serves each node's metrics from a table ("" fails the read); it cannot connect.
type fakeMetrics map[string]string

func (fakeMetrics) Connect(context.Context, string) (*clientv3.Client, error) {
	return nil, errors.New("not connected in this test")
}

func (f fakeMetrics) Metrics(_ context.Context, node string) ([]byte, error) {
	if f[node] == "" {
		return nil, errors.New("refused")
	}
	return []byte(f[node]), nil
}

// activeSeries renders what member local exports about its peers.
func activeSeries(local uint64, connected map[uint64]bool) string {
	var b strings.Builder
	b.WriteString("# TYPE etcd_network_active_peers gauge\n")
	for remote, up := range connected {
		v := 0
		if up {
			v = 1
		}
		fmt.Fprintf(&b, "etcd_network_active_peers{Local=\"%x\",Remote=\"%x\"} %d\n", local, remote, v)
	}
	return b.String()
}

func TestMarkAlive(t *testing.T) {
	ctx := context.Background()
	three := func() *State {
		return &State{QuorumProven: true, LeaderID: 1, Members: []MemberStatus{member(1, true), member(2, true), member(3, false)}}
	}
	seen := fakeMetrics{"n1": activeSeries(1, map[uint64]bool{2: true, 3: true}), "n2": activeSeries(2, map[uint64]bool{1: true, 3: true})}

	t.Run("a follower its peers see connected", func(t *testing.T) {
		g := NewWithT(t)
		state := three()
		(&Cluster{Connector: seen}).markAlive(ctx, state, []uint64{1, 1, 0})
		m := state.ByName("n3")
		g.Expect(m.Reachable).To(BeFalse())
		g.Expect(m.Healthy).To(BeTrue())
		g.Expect(m.Problem).To(BeEmpty())
		g.Expect(m.Note).To(Equal("unreachable through its node, but alive: n1, n2 see its raft streams connected (with it a quorum of the voters)"))
		g.Expect(state.Counts()).To(Equal(Counts{Voting: 3, Healthy: 3, Unreachable: 1, QuorumProven: true}))
	})
	t.Run("an alarmed follower votes and keeps its alarm as the problem", func(t *testing.T) {
		g := NewWithT(t)
		state := three()
		state.Members[2].Alarms = []string{"NOSPACE"}
		(&Cluster{Connector: seen}).markAlive(ctx, state, []uint64{1, 1, 0})
		m := state.ByName("n3")
		g.Expect(m.Healthy).To(BeFalse())
		g.Expect(m.Up()).To(BeTrue())
		g.Expect(m.Problem).To(Equal("alarmed (NOSPACE)"))
	})
	t.Run("a follower not seen connected says why", func(t *testing.T) {
		g := NewWithT(t)
		state := three()
		down := fakeMetrics{"n1": activeSeries(1, map[uint64]bool{2: true, 3: false}), "n2": seen["n2"]}
		(&Cluster{Connector: down}).markAlive(ctx, state, []uint64{1, 1, 0})
		m := state.ByName("n3")
		g.Expect(m.Up()).To(BeFalse())
		g.Expect(m.Problem).To(Equal("unreachable (no raft connection to it from n1)"))
		g.Expect(m.Note).To(BeEmpty())
	})
	t.Run("a failed read is unknown, never alive", func(t *testing.T) {
		g := NewWithT(t)
		state := three()
		(&Cluster{Connector: fakeMetrics{}}).markAlive(ctx, state, []uint64{1, 1, 0})
		g.Expect(state.ByName("n3").Up()).To(BeFalse())
		g.Expect(state.ByName("n3").Problem).To(Equal("unreachable (its peers' view of it could not be read)"))
	})
	t.Run("without a proven quorum nothing is read", func(t *testing.T) {
		g := NewWithT(t)
		state := three()
		state.QuorumProven, state.Serializable = false, true
		(&Cluster{Connector: seen}).markAlive(ctx, state, []uint64{1, 1, 0})
		g.Expect(state.ByName("n3").Up()).To(BeFalse())
		g.Expect(state.ByName("n3").Problem).To(Equal("unreachable"))
	})
	t.Run("the leader followed by the others, without metrics", func(t *testing.T) {
		g := NewWithT(t)
		state := &State{QuorumProven: true, LeaderID: 1, Members: []MemberStatus{member(1, false), member(2, true), member(3, true)}}
		(&Cluster{Connector: fakeMetrics{}}).markAlive(ctx, state, []uint64{0, 1, 1})
		g.Expect(state.ByName("n1").Healthy).To(BeTrue())
		g.Expect(state.ByName("n1").Note).To(ContainSubstring("it leads (2 reachable member(s) follow it"))
	})
	t.Run("a leader not named by every reachable member is not known alive by leading", func(t *testing.T) {
		g := NewWithT(t)
		state := &State{QuorumProven: true, LeaderID: 1, Members: []MemberStatus{member(1, false), member(2, true), member(3, true)}}
		(&Cluster{Connector: fakeMetrics{}}).markAlive(ctx, state, []uint64{0, 1, 3})
		g.Expect(state.ByName("n1").Up()).To(BeFalse())
	})
}
