package controlplane

import (
	"sort"
	"testing"
	"time"

	kcpreconciler "sigs.k8s.io/cluster-api/controlplane/kubeadm/reconcilers/kubeadmcontrolplane"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/etcdutil"
)

// kcpOption configures kcpObject.
type kcpOption func(*kcpOptions)

type kcpOptions struct {
	certificatesAvailable bool
	externalEtcd          bool
}

// withExternalEtcd sets spec.kubeadmConfigSpec.clusterConfiguration.etcd.external.
func withExternalEtcd() kcpOption {
	return func(o *kcpOptions) { o.externalEtcd = true }
}

// withoutCertificates makes KCP's CertificatesAvailable condition False.
func withoutCertificates() kcpOption {
	return func(o *kcpOptions) { o.certificatesAvailable = false }
}

// kcpObject returns a KubeadmControlPlane with 3 replicas and its certificates available.
func kcpObject(opts ...kcpOption) *unstructured.Unstructured {
	o := kcpOptions{certificatesAvailable: true}
	for _, opt := range opts {
		opt(&o)
	}
	status := "False"
	if o.certificatesAvailable {
		status = "True"
	}
	spec := map[string]interface{}{"replicas": int64(3)}
	if o.externalEtcd {
		spec["kubeadmConfigSpec"] = map[string]interface{}{"clusterConfiguration": map[string]interface{}{"etcd": map[string]interface{}{"external": map[string]interface{}{
			"endpoints": []interface{}{"https://etcd:2379"}, "caFile": "/etc/kubernetes/pki/etcd/ca.crt",
			"certFile": "/etc/kubernetes/pki/apiserver-etcd-client.crt", "keyFile": "/etc/kubernetes/pki/apiserver-etcd-client.key",
		}}}}
	}
	return &unstructured.Unstructured{Object: map[string]interface{}{
		"apiVersion": "controlplane.cluster.x-k8s.io/v1beta2", "kind": "KubeadmControlPlane",
		"metadata": map[string]interface{}{"name": "kcp", "namespace": "ns"},
		"spec":     spec,
		"status": map[string]interface{}{"conditions": []interface{}{
			map[string]interface{}{"type": "CertificatesAvailable", "status": status},
		}},
	}}
}

// kcpMachine returns a control-plane Machine with KCP's health conditions; unhealthy lists the
// conditions that are False.
func kcpMachine(name string, unhealthy ...string) *clusterv1.Machine {
	m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: name}}
	m.Status.NodeRef = clusterv1.MachineNodeReference{Name: name}
	bad := map[string]bool{}
	for _, u := range unhealthy {
		bad[u] = true
	}
	for _, c := range []string{controlplanev1.KubeadmControlPlaneMachineAPIServerPodHealthyCondition, controlplanev1.KubeadmControlPlaneMachineControllerManagerPodHealthyCondition, controlplanev1.KubeadmControlPlaneMachineSchedulerPodHealthyCondition, controlplanev1.KubeadmControlPlaneMachineEtcdPodHealthyCondition, controlplanev1.KubeadmControlPlaneMachineEtcdMemberHealthyCondition} {
		status := metav1.ConditionTrue
		if bad[c] {
			status = metav1.ConditionFalse
		}
		m.Status.Conditions = append(m.Status.Conditions, metav1.Condition{Type: c, Status: status})
	}
	return m
}

func etcdState(names ...string) *etcdutil.State {
	s := &etcdutil.State{}
	for i, n := range names {
		s.Members = append(s.Members, etcdutil.MemberStatus{ID: uint64(i + 1), Name: n, Healthy: true})
	}
	return s
}

// answeredState is an inspection of members a, b, victim…: those mapped to true answered through their
// Node and are healthy, the others could not be reached.
func answeredState(answered map[string]bool) *etcdutil.State {
	names := make([]string, 0, len(answered))
	for n := range answered {
		names = append(names, n)
	}
	sort.Strings(names)
	s := &etcdutil.State{QuorumProven: true}
	for i, n := range names {
		m := etcdutil.MemberStatus{ID: uint64(i + 1), Name: n, Problem: "unreachable"}
		if answered[n] {
			m.Reachable, m.Healthy, m.Votes, m.Problem = true, true, true, ""
		}
		s.Members = append(s.Members, m)
	}
	return s
}

