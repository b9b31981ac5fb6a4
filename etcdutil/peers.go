package etcdutil

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

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
//   - A follower, from what the leader receives from it (heardFrom): a follower answers every
//     heartbeat of the leader (raft MsgHeartbeatResp, every --heartbeat-interval, 100 ms by default),
//     and the leader counts the bytes of every message it decodes per sender in the counter
//     etcd_network_peer_received_bytes_total{From} (rafthttp stream.go decodeLoop, metrics.go). The
//     counter grows only while the follower's process runs and its messages reach the leader: it
//     stops for a dead process, a frozen one (docker pause, SIGSTOP) and a black-holed node alike.
//     It is read twice or more, LivenessWindow apart at most. Only the leader hears its followers
//     (followers exchange only link heartbeats, counted without a sender), so with the leader itself
//     unreachable a follower is not known alive.
//
// The gauge etcd_network_active_peers, which each member keeps per peer, is not used: a frozen peer's
// kernel keeps its connections open and accepts writes, and the gauge stayed 1 for a frozen member
// (test/integration/etcdutil TestInspectFrozenFollowerBehindAStoppedKubeletIsNotUp; on kind, a paused
// node's member was taken for healthy).
//
// Either way the member counts as voting (Healthy, or Votes when alarmed) and stays not Reachable:
// nothing can be sent to it. Both are read only when State.QuorumProven: a member's view of a
// cluster without a quorum-backed leader says nothing about who votes in it. A read that fails leaves
// the member unknown, never alive.

// receivedBytesMetric is the counter of the bytes a member's raft transport decoded from each peer,
// labelled From: the sender's ID as types.ID.String(), hexadecimal ("0" for link heartbeats).
const receivedBytesMetric = "etcd_network_peer_received_bytes_total"

// DefaultLivenessWindow is how long the leader is watched for messages from an unreachable follower.
// It must exceed the cluster's --heartbeat-interval (kubeadm's default: 100 ms) by enough to absorb
// a loaded node; etcd's own default election timeout, after which raft's CheckQuorum counts a silent
// follower inactive, is 1 s.
const DefaultLivenessWindow = 2 * time.Second

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
	leader := state.ByID(state.LeaderID)
	if leader == nil || !leader.Reachable {
		for _, m := range unknown {
			if m.ID != state.LeaderID {
				m.Problem += " (only the leader hears from its followers, and it cannot be asked)"
			}
		}
		return
	}
	ids := make([]uint64, 0, len(unknown))
	for _, m := range unknown {
		ids = append(ids, m.ID)
	}
	window := orDuration(c.LivenessWindow, DefaultLivenessWindow)
	heard, err := c.heardFrom(ctx, leader.Name, ids, window)
	if err != nil {
		ctrl.LoggerFrom(ctx).V(4).Info("Could not watch what the etcd leader receives from its followers", "node", leader.Name, "err", err.Error())
	}
	for _, m := range unknown {
		switch {
		case heard[m.ID]:
			setAlive(m, fmt.Sprintf("unreachable through its node, but alive: the leader %s received its raft messages within %s", leader.Name, window))
		case err != nil:
			m.Problem += fmt.Sprintf(" (what the leader %s receives from it could not be read)", leader.Name)
		default:
			m.Problem += fmt.Sprintf(" (the leader %s received nothing from it in %s)", leader.Name, window)
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

// heardFrom watches the bytes the leader on node has received from each of the followers ids, and
// returns those whose count grew within window of a first reading. It reads the leader's metrics (the
// first time within the call timeout), then every window/4 until each has grown or the window is
// over, every later read cut at the window's end: a live follower answers within a heartbeat
// interval, so it is known at the first reading after that, and only a silent one costs the window.
// A later read that fails is tried again at the next tick. It is an error when the first read
// fails, or when ctx ends before the window does: the watch was then too short to say anything of
// the followers not heard.
func (c *Cluster) heardFrom(ctx context.Context, node string, ids []uint64, window time.Duration) (map[uint64]bool, error) {
	mc, ok := c.Connector.(MetricsConnector)
	if !ok {
		return nil, errNoMetrics
	}
	read := func(ctx context.Context) (map[uint64]float64, error) {
		cctx, cancel := c.callCtx(ctx)
		defer cancel()
		body, err := mc.Metrics(cctx, node)
		if err != nil {
			return nil, err
		}
		return receivedBytes(body)
	}
	first, err := read(ctx)
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, window)
	defer cancel()
	tick := time.NewTicker(max(window/4, time.Millisecond))
	defer tick.Stop()
	heard := map[uint64]bool{}
	for len(heard) < len(ids) {
		select {
		case <-wctx.Done():
			if ctx.Err() != nil {
				return heard, fmt.Errorf("watching what the etcd leader on %s receives: %w", node, context.Cause(ctx))
			}
			return heard, nil
		case <-tick.C:
		}
		now, err := read(wctx)
		if err != nil {
			continue
		}
		for _, id := range ids {
			if now[id] > first[id] {
				heard[id] = true
			}
		}
	}
	return heard, nil
}

// receivedBytes reads, from a member's metrics (Prometheus text format), the bytes its raft transport
// has received from each peer (etcd_network_peer_received_bytes_total by From). Link heartbeats,
// counted under From "0", name no sender and are left out. Metrics without the counter are an error:
// a member of a cluster of several has received from a peer once.
func receivedBytes(metrics []byte) (map[uint64]float64, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(metrics))
	if err != nil {
		return nil, fmt.Errorf("parsing etcd metrics: %w", err)
	}
	family, ok := families[receivedBytesMetric]
	if !ok {
		return nil, fmt.Errorf("the etcd metrics have no %s", receivedBytesMetric)
	}
	out := map[uint64]float64{}
	for _, m := range family.GetMetric() {
		var from string
		for _, l := range m.GetLabel() {
			if l.GetName() == "From" {
				from = l.GetValue()
			}
		}
		id, err := strconv.ParseUint(from, 16, 64)
		if err != nil {
			return nil, fmt.Errorf("metric %s: label From %q is not a member ID", receivedBytesMetric, from)
		}
		if id == 0 {
			continue
		}
		value := m.GetCounter().GetValue()
		if m.Counter == nil {
			value = m.GetUntyped().GetValue()
		}
		out[id] = value
	}
	return out, nil
}
