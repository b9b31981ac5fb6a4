package scenarios_test

import (
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/controllers"
	"github.com/capr-io/capr/remediation/controlplane"
	"github.com/capr-io/capr/test/sandbox"
)

// BenchmarkControlPlaneStepLatency measures the controller's own added latency per step of a
// scale-up-first remediation on the sandbox: the time between the world being ready for a step and
// CAPR issuing it (or seeing it done). What the providers and etcd take themselves is not counted.
//
//	ScaleUp       remediation requested (MachineRemediation created) → ScaleUp issued
//	MoveLeader    replacement Node Ready and its member promoted      → MoveLeader issued
//	RemoveMember  leadership move seen                                 → RemoveMember issued
//	Fence         member removal seen                                  → Fence issued
//	Delete        fencing seen                                         → Delete issued
//	Done          Machine gone                                         → Delete seen done
func BenchmarkControlPlaneStepLatency(b *testing.B) {
	totals := map[string]time.Duration{}
	for range b.N {
		for k, v := range stepLatencyRun(b) {
			totals[k] += v
		}
	}
	for _, k := range []string{"ScaleUp", "MoveLeader", "RemoveMember", "Fence", "Delete", "Done"} {
		b.ReportMetric(float64(totals[k].Microseconds())/1000/float64(b.N), "ms/"+k)
	}
}

func stepLatencyRun(b *testing.B) map[string]time.Duration {
	b.StopTimer()
	g := NewWithT(b)
	wc := newCluster(b)
	victim := controlPlane(g, wc)[1]

	var mu sync.Mutex
	issued, done := map[caprv1.StepName]time.Time{}, map[caprv1.StepName]time.Time{}
	capr, err := sb.StartCAPR(ctx, sandbox.CAPROptions{Options: controllers.Options{StepObserver: func(e controlplane.StepEvent) {
		mu.Lock()
		defer mu.Unlock()
		if e.Remediation.Name != victim.Name {
			return
		}
		if e.Done {
			done[e.Step] = e.Time
		} else {
			issued[e.Step] = e.Time
		}
	}}})
	g.Expect(err).NotTo(HaveOccurred())
	defer capr.Stop()
	start := time.Now()
	b.StartTimer()
	g.Expect(sb.StopHeartbeat(ctx, wc, victim.Status.NodeRef.Name)).To(Succeed())

	var requested time.Time
	g.Eventually(func() bool {
		if requested.IsZero() && sb.Client.Get(ctx, client.ObjectKey{Namespace: wc.Namespace, Name: victim.Name}, &caprv1.MachineRemediation{}) == nil {
			requested = time.Now()
		}
		mu.Lock()
		defer mu.Unlock()
		_, ok := done[caprv1.StepDelete]
		return ok
	}, remediationTimeout, 10*time.Millisecond).Should(BeTrue())
	b.StopTimer()
	g.Eventually(func(g Gomega) {
		g.Expect(getRemediation(g, wc, victim.Name).Status.Phase).To(Equal(caprv1.MachineRemediationPhaseSucceeded))
	}, remediationTimeout, 50*time.Millisecond).Should(Succeed())

	var promoted, provisioned, deleted time.Time
	for _, e := range sb.Log.Since(wc.LogKey(), start) {
		switch {
		case strings.Contains(e.Text, "promoted to voter"):
			promoted = e.Time
		case strings.Contains(e.Text, "provisioned"):
			provisioned = e.Time
		case strings.Contains(e.Text, "Machine "+victim.Name+" deleted"):
			deleted = e.Time
		}
	}
	mu.Lock()
	defer mu.Unlock()
	ready := promoted
	if provisioned.After(ready) {
		ready = provisioned
	}
	return map[string]time.Duration{
		"ScaleUp":      issued[caprv1.StepScaleUp].Sub(requested),
		"MoveLeader":   issued[caprv1.StepMoveLeader].Sub(ready),
		"RemoveMember": issued[caprv1.StepRemoveMember].Sub(done[caprv1.StepMoveLeader]),
		"Fence":        issued[caprv1.StepFence].Sub(done[caprv1.StepRemoveMember]),
		"Delete":       issued[caprv1.StepDelete].Sub(done[caprv1.StepFence]),
		"Done":         done[caprv1.StepDelete].Sub(deleted),
	}
}
