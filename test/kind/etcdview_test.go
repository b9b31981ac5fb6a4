package kind

import (
	"strings"
	"testing"

	. "github.com/onsi/gomega"
)

// etcdctl v3.6's answers as a kubeadm member prints them (IDs are decimal in JSON), captured on the
// kind platform: three voters, one of them unhealthy, the leader 5989846029734297070.
const (
	memberList = `{"header":{"cluster_id":13122874208970909450,"member_id":3305490284527677042,"raft_term":2},"members":[` +
		`{"ID":3305490284527677042,"name":"cp-a","peerURLs":["https://172.18.0.7:2380"],"clientURLs":["https://172.18.0.7:2379"]},` +
		`{"ID":4246620370066203932,"name":"cp-b","peerURLs":["https://172.18.0.5:2380"],"clientURLs":["https://172.18.0.5:2379"]},` +
		`{"ID":5989846029734297070,"name":"cp-c","peerURLs":["https://172.18.0.4:2380"],"clientURLs":["https://172.18.0.4:2379"]}]}`
	health = `[{"endpoint":"https://172.18.0.7:2379","health":true,"took":"167ms"},` +
		`{"endpoint":"https://172.18.0.4:2379","health":true,"took":"183ms"},` +
		`{"endpoint":"https://172.18.0.5:2379","health":false,"took":"3s","error":"context deadline exceeded"}]`
	status = `[{"Endpoint":"https://172.18.0.7:2379","Status":{"header":{"member_id":3305490284527677042},"leader":5989846029734297070}},` +
		`{"Endpoint":"https://172.18.0.4:2379","Status":{"header":{"member_id":5989846029734297070},"leader":5989846029734297070}}]`
	learnerList = `{"members":[` +
		`{"ID":1,"name":"cp-a","clientURLs":["https://10.0.0.1:2379"]},` +
		`{"ID":2,"name":"cp-b","clientURLs":["https://10.0.0.2:2379"]},` +
		`{"ID":3,"name":"cp-c","clientURLs":["https://10.0.0.3:2379"]},` +
		`{"ID":4,"name":"cp-d","clientURLs":["https://10.0.0.4:2379"],"isLearner":true}]}`
	learnerHealth = `[{"endpoint":"https://10.0.0.1:2379","health":true},{"endpoint":"https://10.0.0.2:2379","health":true},` +
		`{"endpoint":"https://10.0.0.3:2379","health":true},{"endpoint":"https://10.0.0.4:2379","health":true}]`
)

