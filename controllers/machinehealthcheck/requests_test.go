package machinehealthcheck

import (
	"context"
	"errors"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// TestFinishedWithMachineKept: only a request that ended by recovery (nothing deleted) is replaced
// when its Machine is unhealthy again; the record of a remediation that deleted its Machine is kept
// even while a cache still shows that Machine (the fault suite saw control-plane records vanish).
func TestFinishedWithMachineKept(t *testing.T) {
	succeeded := func(mutate func(*caprv1.MachineRemediation)) *caprv1.MachineRemediation {
		mr := &caprv1.MachineRemediation{Status: caprv1.MachineRemediationStatus{Phase: caprv1.MachineRemediationPhaseSucceeded}}
		mutate(mr)
		return mr
	}
	oneStep := []caprv1.EscalationStep{{TemplateRef: caprv1.TemplateReference{Kind: "RebootTemplate"}, TimeoutSeconds: 60}}
	machine := &clusterv1.Machine{}
	deleting := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &metav1.Time{Time: time.Now()}}}
	tests := []struct {
		name string
		mr   *caprv1.MachineRemediation
		m    *clusterv1.Machine
		want bool
	}{
		{"worker, recovered during escalation", succeeded(func(mr *caprv1.MachineRemediation) {
			mr.Status.Worker = &caprv1.WorkerRemediationStatus{}
			mr.Spec.Escalation = oneStep
			mr.Status.Steps = []caprv1.RemediationStep{{Name: caprv1.EscalationStepName(0), Outcome: caprv1.StepOutcomeSucceeded}}
		}), machine, true},
		{"control plane, recovered during escalation", succeeded(func(mr *caprv1.MachineRemediation) {
			mr.Status.ControlPlane = &caprv1.ControlPlaneRemediationStatus{}
			mr.Spec.Escalation = []caprv1.EscalationStep{oneStep[0], oneStep[0]}
			mr.Status.Steps = []caprv1.RemediationStep{
				{Name: caprv1.EscalationStepName(0), Outcome: caprv1.StepOutcomeFailed},
				{Name: caprv1.EscalationStepName(1), Outcome: caprv1.StepOutcomeSucceeded},
			}
		}), machine, true},
		{"control plane, escalation timed out, replaced (stale cache)", succeeded(func(mr *caprv1.MachineRemediation) {
			mr.Status.ControlPlane = &caprv1.ControlPlaneRemediationStatus{}
			mr.Spec.Escalation = oneStep
			mr.Status.Steps = []caprv1.RemediationStep{
				{Name: caprv1.EscalationStepName(0), Outcome: caprv1.StepOutcomeFailed},
				{Name: caprv1.StepFence, Outcome: caprv1.StepOutcomeSkipped},
				{Name: caprv1.StepDelete, Outcome: caprv1.StepOutcomeSucceeded},
			}
		}), machine, false},
		{"escalation skipped (a manual request), Machine deleted outside", succeeded(func(mr *caprv1.MachineRemediation) {
			mr.Status.Worker = &caprv1.WorkerRemediationStatus{}
			mr.Spec.Escalation = oneStep
			mr.Status.Steps = []caprv1.RemediationStep{{Name: caprv1.EscalationStepName(0), Outcome: caprv1.StepOutcomeSkipped}}
		}), machine, false},
		{"worker, deleted by its Delete step (stale cache)", succeeded(func(mr *caprv1.MachineRemediation) {
			mr.Status.Worker = &caprv1.WorkerRemediationStatus{}
			mr.Status.Steps = []caprv1.RemediationStep{{Name: caprv1.StepDelete}}
		}), machine, false},
		{"control plane, replaced (stale cache)", succeeded(func(mr *caprv1.MachineRemediation) {
			mr.Status.ControlPlane = &caprv1.ControlPlaneRemediationStatus{}
		}), machine, false},
		{"Machine being deleted", succeeded(func(*caprv1.MachineRemediation) {}), deleting, false},
		{"still running", &caprv1.MachineRemediation{Status: caprv1.MachineRemediationStatus{Phase: caprv1.MachineRemediationPhaseRunning}}, machine, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			NewWithT(t).Expect(finishedWithMachineKept(tt.mr, tt.m)).To(Equal(tt.want))
		})
	}
}

