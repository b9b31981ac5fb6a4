package scenarios_test

import (
	"encoding/json"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/cluster-api/util/conditions"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/test/sandbox"
)

// TestRetryLimits: a replacement that fails within minHealthyPeriodSeconds is a retry. It waits for
// retryPeriodSeconds, is remediated with retryCount 1, and when its own replacement fails too,
// maxRetry (1) stops CAPR: the remediation fails and says a person must act.
func TestRetryLimits(t *testing.T) {
	g := NewWithT(t)
	wc := newCluster(t, withHealthCheck(func(mhc *caprv1.MachineHealthCheck) {
		mhc.Spec.Remediation.ControlPlane = &caprv1.ControlPlaneRemediationSpec{
			MaxRetry: ptr.To[int32](1), RetryPeriodSeconds: ptr.To[int32](25), MinHealthyPeriodSeconds: ptr.To[int32](3600),
		}
	}))
	capr, err := sb.StartCAPR(ctx, sandbox.CAPROptions{})
	g.Expect(err).NotTo(HaveOccurred())
	defer capr.Stop()

	first := controlPlane(g, wc)[0]
	g.Expect(sb.StopHeartbeat(ctx, wc, first.Status.NodeRef.Name)).To(Succeed())
	mrA := waitRemediated(t, wc, first.Name, 3)
	b := mrA.Status.ControlPlane.Replacement
	record := retryRecord(g, wc, b)
	g.Expect(record.Machine).To(Equal(first.Name))
	g.Expect(record.RetryCount).To(BeEquivalentTo(0))

	// The replacement fails too: a retry, which waits for retryPeriodSeconds after A's remediation.
	g.Expect(sb.StopHeartbeat(ctx, wc, getMachine(g, wc, b).Status.NodeRef.Name)).To(Succeed())
	g.Eventually(func(g Gomega) {
		mr := getRemediation(g, wc, b)
		g.Expect(conditions.GetReason(mr, caprv1.MachineRemediationProgressingCondition)).To(Equal(caprv1.MachineRemediationWaitingForRetryPeriodReason))
		g.Expect(conditions.GetMessage(mr, caprv1.MachineRemediationProgressingCondition)).To(ContainSubstring("retryPeriodSeconds"))
	}, time.Minute, 200*time.Millisecond).Should(Succeed())
	mrB := waitRemediated(t, wc, b, 3)
	g.Expect(mrB.Status.ControlPlane.RetryCount).To(BeEquivalentTo(1))
	g.Expect(mrB.Status.StartTime.Time).To(BeTemporally(">=", mrA.Status.StartTime.Add(25*time.Second)))
	c := mrB.Status.ControlPlane.Replacement
	g.Expect(retryRecord(g, wc, c).RetryCount).To(BeEquivalentTo(1))

	// Its replacement fails as well: maxRetry is reached, nothing more is done.
	g.Expect(sb.StopHeartbeat(ctx, wc, getMachine(g, wc, c).Status.NodeRef.Name)).To(Succeed())
	g.Eventually(func(g Gomega) {
		mr := getRemediation(g, wc, c)
		g.Expect(mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhaseFailed))
		g.Expect(conditions.GetReason(mr, caprv1.MachineRemediationSucceededCondition)).To(Equal(caprv1.MachineRemediationRetryLimitReachedReason))
		g.Expect(mr.Status.LastError).To(ContainSubstring("maxRetry (1) reached"))
	}, remediationTimeout, 200*time.Millisecond).Should(Succeed())
	g.Consistently(func(g Gomega) {
		g.Expect(controlPlane(g, wc)).To(HaveLen(3))
		g.Expect(getMachine(g, wc, c).DeletionTimestamp.IsZero()).To(BeTrue())
	}, 3*time.Second, 500*time.Millisecond).Should(Succeed())
}

func retryRecord(g Gomega, wc *sandbox.WorkloadCluster, machine string) *caprv1.RemediationRecord {
	m := getMachine(g, wc, machine)
	rec := &caprv1.RemediationRecord{}
	g.Expect(json.Unmarshal([]byte(m.Annotations[caprv1.RemediationRecordAnnotation]), rec)).To(Succeed())
	return rec
}
