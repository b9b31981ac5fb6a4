package etcdutil

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/capr-io/capr/metrics"
)

// MemberStatus is one etcd member as seen now.
type MemberStatus struct {
	ID        uint64
	Name      string
	PeerURLs  []string
	IsLearner bool
	// Reachable is true when the member answered Status through its own node. A member that is not
	// reachable is unknown, not dead: its kubelet or node may be down while etcd runs. Inspect counts
	// it alive (Healthy or Votes, with a Note) when etcd shows that it runs (markAlive, peers.go).
	Reachable bool
	// Alarms are the alarms raised for this member (NOSPACE, CORRUPT), from AlarmList.
	Alarms []string
	// Healthy is true for a reachable, unalarmed member that knows a leader.
	Healthy bool
	// Votes is true for a voting member that runs and follows a leader: a healthy one, or one whose
	// only problem is an alarm. etcd applies an alarm to requests (NOSPACE refuses writes, CORRUPT
	// everything; server/etcdserver/apply), not to raft: the alarmed member still votes, so the quorum
	// math counts it (Counts.Healthy, through Up) while the health check still reports its Problem.
	Votes bool
	// Problem says why the member is not healthy ("" when healthy). An unreachable member not known
	// alive has "unreachable", followed by why etcd does not show it alive (markAlive).
	Problem string
	// Note says how a member that could not be reached is known to be alive ("" otherwise).
	Note string
}

// Up reports whether the member is a voter that runs and follows a leader (Healthy or Votes): the
// members the quorum math counts as healthy (Counts.Healthy, quorum.Victim.Healthy).
func (m *MemberStatus) Up() bool {
	return !m.IsLearner && (m.Healthy || m.Votes)
}

// State is a fresh view of an etcd cluster: the member list plus each member's status.
type State struct {
	ClusterID uint64
	LeaderID  uint64
	Members   []MemberStatus
	// QuorumProven is true when the member list was read linearizably: etcd serves that only through
	// a leader backed by a quorum, so quorum exists even when members cannot be reached.
	QuorumProven bool
	// Serializable is true when no member could serve a linearizable member list, so the list is one
	// member's local view. It is not authoritative: Counts carries the flag and the quorum math
	// (etcdutil/quorum) refuses every membership change on it.
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
	c := Counts{QuorumProven: s.QuorumProven, Serializable: s.Serializable}
	for _, m := range s.Members {
		switch {
		case m.IsLearner:
			c.Learners++
		default:
			c.Voting++
			if m.Up() {
				c.Healthy++
			}
			if unreachable(m) {
				c.Unreachable++
			}
		}
	}
	return c
}

// unreachable is a started voting member that could not be asked.
func unreachable(m MemberStatus) bool {
	return !m.IsLearner && m.Name != "" && !m.Reachable
}

// UnreachableNames lists the voting members that could not be reached (unknown, not proven down).
func (s *State) UnreachableNames() []string {
	var out []string
	for _, m := range s.Members {
		if unreachable(m) {
			out = append(out, m.Name)
		}
	}
	sort.Strings(out)
	return out
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
		switch {
		case !m.Healthy && m.Up():
			health = "ALARMED"
		case !m.Healthy:
			health = "DOWN"
		}
		fmt.Fprintf(&b, "%-28s %-17x %-8s %-8s %s\n", orDefault(m.Name, "(unstarted)"), m.ID, role, health, orDefault(m.Problem, m.Note))
	}
	return b.String()
}

// Cluster performs membership operations on one etcd cluster. Every call is bounded by CallTimeout,
// every dial by the Connector's dial timeout, and an Inspect as a whole by InspectTimeout.
type Cluster struct {
	Connector   Connector
	CallTimeout time.Duration
	// InspectTimeout bounds one Inspect: members are dialled and asked in parallel, so one Inspect
	// takes about one dial plus two calls even when members are unreachable (default 3×CallTimeout).
	InspectTimeout time.Duration
	// LivenessWindow is how long the leader is watched for messages from a voter that cannot be
	// reached through its node, before it is left unknown (peers.go; default DefaultLivenessWindow).
	LivenessWindow time.Duration
}

