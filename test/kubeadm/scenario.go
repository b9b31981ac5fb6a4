package kubeadm

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	. "github.com/onsi/gomega" //nolint:staticcheck // gomega's DSL, as in the tests that call this
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/controllers"
	"github.com/capr-io/capr/remediation/fencing"
	capienv "github.com/capr-io/capr/test/envtest"
	"github.com/capr-io/capr/test/sandbox"
)

// remediationTimeout bounds the remediations of one scenario on KCP: KCP creates and deletes one
// Machine at a time with its own fixed requeues (15-30 s), and a surge of two adds and removes two.
const remediationTimeout = 10 * time.Minute

// Scenario is a fault on a KCP cluster and what CAPR must do about it.
type Scenario struct {
	ControlPlane int32
	// ExternalEtcd runs the cluster with external etcd (sandbox.ClusterSpec.ExternalEtcd).
	ExternalEtcd bool
	// Topology builds the cluster from a ClusterClass (sandbox.ClusterSpec.Topology); the scenario
	// then also checks that Cluster spec.topology.controlPlane.replicas are back at ControlPlane.
	Topology *sandbox.TopologySpec
	// Inject breaks the cluster and returns the Machines that must be remediated.
	Inject func(ctx context.Context, wc *sandbox.WorkloadCluster, machines []clusterv1.Machine) ([]string, error)
	// Fencing, if set, is the health check's fencing spec; CAPR then fences with Fencer.
	Fencing *caprv1.FencingSpec
	Fencer  fencing.Fencer
	// HealthCheck, if set, changes the health check before it is created (e.g. an escalation).
	HealthCheck func(*caprv1.MachineHealthCheck)
	// EscalationTimeout, if set, is CAPR's controllers.Options.EscalationTimeout.
	EscalationTimeout func(timeoutSeconds int32) time.Duration
	// Outage, if set, stops CAPR after Inject once Outage.Stop says so, and starts it again once
	// Outage.Resume does (both polled every 200 ms): what the providers do while no CAPR runs.
	Outage *Outage
}

// Outage says when CAPR is stopped and started again during a scenario.
type Outage struct {
	Stop, Resume func(ctx context.Context, wc *sandbox.WorkloadCluster) (bool, error)
}

// Result is what a scenario left behind.
type Result struct {
	Remediations map[string]*caprv1.MachineRemediation
	// MinMargin is the minimum etcd failure margin seen (running voting members minus quorum) and
	// MinMarginAt when and what the cluster looked like then.
	MinMargin   int
	MinMarginAt string
	// Created names the control-plane Machines created while the fault was remediated, as the API
	// server's watch saw them (surplus ones deleted again included).
	Created []string
}

// RunScenario creates a KCP cluster with a CAPR health check, injects the fault, waits until
// every victim's remediation succeeded and the control plane is whole again, and checks what must
// hold on every KCP scenario: no quorum loss, the data still there, KCP back at its replicas with no
// annotation of CAPR's or of KCP's remediation left, no victim left.
func RunScenario(ctx context.Context, t *testing.T, sb *sandbox.Sandbox, name string, sc Scenario) Result {
	t.Helper()
	g := NewWithT(t)
	ns, err := capienv.CreateNamespace(ctx, sb.Client, name)
	g.Expect(err).NotTo(HaveOccurred())
	wc, err := sb.CreateCluster(ctx, sandbox.ClusterSpec{Namespace: ns, Name: "wc", ControlPlane: sc.ControlPlane, ExternalEtcd: sc.ExternalEtcd, Topology: sc.Topology})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { sb.DestroyCluster(ctx, wc) })
	t.Cleanup(func() { // runs before the cluster is destroyed
		if t.Failed() {
			t.Log(Describe(ctx, sb, wc))
		}
	})
	mhc := sandbox.ControlPlaneHealthCheck(ns, "cp", wc.Name, 2)
	mhc.Spec.Remediation.Fencing = sc.Fencing
	if sc.HealthCheck != nil {
		sc.HealthCheck(mhc)
	}
	g.Expect(sb.Client.Create(ctx, mhc)).To(Succeed())
	check, err := sandbox.WriteData(ctx, wc, 50)
	g.Expect(err).NotTo(HaveOccurred())
	machines, err := sb.ControlPlaneMachines(ctx, wc)
	g.Expect(err).NotTo(HaveOccurred())
	opts := sandbox.CAPROptions{Options: controllers.Options{Fencer: sc.Fencer, EscalationTimeout: sc.EscalationTimeout}}
	capr, err := sb.StartCAPR(ctx, opts)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { capr.Stop() })
	quorum := sb.WatchQuorum(ctx, wc)
	running := sb.WatchRunning(ctx, wc)
	creations, err := sb.WatchMachineCreations(ctx, wc)
	g.Expect(err).NotTo(HaveOccurred())

	victims, err := sc.Inject(ctx, wc, machines)
	g.Expect(err).NotTo(HaveOccurred())
	if sc.Outage != nil {
		until := func(what string, cond func(context.Context, *sandbox.WorkloadCluster) (bool, error)) {
			g.Expect(wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, remediationTimeout, true, func(ctx context.Context) (bool, error) {
				return cond(ctx, wc)
			})).To(Succeed(), what)
		}
		until("waiting for the outage to start", sc.Outage.Stop)
		capr.Stop()
		until("waiting for the outage to end", sc.Outage.Resume)
		capr, err = sb.StartCAPR(ctx, opts)
		g.Expect(err).NotTo(HaveOccurred())
	}
	res := Result{Remediations: map[string]*caprv1.MachineRemediation{}}
	g.Eventually(func(g Gomega) {
		for _, v := range victims {
			mr := &caprv1.MachineRemediation{}
			g.Expect(sb.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: v}, mr)).To(Succeed())
			if mr.Status.Phase == caprv1.MachineRemediationPhaseFailed {
				StopTrying(fmt.Sprintf("remediation of %s failed: %v", v, mr.Status.Conditions)).Now()
			}
			g.Expect(mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhaseSucceeded), "%s: step %s: %v", v, mr.Status.CurrentStep, mr.Status.Conditions)
			res.Remediations[v] = mr
		}
	}, remediationTimeout, time.Second).Should(Succeed())
	g.Expect(sb.WaitForControlPlane(ctx, wc, int(sc.ControlPlane), 3*time.Minute)).To(Succeed())

	_, lost := quorum.Stop()
	g.Expect(lost).To(BeEmpty())
	g.Expect(running.Stop()).To(BeEmpty(), "two control-plane remediations ran at once")
	res.MinMargin, res.MinMarginAt, _ = quorum.Margin()
	res.Created, err = creations.Stop()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(check()).To(Succeed())

	kcp := &controlplanev1.KubeadmControlPlane{}
	g.Expect(sb.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "wc-cp"}, kcp)).To(Succeed())
	g.Expect(*kcp.Spec.Replicas).To(Equal(sc.ControlPlane))
	g.Expect(kcp.Annotations).NotTo(HaveKey(controlplanev1.RemediationInProgressAnnotation))
	g.Expect(kcp.Annotations).NotTo(HaveKey(caprv1.ControlPlaneLockAnnotation))
	if sc.Topology != nil {
		cluster := &clusterv1.Cluster{}
		g.Expect(sb.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: wc.Name}, cluster)).To(Succeed())
		g.Expect(cluster.Spec.Topology.ControlPlane.Replicas).To(HaveValue(Equal(sc.ControlPlane)), "Cluster spec.topology.controlPlane.replicas")
	}
	machines, err = sb.ControlPlaneMachines(ctx, wc)
	g.Expect(err).NotTo(HaveOccurred())
	for _, m := range machines {
		g.Expect(victims).NotTo(ContainElement(m.Name))
	}
	return res
}