func TestKCPScaleUpRefusal(t *testing.T) {
	allPods := []string{controlplanev1.KubeadmControlPlaneMachineAPIServerPodHealthyCondition, controlplanev1.KubeadmControlPlaneMachineControllerManagerPodHealthyCondition, controlplanev1.KubeadmControlPlaneMachineSchedulerPodHealthyCondition, controlplanev1.KubeadmControlPlaneMachineEtcdPodHealthyCondition, controlplanev1.KubeadmControlPlaneMachineEtcdMemberHealthyCondition}
	tests := []struct {
		name         string
		cp           *unstructured.Unstructured
		machines     []*clusterv1.Machine
		etcd         *etcdutil.State
		afterRemoval bool
		refused      string // substring; "" = KCP scales up
	}{
		{"all healthy: strict preflight passes", kcpObject(),
			[]*clusterv1.Machine{kcpMachine("a"), kcpMachine("b"), kcpMachine("c")}, etcdState("a", "b", "c"), false, ""},
		{"certificates missing", kcpObject(withoutCertificates()),
			[]*clusterv1.Machine{kcpMachine("a")}, etcdState("a"), false, "CertificatesAvailable"},
		{"a deleting Machine blocks scale up", kcpObject(),
			[]*clusterv1.Machine{kcpMachine("a"), func() *clusterv1.Machine {
				m := kcpMachine("b")
				m.DeletionTimestamp = ptr.To(metav1.NewTime(time.Now()))
				return m
			}()}, etcdState("a", "b"), false, "to be deleted"},
		// The case that makes KCP delete-first: 3 members, the victim's node is down (its pods and its
		// member look unhealthy to KCP). Projection: 4 voters, victim + new unhealthy → 2 < 3.
		{"3 members, victim unhealthy: KCP refuses scale-up first", kcpObject(),
			[]*clusterv1.Machine{kcpMachine("a"), kcpMachine("b"), kcpMachine("victim", allPods...)}, etcdState("a", "b", "victim"), false, "quorum needs 3"},
		{"3 members, victim unhealthy, after its member is removed: KCP scales up", kcpObject(),
			[]*clusterv1.Machine{kcpMachine("a"), kcpMachine("b"), kcpMachine("victim", allPods...)}, etcdState("a", "b", "victim"), true, ""},
		// compare-kcp "member dead" right after the cluster was created: the victim's member is dead and
		// KCP has not reconciled since "b" joined (its EtcdMemberHealthy not True yet). b answered CAPR's
		// inspection, so KCP will count it healthy at its next reconcile: after the removal KCP scales up.
		// A b that did not answer (only KCP's stale condition to go by) keeps the refusal.
		{"victim dead, b just joined and answered: after the removal KCP scales up", kcpObject(),
			[]*clusterv1.Machine{kcpMachine("a"), kcpMachine("b", controlplanev1.KubeadmControlPlaneMachineEtcdMemberHealthyCondition), kcpMachine("victim", controlplanev1.KubeadmControlPlaneMachineEtcdPodHealthyCondition)},
			answeredState(map[string]bool{"a": true, "b": true, "victim": false}), true, ""},
		{"victim dead, b's condition not True and b unreachable: refused", kcpObject(),
			[]*clusterv1.Machine{kcpMachine("a"), kcpMachine("b", controlplanev1.KubeadmControlPlaneMachineEtcdMemberHealthyCondition), kcpMachine("victim", controlplanev1.KubeadmControlPlaneMachineEtcdPodHealthyCondition)},
			answeredState(map[string]bool{"a": true, "b": false, "victim": false}), true, "quorum needs 2"},
		{"5 members, victim unhealthy: projection 6 voters, 2 unhealthy → scale up", kcpObject(),
			[]*clusterv1.Machine{kcpMachine("a"), kcpMachine("b"), kcpMachine("c"), kcpMachine("d"), kcpMachine("victim", allPods...)},
			etcdState("a", "b", "c", "d", "victim"), false, ""},
		{"no Machine with healthy components", kcpObject(),
			[]*clusterv1.Machine{kcpMachine("a", controlplanev1.KubeadmControlPlaneMachineAPIServerPodHealthyCondition), kcpMachine("b", controlplanev1.KubeadmControlPlaneMachineSchedulerPodHealthyCondition)}, etcdState("a", "b"), false, "no control-plane Machine with all Kubernetes control plane components"},
		{"learner present", kcpObject(),
			[]*clusterv1.Machine{kcpMachine("a"), kcpMachine("b"), kcpMachine("c", controlplanev1.KubeadmControlPlaneMachineEtcdMemberHealthyCondition)}, func() *etcdutil.State {
				s := etcdState("a", "b", "c", "d")
				s.Members[3].IsLearner = true
				return s
			}(), false, "KCP"},
		{"empty member list", kcpObject(),
			[]*clusterv1.Machine{kcpMachine("a", controlplanev1.KubeadmControlPlaneMachineEtcdMemberHealthyCondition)}, &etcdutil.State{}, false, "member list is empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			view := ProviderView{ControlPlane: tt.cp, Machines: tt.machines, Victim: tt.machines[len(tt.machines)-1], Etcd: tt.etcd}
			got := KCP{}.ScaleUpRefusal(view, tt.afterRemoval)
			if tt.refused == "" {
				g.Expect(got).To(BeEmpty())
			} else {
				g.Expect(got).To(ContainSubstring(tt.refused))
			}
		})
	}
}

