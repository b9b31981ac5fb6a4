package worker

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

func TestOrder(t *testing.T) {
	t0 := time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC)
	cands := []Candidate{
		{Name: "new", Created: t0.Add(2 * time.Minute)},
		{Name: "old", Created: t0},
		{Name: "explicit-new", Requested: true, Created: t0.Add(3 * time.Minute)},
		{Name: "b-same", Created: t0.Add(time.Minute)},
		{Name: "a-same", Created: t0.Add(time.Minute)},
		{Name: "explicit-old", Requested: true, Created: t0.Add(time.Minute)},
	}
	got := Order(cands)
	want := []string{"explicit-old", "explicit-new", "old", "a-same", "b-same", "new"}
	for i, c := range got {
		if c.Name != want[i] {
			t.Fatalf("Order() = %v, want %v", names(got), want)
		}
	}
	if cands[0].Name != "new" {
		t.Fatalf("Order changed its input: %v", names(cands))
	}
}

func names(cs []Candidate) []string {
	out := make([]string, 0, len(cs))
	for _, c := range cs {
		out = append(out, c.Name)
	}
	return out
}

func TestAdmit(t *testing.T) {
	t0 := time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC)
	a := Candidate{Name: "a", Created: t0}
	b := Candidate{Name: "b", Created: t0.Add(time.Second)}
	bExplicit := Candidate{Name: "b", Requested: true, Created: t0.Add(time.Second)}
	c := Candidate{Name: "c", Created: t0.Add(2 * time.Second)}
	tests := []struct {
		name        string
		maxInFlight int
		inFlight    int
		waiting     []Candidate
		self        string
		start       bool
		msgContains string
	}{
		{name: "unlimited, many in flight", maxInFlight: Unlimited, inFlight: 100, waiting: []Candidate{a, b, c}, self: "c", start: true, msgContains: "unlimited"},
		{name: "one slot, oldest takes it", maxInFlight: 1, waiting: []Candidate{b, a}, self: "a", start: true},
		{name: "one slot, younger waits", maxInFlight: 1, waiting: []Candidate{b, a}, self: "b", msgContains: "1 go first: [a]"},
		{name: "one slot, explicit request goes first", maxInFlight: 1, waiting: []Candidate{a, bExplicit}, self: "b", start: true},
		{name: "one slot, oldest waits for explicit", maxInFlight: 1, waiting: []Candidate{a, bExplicit}, self: "a", msgContains: "go first: [b]"},
		{name: "slot taken by one in flight", maxInFlight: 1, inFlight: 1, waiting: []Candidate{a}, self: "a", msgContains: "1 remediation(s) already in flight, maxInFlight is 1"},
		{name: "more in flight than allowed (limit lowered)", maxInFlight: 1, inFlight: 3, waiting: []Candidate{a}, self: "a"},
		{name: "two slots, one used: first of two waiting starts", maxInFlight: 2, inFlight: 1, waiting: []Candidate{a, b}, self: "a", start: true},
		{name: "two slots, one used: second waits", maxInFlight: 2, inFlight: 1, waiting: []Candidate{a, b}, self: "b"},
		{name: "three slots: third of three starts", maxInFlight: 3, waiting: []Candidate{c, b, a}, self: "c", start: true},
		{name: "maxInFlight 0 never starts", maxInFlight: 0, waiting: []Candidate{a}, self: "a"},
		{name: "self not a candidate", maxInFlight: 5, waiting: []Candidate{a}, self: "z", msgContains: "not a candidate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Admit(tt.maxInFlight, tt.inFlight, tt.waiting, tt.self)
			if got.Start != tt.start {
				t.Fatalf("Admit().Start = %v, want %v (%s)", got.Start, tt.start, got.Message)
			}
			if !strings.Contains(got.Message, tt.msgContains) {
				t.Fatalf("Admit().Message = %q, want it to contain %q", got.Message, tt.msgContains)
			}
		})
	}
}

