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

// A replacement's promotion starts its time again: seen joining (not listed, then a learner) for
// 8 s and then a voter that fails its reads, it is timed from the promotion, so a 10 s timeout has
// not expired 4 s later. A learner that stays a learner is timed from when it was first seen, and a
// voter that goes on failing keeps the time of its first failure as a voter.
func TestEtcdPromotionStartsTheTimeAgain(t *testing.T) {
	g := NewWithT(t)
	r := &Reconciler{}
	observe := func(problem string, at time.Time) *etcdMemberFact {
		targets := []target{{machine: machine(asControlPlane, func(m *clusterv1.Machine) { m.UID = "replacement" })}}
		health := fixedEtcdMembers{}
		if problem != "" {
			health["n"] = EtcdMemberHealth{Problem: problem}
		}
		r.observeEtcdMembers(health, targets, at)
		return targets[0].etcd
	}
	g.Expect(observe("", now).since).To(Equal(now), "not listed yet")
	g.Expect(observe("a learner", now.Add(5*time.Second)).since).To(Equal(now), "still joining")
	g.Expect(observe("unreachable", now.Add(8*time.Second)).since).To(Equal(now.Add(8*time.Second)), "promoted: timed from here")
	g.Expect(observe("unreachable", now.Add(12*time.Second)).since).To(Equal(now.Add(8 * time.Second)))

	r = &Reconciler{}
	g.Expect(observe("a learner", now).since).To(Equal(now))
	g.Expect(observe("a learner", now.Add(time.Minute)).since).To(Equal(now), "a learner stuck for a minute")
	g.Expect(observe("has no leader", now.Add(2*time.Minute)).since).To(Equal(now.Add(2 * time.Minute)))
	g.Expect(observe("unreachable", now.Add(3*time.Minute)).since).To(Equal(now.Add(2*time.Minute)), "a voter's problems share one time")
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
