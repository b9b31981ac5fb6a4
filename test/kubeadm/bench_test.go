package kubeadm_test

import (
	"context"
	"sort"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/controllers"
	"github.com/capr-io/capr/remediation/controlplane"
	"github.com/capr-io/capr/test/builder"
	capienv "github.com/capr-io/capr/test/envtest"
	"github.com/capr-io/capr/test/kubeadm"
	"github.com/capr-io/capr/test/sandbox"
)

// BenchmarkKCPStepLatency measures, on the full stack (CAPI's core, CABPK, KCP, kube-controller-manager),
// where the time of a control-plane remediation goes, per step, on a three-Machine
// KubeadmControlPlane (`make bench-steps PROVIDER=kubeadm`), for two faults:
// "member healthy" (a Node stops renewing its Lease: ScaleUpFirst) and "member dead" (a follower's
// etcd process is killed: DeleteFirst). Times are taken from CAPR's StepObserver (when each step
// started and was seen done) and from the world as the benchmark sees it through the API and etcd
// every 50 ms. Reported, in ms, per step S of the order:
//
//	gap/S                 previous step done (the request seen, for the first) → S started: CAPR's own latency between steps
//	took/S                S started → S seen done: what S waited for (etcd, KCP, the fencing), CAPR's polling included
//	seen/WaitForReplacement  replacement with a Node and a healthy voting member → the step seen done
//	seen/Delete           victim Machine gone → the step seen done
//	provider/replacement  ScaleUp started (without one: victim gone) → replacement up (KCP, CABPK, the stand-in kubelet, etcd)
//	provider/delete       Delete started → victim Machine gone
//	detect                fault → the MachineRemediation seen (the health check's timeouts: 2 s, 10 s)
//	total                 fault → the remediation Succeeded
//
// The 50 ms sampling adds up to 50 ms (plus one API and one etcd read) to the world side's times, so a
// "seen" latency is at most that much too short, never too long.
func BenchmarkKCPStepLatency(b *testing.B) {
	for _, f := range []kcpBenchFault{
		{name: "member healthy", order: caprv1.ControlPlaneOrderScaleUpFirst, inject: func(ctx context.Context, wc *sandbox.WorkloadCluster, m clusterv1.Machine) error {
			return sb.StopHeartbeat(ctx, wc, m.Status.NodeRef.Name)
		}},
		{name: "member dead", order: caprv1.ControlPlaneOrderDeleteFirst, follower: true, inject: func(_ context.Context, wc *sandbox.WorkloadCluster, m clusterv1.Machine) error {
			sb.KillEtcdMember(wc, m.Status.NodeRef.Name)
			return nil
		}},
	} {
		b.Run(f.name, func(b *testing.B) {
			totals := map[string]time.Duration{}
			for range b.N {
				kcpBenchRuns[f.name]++
				for k, v := range kcpStepLatencyRun(b, f, kcpBenchRuns[f.name]) {
					totals[k] += v
				}
			}
			keys := make([]string, 0, len(totals))
			for k := range totals {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				b.ReportMetric(float64(totals[k].Microseconds())/1000/float64(b.N), "ms/"+k)
			}
		})
	}
}

// kcpBenchRuns counts the runs of each fault over -count's repetitions, for the log lines.
var kcpBenchRuns = map[string]int{}

// kcpBenchFault is one fault of BenchmarkKCPStepLatency and the order CAPR must take for it.
type kcpBenchFault struct {
	name  string
	order caprv1.ControlPlaneOrder
	// follower picks the victim among the etcd followers (a dead leader is another case).
	follower bool
	inject   func(context.Context, *sandbox.WorkloadCluster, clusterv1.Machine) error
}

// stepTimes are the StepObserver's events of one remediation: when each step was issued and seen done.
type stepTimes struct {
	mu            sync.Mutex
	issued, done  map[caprv1.StepName]time.Time
	remediation   string
	namespace     string
	requested     time.Time
	replacementUp time.Time
	victimGone    time.Time
}

func (st *stepTimes) observe(e controlplane.StepEvent) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if e.Remediation.Namespace != st.namespace || e.Remediation.Name != st.remediation {
		return
	}
	at := st.issued
	if e.Done {
		at = st.done
	}
	if _, seen := at[e.Step]; !seen { // a step re-issued after a conflict keeps its first time
		at[e.Step] = e.Time
	}
}

