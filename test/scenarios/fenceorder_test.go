package scenarios_test

import (
	"slices"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/capr-io/capr/test/sandbox"
	"github.com/capr-io/capr/test/storage"
)

// Fence before delete, judged from outside CAPR: the fence time comes from the
// backend that confirmed it (the storage sidecar's call record for the NetworkFence, the Node's
// out-of-service taint seen through a watch) and the delete time from the API server (a watch seeing
// the Machine deleting and no longer held by CAPR's hook), both at the test clock's full resolution.
// CAPR's own record (status.fencing FencedTime, a metav1.Time of whole seconds) let a deletion up to
// a second before the fence pass.

// watchFenceOrder starts the watches expectFencedBeforeDeleted reads; they stop with the test.
func watchFenceOrder(t *testing.T, wc *sandbox.WorkloadCluster) (deletions, taints *sandbox.FirstSeen) {
	g := NewWithT(t)
	deletions, err := sb.WatchMachineDeletions(ctx, wc)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(deletions.Stop)
	taints, err = sb.WatchNodeTaints(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(taints.Stop)
	return deletions, taints
}

// expectFencedBeforeDeleted asserts that the storage system refused cidr (the sidecar's first fence
// call after start) and the Node carried the out-of-service taint before the Machine's deletion took
// effect, and that cidr was not unfenced in between.
func expectFencedBeforeDeleted(g Gomega, stack *storage.Stack, deletions, taints *sandbox.FirstSeen, start time.Time, machine, node, cidr string) {
	released, err := deletions.At(machine, sandbox.MachineReleased)
	g.Expect(err).NotTo(HaveOccurred())
	var fenced time.Time
	for _, c := range stack.Sidecar.Calls() {
		if c.Time.Before(start) || !slices.Contains(c.CIDRs, cidr) {
			continue
		}
		if c.Fence && fenced.IsZero() {
			fenced = c.Time
		}
		if !c.Fence && !fenced.IsZero() {
			g.Expect(c.Time.Before(released)).To(BeFalse(), "%s unfenced at %s, before Machine %s's deletion took effect at %s",
				cidr, stamp(c.Time), machine, stamp(released))
		}
	}
	g.Expect(fenced.IsZero()).To(BeFalse(), "the storage system was never asked to fence %s", cidr)
	g.Expect(fenced.Before(released)).To(BeTrue(), "Machine %s's deletion took effect at %s, before the storage system fenced %s at %s",
		machine, stamp(released), cidr, stamp(fenced))
	tainted, err := taints.At(node, sandbox.NodeOutOfService)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(tainted.Before(released)).To(BeTrue(), "Machine %s's deletion took effect at %s, before Node %s was seen out-of-service at %s",
		machine, stamp(released), node, stamp(tainted))
}

func stamp(t time.Time) string { return t.Format("15:04:05.000") }