func TestKCPOrderIsRemoveFirstWhenKCPWouldRefuseScaleUpFirst(t *testing.T) {
	g := NewWithT(t)
	allPods := []string{controlplanev1.KubeadmControlPlaneMachineAPIServerPodHealthyCondition, controlplanev1.KubeadmControlPlaneMachineControllerManagerPodHealthyCondition, controlplanev1.KubeadmControlPlaneMachineSchedulerPodHealthyCondition, controlplanev1.KubeadmControlPlaneMachineEtcdPodHealthyCondition, controlplanev1.KubeadmControlPlaneMachineEtcdMemberHealthyCondition}
	machines := []*clusterv1.Machine{kcpMachine("a"), kcpMachine("b"), kcpMachine("victim", allPods...)}
	view := ProviderView{ControlPlane: kcpObject(), Machines: machines, Victim: machines[2], Etcd: etcdState("a", "b", "victim")}
	in := OrderInput{
		Initialized: true, Counts: etcdutil.Counts{Voting: 3, Healthy: 3}, Victim: VictimHealthy,
		ProviderRefusesScaleUpNow:          KCP{}.ScaleUpRefusal(view, false),
		ProviderRefusesScaleUpAfterRemoval: KCP{}.ScaleUpRefusal(view, true),
	}
	// All three members are healthy: removing the victim's first would leave 2 of 2, so CAPR waits…
	d := ChooseOrder(in)
	g.Expect(d.Order).To(BeEmpty())
	g.Expect(d.WaitReason).To(Equal(caprv1.MachineRemediationWouldLoseFailureMarginReason))
	g.Expect(d.WaitMessage).To(ContainSubstring("KCP projects"))
	// …unless a person chose RemoveMemberFirst.
	in.Policy = caprv1.ControlPlaneOrderRemoveMemberFirst
	d = ChooseOrder(in)
	g.Expect(d.Order).To(BeEquivalentTo("RemoveMemberFirst"))
}

func TestKCPBeforeScaleUpSetsRemediationInProgress(t *testing.T) {
	g := NewWithT(t)
	cp := kcpObject()
	g.Expect(KCP{}.BeforeScaleUp(cp, "victim", time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), 2)).To(Succeed())
	g.Expect(cp.GetAnnotations()).To(HaveKeyWithValue(controlplanev1.RemediationInProgressAnnotation,
		`{"machine":"victim","timestamp":"2026-01-02T03:04:05Z","retryCount":2}`))
	g.Expect(AdapterFor(cp)).To(Equal(KCP{}))
	other := &unstructured.Unstructured{}
	other.SetAPIVersion("controlplane.cluster.x-k8s.io/v1alpha1")
	other.SetKind("SandboxControlPlane")
	g.Expect(AdapterFor(other)).To(Equal(Generic{}))
}

