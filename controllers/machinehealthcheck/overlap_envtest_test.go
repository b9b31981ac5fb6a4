//go:build envtest

package machinehealthcheck_test

import (
	"fmt"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/controllers/machinehealthcheck"
	capienv "github.com/capr-io/capr/test/envtest"
)

// overlapQuiet is how long the overlap tests watch that nothing changes: longer than any requeue of
// these health checks (timeouts of 1 s, standInRecheck and statusWriteInterval of 1 s, the first
// connection's 2 s), so that every round they start on their own runs within it.
const overlapQuiet = 5 * time.Second

// overlappingHealthChecks creates two overlapping health checks over pool "a": "ready" finds a
// Machine unhealthy when its Node is Ready=False or Unknown for 1 s, "disk" only when its Node has
// DiskPressure=True for 1 s. It returns "disk".
func (f *fixture) overlappingHealthChecks(g *WithT) *caprv1.MachineHealthCheck {
	ready := capienv.NewHealthCheck(f.ns, f.cluster.Name, "a", 1)
	ready.Name = "ready"
	disk := capienv.NewHealthCheck(f.ns, f.cluster.Name, "a", 1)
	disk.Name = "disk"
	disk.Spec.Checks.UnhealthyNodeConditions = []caprv1.UnhealthyNodeCondition{
		{Type: corev1.NodeDiskPressure, Status: corev1.ConditionTrue, TimeoutSeconds: ptr.To[int32](1)},
	}
	g.Expect(k8sClient.Create(ctx, ready)).To(Succeed())
	g.Expect(k8sClient.Create(ctx, disk)).To(Succeed())
	return disk
}

// markCheckers returns the mark condition of Machine "m" (nil when it has none) and the health
// checks whose entries it has, in order (none when it is not at False).
func markCheckers(g Gomega, ns string) (*metav1.Condition, []string) {
	cond := conditions.Get(getMachine(g, ns, "m"), caprv1.MachineCAPRHealthCheckSucceededCondition)
	if cond == nil || cond.Status != metav1.ConditionFalse {
		return cond, nil
	}
	entries, err := caprv1.MarkEntriesFromMessage(cond.Message)
	g.Expect(err).NotTo(HaveOccurred(), "the mark names its health checks")
	checkers := make([]string, 0, len(entries))
	for _, e := range entries {
		checkers = append(checkers, e.Checker)
	}
	return cond, checkers
}

// TestOverlappingHealthChecksDoNotFight: "ready" and "disk" select one
// Machine, and its Node goes Ready=Unknown. "ready" marks it; "disk", which finds it healthy, leaves
// that mark alone. The mark stays (same since) over rounds of both, the request is created once, the
// Machine is written a bounded number of times, and each health check reports the overlap in
// TargetsOverlap and one Warning event.
func TestOverlappingHealthChecksDoNotFight(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	f := newFixture(t, g, 0)
	f.machine(g, "m")
	f.overlappingHealthChecks(g)
	machinePath := fmt.Sprintf("/apis/%s/namespaces/%s/machines/m", clusterv1.GroupVersion.String(), f.ns)
	requestsPath := fmt.Sprintf("/apis/%s/namespaces/%s/machineremediations", caprv1.GroupVersion.String(), f.ns)

	for _, pair := range [][2]string{{"ready", "disk"}, {"disk", "ready"}} {
		g.Eventually(func(g Gomega) {
			mhc := &caprv1.MachineHealthCheck{}
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: pair[0]}, mhc)).To(Succeed())
			g.Expect(mhc.Status.Targets).To(Equal([]string{"m"}))
			c := conditions.Get(mhc, caprv1.MachineHealthCheckTargetsOverlapCondition)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(Equal(metav1.ConditionTrue))
			g.Expect(c.Reason).To(Equal(caprv1.MachineHealthCheckTargetsOverlapReason))
			g.Expect(c.Message).To(ContainSubstring(pair[1] + " (Machine m)"))
			g.Expect(eventsFor(g, f.ns, pair[0], caprv1.EventTargetsOverlap)).To(ContainElement(HaveField("Type", corev1.EventTypeWarning)))
		}, eventually, poll).Should(Succeed(), "health check %s reports the overlap with %s", pair[0], pair[1])
	}
	g.Eventually(func(g Gomega) {
		cond, _ := markCheckers(g, f.ns)
		g.Expect(cond).NotTo(BeNil())
		g.Expect(cond.Status).To(Equal(metav1.ConditionTrue))
	}, eventually, poll).Should(Succeed())

	g.Expect(capienv.SetNodeReady(ctx, k8sClient, f.ns+"-m", corev1.ConditionUnknown)).To(Succeed())
	var since metav1.Time
	g.Eventually(func(g Gomega) {
		cond, checkers := markCheckers(g, f.ns)
		g.Expect(checkers).To(Equal([]string{f.ns + "/ready"}))
		g.Expect(cond.Reason).To(Equal(caprv1.MachineCAPRHealthCheckUnhealthyNodeReason))
		since = cond.LastTransitionTime
		mr := &caprv1.MachineRemediation{}
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: "m"}, mr)).To(Succeed())
		g.Expect(mr.Labels).To(HaveKeyWithValue(machinehealthcheck.HealthCheckLabel, "ready"))
	}, eventually, poll).Should(Succeed())

	g.Consistently(func(g Gomega) {
		cond, checkers := markCheckers(g, f.ns)
		g.Expect(checkers).To(Equal([]string{f.ns + "/ready"}), "the mark stays")
		g.Expect(cond.LastTransitionTime.Time).To(BeTemporally("==", since.Time), "never cleared and set again")
		g.Expect(remediationExists(f.ns, "m")).To(BeTrue())
	}, overlapQuiet, poll).Should(Succeed())
	g.Expect(requests.Of("POST", requestsPath)).To(Equal(1), "the request is created once")
	// Reporting the Machine healthy (once per health check at most, when both start from a Machine
	// without the condition) and marking it: no write loop.
	g.Expect(requests.WritesTo(machinePath)).To(BeNumerically("<=", 3), "Machine writes")
	for _, name := range []string{"ready", "disk"} {
		evs := eventsFor(g, f.ns, name, caprv1.EventTargetsOverlap)
		g.Expect(evs).To(HaveLen(1), "one overlap event on %s", name)
		g.Expect(evs[0].Series).To(BeNil(), "recorded once on %s", name)
	}
}