func (c *Cluster) callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeoutCause(ctx, orDuration(c.CallTimeout, DefaultCallTimeout), errors.New("etcd call timeout expired"))
}

// release hands a client back: a shared client is kept unless its call failed, any other is closed.
func (c *Cluster) release(node string, cli *clientv3.Client, failed bool) {
	if shared, ok := c.Connector.(SharedConnector); ok {
		if failed {
			shared.Discard(node, cli)
		}
		return
	}
	_ = cli.Close()
}

// dials connects to each node at most once per operation (a node that did not answer is not dialled
// again), concurrently; get waits for the node's dial.
type dials struct {
	c       *Cluster
	ctx     context.Context
	mu      sync.Mutex
	results map[string]*dialResult
}

type dialResult struct {
	done chan struct{}
	cli  *clientv3.Client
	err  error
	// failed records that a call through cli failed, so the client is discarded at the end.
	failed bool
}

func (c *Cluster) newDials(ctx context.Context) *dials {
	return &dials{c: c, ctx: ctx, results: map[string]*dialResult{}}
}

// start begins dialling node (once) and returns its pending result.
func (d *dials) start(node string) *dialResult {
	d.mu.Lock()
	defer d.mu.Unlock()
	if r, ok := d.results[node]; ok {
		return r
	}
	r := &dialResult{done: make(chan struct{})}
	d.results[node] = r
	go func() {
		defer close(r.done)
		r.cli, r.err = d.c.Connector.Connect(d.ctx, node)
		if r.err != nil {
			r.err = fmt.Errorf("reaching the etcd member on node %s: %w", node, r.err)
		}
	}()
	return r
}

func (d *dials) get(node string) (*clientv3.Client, error) {
	r := d.start(node)
	<-r.done
	return r.cli, r.err
}

// fail marks the client of node as failed: it is discarded (shared) at close.
func (d *dials) fail(node string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if r, ok := d.results[node]; ok {
		r.failed = true
	}
}

// close releases every client, each once its dial is done. It does not wait for dials still
// pending: memberList dials every node at once, and a node whose member is gone or dead (the victim's,
// while its Machine exists) answers only at the dial timeout, which every operation would otherwise
// wait for although it never needed that node (each Inspect of a cluster with a dead
// member took the whole dial timeout). The operation's context ends right after close, which ends
// such a dial; its client, if any, is released then.
func (d *dials) close() {
	d.mu.Lock()
	results := maps.Clone(d.results)
	d.mu.Unlock()
	for node, r := range results {
		release := func() {
			d.mu.Lock()
			failed := r.failed
			d.mu.Unlock()
			if r.cli != nil {
				d.c.release(node, r.cli, failed)
			}
		}
		select {
		case <-r.done:
			release()
		default:
			go func() {
				<-r.done
				release()
			}()
		}
	}
}

