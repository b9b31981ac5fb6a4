package etcdutil

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	ctrl "sigs.k8s.io/controller-runtime"
)

// A voting member that cannot be reached through its node (its kubelet stopped, the port-forward
// refused) may still run and vote: its etcd is a static pod, which the kubelet does not stop. Counting
// it down makes a remediation remove a live voter before its replacement exists. markAlive asks etcd
// itself instead, in two ways:
//
//   - The leader (leaderAlive): the member list was just read linearizably, which etcd serves only
//     through a leader that has confirmed its leadership with a quorum (ReadIndex), and every reachable
//     member that knows a leader names it. A dead leader stops being named within an election timeout
//     and linearizable reads fail until a new one is elected. This is the case of a Machine whose
//     kubelet died under a running leader (CAPI #8465, #12711).
//   - Any voter, from what its peers see of it (peersSeeAlive): each member's raft transport keeps a
//     status per peer and exports it as the gauge etcd_network_active_peers{Local,Remote} (rafthttp
//     peer_status.go, metrics.go): 1 from when a stream or the pipeline to the peer connects, 0 when
//     one fails. A dead process fails them at once (the stream's connection is closed and the redial,
//     every 100 ms, is refused); a peer that stops answering (a node powered off, a black hole) fails
//     the stream reader at its read timeout (rafthttp ConnReadTimeout, 5 s; link heartbeats every third
//     of it keep a live stream busy). A "connected" seen is therefore at most about 5 s stale. etcd
//     serves /metrics on its client port (MetricsConnector), so it is read the way the member is
//     reached.
//
// Either way the member counts as voting (Healthy, or Votes when alarmed) and stays not Reachable:
// nothing can be sent to it. Both are read only when State.QuorumProven: a member's view of a
// cluster without a quorum-backed leader says nothing about who votes in it.

// activePeersMetric is the gauge of rafthttp's peer status, labelled Local (the exporting member's ID)
// and Remote (the peer's ID), both as types.ID.String(): hexadecimal.
const activePeersMetric = "etcd_network_active_peers"

// errNoMetrics is the error of a Connector that cannot read metrics.
var errNoMetrics = errors.New("the etcd connector cannot read metrics")

// markAlive counts as alive the unreachable voting members that etcd shows running (see above).
func (c *Cluster) markAlive(ctx context.Context, state *State, leaders []uint64) {
	if !state.QuorumProven {
		return
	}
	if leader, followers := leaderAlive(state, leaders); leader != nil {
		setAlive(leader, fmt.Sprintf("unreachable through its node, but alive: it leads (%d reachable member(s) follow it, a linearizable read just passed through it)", followers))
	}
	var unknown []*MemberStatus
	for i := range state.Members {
		if m := &state.Members[i]; unreachable(*m) && !m.Up() {
			unknown = append(unknown, m)
		}
	}
	if len(unknown) == 0 {
		return
	}
	views := map[uint64]map[uint64]bool{} // none read: a Connector without metrics knows nothing more
	if mc, ok := c.Connector.(MetricsConnector); ok {
		views = c.peerViews(ctx, mc, observers(state))
	}
	for _, m := range unknown {
		alive, why := peersSeeAlive(state, views, m.ID)
		if alive {
			setAlive(m, fmt.Sprintf("unreachable through its node, but alive: %s see its raft streams connected (with it a quorum of the voters)", why))
		} else {
			m.Problem += " (" + why + ")"
		}
	}
}

// setAlive counts m as a running voter known alive by note: healthy, or voting with its alarms.
func setAlive(m *MemberStatus, note string) {
	m.Votes, m.Note = true, note
	if len(m.Alarms) > 0 {
		m.Problem = "alarmed (" + strings.Join(m.Alarms, ",") + ")"
		return
	}
	m.Healthy, m.Problem = true, ""
}

// leaderAlive returns the unreachable leader and how many reachable members follow it, when every
// reachable member that knows a leader names it (nil otherwise).
func leaderAlive(state *State, leaders []uint64) (*MemberStatus, int) {
	leader := state.ByID(state.LeaderID)
	if state.LeaderID == 0 || leader == nil || !unreachable(*leader) {
		return nil, 0
	}
	followers := 0
	for i, m := range state.Members {
		if !m.Reachable || leaders[i] == 0 {
			continue
		}
		if leaders[i] != state.LeaderID {
			return nil, 0
		}
		followers++
	}
	if followers == 0 {
		return nil, 0
	}
	return leader, followers
}

// observers are the members whose view of their peers is asked: reachable voters that follow a
// leader (Up). A reachable member without a leader is cut off itself; its view is not of the side
// that holds the quorum, and it is not asked.
func observers(state *State) []MemberStatus {
	var out []MemberStatus
	for _, m := range state.Members {
		if m.Reachable && m.Up() {
			out = append(out, m)
		}
	}
	return out
}