// TestKCPRemediationDataIsReadByKCP: what BeforeScaleUp writes is what KCP's own parser reads, and
// ClearScaleUp removes only the value naming its victim.
func TestKCPRemediationDataIsReadByKCP(t *testing.T) {
	g := NewWithT(t)
	cp := kcpObject()
	started := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	g.Expect(KCP{}.BeforeScaleUp(cp, "victim", started, 2)).To(Succeed())
	data, err := kcpreconciler.RemediationDataFromAnnotation(cp.GetAnnotations()[controlplanev1.RemediationInProgressAnnotation])
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(data.Machine).To(Equal("victim"))
	g.Expect(data.Timestamp.Time.Equal(started)).To(BeTrue())
	g.Expect(data.RetryCount).To(Equal(2))

	g.Expect(KCP{}.ClearScaleUp(cp, "another")).To(BeFalse(), "a value naming another Machine is KCP's or another remediation's")
	g.Expect(cp.GetAnnotations()).To(HaveKey(controlplanev1.RemediationInProgressAnnotation))
	g.Expect(KCP{}.ClearScaleUp(cp, "victim")).To(BeTrue())
	g.Expect(cp.GetAnnotations()).NotTo(HaveKey(controlplanev1.RemediationInProgressAnnotation))
}

// TestKCPSurge: KCP's admission refuses even replicas with stacked etcd (probed against KCP's own
// webhook in test/kubeadm), so the replicas are raised by two, but KCP creates one Machine at a time
// and the replicas return at the first: one Machine. External etcd takes any count. KCP creates no
// Machine while one is deleting (preflight.go), with either; a generic provider does.
func TestKCPSurge(t *testing.T) {
	g := NewWithT(t)
	const waits = "KCP creates no Machine while another is deleting"
	plan := KCP{}.Surge(kcpObject())
	g.Expect(plan).To(Equal(SurgePlan{Replicas: 2, Machines: 1, WaitsForDeletion: waits, Reason: plan.Reason}))
	g.Expect(plan.Reason).To(ContainSubstring("odd"))
	external := kcpObject()
	g.Expect(unstructured.SetNestedMap(external.Object, map[string]interface{}{"endpoints": []interface{}{"https://etcd:2379"}},
		"spec", "kubeadmConfigSpec", "clusterConfiguration", "etcd", "external")).To(Succeed())
	plan = KCP{}.Surge(external)
	g.Expect(plan).To(Equal(SurgePlan{Replicas: 1, Machines: 1, WaitsForDeletion: waits, Reason: plan.Reason}))
	plan = Generic{}.Surge(kcpObject())
	g.Expect(plan).To(Equal(SurgePlan{Replicas: 1, Machines: 1, Reason: plan.Reason}))
}

