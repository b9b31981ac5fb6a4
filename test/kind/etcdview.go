package kind

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"
)

// EtcdView is one reading of a workload cluster's etcd by the kind e2e suite's observer, from
// etcdctl's answers inside one member's container (ParseEtcdctl). It is the observer's own reading,
// independent of CAPR's etcd code.
type EtcdView struct {
	At time.Time
	// OK: some member answered; the counts are from that answer.
	OK bool
	// Voters and Learners count the member list; HealthyVoter the voters whose client URL answered
	// etcdctl's health check.
	Voters, Learners, HealthyVoter int
	// Names are the voting members' names (kubeadm names a member after its node); Healthy those of
	// the voters that answered the health check.
	Names, Healthy []string
	// Unhealthy are the voters that failed the health check, each as "name: etcdctl's error", then
	// what the member's status said of its raft log beside the leader's (a member just promoted
	// may answer its status, with its log caught up, before it serves a linearizable read), or
	// that it gave no status.
	Unhealthy []string
	// Leader is the name of the member the answering members name as leader.
	Leader string
	// From is the node whose member answered; Err why the last one asked did not.
	From, Err string
	// Changing: the member list read again after the health check differed from the first, so the
	// counts would mix two memberships (a member removed between the two reads counts as a voter
	// that failed its health check). Such a reading says nothing about the margin.
	Changing bool
	// Unconfirmed: a member's answer was refused because it did not read the member list again
	// (ErrMembershipUnconfirmed); the counts, if any, are another member's.
	Unconfirmed bool
}

// ErrMembershipChanged is ParseEtcdctl's error when the member list read after the health check
// differs from the one read before it.
var ErrMembershipChanged = errors.New("the member list changed during the reading")

// ErrMembershipUnconfirmed is ParseEtcdctl's error when the member list was not read again after the
// health check.
var ErrMembershipUnconfirmed = errors.New("the member list was not read again after the health check")

// Margin is how many more voting members may fail before quorum is lost: the healthy voters less a
// quorum of the voters.
func (v EtcdView) Margin() int { return v.HealthyVoter - (v.Voters/2 + 1) }

// JoiningOnly reports whether every voter that failed the health check is joining: named in created
// (the members of Machines created during a run: kubeadm names a member after its node, CAPD a node
// after its Machine) and not in served (the voters an earlier reading saw healthy). A reading with no
// failing voter is not.
func (v EtcdView) JoiningOnly(created, served map[string]bool) bool {
	failing := 0
	for _, name := range v.Names {
		if slices.Contains(v.Healthy, name) {
			continue
		}
		if !created[name] || served[name] {
			return false
		}
		failing++
	}
	return failing > 0
}

type etcdMember struct {
	ID         uint64   `json:"ID"`
	Name       string   `json:"name"`
	ClientURLs []string `json:"clientURLs"`
	IsLearner  bool     `json:"isLearner"`
}

