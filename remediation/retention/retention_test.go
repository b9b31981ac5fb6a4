package retention

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/event"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

var now = time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)

func rec(name string, finishedAgo time.Duration, keep string) Record {
	return Record{Name: name, Finished: now.Add(-finishedAgo), Keep: keep}
}

func TestDecide(t *testing.T) {
	day := Settings{TTL: 24 * time.Hour}
	tests := []struct {
		name        string
		records     []Record
		settings    Settings
		wantDelete  []Deletion
		wantRequeue time.Duration
	}{
		{name: "nothing finished", settings: Settings{TTL: time.Hour, MaxPerCluster: 3}},
		{name: "past the TTL goes, the other is looked at again when it expires", settings: day,
			records:    []Record{rec("old", 25*time.Hour, ""), rec("new", 23*time.Hour, "")},
			wantDelete: []Deletion{{"old", ReasonExpired}}, wantRequeue: time.Hour},
		{name: "exactly at the TTL goes", settings: day,
			records:    []Record{rec("a", 24*time.Hour, "")},
			wantDelete: []Deletion{{"a", ReasonExpired}}},
		{name: "the requeue is the earliest expiry, in any input order", settings: day,
			records:     []Record{rec("b", time.Hour, ""), rec("a", 20*time.Hour, ""), rec("c", 2*time.Hour, "")},
			wantRequeue: 4 * time.Hour},
		{name: "a kept request never goes and brings no requeue", settings: day,
			records: []Record{rec("failed", 48*time.Hour, "it failed and its Machine still exists")}},
		{name: "TTL 0 keeps without time limit", settings: Settings{},
			records: []Record{rec("a", 1000*time.Hour, "")}},
		{name: "over the limit the oldest go first", settings: Settings{MaxPerCluster: 2},
			records:    []Record{rec("c", time.Minute, ""), rec("a", 3*time.Minute, ""), rec("d", 0, ""), rec("b", 2*time.Minute, "")},
			wantDelete: []Deletion{{"a", ReasonOverLimit}, {"b", ReasonOverLimit}}},
		{name: "equal finish times go by name", settings: Settings{MaxPerCluster: 1},
			records:    []Record{rec("y", time.Minute, ""), rec("x", time.Minute, "")},
			wantDelete: []Deletion{{"x", ReasonOverLimit}}},
		{name: "kept requests count towards the limit but are skipped", settings: Settings{MaxPerCluster: 2},
			records:    []Record{rec("kept-oldest", 3*time.Minute, "its fence is still to be undone"), rec("b", 2*time.Minute, ""), rec("c", time.Minute, "")},
			wantDelete: []Deletion{{"b", ReasonOverLimit}}},
		{name: "more kept than the limit: every other goes", settings: Settings{MaxPerCluster: 1},
			records:    []Record{rec("k1", time.Minute, "x"), rec("k2", 2*time.Minute, "x"), rec("a", 0, "")},
			wantDelete: []Deletion{{"a", ReasonOverLimit}}},
		{name: "expired ones count as gone for the limit", settings: Settings{TTL: time.Hour, MaxPerCluster: 2},
			records:     []Record{rec("old", 2*time.Hour, ""), rec("a", 30*time.Minute, ""), rec("b", 20*time.Minute, "")},
			wantDelete:  []Deletion{{"old", ReasonExpired}},
			wantRequeue: 30 * time.Minute},
		{name: "both bounds; the requeue ignores those deleted over the limit", settings: Settings{TTL: time.Hour, MaxPerCluster: 1},
			records:     []Record{rec("old", 2*time.Hour, ""), rec("a", 50*time.Minute, ""), rec("b", 10*time.Minute, "")},
			wantDelete:  []Deletion{{"old", ReasonExpired}, {"a", ReasonOverLimit}},
			wantRequeue: 50 * time.Minute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			d := Decide(tt.records, now, tt.settings)
			g.Expect(d.Delete).To(Equal(tt.wantDelete))
			g.Expect(d.RequeueAfter).To(Equal(tt.wantRequeue))
		})
	}
}

