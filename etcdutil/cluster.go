package etcdutil

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// MemberStatus is one etcd member as seen now.
type MemberStatus struct {
	ID        uint64
	Name      string
	PeerURLs  []string
	IsLearner bool
	// Reachable is true when the member answered Status through its own node.
	Reachable bool
	// Alarms are the alarms raised for this member (NOSPACE, CORRUPT).
	Alarms []string
	// Healthy is true for a reachable, unalarmed member that knows a leader.
	Healthy bool
	// Problem says why the member is not healthy ("" when healthy).
	Problem string
}

// State is a fresh view of an etcd cluster: the member list plus each member's status.
type State struct {
	ClusterID uint64
	LeaderID  uint64
	Members   []MemberStatus
	// Serializable is true when no member could serve a linearizable member list (no quorum), so the
	// list is one member's local view.
	Serializable bool
}

// ByName returns the member with the given name (= node name), or nil.
func (s *State) ByName(name string) *MemberStatus {
	for i := range s.Members {
		if s.Members[i].Name == name {
			return &s.Members[i]
		}
	}
	return nil
}

// ByID returns the member with the given ID, or nil.
func (s *State) ByID(id uint64) *MemberStatus {
	for i := range s.Members {
		if s.Members[i].ID == id {
			return &s.Members[i]
		}
	}
	return nil
}

// Counts summarises the state for the quorum math.
func (s *State) Counts() Counts {
	var c Counts
	for _, m := range s.Members {
		switch {
		case m.IsLearner:
			c.Learners++
		default:
			c.Voting++
			if m.Healthy {
				c.Healthy++
			}
		}
	}
	return c
}

// Unhealthy lists the voting members that are not healthy, as "name (problem)".
func (s *State) Unhealthy() []string {
	var out []string
	for _, m := range s.Members {
		if !m.IsLearner && !m.Healthy {
			out = append(out, fmt.Sprintf("%s (%s)", orDefault(m.Name, fmt.Sprintf("%x", m.ID)), m.Problem))
		}
	}
	return out
}

// Table renders the members as a small text table (for events, logs and the demo).
func (s *State) Table() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-28s %-17s %-8s %-8s %s\n", "MEMBER", "ID", "ROLE", "HEALTH", "NOTE")
	members := append([]MemberStatus(nil), s.Members...)
	sort.Slice(members, func(i, j int) bool { return members[i].Name < members[j].Name })
	for _, m := range members {
		role := "voter"
		if m.IsLearner {
			role = "learner"
		}
		if m.ID == s.LeaderID {
			role = "LEADER"
		}
		health := "healthy"
		if !m.Healthy {
			health = "DOWN"
		}
		fmt.Fprintf(&b, "%-28s %-17x %-8s %-8s %s\n", orDefault(m.Name, "(unstarted)"), m.ID, role, health, m.Problem)
	}
	return b.String()
}

// Cluster performs membership operations on one etcd cluster. Every call is bounded by CallTimeout.
type Cluster struct {
	Connector   Connector
	CallTimeout time.Duration
}

func (c *Cluster) callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeoutCause(ctx, orDuration(c.CallTimeout, DefaultCallTimeout), errors.New("etcd call timeout expired"))
}

// connectAny connects to the first of nodes that answers a member list, and returns the list.
func (c *Cluster) connectAny(ctx context.Context, nodes []string, serializable bool) (*clientv3.Client, *clientv3.MemberListResponse, error) {
	var errs []error
	for _, node := range nodes {
		cli, err := c.Connector.Connect(ctx, node)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		cctx, cancel := c.callCtx(ctx)
		var opts []clientv3.OpOption
		if serializable {
			opts = append(opts, clientv3.WithSerializable())
		}
		resp, err := cli.MemberList(cctx, opts...)
		cancel()
		if err != nil {
			_ = cli.Close()
			errs = append(errs, fmt.Errorf("member list through node %s: %w", node, err))
			continue
		}
		return cli, resp, nil
	}
	if len(errs) == 0 {
		return nil, nil, errors.New("no node to reach etcd through")
	}
	return nil, nil, fmt.Errorf("no etcd member could be reached: %w", errors.Join(errs...))
}