// ParseEtcdctl reads the output of etcdctl commands, each -w json, one document a line, blank lines
// ignored: member list, endpoint health --cluster, endpoint status --cluster (an array; optional),
// and the member list again (an object), which must equal the first (ErrMembershipChanged). Without
// that second list the reading is refused (ErrMembershipUnconfirmed): the counts could mix two
// memberships, e.g. a member removed during the health check that the answering member no longer
// serves a linearizable list for, or a script cut short by its timeout.
func ParseEtcdctl(out string) (EtcdView, error) {
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if strings.TrimSpace(l) != "" {
			lines = append(lines, l)
		}
	}
	if len(lines) < 2 {
		return EtcdView{}, fmt.Errorf("want the member list and the health, got %q", out)
	}
	var list struct {
		Members []etcdMember `json:"members"`
	}
	if err := json.Unmarshal([]byte(lines[0]), &list); err != nil {
		return EtcdView{}, fmt.Errorf("member list: %w", err)
	}
	if len(list.Members) == 0 {
		return EtcdView{}, errors.New("member list: no members")
	}
	var health []struct {
		Endpoint string `json:"endpoint"`
		Health   bool   `json:"health"`
		Error    string `json:"error"`
	}
	if err := json.Unmarshal([]byte(lines[1]), &health); err != nil {
		return EtcdView{}, fmt.Errorf("endpoint health: %w", err)
	}
	healthy, why := map[string]bool{}, map[string]string{}
	for _, h := range health {
		healthy[h.Endpoint], why[h.Endpoint] = h.Health, h.Error
	}
	var leaderID uint64
	statusOf := map[uint64]memberStatus{}
	confirmed := false
	for _, line := range lines[2:] {
		if strings.HasPrefix(strings.TrimSpace(line), "{") {
			var again struct {
				Members []etcdMember `json:"members"`
			}
			if err := json.Unmarshal([]byte(line), &again); err != nil {
				return EtcdView{}, fmt.Errorf("member list read again: %w", err)
			}
			if !sameMembership(list.Members, again.Members) {
				return EtcdView{}, ErrMembershipChanged
			}
			confirmed = true
			continue
		}
		var status []struct {
			Status memberStatus `json:"Status"`
		}
		if err := json.Unmarshal([]byte(line), &status); err != nil {
			return EtcdView{}, fmt.Errorf("endpoint status: %w", err)
		}
		for _, st := range status {
			if st.Status.Leader != 0 {
				leaderID = st.Status.Leader
			}
			statusOf[st.Status.Header.MemberID] = st.Status
		}
	}
	if !confirmed {
		return EtcdView{}, ErrMembershipUnconfirmed
	}
	v := EtcdView{OK: true}
	for _, m := range list.Members {
		if m.ID == leaderID {
			v.Leader = m.Name
		}
		if m.IsLearner {
			v.Learners++
			continue
		}
		v.Voters++
		v.Names = append(v.Names, m.Name)
		if slices.ContainsFunc(m.ClientURLs, func(u string) bool { return healthy[u] }) {
			v.HealthyVoter++
			v.Healthy = append(v.Healthy, m.Name)
			continue
		}
		reason := "no health answer"
		for _, u := range m.ClientURLs {
			if why[u] != "" {
				reason = why[u]
			}
		}
		v.Unhealthy = append(v.Unhealthy, m.Name+": "+reason+"; "+describeStatus(m.ID, leaderID, statusOf))
	}
	sort.Strings(v.Names)
	sort.Strings(v.Healthy)
	sort.Strings(v.Unhealthy)
	return v, nil
}

// memberStatus is the part of etcdctl's endpoint status that says where a member's raft log stands.
type memberStatus struct {
	Header struct {
		MemberID uint64 `json:"member_id"`
	} `json:"header"`
	Leader           uint64 `json:"leader"`
	RaftTerm         uint64 `json:"raftTerm"`
	RaftIndex        uint64 `json:"raftIndex"`
	RaftAppliedIndex uint64 `json:"raftAppliedIndex"`
}

// describeStatus says what member id's status answer (if any) said of its raft log, beside the
// leader's: its term, its committed and applied index.
func describeStatus(id, leaderID uint64, statusOf map[uint64]memberStatus) string {
	st, ok := statusOf[id]
	if !ok {
		return "no status"
	}
	out := fmt.Sprintf("status: term %d, committed %d, applied %d", st.RaftTerm, st.RaftIndex, st.RaftAppliedIndex)
	if l, ok := statusOf[leaderID]; ok && leaderID != id {
		out += fmt.Sprintf(" (leader: term %d, committed %d, applied %d)", l.RaftTerm, l.RaftIndex, l.RaftAppliedIndex)
	}
	return out
}

// sameMembership reports whether two member lists have the same members, each a voter or a learner
// in both.
func sameMembership(a, b []etcdMember) bool {
	if len(a) != len(b) {
		return false
	}
	learner := map[uint64]bool{}
	for _, m := range a {
		learner[m.ID] = m.IsLearner
	}
	for _, m := range b {
		if l, ok := learner[m.ID]; !ok || l != m.IsLearner {
			return false
		}
	}
	return true
}