func TestRecordOfKeepsWhatStillMatters(t *testing.T) {
	machine := &clusterv1.Machine{}
	deleting := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: ptr.To(metav1.NewTime(now))}}
	request := func(phase caprv1.RemediationPhase, mutate ...func(*caprv1.MachineRemediation)) *caprv1.MachineRemediation {
		mr := &caprv1.MachineRemediation{
			ObjectMeta: metav1.ObjectMeta{Name: "m", CreationTimestamp: metav1.NewTime(now.Add(-time.Hour))},
			Status:     caprv1.MachineRemediationStatus{Phase: phase, CompletionTime: ptr.To(metav1.NewTime(now.Add(-time.Minute)))},
		}
		for _, mu := range mutate {
			mu(mr)
		}
		return mr
	}
	owed := func(mr *caprv1.MachineRemediation) { mr.Status.Fencing = &caprv1.FencingStatus{NodeName: "n"} }
	unfenced := func(mr *caprv1.MachineRemediation) {
		mr.Status.Fencing = &caprv1.FencingStatus{NodeName: "n", UnfencedTime: ptr.To(metav1.NewTime(now))}
	}
	retry := func(mr *caprv1.MachineRemediation) { mr.Annotations = map[string]string{caprv1.RetryAnnotation: ""} }
	tests := []struct {
		name     string
		mr       *caprv1.MachineRemediation
		m        *clusterv1.Machine
		wantKeep string
	}{
		{name: "Succeeded, Machine gone", mr: request(caprv1.MachineRemediationPhaseSucceeded)},
		{name: "Succeeded, Machine kept (recovered during escalation)", mr: request(caprv1.MachineRemediationPhaseSucceeded), m: machine},
		{name: "Succeeded, Machine being deleted", mr: request(caprv1.MachineRemediationPhaseSucceeded), m: deleting, wantKeep: "its Machine is being deleted"},
		{name: "Failed, Machine gone", mr: request(caprv1.MachineRemediationPhaseFailed)},
		{name: "Failed, Machine exists", mr: request(caprv1.MachineRemediationPhaseFailed), m: machine, wantKeep: "it failed and its Machine still exists"},
		{name: "Failed, retry requested", mr: request(caprv1.MachineRemediationPhaseFailed, retry), wantKeep: "a retry was requested (annotation " + caprv1.RetryAnnotation + ")"},
		{name: "fence owed", mr: request(caprv1.MachineRemediationPhaseSucceeded, owed), wantKeep: "its fence is still to be undone"},
		{name: "fence undone", mr: request(caprv1.MachineRemediationPhaseFailed, unfenced)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			r := RecordOf(tt.mr, tt.m)
			g.Expect(r.Keep).To(Equal(tt.wantKeep))
			g.Expect(r.Finished).To(Equal(now.Add(-time.Minute)))
		})
	}

	// A finished status without completionTime (not written by CAPR) counts from the creation.
	noCompletion := request(caprv1.MachineRemediationPhaseSucceeded, func(mr *caprv1.MachineRemediation) { mr.Status.CompletionTime = nil })
	NewWithT(t).Expect(RecordOf(noCompletion, nil).Finished).To(Equal(now.Add(-time.Hour)))
}

func TestSettingsValidateNamesTheFlag(t *testing.T) {
	g := NewWithT(t)
	g.Expect(Settings{TTL: time.Hour, MaxPerCluster: 3}.Validate()).To(Succeed())
	g.Expect(Settings{}.Validate()).To(Succeed())
	g.Expect(Settings{TTL: -time.Second}.Validate()).To(MatchError(ContainSubstring("--machineremediation-ttl-after-finished")))
	g.Expect(Settings{MaxPerCluster: -1}.Validate()).To(MatchError(ContainSubstring("--machineremediation-max-finished-per-cluster")))
}

type recordingForgetter struct{ forgot []string }

func (f *recordingForgetter) Forget(uid types.UID) { f.forgot = append(f.forgot, string(uid)) }

// A deleted Cluster's etcd clients and certificate are dropped: its delete event reaches
// etcdutil.Workload.Forget with the Cluster's UID (what Workload keeps them under; Forget itself is
// tested in etcdutil).
func TestDeletedClusterIsForgotten(t *testing.T) {
	g := NewWithT(t)
	f := &recordingForgetter{}
	r := &Reconciler{Etcd: f}
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c1", UID: "uid-1"}}
	r.clusterDeleted(context.Background(), event.DeleteEvent{Object: cluster}, nil)
	g.Expect(f.forgot).To(Equal([]string{"uid-1"}))
}