// memberList reads the member list through the first of nodes that answers. All nodes are dialled and
// asked at once; linearizable (serializable=false) lists only come from a member that has quorum.
func (d *dials) memberList(ctx context.Context, nodes []string, serializable bool) (string, *clientv3.MemberListResponse, error) {
	if len(nodes) == 0 {
		return "", nil, errors.New("no node to reach etcd through")
	}
	type answer struct {
		node string
		resp *clientv3.MemberListResponse
		err  error
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	answers := make(chan answer, len(nodes))
	for _, node := range nodes {
		d.start(node)
		go func() {
			cli, err := d.get(node)
			if err != nil {
				answers <- answer{node: node, err: err}
				return
			}
			cctx, ccancel := d.c.callCtx(ctx)
			defer ccancel()
			var opts []clientv3.OpOption
			if serializable {
				opts = append(opts, clientv3.WithSerializable())
			}
			resp, err := cli.MemberList(cctx, opts...)
			if err != nil {
				err = fmt.Errorf("member list through node %s: %w", node, err)
			}
			answers <- answer{node: node, resp: resp, err: err}
		}()
	}
	var errs []error
	for range nodes {
		a := <-answers
		if a.err == nil {
			return a.node, a.resp, nil
		}
		errs = append(errs, a.err)
	}
	return "", nil, fmt.Errorf("no etcd member could be reached: %w", errors.Join(errs...))
}

// Inspect reads the member list and the status of every member through its own node. All members
// are dialled and asked in parallel, each at most once, within InspectTimeout. The list is read
// linearizably when any member can serve it (State.QuorumProven); otherwise serializably, so that
// the state still says which members are down, marked State.Serializable (not authoritative). When
// a voting member cannot be reached, etcd is asked whether it runs (markAlive: the leader's
// metrics, watched for up to LivenessWindow), within the same InspectTimeout.
func (c *Cluster) Inspect(ctx context.Context, nodes []string) (_ *State, err error) {
	defer observe("inspect", time.Now(), &err)
	ctx, cancel := context.WithTimeoutCause(ctx, orDuration(c.InspectTimeout, 3*orDuration(c.CallTimeout, DefaultCallTimeout)),
		errors.New("etcd inspection timeout expired"))
	defer cancel()
	d := c.newDials(ctx)
	defer d.close()

	state := &State{QuorumProven: true}
	via, list, err := d.memberList(ctx, nodes, false)
	if err != nil {
		var serr error
		via, list, serr = d.memberList(ctx, nodes, true)
		if serr != nil {
			return nil, err
		}
		state.QuorumProven, state.Serializable = false, true
	}
	state.ClusterID = list.Header.GetClusterId()

	alarms := map[uint64][]string{}
	if state.QuorumProven {
		cli, _ := d.get(via)
		actx, acancel := c.callCtx(ctx)
		resp, err := cli.AlarmList(actx)
		acancel()
		if err != nil {
			d.fail(via)
			return nil, fmt.Errorf("listing etcd alarms through node %s: %w", via, err)
		}
		for _, a := range resp.Alarms {
			if a.Alarm != pb.AlarmType_NONE {
				alarms[a.MemberID] = append(alarms[a.MemberID], a.Alarm.String())
			}
		}
	}

	state.Members = make([]MemberStatus, len(list.Members))
	leaders := make([]uint64, len(list.Members))
	var wg sync.WaitGroup
	for i, m := range list.Members {
		state.Members[i] = MemberStatus{ID: m.ID, Name: m.Name, PeerURLs: m.PeerURLs, IsLearner: m.IsLearner, Alarms: alarms[m.ID]}
		wg.Go(func() {
			leaders[i] = c.probe(ctx, d, &state.Members[i])
		})
	}
	wg.Wait()
	state.LeaderID = electedLeader(state.Members, leaders)
	c.markAlive(ctx, state, leaders)
	return state, nil
}

// probe fills Reachable/Healthy/Problem of one member and returns the leader it reports. Health is
// decided from Status (a leader known) and the alarms from AlarmList; Status.Errors is meant for
// humans (KCP relies on alarms only, controlplane/kubeadm/pkg/etcd newEtcdClient) and is not read.
func (c *Cluster) probe(ctx context.Context, d *dials, m *MemberStatus) uint64 {
	if m.Name == "" {
		m.Problem = "not started"
		return 0
	}
	cli, err := d.get(m.Name)
	if err != nil {
		m.Problem = "unreachable"
		return 0
	}
	sctx, cancel := c.callCtx(ctx)
	defer cancel()
	st, err := cli.Status(sctx, cli.Endpoints()[0])
	if err != nil {
		d.fail(m.Name)
		m.Problem = "unreachable"
		return 0
	}
	m.Reachable = true
	switch {
	case len(m.Alarms) > 0:
		m.Problem = "alarmed (" + strings.Join(m.Alarms, ",") + ")"
		m.Votes = st.Leader != 0 && !m.IsLearner
	case st.Leader == 0:
		m.Problem = "has no leader"
	case m.IsLearner:
		m.Problem = "a learner"
	default:
		m.Healthy, m.Votes = true, true
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
func (c *Cluster) MoveLeader(ctx context.Context, leaderNode string, to uint64) (err error) {
	defer observe("move_leader", time.Now(), &err)
	cli, err := c.Connector.Connect(ctx, leaderNode)
	if err != nil {
		return fmt.Errorf("reaching the leader on node %s: %w", leaderNode, err)
	}
	cctx, cancel := c.callCtx(ctx)
	defer cancel()
	_, err = cli.MoveLeader(cctx, to)
	c.release(leaderNode, cli, err != nil)
	if err != nil {
		return fmt.Errorf("moving etcd leadership from %s to %x: %w", leaderNode, to, err)
	}
	return nil
}

// ErrLastMember is returned when asked to remove the only member of a cluster.
var ErrLastMember = errors.New("refusing to remove the last etcd member")

// RemoveMember removes the member with ID id through the first of via that answers a linearizable
// member list. A member that is already gone is success (the call is idempotent); the last member is
// never removed.
//
// If that member refuses with "unhealthy cluster" (rpctypes.ErrUnhealthy), the removal is asked
// through the other nodes of via, in via's order. Each member judges that by its own connections:
// etcd's mayRemoveMember (server/etcdserver/server.go, strict reconfiguration check) counts the
// voters it has been connected to for HealthInterval (5 s). A member that joined moments ago (a
// replacement, promoted as soon as it caught up) has no connection that old and refuses every
// removal of a live member, while a member that was there before it sees the others connected and
// accepts; which of them answered the list first is chance. Any other error ends the call.
func (c *Cluster) RemoveMember(ctx context.Context, id uint64, via []string) (err error) {
	defer observe("remove_member", time.Now(), &err)
	d := c.newDials(ctx)
	defer d.close()
	node, list, err := d.memberList(ctx, via, false)
	if err != nil {
		return err
	}
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
	var refusals []error
	for _, n := range append([]string{node}, slices.DeleteFunc(slices.Clone(via), func(v string) bool { return v == node })...) {
		cli, derr := d.get(n)
		if derr != nil {
			refusals = append(refusals, derr)
			continue
		}
		err := c.removeThrough(ctx, d, n, cli, id)
		if err == nil || !errors.Is(err, rpctypes.ErrUnhealthy) {
			return err
		}
		refusals = append(refusals, err)
	}
	return errors.Join(refusals...)
}

// removeThrough asks the member on node to remove member id; already gone is success.
func (c *Cluster) removeThrough(ctx context.Context, d *dials, node string, cli *clientv3.Client, id uint64) error {
	cctx, cancel := c.callCtx(ctx)
	defer cancel()
	if _, err := cli.MemberRemove(cctx, id); err != nil {
		// etcd answers rpctypes.ErrGRPCMemberNotFound; the client turns it into rpctypes.ErrMemberNotFound
		// (clientv3.ContextError → rpctypes.Error).
		if errors.Is(err, rpctypes.ErrMemberNotFound) {
			return nil
		}
		if !errors.Is(err, rpctypes.ErrUnhealthy) { // a refusal says nothing about the connection
			d.fail(node)
		}
		return fmt.Errorf("removing etcd member %x through node %s: %w", id, node, err)
	}
	return nil
}

// observe records an etcd operation's duration and outcome (metrics.EtcdCall).
func observe(operation string, start time.Time, err *error) {
	metrics.EtcdCall(operation, time.Since(start), *err)
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}