// A withdrawal refused because the request changed since the cache read it (the remediator
// recorded it Pending) is not a failed round: the round runs again shortly, and the work queue's
// per-item backoff, which grows with every failure in a row, never delays the next one. During a
// recovery of many Machines this conflict is common.
func TestWithdrawalMeetingANewerRequestRequeuesWithoutFailing(t *testing.T) {
	g := NewWithT(t)
	scheme := runtime.NewScheme()
	g.Expect(caprv1.AddToScheme(scheme)).To(Succeed())
	mhc := &caprv1.MachineHealthCheck{ObjectMeta: metav1.ObjectMeta{Name: "hc", Namespace: "ns"}}
	m := machine()
	m.Namespace = "ns"
	request := &caprv1.MachineRemediation{ObjectMeta: metav1.ObjectMeta{Name: m.Name, Namespace: "ns",
		Labels: map[string]string{HealthCheckLabel: mhc.Name}}}
	deletes := 0
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(request).WithInterceptorFuncs(interceptor.Funcs{
		Delete: func(context.Context, client.WithWatch, client.Object, ...client.DeleteOption) error {
			deletes++ // what the API server answers when the precondition's resourceVersion is old
			return apierrors.NewConflict(caprv1.GroupVersion.WithResource("machineremediations").GroupResource(), m.Name, errors.New("the object has been modified"))
		},
	}).Build()
	r := &Reconciler{Client: c}

	applied, err := r.applyMarksAndRequests(context.Background(), &clusterv1.Cluster{}, mhc, defaultConfig(),
		&round{}, limits{}, []*clusterv1.Machine{m})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(applied.requestChanged).To(BeTrue())
	g.Expect(applied.restricted).To(BeZero())
	g.Expect(deletes).To(Equal(1))
}

// With --watch-filter, CAPR's controllers only see objects that carry the filter's label: a request
// created for a health check that carries it carries it too, or no remediator would ever see it.
func TestRequestCarriesTheHealthChecksWatchFilterLabel(t *testing.T) {
	for _, filter := range []string{"", "team-a"} {
		t.Run("filter="+filter, func(t *testing.T) {
			g := NewWithT(t)
			scheme := runtime.NewScheme()
			g.Expect(caprv1.AddToScheme(scheme)).To(Succeed())
			mhc := &caprv1.MachineHealthCheck{ObjectMeta: metav1.ObjectMeta{Name: "hc", Namespace: "ns"}}
			mhc.Spec.ClusterName = "c1"
			if filter != "" {
				mhc.Labels = map[string]string{clusterv1.WatchLabel: filter}
			}
			m := machine()
			m.Namespace = "ns"
			r := &Reconciler{Client: fake.NewClientBuilder().WithScheme(scheme).Build()}

			created, err := r.ensureRequest(context.Background(), mhc, m, evaluation{verdict: verdictUnhealthy, reason: "UnhealthyNode"}, nil)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(created).To(BeTrue())
			mr := &caprv1.MachineRemediation{}
			g.Expect(r.Client.Get(context.Background(), client.ObjectKey{Namespace: "ns", Name: m.Name}, mr)).To(Succeed())
			g.Expect(mr.Labels).To(HaveKeyWithValue(HealthCheckLabel, "hc"))
			if filter == "" {
				g.Expect(mr.Labels).NotTo(HaveKey(clusterv1.WatchLabel))
			} else {
				g.Expect(mr.Labels).To(HaveKeyWithValue(clusterv1.WatchLabel, filter))
			}
		})
	}
}