// TestKCPScaleDownRefusal: KCP refuses to scale down while another Machine fails its strict health
// check, judged from its Machine conditions; CAPR also predicts the refusal from etcd when KCP's
// conditions lag it (both killed members were down in etcd while KCP still called one
// healthy, so CAPR surged and then threw a replacement away).
func TestKCPScaleDownRefusal(t *testing.T) {
	reachable := func(names ...string) *etcdutil.State {
		s := etcdState(names...)
		for i := range s.Members {
			s.Members[i].Reachable = true
		}
		return s
	}
	with := func(s *etcdutil.State, name string, mutate func(*etcdutil.MemberStatus)) *etcdutil.State {
		mutate(s.ByName(name))
		return s
	}
	victim := kcpMachine("victim", controlplanev1.KubeadmControlPlaneMachineEtcdMemberHealthyCondition)
	tests := []struct {
		name     string
		machines []*clusterv1.Machine
		etcd     *etcdutil.State
		cp       *unstructured.Unstructured
		refusal  string // substring; "" for none
	}{
		{name: "every other Machine healthy", machines: []*clusterv1.Machine{kcpMachine("a"), kcpMachine("b")}, refusal: ""},
		{name: "another Machine's conditions unhealthy", machines: []*clusterv1.Machine{kcpMachine("a"), kcpMachine("b"),
			kcpMachine("d", controlplanev1.KubeadmControlPlaneMachineEtcdMemberHealthyCondition)}, refusal: "d is not"},
		{name: "etcd inspected, every member healthy", machines: []*clusterv1.Machine{kcpMachine("a"), kcpMachine("b")},
			etcd: reachable("a", "b", "victim"), refusal: ""},
		{name: "the victim's own member down does not count", machines: []*clusterv1.Machine{kcpMachine("a"), kcpMachine("b")},
			etcd: with(reachable("a", "b", "victim"), "victim", func(m *etcdutil.MemberStatus) { m.Healthy, m.Reachable = false, false }), refusal: ""},
		{name: "KCP's conditions lag etcd: another member dead", machines: []*clusterv1.Machine{kcpMachine("a"), kcpMachine("b")},
			etcd:    with(reachable("a", "b", "victim"), "b", func(m *etcdutil.MemberStatus) { m.Healthy, m.Reachable, m.Problem = false, false, "connection refused" }),
			refusal: "in etcd b (its member cannot be reached) is not (KCP's conditions have not caught up yet)"},
		{name: "KCP's conditions lag etcd: another member alarmed", machines: []*clusterv1.Machine{kcpMachine("a"), kcpMachine("b")},
			etcd:    with(reachable("a", "b", "victim"), "a", func(m *etcdutil.MemberStatus) { m.Healthy, m.Problem = false, "alarm NOSPACE" }),
			refusal: "a (its member is not healthy: alarm NOSPACE)"},
		{name: "KCP's conditions lag etcd: another member reachable only through the leader's word", machines: []*clusterv1.Machine{kcpMachine("a"), kcpMachine("b")},
			etcd:    with(reachable("a", "b", "victim"), "a", func(m *etcdutil.MemberStatus) { m.Reachable, m.Note = false, "the leader hears it" }),
			refusal: "a (its member cannot be reached)"},
		{name: "KCP's conditions lag etcd: another Machine has no member", machines: []*clusterv1.Machine{kcpMachine("a"), kcpMachine("b")},
			etcd: reachable("a", "victim"), refusal: "b (no member)"},
		{name: "a learner is not yet a healthy member", machines: []*clusterv1.Machine{kcpMachine("a"), kcpMachine("b")},
			etcd: with(reachable("a", "b", "victim"), "b", func(m *etcdutil.MemberStatus) { m.IsLearner = true }), refusal: "b (its member is a learner)"},
		{name: "conditions first: both kinds name the condition's Machine", machines: []*clusterv1.Machine{kcpMachine("a"),
			kcpMachine("d", controlplanev1.KubeadmControlPlaneMachineEtcdMemberHealthyCondition)},
			etcd: with(reachable("a", "d", "victim"), "a", func(m *etcdutil.MemberStatus) { m.Healthy = false }), refusal: "d is not"},
		{name: "external etcd: members are not the Machines'", machines: []*clusterv1.Machine{kcpMachine("a"), kcpMachine("b")},
			cp: kcpObject(withExternalEtcd()), etcd: reachable("x", "y", "z"), refusal: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			cp := tt.cp
			if cp == nil {
				cp = kcpObject()
			}
			view := ProviderView{ControlPlane: cp, Machines: append(tt.machines, victim), Victim: victim, Etcd: tt.etcd}
			got := KCP{}.ScaleDownRefusal(view)
			if tt.refusal == "" {
				g.Expect(got).To(BeEmpty())
				return
			}
			g.Expect(got).To(ContainSubstring(tt.refusal))
		})
	}
}

func TestKCPBusy(t *testing.T) {
	victim := kcpMachine("victim")
	three := []*clusterv1.Machine{kcpMachine("a"), kcpMachine("b"), victim}
	quiet := func() *unstructured.Unstructured {
		cp := kcpObject()
		g := NewWithT(t)
		g.Expect(unstructured.SetNestedField(cp.Object, int64(3), "status", "replicas")).To(Succeed())
		g.Expect(unstructured.SetNestedField(cp.Object, int64(3), "status", "upToDateReplicas")).To(Succeed())
		return cp
	}
	tests := []struct {
		name     string
		mutate   func(*unstructured.Unstructured)
		machines []*clusterv1.Machine
		busy     string
	}{
		{"quiet", func(*unstructured.Unstructured) {}, three, ""},
		{"scaling: a Machine missing", func(*unstructured.Unstructured) {}, three[1:], "is scaling"},
		{"status not caught up", func(cp *unstructured.Unstructured) {
			_ = unstructured.SetNestedField(cp.Object, int64(2), "status", "replicas")
		}, three, "not observed"},
		{"rolling out", func(cp *unstructured.Unstructured) {
			_ = unstructured.SetNestedField(cp.Object, int64(1), "status", "upToDateReplicas")
		}, three, "rolling out"},
		{"KCP's own remediation of another Machine", func(cp *unstructured.Unstructured) {
			cp.SetAnnotations(map[string]string{controlplanev1.RemediationInProgressAnnotation: `{"machine":"a","timestamp":"2026-01-02T03:04:05Z","retryCount":0}`})
		}, three, "another remediation"},
		{"ours (a crash after setting it) is not busy", func(cp *unstructured.Unstructured) {
			cp.SetAnnotations(map[string]string{controlplanev1.RemediationInProgressAnnotation: `{"machine":"victim","timestamp":"2026-01-02T03:04:05Z","retryCount":0}`})
		}, three, ""},
		// The Cluster topology's part is the Topology adapter's (topology_test.go).
		{"topology owns replicas: KCP itself is quiet", func(cp *unstructured.Unstructured) {
			cp.SetLabels(map[string]string{clusterv1.ClusterTopologyOwnedLabel: ""})
		}, three, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			cp := quiet()
			tt.mutate(cp)
			got := KCP{}.Busy(ProviderView{ControlPlane: cp, Machines: tt.machines, Victim: victim})
			if tt.busy == "" {
				g.Expect(got).To(BeEmpty())
			} else {
				g.Expect(got).To(ContainSubstring(tt.busy))
			}
		})
	}
}