// TestDeletingOneOfTwoOverlappingHealthChecksKeepsTheOthersMark: a health check being deleted
// removes only its own entry of a mark: the Machine stays marked, since kept, by the other, which
// reports that the overlap ended.
func TestDeletingOneOfTwoOverlappingHealthChecksKeepsTheOthersMark(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// diskPressure: "disk" marks the Machine too before it is deleted.
		diskPressure bool
	}{
		{name: "only the other marks"},
		{name: "both mark", diskPressure: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			g := NewWithT(t)
			f := newFixture(t, g, 0)
			f.machine(g, "m")
			disk := f.overlappingHealthChecks(g)
			want := []string{f.ns + "/ready"}
			g.Expect(capienv.SetNodeReady(ctx, k8sClient, f.ns+"-m", corev1.ConditionUnknown)).To(Succeed())
			if tc.diskPressure {
				g.Expect(capienv.SetNodeCondition(ctx, k8sClient, f.ns+"-m", corev1.NodeDiskPressure, corev1.ConditionTrue)).To(Succeed())
				want = append(want, f.ns+"/disk")
			}
			var since metav1.Time
			g.Eventually(func(g Gomega) {
				cond, checkers := markCheckers(g, f.ns)
				g.Expect(checkers).To(ConsistOf(want))
				since = cond.LastTransitionTime
			}, eventually, poll).Should(Succeed())

			g.Expect(k8sClient.Delete(ctx, disk)).To(Succeed())
			g.Eventually(func(g Gomega) {
				err := k8sClient.Get(ctx, client.ObjectKeyFromObject(disk), &caprv1.MachineHealthCheck{})
				g.Expect(apierrors.IsNotFound(err)).To(BeTrue())
				_, checkers := markCheckers(g, f.ns)
				g.Expect(checkers).To(Equal([]string{f.ns + "/ready"}))
			}, eventually, poll).Should(Succeed())
			g.Eventually(func(g Gomega) {
				mhc := &caprv1.MachineHealthCheck{}
				g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: "ready"}, mhc)).To(Succeed())
				g.Expect(conditions.GetReason(mhc, caprv1.MachineHealthCheckTargetsOverlapCondition)).To(Equal(caprv1.MachineHealthCheckNoTargetsOverlapReason))
			}, eventually, poll).Should(Succeed(), "the overlap ended with the other health check")
			g.Consistently(func(g Gomega) {
				cond, checkers := markCheckers(g, f.ns)
				g.Expect(checkers).To(Equal([]string{f.ns + "/ready"}), "the other's mark stays")
				g.Expect(cond.LastTransitionTime.Time).To(BeTemporally("==", since.Time), "never cleared and set again")
			}, overlapQuiet, poll).Should(Succeed())
			g.Eventually(func() bool { return remediationExists(f.ns, "m") }, eventually, poll).Should(BeTrue())
		})
	}
}

// TestAnOverlapIsReportedWhenTheOtherHealthCheckIsCreated: a health check learns of an overlap that
// starts without any Machine changing: "disk" is created over the Machines "ready" already checks
// and found healthy, so neither writes a Machine, and "ready" reports the overlap all the same.
func TestAnOverlapIsReportedWhenTheOtherHealthCheckIsCreated(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	f := newFixture(t, g, 0)
	f.machine(g, "m")
	ready := capienv.NewHealthCheck(f.ns, f.cluster.Name, "a", 1)
	ready.Name = "ready"
	g.Expect(k8sClient.Create(ctx, ready)).To(Succeed())
	reason := func(g Gomega) string {
		mhc := &caprv1.MachineHealthCheck{}
		g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(ready), mhc)).To(Succeed())
		return conditions.GetReason(mhc, caprv1.MachineHealthCheckTargetsOverlapCondition)
	}
	g.Eventually(func(g Gomega) {
		g.Expect(reason(g)).To(Equal(caprv1.MachineHealthCheckNoTargetsOverlapReason))
		cond, _ := markCheckers(g, f.ns)
		g.Expect(cond).NotTo(BeNil())
		g.Expect(cond.Status).To(Equal(metav1.ConditionTrue))
	}, eventually, poll).Should(Succeed())

	disk := capienv.NewHealthCheck(f.ns, f.cluster.Name, "a", 1)
	disk.Name = "disk"
	g.Expect(k8sClient.Create(ctx, disk)).To(Succeed())
	g.Eventually(reason, eventually, poll).Should(Equal(caprv1.MachineHealthCheckTargetsOverlapReason))
}
