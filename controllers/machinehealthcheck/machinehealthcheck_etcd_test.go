package machinehealthcheck

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/types"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
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
	first.etcdUnhealthy.mu.Lock()
	g.Expect(first.etcdUnhealthy.since).To(HaveLen(1))
	g.Expect(first.etcdUnhealthy.since).To(HaveKey(types.UID("b")))
	first.etcdUnhealthy.mu.Unlock()
}
