//go:build envtest

package worker_test

import (
	"fmt"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/remediation/retention"
	"github.com/capr-io/capr/test/builder"
)

// retentionLimit is the suite's maximum of finished requests per Cluster (suite_envtest_test.go).
const retentionLimit = 5

// finishedRequest creates the request of Machine name as a remediator leaves it when it has
// finished: owned by the Cluster, labelled with it, phase and completionTime as given. The status is
// written until it sticks: the worker remediator may write the new request first (its Machine may
// not exist), after which it no longer touches a finished one.
func (f *fixture) finishedRequest(g *WithT, name string, phase caprv1.RemediationPhase, completed time.Time) {
	mr := builder.MachineRemediation(f.ns, f.cluster.Name, name).OwnedByCluster(f.cluster).Build()
	g.Expect(k8sClient.Create(ctx, mr)).To(Succeed())
	g.Eventually(func(g Gomega) {
		mr := getRemediation(g, f.ns, name)
		mr.Status.Phase = phase
		mr.Status.StartTime = ptr.To(metav1.NewTime(completed.Add(-time.Minute)))
		mr.Status.CompletionTime = ptr.To(metav1.NewTime(completed))
		g.Expect(k8sClient.Status().Update(ctx, mr)).To(Succeed())
	}, eventually, poll).Should(Succeed())
}

// A finished request goes once its TTL after completionTime has passed, at that time (the
// controller comes back at the expiry: nothing else happens to the request meanwhile), and a Failed
// one whose Machine still exists stays whatever its age, until its Machine is gone.
func TestFinishedRequestsGoAfterTheirTTL(t *testing.T) {
	g := NewWithT(t)
	f := newFixture(t, g, nil)
	ttl := retention.DefaultTTL

	f.finishedRequest(g, "expired", caprv1.MachineRemediationPhaseSucceeded, time.Now().Add(-ttl-time.Hour))
	// completionTime has a resolution of a second: this one expires 11 to 12 seconds from now.
	expiresAt := time.Now().Add(12 * time.Second)
	f.finishedRequest(g, "expiring", caprv1.MachineRemediationPhaseSucceeded, expiresAt.Add(-ttl))
	failed := f.machine(g, "failed")
	f.finishedRequest(g, "failed", caprv1.MachineRemediationPhaseFailed, time.Now().Add(-ttl-time.Hour))

	g.Eventually(func(g Gomega) bool { return remediationExists(g, f.ns, "expired") }, eventually, poll).Should(BeFalse())
	g.Consistently(func(g Gomega) bool { return remediationExists(g, f.ns, "expiring") }, time.Until(expiresAt.Add(-2*time.Second)), poll).Should(BeTrue())
	g.Eventually(func(g Gomega) bool { return remediationExists(g, f.ns, "expiring") }, eventually, poll).Should(BeFalse())
	g.Expect(time.Now()).To(BeTemporally(">=", expiresAt.Add(-time.Second)), "deleted before its expiry")

	// The Failed request is what stops the health checker from asking again for its Machine.
	g.Consistently(func(g Gomega) bool { return remediationExists(g, f.ns, "failed") }, quiet, poll).Should(BeTrue())
	g.Expect(k8sClient.Delete(ctx, failed)).To(Succeed())
	g.Eventually(func(g Gomega) bool { return remediationExists(g, f.ns, "failed") }, eventually, poll).Should(BeFalse())
}

// Beyond the limit per Cluster, the oldest finished requests go first; Pending ones and the requests
// of another Cluster do not count.
func TestFinishedRequestsBeyondTheLimitGoOldestFirst(t *testing.T) {
	g := NewWithT(t)
	f := newFixture(t, g, nil)
	other := newFixture(t, g, nil)

	// A Pending request of a Machine that exists (nothing replaces it: it waits) and a finished one
	// of another Cluster.
	f.request(g, f.machine(g, "pending"), nil, caprv1.MachineRemediationSourceHealthCheck)
	other.finishedRequest(g, "elsewhere", caprv1.MachineRemediationPhaseSucceeded, time.Now().Add(-time.Hour))

	// Written oldest first, each a minute younger than the one before.
	start := time.Now().Add(-time.Hour)
	names := make([]string, 0, retentionLimit+2)
	for i := range retentionLimit + 2 {
		name := fmt.Sprintf("r%d", i)
		names = append(names, name)
		f.finishedRequest(g, name, caprv1.MachineRemediationPhaseSucceeded, start.Add(time.Duration(i)*time.Minute))
	}
	g.Eventually(func(g Gomega) []string {
		list := &caprv1.MachineRemediationList{}
		g.Expect(k8sClient.List(ctx, list, client.InNamespace(f.ns))).To(Succeed())
		left := make([]string, 0, len(list.Items))
		for _, mr := range list.Items {
			left = append(left, mr.Name)
		}
		return left
	}, eventually, poll).Should(ConsistOf(append([]string{"pending"}, names[2:]...)))
	g.Consistently(func(g Gomega) bool { return remediationExists(g, f.ns, names[2]) }, quiet, poll).Should(BeTrue())
	g.Expect(remediationExists(g, other.ns, "elsewhere")).To(BeTrue())
}
