package machinehealthcheck

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// TestAMarksRequestIsMadeInTheNextRound: a round that marks a Machine writes the mark only and asks
// to run again at once; the next round creates the request and records the mark's one event, saying
// the request was made. So when many health checks' timeouts expire at once, every health check's
// marks are written before the requests and their remediators' writes.
func TestAMarksRequestIsMadeInTheNextRound(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	r, c, recorder, mhc, m, marks := markingReconciler(g)
	ev := evaluation{verdict: verdictUnhealthy, reason: caprv1.MachineCAPRHealthCheckUnhealthyNodeReason, message: "Node n is not Ready"}
	allowed := limits{trigger: limitDecision{allowed: true}, controlPlane: limitDecision{allowed: true}}
	requestExists := func() bool {
		return c.Get(ctx, client.ObjectKey{Namespace: "ns", Name: m.Name}, &caprv1.MachineRemediation{}) == nil
	}

	rd := &round{targets: []target{{machine: m}}, evals: []evaluation{ev}}
	applied, err := r.applyMarksAndRequests(ctx, &clusterv1.Cluster{}, mhc, defaultConfig(), rd, allowed, nil)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(*marks).To(Equal(1))
	g.Expect(applied.requestsDeferred).To(BeTrue())
	g.Expect(requestExists()).To(BeFalse(), "no request in the round that marks")
	g.Expect(recorder.Events).NotTo(Receive(), "the mark's event waits for its request")

	// The next round runs at once: its cache may not show the mark yet.
	rd = &round{targets: []target{{machine: m}}, evals: []evaluation{ev}}
	applied, err = r.applyMarksAndRequests(ctx, &clusterv1.Cluster{}, mhc, defaultConfig(), rd, allowed, nil)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(*marks).To(Equal(1), "the mark is not written again")
	g.Expect(applied.requestsDeferred).To(BeFalse())
	g.Expect(requestExists()).To(BeTrue())
	g.Expect(recorder.Events).To(Receive(And(ContainSubstring(caprv1.EventMachineMarkedUnhealthy), HaveSuffix("; remediation requested"))))
	g.Expect(recorder.Events).NotTo(Receive(), "one event for the mark and its request")
}

// TestAMarkNotRequestedInTheNextRoundIsStillSaid: when the next round makes no request (the limits
// refuse it), it still records the mark's event, without "remediation requested".
func TestAMarkNotRequestedInTheNextRoundIsStillSaid(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	r, _, recorder, mhc, m, _ := markingReconciler(g)
	ev := evaluation{verdict: verdictUnhealthy, reason: caprv1.MachineCAPRHealthCheckUnhealthyNodeReason, message: "Node n is not Ready"}

	rd := &round{targets: []target{{machine: m}}, evals: []evaluation{ev}}
	allowed := limits{trigger: limitDecision{allowed: true}, controlPlane: limitDecision{allowed: true}}
	_, err := r.applyMarksAndRequests(ctx, &clusterv1.Cluster{}, mhc, defaultConfig(), rd, allowed, nil)
	g.Expect(err).NotTo(HaveOccurred())

	rd = &round{targets: []target{{machine: rd.targets[0].machine}}, evals: []evaluation{ev}}
	applied, err := r.applyMarksAndRequests(ctx, &clusterv1.Cluster{}, mhc, defaultConfig(), rd, limits{}, nil)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(applied.restricted).To(Equal(1))
	g.Expect(recorder.Events).To(Receive(And(ContainSubstring(caprv1.EventMachineMarkedUnhealthy), Not(ContainSubstring("remediation requested")))))
	g.Expect(recorder.Events).NotTo(Receive())
}

// markingReconciler is a Reconciler on a fake client holding Machine m of health check ns/hc, whose
// mark writes (server-side applies) are counted in marks, its events in the returned recorder.
func markingReconciler(g *WithT) (r *Reconciler, c client.Client, recorder *events.FakeRecorder, mhc *caprv1.MachineHealthCheck, m *clusterv1.Machine, marks *int) {
	scheme := runtime.NewScheme()
	g.Expect(caprv1.AddToScheme(scheme)).To(Succeed())
	g.Expect(clusterv1.AddToScheme(scheme)).To(Succeed())
	mhc = &caprv1.MachineHealthCheck{}
	mhc.Name, mhc.Namespace = "hc", "ns"
	m = machine()
	m.Namespace = "ns"
	marks = new(int)
	c = fake.NewClientBuilder().WithScheme(scheme).WithObjects(m).WithInterceptorFuncs(interceptor.Funcs{
		SubResourceApply: func(context.Context, client.Client, string, runtime.ApplyConfiguration, ...client.SubResourceApplyOption) error {
			*marks++
			return nil
		},
	}).Build()
	recorder = events.NewFakeRecorder(10)
	return &Reconciler{Client: c, recorder: recorder}, c, recorder, mhc, m, marks
}
