package machinehealthcheck

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
)

// The round runs again just after the first running timeout expires: never before it (the
// evaluation then would still be Pending), and not a whole second after it.
func TestRequeueLandsJustAfterTheExpiry(t *testing.T) {
	g := NewWithT(t)
	targets := []target{
		{machine: machine(), node: node(nodeCond(corev1.NodeReady, corev1.ConditionFalse, 100*time.Second))},
		{machine: machine(), node: node(nodeCond(corev1.NodeReady, corev1.ConditionUnknown, 250*time.Second))},
	}
	rd := evaluateAll(targets, defaultConfig(), readyCluster, now)
	g.Expect(rd.next).To(Equal(50*time.Second + expirySlack)) // nextCheck keeps its slack
	after := rd.requeueAfter(defaultConfig())
	g.Expect(after).To(Equal(50*time.Second + requeueMargin))

	// At the requeue the target whose timeout expired is unhealthy.
	g.Expect(evaluate(targets[1], defaultConfig(), readyCluster, now.Add(after)).verdict).To(Equal(verdictUnhealthy))
}

func TestRequeueWithoutRunningTimeoutsOnlyPollsEtcd(t *testing.T) {
	g := NewWithT(t)
	cfg := defaultConfig()
	cfg.etcdMemberTimeout = 0
	rd := evaluateAll([]target{{machine: machine(asControlPlane), node: node(nodeCond(corev1.NodeReady, corev1.ConditionTrue, time.Hour))}},
		cfg, readyCluster, now)
	g.Expect(rd.requeueAfter(cfg)).To(BeZero())
	cfg.etcdMemberTimeout = time.Minute
	g.Expect(rd.requeueAfter(cfg)).To(Equal(etcdPollInterval))
}