// TestKCPBeforeScaleUpNeverOverwritesAnotherMachine: KCP's (or another remediation's) value stays;
// ours is re-stamped only forward in time (the second Machine of a surge must not look stale to KCP).
func TestKCPBeforeScaleUpNeverOverwritesAnotherMachine(t *testing.T) {
	g := NewWithT(t)
	cp := kcpObject()
	theirs := `{"machine":"a","timestamp":"2026-01-02T03:04:05Z","retryCount":0}`
	cp.SetAnnotations(map[string]string{controlplanev1.RemediationInProgressAnnotation: theirs})
	g.Expect(KCP{}.BeforeScaleUp(cp, "victim", time.Now(), 0)).To(MatchError(ContainSubstring("not overwritten")))
	g.Expect(cp.GetAnnotations()[controlplanev1.RemediationInProgressAnnotation]).To(Equal(theirs))

	cp = kcpObject()
	first := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	g.Expect(KCP{}.BeforeScaleUp(cp, "victim", first, 1)).To(Succeed())
	g.Expect(KCP{}.BeforeScaleUp(cp, "victim", first.Add(-time.Minute), 1)).To(Succeed())
	data, err := kcpreconciler.RemediationDataFromAnnotation(cp.GetAnnotations()[controlplanev1.RemediationInProgressAnnotation])
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(data.Timestamp.Time.Equal(first)).To(BeTrue(), "never moved back")
	g.Expect(KCP{}.BeforeScaleUp(cp, "victim", first.Add(time.Minute), 1)).To(Succeed())
	data, err = kcpreconciler.RemediationDataFromAnnotation(cp.GetAnnotations()[controlplanev1.RemediationInProgressAnnotation])
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(data.Timestamp.Time.Equal(first.Add(time.Minute))).To(BeTrue(), "re-stamped after the newest replacement")
}

// TestKCPExplain: while a step waits on KCP, CAPR's message carries KCP's own reason.
func TestKCPExplain(t *testing.T) {
	g := NewWithT(t)
	cp := kcpObject()
	g.Expect(KCP{}.Explain(cp)).To(BeEmpty())
	g.Expect(unstructured.SetNestedSlice(cp.Object, []interface{}{
		map[string]interface{}{"type": controlplanev1.KubeadmControlPlaneScalingUpCondition, "status": "True", "message": "Scaling up from 3 to 5 replicas is blocked because:\n* etcd would lose quorum"},
		map[string]interface{}{"type": controlplanev1.KubeadmControlPlaneScalingDownCondition, "status": "False", "message": "not scaling down"},
	}, "status", "conditions")).To(Succeed())
	got := KCP{}.Explain(cp)
	g.Expect(got).To(ContainSubstring("KCP ScalingUp: Scaling up from 3 to 5"))
	g.Expect(got).NotTo(ContainSubstring("not scaling down"))
	g.Expect(got).NotTo(ContainSubstring("\n"), "one line in a condition message")
	g.Expect(Generic{}.Explain(cp)).To(BeEmpty())
}

