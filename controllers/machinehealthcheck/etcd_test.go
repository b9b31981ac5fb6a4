package machinehealthcheck

import (
	"context"
	"errors"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

type fixedEtcdMembers map[string]EtcdMemberHealth

func (f fixedEtcdMembers) MemberHealth(context.Context, *clusterv1.Cluster) (map[string]EtcdMemberHealth, error) {
	return f, nil
}

// The unhealthy-since times live on the Reconciler, not in package state, and are pruned when their
// Machines are no longer observed.
func TestEtcdUnhealthySinceIsPerReconcilerAndPruned(t *testing.T) {
	g := NewWithT(t)
	down := fixedEtcdMembers{"n": {Problem: "unreachable"}}
	cp := func(uid string) []target {
		return []target{{machine: machine(asControlPlane, func(m *clusterv1.Machine) { m.UID = types.UID(uid) })}}
	}

	first := &Reconciler{EtcdMembers: down}
	targets := cp("a")
	first.observeEtcdMembers(down, targets, now)
	g.Expect(targets[0].etcd.since).To(Equal(now))

	// Another Reconciler (another manager in the same process, a test) starts its own timeout.
	second := &Reconciler{EtcdMembers: down}
	targets = cp("a")
	second.observeEtcdMembers(down, targets, now.Add(time.Minute))
	g.Expect(targets[0].etcd.since).To(Equal(now.Add(time.Minute)), "state is not shared between Reconcilers")

	// The first keeps its time while the Machine is observed...
	targets = cp("a")
	first.observeEtcdMembers(down, targets, now.Add(30*time.Minute))
	g.Expect(targets[0].etcd.since).To(Equal(now))
	// ...and forgets it once the Machine is gone (no longer observed) for long enough.
	first.observeEtcdMembers(down, cp("b"), now.Add(2*time.Hour))
	first.state.etcdUnhealthy.mu.Lock()
	g.Expect(first.state.etcdUnhealthy.since).To(HaveLen(1))
	g.Expect(first.state.etcdUnhealthy.since).To(HaveKey(types.UID("b")))
	first.state.etcdUnhealthy.mu.Unlock()
}

// A replacement's promotion starts its time again, once: seen joining (not listed, then a learner,
// reachable or not) for 8 s and then a voter that fails its reads, it is timed from the promotion, so
// a 10 s timeout has not expired 4 s later. A learner that stays a learner is timed from when it was
// first seen, also while it flips between unreachable and reachable; a voter's problems share one
// time; and a member that leaves the list and comes back voting is not timed again.
func TestEtcdPromotionStartsTheTimeAgain(t *testing.T) {
	g := NewWithT(t)
	r := &Reconciler{}
	learner := func(problem string) *EtcdMemberHealth { return &EtcdMemberHealth{Problem: problem, Learner: true} }
	voter := func(problem string) *EtcdMemberHealth { return &EtcdMemberHealth{Problem: problem} }
	observe := func(h *EtcdMemberHealth, at time.Time) time.Time {
		targets := []target{{machine: machine(asControlPlane, func(m *clusterv1.Machine) { m.UID = "replacement" })}}
		health := fixedEtcdMembers{}
		if h != nil {
			health["n"] = *h
		}
		r.observeEtcdMembers(health, targets, at)
		return targets[0].etcd.since
	}
	at := func(s int) time.Time { return now.Add(time.Duration(s) * time.Second) }
	g.Expect(observe(nil, at(0))).To(Equal(at(0)), "not listed yet")
	g.Expect(observe(learner("a learner"), at(5))).To(Equal(at(0)), "still joining")
	g.Expect(observe(voter("unreachable"), at(8))).To(Equal(at(8)), "promoted: timed from here")
	g.Expect(observe(voter("unreachable"), at(12))).To(Equal(at(8)))
	g.Expect(observe(nil, at(20))).To(Equal(at(8)), "gone from the list")
	g.Expect(observe(voter("unreachable"), at(25))).To(Equal(at(8)), "timed again once only")

	r = &Reconciler{}
	g.Expect(observe(learner("a learner"), at(0))).To(Equal(at(0)))
	g.Expect(observe(learner("unreachable"), at(30))).To(Equal(at(0)), "a learner that cannot be reached is still joining")
	g.Expect(observe(learner("a learner"), at(60))).To(Equal(at(0)), "a learner stuck for a minute")
	g.Expect(observe(voter("has no leader"), at(120))).To(Equal(at(120)))
	g.Expect(observe(voter("unreachable"), at(180))).To(Equal(at(120)), "a voter's problems share one time")
}

// countingEtcdMembers counts the reads of etcd member health.
type countingEtcdMembers struct{ reads int }

func (c *countingEtcdMembers) MemberHealth(context.Context, *clusterv1.Cluster) (map[string]EtcdMemberHealth, error) {
	c.reads++
	return map[string]EtcdMemberHealth{}, nil
}

// With external etcd the control-plane Machines have no members: etcd is not read (it could only
// fail, after its timeouts, and delay the round's marks).
func TestObserveEtcdSkipsExternalEtcd(t *testing.T) {
	g := NewWithT(t)
	source := &countingEtcdMembers{}
	r := &Reconciler{EtcdMembers: source}
	cfg := checkConfig{etcdMemberTimeout: time.Minute}
	facts := clusterFacts{controlPlaneInitialized: true}
	targets := []target{{machine: machine(asControlPlane)}}
	r.observeEtcd(context.Background(), &clusterv1.Cluster{}, cfg, facts, targets, caprv1.EtcdPlacementStacked, now)
	g.Expect(source.reads).To(Equal(1))
	q := r.observeEtcd(context.Background(), &clusterv1.Cluster{}, cfg, facts, targets, caprv1.EtcdPlacementExternal, now)
	g.Expect(source.reads).To(Equal(1), "external etcd is not read")
	g.Expect(q.lost()).To(BeFalse())
}

// The control-plane limit follows the control-plane object's etcd placement: with KCP's
// etcd.external, two of three Machines may be remediated; stacked, one.
func TestControlPlaneLimitFollowsTheEtcdPlacement(t *testing.T) {
	g := NewWithT(t)
	kcp := func(external bool) *unstructured.Unstructured {
		cp := &unstructured.Unstructured{Object: map[string]interface{}{
			"apiVersion": "controlplane.cluster.x-k8s.io/v1beta2", "kind": "KubeadmControlPlane",
			"metadata": map[string]interface{}{"name": "kcp"}, "spec": map[string]interface{}{"replicas": int64(3)},
		}}
		if external {
			g.Expect(unstructured.SetNestedMap(cp.Object, map[string]interface{}{"endpoints": []interface{}{"https://etcd:2379"}},
				"spec", "kubeadmConfigSpec", "clusterConfiguration", "etcd", "external")).To(Succeed())
		}
		return cp
	}
	stacked := controlPlaneLimit(kcp(false), nil, -1, 3, 2, 0)
	g.Expect(stacked.allowed).To(BeFalse())
	g.Expect(stacked.message).To(ContainSubstring("quorum-safe limit is 1"))
	external := controlPlaneLimit(kcp(true), nil, -1, 3, 2, 0)
	g.Expect(external.allowed).To(BeTrue())
	g.Expect(external.limit).To(Equal(2))
	g.Expect(controlPlaneLimit(kcp(true), nil, -1, 3, 3, 0).allowed).To(BeFalse(), "one Machine must keep serving")
	unreadable := controlPlaneLimit(nil, errors.New("cannot read the control plane's desired replicas: boom"), -1, 3, 0, 0)
	g.Expect(unreadable.allowed).To(BeFalse())
	g.Expect(unreadable.message).To(ContainSubstring("boom"))
}