// StepNames returns the names of a remediation's steps, in order.
func StepNames(mr *caprv1.MachineRemediation) []caprv1.StepName {
	out := make([]caprv1.StepName, 0, len(mr.Status.Steps))
	for _, s := range mr.Status.Steps {
		out = append(out, s.Name)
	}
	return out
}

// Describe says what a failed scenario left: the health checks, the requests, the Machines, KCP
// and the events of the cluster's namespace.
func Describe(ctx context.Context, sb *sandbox.Sandbox, wc *sandbox.WorkloadCluster) string {
	out := "state at failure:\n"
	mhcs := &caprv1.MachineHealthCheckList{}
	if err := sb.Client.List(ctx, mhcs, client.InNamespace(wc.Namespace)); err == nil {
		for _, h := range mhcs.Items {
			out += fmt.Sprintf("  MachineHealthCheck %s: %s\n", h.Name, conditionsString(h.Status.Conditions))
		}
	}
	mrs := &caprv1.MachineRemediationList{}
	if err := sb.Client.List(ctx, mrs, client.InNamespace(wc.Namespace)); err == nil {
		for _, mr := range mrs.Items {
			out += fmt.Sprintf("  MachineRemediation %s: %s step %q, %s\n", mr.Name, mr.Status.Phase, mr.Status.CurrentStep, conditionsString(mr.Status.Conditions))
		}
	}
	if machines, err := sb.ControlPlaneMachines(ctx, wc); err == nil {
		for _, m := range machines {
			out += fmt.Sprintf("  Machine %s (created %s, deleting %t, annotations %v): %s\n", m.Name, m.CreationTimestamp.Format(time.TimeOnly),
				!m.DeletionTimestamp.IsZero(), m.Annotations, conditionsString(m.Status.Conditions))
		}
	}
	kcp := &controlplanev1.KubeadmControlPlane{}
	if err := sb.Client.Get(ctx, client.ObjectKey{Namespace: wc.Namespace, Name: "wc-cp"}, kcp); err == nil {
		out += fmt.Sprintf("  KubeadmControlPlane: replicas %d, annotations %v, %s\n", ptr.Deref(kcp.Spec.Replicas, 0), kcp.Annotations, conditionsString(kcp.Status.Conditions))
	}
	events := &eventsv1.EventList{}
	if err := sb.Client.List(ctx, events, client.InNamespace(wc.Namespace)); err == nil {
		sort.Slice(events.Items, func(i, j int) bool {
			return events.Items[i].CreationTimestamp.Before(&events.Items[j].CreationTimestamp)
		})
		for _, e := range events.Items {
			out += fmt.Sprintf("  event %s %s/%s %s: %s\n", e.CreationTimestamp.Format(time.TimeOnly), e.Regarding.Kind, e.Regarding.Name, e.Reason, e.Note)
		}
	}
	return out
}

func conditionsString(cs []metav1.Condition) string {
	out := ""
	for _, c := range cs {
		if c.Status != metav1.ConditionTrue || c.Reason != "" {
			out += fmt.Sprintf("[%s=%s %s: %s] ", c.Type, c.Status, c.Reason, c.Message)
		}
	}
	return out
}