func TestReplacingOwner(t *testing.T) {
	ref := func(apiVersion, kind string, controller bool) []metav1.OwnerReference {
		return []metav1.OwnerReference{{APIVersion: apiVersion, Kind: kind, Name: "o", UID: "u", Controller: &controller}}
	}
	tests := []struct {
		name    string
		owners  []metav1.OwnerReference
		ms      string
		refusal string
	}{
		{name: "MachineSet controller", owners: ref(clusterv1.GroupVersion.String(), "MachineSet", true), ms: "o"},
		{name: "MachineSet of an older API version", owners: ref("cluster.x-k8s.io/v1beta1", "MachineSet", true), ms: "o"},
		{name: "no owner", refusal: "has no controller owner"},
		{name: "MachineSet owner that is not the controller", owners: ref(clusterv1.GroupVersion.String(), "MachineSet", false), refusal: "has no controller owner"},
		{name: "MachinePool", owners: ref(clusterv1.GroupVersion.String(), "MachinePool", true), refusal: "MachinePool o"},
		{name: "a MachineSet kind of another group", owners: ref("example.com/v1", "MachineSet", true), refusal: "not by a MachineSet"},
		{name: "a control-plane provider", owners: ref("controlplane.cluster.x-k8s.io/v1beta2", "KubeadmControlPlane", true), refusal: "not by a MachineSet"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "m", OwnerReferences: tt.owners}}
			ms, refusal := replacingOwner(m)
			if ms != tt.ms {
				t.Fatalf("MachineSet = %q, want %q (%s)", ms, tt.ms, refusal)
			}
			if (tt.refusal == "") != (refusal == "") || !strings.Contains(refusal, tt.refusal) {
				t.Fatalf("refusal = %q, want one containing %q", refusal, tt.refusal)
			}
		})
	}
}

// TestWaitsForTurnReadsPauseAsItIsNow: a request's Paused condition and Paused reason say what its
// last reconcile saw. When a Cluster is unpaused its requests are reconciled one by one, so one not
// reconciled yet still says Paused; it must keep its turn (TestMaxInFlightOneAtATime saw the explicit
// request overtaken that way).
func TestWaitsForTurnReadsPauseAsItIsNow(t *testing.T) {
	stalePaused := func(mr *caprv1.MachineRemediation) {
		conditions.Set(mr, metav1.Condition{Type: clusterv1.PausedCondition, Status: metav1.ConditionTrue, Reason: clusterv1.PausedReason})
	}
	staleMachinePaused := func(mr *caprv1.MachineRemediation) {
		conditions.Set(mr, metav1.Condition{Type: caprv1.MachineRemediationProgressingCondition, Status: metav1.ConditionFalse,
			Reason: caprv1.MachineRemediationPausedReason})
	}
	pausedAnnotation := func(o metav1.Object) { o.SetAnnotations(map[string]string{clusterv1.PausedAnnotation: ""}) }
	now := metav1.Now()
	for _, tc := range []struct {
		name           string
		clusterPaused  bool
		request        func(*caprv1.MachineRemediation)
		machine        func(*clusterv1.Machine)
		noMachine      bool
		wantItsTurnNow bool
	}{
		{name: "waiting", wantItsTurnNow: true},
		{name: "Paused condition from before the Cluster was unpaused", request: stalePaused, wantItsTurnNow: true},
		{name: "Paused reason from before the Machine was unpaused", request: staleMachinePaused, wantItsTurnNow: true},
		{name: "Machine not found", noMachine: true, wantItsTurnNow: true},
		{name: "Cluster paused", clusterPaused: true},
		{name: "request paused", request: func(mr *caprv1.MachineRemediation) { pausedAnnotation(mr) }},
		{name: "Machine paused", machine: func(m *clusterv1.Machine) { pausedAnnotation(m) }},
		{name: "being deleted", request: func(mr *caprv1.MachineRemediation) {
			mr.DeletionTimestamp = &now
			mr.Finalizers = []string{"x"}
		}},
		{name: "no remediator", request: func(mr *caprv1.MachineRemediation) {
			conditions.Set(mr, metav1.Condition{Type: caprv1.MachineRemediationProgressingCondition, Status: metav1.ConditionFalse,
				Reason: caprv1.MachineRemediationNoRemediatorReason})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cluster := &clusterv1.Cluster{Spec: clusterv1.ClusterSpec{Paused: ptr.To(tc.clusterPaused)}}
			mr := &caprv1.MachineRemediation{}
			if tc.request != nil {
				tc.request(mr)
			}
			m := &clusterv1.Machine{}
			if tc.machine != nil {
				tc.machine(m)
			}
			if tc.noMachine {
				m = nil
			}
			if got := waitsForTurn(cluster, mr, m); got != tc.wantItsTurnNow {
				t.Fatalf("waitsForTurn() = %t, want %t", got, tc.wantItsTurnNow)
			}
		})
	}
}
