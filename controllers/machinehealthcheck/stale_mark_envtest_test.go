//go:build envtest

package machinehealthcheck_test

import (
	"testing"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	"github.com/capr-io/capr/controllers/machinehealthcheck"
	"github.com/capr-io/capr/test/builder"
	capienv "github.com/capr-io/capr/test/envtest"
)

// TestAMarkWrittenFromAStaleCopyKeepsTheOtherHealthChecksEntry: two health checks "ready" and "disk"
// over one Machine, and "disk" writes from a copy of the Machine read before "ready"'s entry was
// written (its cache lagging behind that write, as under load). Whatever "disk" writes, its report
// that the Machine is healthy, its own entry or the removal of its entry when it is deleted,
// "ready"'s entry stays and the mark is not set again (its lastTransitionTime is kept). No health
// check runs in the namespace: the writes are the test's, made the way the health checker makes
// them, in a fixed order.
func TestAMarkWrittenFromAStaleCopyKeepsTheOtherHealthChecksEntry(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// diskMarkedFirst: "disk"'s entry is on the Machine before its stale copy is read.
		diskMarkedFirst bool
		// write is what "disk" writes from its stale copy.
		write func(g *WithT, stale *clusterv1.Machine, disk string)
		want  func(ready, disk string) []string
	}{
		{
			name: "disk reports the Machine healthy",
			write: func(g *WithT, stale *clusterv1.Machine, disk string) {
				g.Expect(machinehealthcheck.WriteMarkFrom(ctx, k8sClient, stale, disk, false)).To(Succeed())
			},
			want: func(ready, _ string) []string { return []string{ready} },
		},
		{
			name: "disk marks the Machine too",
			write: func(g *WithT, stale *clusterv1.Machine, disk string) {
				g.Expect(machinehealthcheck.WriteMarkFrom(ctx, k8sClient, stale, disk, true)).To(Succeed())
			},
			want: func(ready, disk string) []string { return []string{ready, disk} },
		},
		{
			name:            "disk is deleted",
			diskMarkedFirst: true,
			write: func(g *WithT, stale *clusterv1.Machine, disk string) {
				g.Expect(machinehealthcheck.UnmarkFrom(ctx, k8sClient, stale, disk)).To(Succeed())
			},
			want: func(ready, _ string) []string { return []string{ready} },
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			g := NewWithT(t)
			ns, err := capienv.CreateNamespace(ctx, k8sClient, "stale")
			g.Expect(err).NotTo(HaveOccurred())
			ready, disk := ns+"/ready", ns+"/disk"
			m := builder.Machine(ns, "c1", "m").WithLabels(pool).Build()
			g.Expect(k8sClient.Create(ctx, m)).To(Succeed())
			// A condition of CAPI's, which no write of the mark may lose.
			conditions.Set(m, metav1.Condition{Type: clusterv1.MachineReadyCondition, Status: metav1.ConditionTrue, Reason: clusterv1.MachineReadyReason})
			g.Expect(k8sClient.Status().Update(ctx, m)).To(Succeed())
			if tc.diskMarkedFirst {
				g.Expect(machinehealthcheck.WriteMarkFrom(ctx, k8sClient, getMachine(g, ns, "m"), disk, true)).To(Succeed())
			}
			stale := getMachine(g, ns, "m")

			g.Expect(machinehealthcheck.WriteMarkFrom(ctx, k8sClient, getMachine(g, ns, "m"), ready, true)).To(Succeed())
			before, checkers := markCheckers(g, ns)
			g.Expect(checkers).To(ContainElement(ready))

			tc.write(g, stale, disk)
			after, checkers := markCheckers(g, ns)
			g.Expect(checkers).To(ConsistOf(tc.want(ready, disk)), "the entries of the mark")
			g.Expect(after.LastTransitionTime.Time).To(BeTemporally("==", before.LastTransitionTime.Time), "the mark is not set again")
			g.Expect(conditions.IsTrue(getMachine(g, ns, "m"), clusterv1.MachineReadyCondition)).To(BeTrue(), "CAPI's condition stays")
		})
	}
}