// Inspect reads the member list (through the first of nodes that answers) and the status of every
// member through its own node. When no member can serve a linearizable list (quorum lost), the list
// is read serializably so that the state still says which members are down.
func (c *Cluster) Inspect(ctx context.Context, nodes []string) (*State, error) {
	cli, list, err := c.connectAny(ctx, nodes, false)
	state := &State{}
	if err != nil {
		var serr error
		cli, list, serr = c.connectAny(ctx, nodes, true)
		if serr != nil {
			return nil, err
		}
		state.Serializable = true
	}
	defer func() { _ = cli.Close() }()
	state.ClusterID = list.Header.GetClusterId()

	alarms := map[uint64][]string{}
	if !state.Serializable {
		actx, cancel := c.callCtx(ctx)
		if resp, err := cli.AlarmList(actx); err == nil {
			for _, a := range resp.Alarms {
				if a.Alarm != pb.AlarmType_NONE {
					alarms[a.MemberID] = append(alarms[a.MemberID], a.Alarm.String())
				}
			}
		}
		cancel()
	}

	state.Members = make([]MemberStatus, len(list.Members))
	leaders := make([]uint64, len(list.Members))
	var wg sync.WaitGroup
	for i, m := range list.Members {
		state.Members[i] = MemberStatus{ID: m.ID, Name: m.Name, PeerURLs: m.PeerURLs, IsLearner: m.IsLearner, Alarms: alarms[m.ID]}
		wg.Go(func() {
			leaders[i] = c.probe(ctx, &state.Members[i])
		})
	}
	wg.Wait()
	state.LeaderID = electedLeader(state.Members, leaders)
	return state, nil
}

// probe fills Reachable/Healthy/Problem of one member and returns the leader it reports.
func (c *Cluster) probe(ctx context.Context, m *MemberStatus) uint64 {
	if m.Name == "" {
		m.Problem = "not started"
		return 0
	}
	cli, err := c.Connector.Connect(ctx, m.Name)
	if err != nil {
		m.Problem = "unreachable"
		return 0
	}
	defer func() { _ = cli.Close() }()
	sctx, cancel := c.callCtx(ctx)
	defer cancel()
	st, err := cli.Status(sctx, cli.Endpoints()[0])
	if err != nil {
		m.Problem = "unreachable"
		return 0
	}
	m.Reachable = true
	// Every member reports the cluster's alarms in its errors; alarms are attributed to the member
	// they were raised for (AlarmList), so only other errors count here.
	var errs []string
	for _, e := range st.Errors {
		if !strings.Contains(e, "alarm:") {
			errs = append(errs, e)
		}
	}
	switch {
	case len(m.Alarms) > 0:
		m.Problem = "alarmed (" + strings.Join(m.Alarms, ",") + ")"
	case len(errs) > 0:
		m.Problem = "reports errors: " + strings.Join(errs, "; ")
	case st.Leader == 0:
		m.Problem = "has no leader"
	case m.IsLearner:
		m.Problem = "a learner"
	default:
		m.Healthy = true
	}
	return st.Leader
}

// electedLeader is the leader a member reports about itself, else the one most members report.
func electedLeader(members []MemberStatus, leaders []uint64) uint64 {
	votes := map[uint64]int{}
	for i, l := range leaders {
		if l != 0 && l == members[i].ID {
			return l
		}
		if l != 0 {
			votes[l]++
		}
	}
	var best uint64
	for l, n := range votes {
		if n > votes[best] {
			best = l
		}
	}
	return best
}

// MoveLeader transfers leadership from the member on leaderNode to the member with ID to. etcd only
// accepts this from the current leader, so it must be reachable.
func (c *Cluster) MoveLeader(ctx context.Context, leaderNode string, to uint64) error {
	cli, err := c.Connector.Connect(ctx, leaderNode)
	if err != nil {
		return fmt.Errorf("reaching the leader on node %s: %w", leaderNode, err)
	}
	defer func() { _ = cli.Close() }()
	cctx, cancel := c.callCtx(ctx)
	defer cancel()
	if _, err := cli.MoveLeader(cctx, to); err != nil {
		return fmt.Errorf("moving etcd leadership from %s to %x: %w", leaderNode, to, err)
	}
	return nil
}

// ErrLastMember is returned when asked to remove the only member of a cluster.
var ErrLastMember = errors.New("refusing to remove the last etcd member")

// RemoveMember removes the member with ID id through the first of via that answers. A member that
// is already gone is success (the call is idempotent); the last member is never removed.
func (c *Cluster) RemoveMember(ctx context.Context, id uint64, via []string) error {
	cli, list, err := c.connectAny(ctx, via, false)
	if err != nil {
		return err
	}
	defer func() { _ = cli.Close() }()
	found := false
	for _, m := range list.Members {
		found = found || m.ID == id
	}
	if !found {
		return nil
	}
	if len(list.Members) == 1 {
		return ErrLastMember
	}
	cctx, cancel := c.callCtx(ctx)
	defer cancel()
	if _, err := cli.MemberRemove(cctx, id); err != nil {
		if strings.Contains(err.Error(), "member not found") {
			return nil
		}
		return fmt.Errorf("removing etcd member %x: %w", id, err)
	}
	return nil
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}