// TestKCPOrderWithADeadMember: a hand-built KCP of three whose victim's member is dead gets
// DeleteFirst, as KCP's own remediation does, not RemoveMemberFirst, whose surge KCP would provision
// only after the victim's deletion anyway (measured on the full stack: BenchmarkKCPStepLatency); a
// generic provider, which provisions while the victim is deleted, keeps RemoveMemberFirst. A healthy
// member still surges first on both. A victim without a member loses no margin to a surge, so on KCP
// it surges first (the replacement comes before the deletion, not after it). A member that votes
// under an etcd alarm (NOSPACE), whose Machine KCP's preflight will not let it surge for, is deleted
// before its member is removed: KCP's kcp-cleanup hook removes it at the pre-terminate point, where
// KCP's own remediation does (DeleteFirst would remove it before the delete, which starts the time at
// margin 0 sooner); a generic provider, whose deletion removes no member, would surge.
func TestKCPOrderWithADeadMember(t *testing.T) {
	nodes := []string{"a", "b", "c"}
	tests := []struct {
		name    string
		adapter Adapter
		down    []string
		missing bool // c has no member in the list
		alarmed bool // c's member votes under etcd's NOSPACE alarm (KCP: EtcdMemberHealthy False)
		want    caprv1.ControlPlaneOrder
		reason  string
	}{
		{name: "KCP, member missing", adapter: KCP{}, missing: true, want: caprv1.ControlPlaneOrderScaleUpFirst, reason: "the replacement is created before the victim is deleted"},
		{name: "generic, member missing", adapter: Generic{}, missing: true, want: caprv1.ControlPlaneOrderRemoveMemberFirst},
		{name: "KCP, member dead", adapter: KCP{}, down: []string{"c"}, want: caprv1.ControlPlaneOrderDeleteFirst, reason: "KCP creates no Machine while another is deleting"},
		{name: "KCP, member healthy", adapter: KCP{}, want: caprv1.ControlPlaneOrderScaleUpFirst},
		{name: "generic, member dead", adapter: Generic{}, down: []string{"c"}, want: caprv1.ControlPlaneOrderRemoveMemberFirst, reason: "removing it first costs no failure margin"},
		{name: "generic, member healthy", adapter: Generic{}, want: caprv1.ControlPlaneOrderScaleUpFirst},
		{name: "KCP, member alarmed", adapter: KCP{}, alarmed: true, want: caprv1.ControlPlaneOrderDeleteBeforeMemberRemoval,
			reason: "KCP's kcp-cleanup pre-terminate hook removes a deleting Machine's etcd member"},
		{name: "generic, member alarmed", adapter: Generic{}, alarmed: true, want: caprv1.ControlPlaneOrderScaleUpFirst},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			var machines []*clusterv1.Machine
			for _, n := range nodes {
				switch {
				case len(tt.down) > 0 && n == tt.down[0]:
					machines = append(machines, kcpMachine(n, controlplanev1.KubeadmControlPlaneMachineEtcdPodHealthyCondition))
				case tt.alarmed && n == "c":
					machines = append(machines, kcpMachine(n, controlplanev1.KubeadmControlPlaneMachineEtcdMemberHealthyCondition))
				default:
					machines = append(machines, kcpMachine(n))
				}
			}
			members := nodes
			if tt.missing {
				members = nodes[:2]
			}
			state := reachableState(members, tt.down...)
			if tt.alarmed {
				state.LeaderID = 1
				for i := range state.Members {
					state.Members[i].Votes = true
				}
				state.Members[2].Healthy, state.Members[2].Alarms, state.Members[2].Problem = false, []string{"NOSPACE"}, "alarmed (NOSPACE)"
			}
			view := ProviderView{ControlPlane: kcpObject(), Machines: machines, Victim: machines[2], Etcd: state}
			in := OrderInput{Policy: caprv1.ControlPlaneOrderAuto, Initialized: true, Counts: state.Counts(), Victim: victimMember(state, "c")}
			if tt.alarmed {
				in.VictimProblem = state.ByName("c").Problem
			}
			in.setProvider(tt.adapter, view)
			d := ChooseOrder(in)
			g.Expect(d.WaitReason).To(BeEmpty(), d.WaitMessage)
			g.Expect(d.Order).To(Equal(tt.want), d.Reason)
			g.Expect(d.Reason).To(ContainSubstring(tt.reason))
		})
	}
}