func TestParseEtcdctl(t *testing.T) {
	for _, tc := range []struct {
		name, out string
		want      EtcdView
		margin    int
		err       string
	}{{
		name: "one voter of three unhealthy, blank lines between the answers",
		out:  memberList + "\n\n" + health + "\n\n" + status + "\n\n" + memberList + "\n",
		want: EtcdView{OK: true, Voters: 3, HealthyVoter: 2, Names: []string{"cp-a", "cp-b", "cp-c"}, Healthy: []string{"cp-a", "cp-c"}, Leader: "cp-c",
			Unhealthy: []string{"cp-b: context deadline exceeded; no status"}},
		margin: 0,
	}, {
		name: "a learner is not a voter; without the status there is no leader",
		out:  learnerList + "\n" + learnerHealth + "\n" + learnerList,
		want: EtcdView{OK: true, Voters: 3, Learners: 1, HealthyVoter: 3, Names: []string{"cp-a", "cp-b", "cp-c"},
			Healthy: []string{"cp-a", "cp-b", "cp-c"}},
		margin: 1,
	}, {
		name: "the member list read again is the same",
		out:  memberList + "\n" + health + "\n" + status + "\n" + memberList + "\n",
		want: EtcdView{OK: true, Voters: 3, HealthyVoter: 2, Names: []string{"cp-a", "cp-b", "cp-c"}, Healthy: []string{"cp-a", "cp-c"}, Leader: "cp-c",
			Unhealthy: []string{"cp-b: context deadline exceeded; no status"}},
		margin: 0,
	}, {
		// A member that fails the health check but answers its status: the status is told beside
		// the leader's, so a reading can tell a member catching up from a member that is down.
		name: "an unhealthy voter that answers its status",
		out: memberList + "\n" + health + "\n" + `[{"Endpoint":"https://172.18.0.7:2379","Status":{"header":{"member_id":3305490284527677042},"leader":5989846029734297070,"raftTerm":2,"raftIndex":900,"raftAppliedIndex":900}},` +
			`{"Endpoint":"https://172.18.0.5:2379","Status":{"header":{"member_id":4246620370066203932},"leader":5989846029734297070,"raftTerm":2,"raftIndex":880,"raftAppliedIndex":410}},` +
			`{"Endpoint":"https://172.18.0.4:2379","Status":{"header":{"member_id":5989846029734297070},"leader":5989846029734297070,"raftTerm":2,"raftIndex":901,"raftAppliedIndex":901}}]` + "\n" + memberList + "\n",
		want: EtcdView{OK: true, Voters: 3, HealthyVoter: 2, Names: []string{"cp-a", "cp-b", "cp-c"}, Healthy: []string{"cp-a", "cp-c"}, Leader: "cp-c",
			Unhealthy: []string{"cp-b: context deadline exceeded; status: term 2, committed 880, applied 410 (leader: term 2, committed 901, applied 901)"}},
		margin: 0,
	}, {
		// A learner promoted (or a member removed) between the two reads: its health was read for a
		// membership that no longer holds.
		name: "the member list read again differs",
		out:  learnerList + "\n" + learnerHealth + "\n" + strings.Replace(learnerList, `,"isLearner":true`, "", 1) + "\n",
		err:  "the member list changed during the reading",
	}, {
		// The answering member could not serve the list again (it was removed meanwhile), or the
		// script was cut short: the health read may belong to another membership.
		name: "the member list is not read again",
		out:  memberList + "\n" + health + "\n" + status + "\n",
		err:  "the member list was not read again after the health check",
	}, {
		name: "no health answer",
		out:  memberList + "\n",
		err:  "want the member list and the health",
	}, {
		name: "garbage",
		out:  "Error: context deadline exceeded\n" + health,
		err:  "member list",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			v, err := ParseEtcdctl(tc.out)
			if tc.err != "" {
				g.Expect(err).To(MatchError(ContainSubstring(tc.err)))
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(v).To(Equal(tc.want))
			g.Expect(v.Margin()).To(Equal(tc.margin))
		})
	}
}

func TestJoiningOnly(t *testing.T) {
	v := EtcdView{OK: true, Voters: 4, HealthyVoter: 3, Names: []string{"new", "old-a", "old-b", "old-c"}, Healthy: []string{"old-a", "old-b", "old-c"}}
	for _, tc := range []struct {
		name            string
		v               EtcdView
		created, served []string
		want            bool
	}{
		{name: "a replacement never seen healthy", v: v, created: []string{"new"}, want: true},
		{name: "a replacement seen healthy before", v: v, created: []string{"new"}, served: []string{"new"}, want: false},
		{name: "a member that was there before the run", v: v, want: false},
		{name: "a joining and an old member failing", v: EtcdView{Names: v.Names, Healthy: []string{"old-a", "old-b"}}, created: []string{"new"}, want: false},
		{name: "every voter healthy", v: EtcdView{Names: v.Names, Healthy: v.Names}, created: []string{"new"}, want: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set := func(names []string) map[string]bool {
				out := map[string]bool{}
				for _, n := range names {
					out[n] = true
				}
				return out
			}
			NewWithT(t).Expect(tc.v.JoiningOnly(set(tc.created), set(tc.served))).To(Equal(tc.want))
		})
	}
}