// peerViews reads, in parallel and each within CallTimeout, what every observer sees of its peers:
// observer ID → peer ID → connected. An observer whose metrics cannot be read or parsed is left out.
func (c *Cluster) peerViews(ctx context.Context, mc MetricsConnector, obs []MemberStatus) map[uint64]map[uint64]bool {
	views := make([]map[uint64]bool, len(obs))
	var wg sync.WaitGroup
	for i, o := range obs {
		wg.Go(func() {
			cctx, cancel := c.callCtx(ctx)
			defer cancel()
			body, err := mc.Metrics(cctx, o.Name)
			if err == nil {
				views[i], err = activePeers(body, o.ID)
			}
			if err != nil {
				ctrl.LoggerFrom(ctx).V(4).Info("Could not read what an etcd member sees of its peers", "node", o.Name, "err", err.Error())
			}
		})
	}
	wg.Wait()
	out := map[uint64]map[uint64]bool{}
	for i, v := range views {
		if v != nil {
			out[obs[i].ID] = v
		}
	}
	return out
}

// peersSeeAlive decides from the observers' views (peerViews) whether the unreachable voter id runs
// and votes. It does when
//
//   - every observer whose view was read sees it connected: one that does not is evidence of a dead or
//     cut-off member, and the stale direction of the gauge is "connected", so it outweighs any number
//     that do;
//   - the leader, when it is an observer, is among them: its streams carry the member's appends and
//     heartbeats, so its view says whether the member follows it;
//   - those observers and the member make a quorum of the voters: under a network split the member is
//     then on the side that holds the quorum, not in a minority island that one observer happens to
//     reach. With 3 voters one observer is enough (2 of 3), with 5 two.
//
// A view that could not be read leaves the member unknown, never alive. What this cannot see: with
// the leader itself unreachable, a member connected to the observers but cut off from the leader
// alone (a partition that is not transitive) counts alive.
//
// It returns the observers that see the member connected when it is alive, else why it is not known
// alive.
func peersSeeAlive(state *State, views map[uint64]map[uint64]bool, id uint64) (bool, string) {
	var seen, down []string
	leaderUnread := false
	for _, o := range observers(state) {
		view, read := views[o.ID]
		switch {
		case !read:
			leaderUnread = leaderUnread || o.ID == state.LeaderID
		case view[id]:
			seen = append(seen, o.Name)
		default:
			down = append(down, o.Name)
		}
	}
	sort.Strings(seen)
	sort.Strings(down)
	quorum := Quorum(state.Counts().Voting)
	switch {
	case len(down) > 0:
		return false, "no raft connection to it from " + strings.Join(down, ", ")
	case len(seen) == 0:
		return false, "its peers' view of it could not be read"
	case leaderUnread:
		return false, "the leader's view of it could not be read"
	case len(seen)+1 < quorum:
		return false, fmt.Sprintf("connected to %s only: with it fewer than the quorum of %d", strings.Join(seen, ", "), quorum)
	}
	return true, strings.Join(seen, ", ")
}

// activePeers reads, from the metrics of the member with ID local (Prometheus text format), whether
// its raft transport is connected to each peer it has a status for (etcd_network_active_peers > 0).
// A peer it never connected to has no series and is absent (not connected). Metrics with no series
// of local at all are an error: a member of a cluster of several has connected to a peer once, so they
// are not that member's.
func activePeers(metrics []byte, local uint64) (map[uint64]bool, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(metrics))
	if err != nil {
		return nil, fmt.Errorf("parsing the metrics of etcd member %x: %w", local, err)
	}
	out := map[uint64]bool{}
	found := false
	for _, m := range families[activePeersMetric].GetMetric() {
		var localLabel, remoteLabel string
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "Local":
				localLabel = l.GetValue()
			case "Remote":
				remoteLabel = l.GetValue()
			}
		}
		from, err := strconv.ParseUint(localLabel, 16, 64)
		if err != nil {
			return nil, fmt.Errorf("metric %s of etcd member %x: label Local %q is not a member ID", activePeersMetric, local, localLabel)
		}
		if from != local {
			continue
		}
		to, err := strconv.ParseUint(remoteLabel, 16, 64)
		if err != nil {
			return nil, fmt.Errorf("metric %s of etcd member %x: label Remote %q is not a member ID", activePeersMetric, local, remoteLabel)
		}
		value := m.GetGauge().GetValue()
		if m.Gauge == nil {
			value = m.GetUntyped().GetValue()
		}
		found = true
		out[to] = out[to] || value > 0
	}
	if !found {
		return nil, fmt.Errorf("the metrics of etcd member %x have no %s of that member", local, activePeersMetric)
	}
	return out, nil
}
