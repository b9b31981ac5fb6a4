package kind

import (
	"encoding/json"
	"errors"
	"fmt"
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
	// Names are the voting members' names (kubeadm names a member after its node).
	Names []string
	// Leader is the name of the member the answering members name as leader.
	Leader string
	// From is the node whose member answered; Err why the last one asked did not.
	From, Err string
}

// Margin is how many more voting members may fail before quorum is lost: the healthy voters less a
// quorum of the voters.
func (v EtcdView) Margin() int { return v.HealthyVoter - (v.Voters/2 + 1) }

type etcdMember struct {
	ID         uint64   `json:"ID"`
	Name       string   `json:"name"`
	ClientURLs []string `json:"clientURLs"`
	IsLearner  bool     `json:"isLearner"`
}

// ParseEtcdctl reads the output of three etcdctl commands, each -w json, one document a line, blank
// lines ignored: member list, endpoint health --cluster, and (optional) endpoint status --cluster.
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
	}
	if err := json.Unmarshal([]byte(lines[1]), &health); err != nil {
		return EtcdView{}, fmt.Errorf("endpoint health: %w", err)
	}
	healthy := map[string]bool{}
	for _, h := range health {
		healthy[h.Endpoint] = h.Health
	}
	var leaderID uint64
	if len(lines) > 2 {
		var status []struct {
			Status struct {
				Leader uint64 `json:"leader"`
			} `json:"Status"`
		}
		if err := json.Unmarshal([]byte(lines[2]), &status); err != nil {
			return EtcdView{}, fmt.Errorf("endpoint status: %w", err)
		}
		for _, st := range status {
			if st.Status.Leader != 0 {
				leaderID = st.Status.Leader
			}
		}
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
		for _, u := range m.ClientURLs {
			if healthy[u] {
				v.HealthyVoter++
				break
			}
		}
	}
	sort.Strings(v.Names)
	return v, nil
}