func kcpStepLatencyRun(b *testing.B, f kcpBenchFault, run int) map[string]time.Duration {
	b.StopTimer()
	g := NewWithT(b)
	ns, err := capienv.CreateNamespace(ctx, sb.Client, "kcp-bench")
	g.Expect(err).NotTo(HaveOccurred())
	wc, err := sb.CreateCluster(ctx, sandbox.ClusterSpec{Namespace: ns, Name: "wc", ControlPlane: 3})
	g.Expect(err).NotTo(HaveOccurred())
	defer sb.DestroyCluster(ctx, wc)
	g.Expect(sb.Client.Create(ctx, sandbox.ControlPlaneHealthCheck(ns, "cp", wc.Name, 2))).To(Succeed())
	initial, err := sb.ControlPlaneMachines(ctx, wc)
	g.Expect(err).NotTo(HaveOccurred())
	victim := initial[1]
	if f.follower {
		m, err := sb.EtcdMachine(ctx, wc, initial, false)
		g.Expect(err).NotTo(HaveOccurred())
		victim = *m
	}
	before := map[string]bool{}
	for _, m := range initial {
		before[m.Name] = true
	}

	st := &stepTimes{issued: map[caprv1.StepName]time.Time{}, done: map[caprv1.StepName]time.Time{}, remediation: victim.Name, namespace: ns}
	capr, err := sb.StartCAPR(ctx, sandbox.CAPROptions{Options: controllers.Options{StepObserver: st.observe}})
	g.Expect(err).NotTo(HaveOccurred())
	defer capr.Stop()

	sampleCtx, stopSampling := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for sampleCtx.Err() == nil {
			sampleWorld(sampleCtx, wc, victim.Name, before, st)
			select {
			case <-sampleCtx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	b.StartTimer()
	fault := time.Now()
	g.Expect(f.inject(ctx, wc, victim)).To(Succeed())
	var succeeded time.Time
	g.Eventually(func(g Gomega) {
		mr := &caprv1.MachineRemediation{}
		g.Expect(sb.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: victim.Name}, mr)).To(Succeed())
		if mr.Status.Phase == caprv1.MachineRemediationPhaseFailed {
			StopTrying("the remediation failed").Now()
		}
		g.Expect(mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhaseSucceeded), "step %s: %v", mr.Status.CurrentStep, mr.Status.Conditions)
		succeeded = time.Now()
		g.Expect(mr.Status.ControlPlane.Order).To(Equal(f.order), mr.Status.ControlPlane.OrderReason)
		g.Expect(kubeadm.StepNames(mr)).To(Equal(builder.Steps[f.order]))
	}, 10*time.Minute, 100*time.Millisecond).Should(Succeed())
	b.StopTimer()
	g.Eventually(func() bool {
		st.mu.Lock()
		defer st.mu.Unlock()
		return !st.victimGone.IsZero()
	}, time.Minute, 50*time.Millisecond).Should(BeTrue(), "the victim Machine was never seen gone")
	stopSampling()
	<-sampled

	st.mu.Lock()
	defer st.mu.Unlock()
	g.Expect(st.requested.IsZero() || st.replacementUp.IsZero()).To(BeFalse(), "requested %v, replacement up %v", st.requested, st.replacementUp)
	steps := builder.Steps[f.order]
	for _, s := range steps {
		g.Expect(st.issued).To(HaveKey(s), "step %s never started", s)
		g.Expect(st.done).To(HaveKey(s), "step %s never seen done", s)
	}
	out := map[string]time.Duration{
		"detect":                  st.requested.Sub(fault),
		"total":                   succeeded.Sub(fault),
		"seen/WaitForReplacement": st.done[caprv1.StepWaitForReplacement].Sub(latest(st.replacementUp, st.issued[caprv1.StepWaitForReplacement])),
		"seen/Delete":             st.done[caprv1.StepDelete].Sub(latest(st.victimGone, st.issued[caprv1.StepDelete])),
		"provider/replacement":    st.replacementUp.Sub(replacementAsked(st)),
		"provider/delete":         st.victimGone.Sub(st.issued[caprv1.StepDelete]),
	}
	previous := st.requested
	for _, s := range steps {
		out["gap/"+string(s)] = st.issued[s].Sub(previous)
		out["took/"+string(s)] = st.done[s].Sub(st.issued[s])
		previous = st.done[s]
	}
	b.Logf("%s, run %d: %v", f.name, run, out)
	return out
}

// replacementAsked is when the provider was asked for the replacement: ScaleUp started, or, in an
// order without it (DeleteFirst), the victim gone (the provider replaces it at the replicas it has).
func replacementAsked(st *stepTimes) time.Time {
	if at, ok := st.issued[caprv1.StepScaleUp]; ok {
		return at
	}
	return st.victimGone
}

// latest returns the later of two times.
func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// sampleWorld records, once each, when the benchmark first saw the request, the replacement up (a
// Node and a healthy voting member, as CAPR's WaitForReplacement requires) and the victim gone.
func sampleWorld(ctx context.Context, wc *sandbox.WorkloadCluster, victim string, before map[string]bool, st *stepTimes) {
	now := time.Now()
	st.mu.Lock()
	requested, up, gone := !st.requested.IsZero(), !st.replacementUp.IsZero(), !st.victimGone.IsZero()
	st.mu.Unlock()
	if !requested && sb.Client.Get(ctx, client.ObjectKey{Namespace: wc.Namespace, Name: victim}, &caprv1.MachineRemediation{}) == nil {
		st.mu.Lock()
		st.requested = now
		st.mu.Unlock()
	}
	if !gone {
		err := sb.Client.Get(ctx, client.ObjectKey{Namespace: wc.Namespace, Name: victim}, &clusterv1.Machine{})
		if apierrors.IsNotFound(err) {
			st.mu.Lock()
			st.victimGone = now
			st.mu.Unlock()
		}
	}
	if up {
		return
	}
	machines, err := sb.ControlPlaneMachines(ctx, wc)
	if err != nil {
		return
	}
	var candidates []clusterv1.Machine
	for _, m := range machines {
		if !before[m.Name] && m.Status.NodeRef.IsDefined() {
			candidates = append(candidates, m)
		}
	}
	if len(candidates) == 0 {
		return
	}
	state, err := sb.EtcdState(ctx, wc)
	if err != nil {
		return
	}
	for _, m := range candidates {
		if member := state.ByName(m.Status.NodeRef.Name); member != nil && member.Healthy && !member.IsLearner {
			st.mu.Lock()
			st.replacementUp = now
			st.mu.Unlock()
			return
		}
	}
}
