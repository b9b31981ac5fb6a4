// Command demo runs CAPR on the sandbox (`make demo`): a real kube-apiserver and etcd for the
// management cluster, a workload cluster whose control plane is a real etcd cluster of one member
// process per Machine (reached through the API server's port-forward and kubelet stand-ins), and
// CAPR's health checker and control-plane remediator. It breaks one control-plane Machine, prints
// the remediation step by step with the etcd member table, then a summary, and exits, leaving
// nothing running.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/controllers"
	"github.com/capr-io/capr/remediation/controlplane"
	"github.com/capr-io/capr/test/sandbox"
)

// scenario is one way of breaking the control plane.
type scenario struct {
	description  string
	controlPlane int32
	// break injects the fault and returns the Machines expected to be remediated.
	inject func(ctx context.Context, d *demo) ([]string, error)
	// quorumLost scenarios end when CAPR reports that it will not act.
	quorumLost bool
	// topology builds the cluster from a ClusterClass (full stack only: CAPI's topology controllers).
	topology bool
}

var scenarios = map[string]scenario{
	"node-notready": {
		description:  "a control-plane Node stops reporting (kubelet/containerd/network) while its etcd member stays healthy",
		controlPlane: 3,
		inject: func(ctx context.Context, d *demo) ([]string, error) {
			m := d.machines[1]
			return []string{m.Name}, d.sb.StopHeartbeat(ctx, d.wc, m.Status.NodeRef.Name)
		},
	},
	"member-dead": {
		description:  "a control-plane Machine's etcd member crashes (its Node stays Ready)",
		controlPlane: 3,
		inject: func(_ context.Context, d *demo) ([]string, error) {
			m := d.machines[0]
			d.sb.KillEtcdMember(d.wc, m.Status.NodeRef.Name)
			return []string{m.Name}, nil
		},
	},
	"leader-kubelet-down": {
		description:  "the kubelet on the etcd leader's Node dies: the leader runs but cannot be reached through the API server (the case that stalls KCP)",
		controlPlane: 3,
		inject: func(ctx context.Context, d *demo) ([]string, error) {
			m, err := d.sb.EtcdMachine(ctx, d.wc, d.machines, true)
			if err != nil {
				return nil, err
			}
			return []string{m.Name}, d.sb.StopKubelet(ctx, d.wc, m.Status.NodeRef.Name)
		},
	},
	"two-of-five": {
		description:  "two of five etcd members crash at once: both are remediated, one at a time",
		controlPlane: 5,
		inject: func(_ context.Context, d *demo) ([]string, error) {
			a, b := d.machines[0], d.machines[3]
			d.sb.KillEtcdMember(d.wc, a.Status.NodeRef.Name)
			d.sb.KillEtcdMember(d.wc, b.Status.NodeRef.Name)
			return []string{a.Name, b.Name}, nil
		},
	},
	"single": {
		description:  "the only control-plane Machine's Node reports NotReady (its container network is down) while its kubelet, static pods and etcd member keep running: it is replaced scale-up-first, the replacement joining as an etcd learner (KCP's own remediation refuses a single Machine)",
		controlPlane: 1,
		inject: func(ctx context.Context, d *demo) ([]string, error) {
			// The provider joins members as learners (kubeadm ≥ 1.29 does; so does the sandbox's) and
			// says so on its control-plane object: CAPR replaces a single Machine only then.
			if err := d.sb.AnnotateControlPlane(ctx, d.wc, caprv1.EtcdLearnerJoinsAnnotation, "true"); err != nil {
				return nil, err
			}
			d.say("Control-plane object annotated %s=true", caprv1.EtcdLearnerJoinsAnnotation)
			// Not a stopped heartbeat: KCP creates a replacement only while one Machine has every
			// control-plane component healthy, which an unreachable Node's cannot show.
			m := d.machines[0]
			return []string{m.Name}, d.sb.ReportNotReady(ctx, d.wc, m.Status.NodeRef.Name)
		},
	},
	"topology": {
		description:  "a cluster built from a ClusterClass (CAPI's topology controller owns KCP's replicas): a control-plane Node stops reporting while its etcd member stays healthy; CAPR surges through Cluster spec.topology.controlPlane.replicas and restores it",
		controlPlane: 3,
		topology:     true,
		inject: func(ctx context.Context, d *demo) ([]string, error) {
			m := d.machines[1]
			return []string{m.Name}, d.sb.StopHeartbeat(ctx, d.wc, m.Status.NodeRef.Name)
		},
	},
	"quorum-lost": {
		description:  "two of three etcd members crash: quorum is lost, CAPR does nothing automatic and says why",
		controlPlane: 3,
		quorumLost:   true,
		inject: func(ctx context.Context, d *demo) ([]string, error) {
			a, b := d.machines[0], d.machines[1]
			d.sb.KillEtcdMember(d.wc, a.Status.NodeRef.Name)
			d.sb.KillEtcdMember(d.wc, b.Status.NodeRef.Name)
			// The health check refuses to request it (quorum-safe limit); a person asks.
			mr := &caprv1.MachineRemediation{ObjectMeta: metav1.ObjectMeta{Namespace: d.wc.Namespace, Name: a.Name},
				Spec: caprv1.MachineRemediationSpec{Source: caprv1.MachineRemediationSourceManual, Reason: caprv1.MachineCAPRHealthCheckManualRequestReason}}
			return []string{a.Name}, d.sb.Client.Create(ctx, mr)
		},
	},
}

func main() {
	name := flag.String("scenario", "node-notready", "Scenario: "+strings.Join(scenarioNames(), ", "))
	timeout := flag.Duration("timeout", 5*time.Minute, "Give up after this long.")
	verbose := flag.Bool("verbose", false, "Also print the controllers' logs.")
	provider := flag.String("provider", string(sandbox.ProviderSandbox), "Providers: sandbox (the lightweight stand-ins) or kubeadm (CAPI's own core, kubeadm bootstrap and KubeadmControlPlane controllers and webhooks, and kube-controller-manager).")
	flag.Parse()
	sc, ok := scenarios[*name]
	if !ok && *name != workerStateful {
		fmt.Fprintf(os.Stderr, "unknown scenario %q; choose one of: %s\n", *name, strings.Join(scenarioNames(), ", "))
		os.Exit(2)
	}
	// The demo prints its own timeline; controller logs go to stderr only with --verbose. Without
	// it, their last lines are kept and printed if the demo fails, so that a failure that cannot be
	// reproduced still says what the controllers did.
	logTail := &tail{max: 300}
	if *verbose {
		ctrl.SetLogger(zap.New(zap.Level(zapcore.InfoLevel)))
	} else {
		ctrl.SetLogger(zap.New(zap.Level(zapcore.InfoLevel), zap.WriteTo(logTail)))
	}
	// Interrupted, the demo returns through its deferred stops (nothing it started keeps running).
	base, stop := sandbox.InterruptContext()
	var err error
	if *name == workerStateful {
		// CAPI's MachineSet replaces the worker: always on the full stack, which starts in minutes.
		ctx, cancel := context.WithTimeout(base, max(*timeout, 15*time.Minute))
		err = runWorkerStateful(ctx)
		cancel()
	} else {
		ctx, cancel := context.WithTimeout(base, *timeout)
		err = run(ctx, *name, sc, sandbox.Provider(*provider))
		cancel()
	}
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "demo failed: %v\n", err)
		if !*verbose {
			fmt.Fprintf(os.Stderr, "the controllers' last %d log lines:\n%s", logTail.max, logTail)
		}
		os.Exit(1)
	}
}

// tail keeps the last max lines written to it.
type tail struct {
	max   int
	mu    sync.Mutex
	lines []string
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, l := range strings.SplitAfter(string(p), "\n") {
		if l == "" {
			continue
		}
		t.lines = append(t.lines, l)
	}
	if over := len(t.lines) - t.max; over > 0 {
		t.lines = append(t.lines[:0], t.lines[over:]...)
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.Join(t.lines, "")
}

func scenarioNames() []string {
	out := make([]string, 0, len(scenarios)+1)
	for name := range scenarios {
		out = append(out, name)
	}
	out = append(out, workerStateful)
	sort.Strings(out)
	return out
}

type demo struct {
	start    time.Time
	sb       *sandbox.Sandbox
	wc       *sandbox.WorkloadCluster
	machines []clusterv1.Machine

	mu    sync.Mutex
	steps []controlplane.StepEvent
	// capr is the running manager (worker-stateful).
	capr *sandbox.CAPR
}

func (d *demo) say(format string, args ...any) {
	d.sayAt(time.Now(), format, args...)
}

func (d *demo) sayAt(t time.Time, format string, args ...any) {
	fmt.Printf("[%6.2fs] %s\n", t.Sub(d.start).Seconds(), fmt.Sprintf(format, args...))
}

// line is something to print at the time it happened.
type line struct {
	at    time.Time
	text  string
	table bool
}

func (d *demo) table(ctx context.Context) {
	state, err := d.sb.EtcdState(ctx, d.wc)
	if err != nil {
		fmt.Printf("           (etcd state unavailable: %v)\n", err)
		return
	}
	for _, line := range strings.Split(strings.TrimRight(state.Table(), "\n"), "\n") {
		fmt.Println("           " + line)
	}
}

func run(ctx context.Context, name string, sc scenario, provider sandbox.Provider) error {
	d := &demo{start: time.Now()}
	d.say("Scenario %q: %s", name, sc.description)
	if provider == sandbox.ProviderKubeadm {
		d.say("Starting kube-apiserver v1.36.3, etcd v3.6.14 and kube-controller-manager v1.36.3 (management cluster), CAPI v1.14.2's core, kubeadm bootstrap and KubeadmControlPlane controllers with their admission webhooks, and the sandbox infrastructure provider")
	} else {
		d.say("Starting kube-apiserver v1.36.3 and etcd v3.6.14 (management cluster) and the sandbox providers")
	}
	if sc.topology && provider != sandbox.ProviderKubeadm {
		return fmt.Errorf("scenario %q needs CAPI's topology controllers: run it with --provider=kubeadm (make demo PROVIDER=kubeadm SCENARIO=%s)", name, name)
	}
	sb, err := sandbox.StartWithOptions(ctx, sandbox.Options{Provider: provider, CAPI: sandbox.CAPIOptions{Topology: sc.topology}})
	if err != nil {
		return err
	}
	d.sb = sb
	defer func() {
		d.say("Stopping every etcd member, kubelet stand-in, the API server and etcd")
		sb.Stop()
	}()
	ns := "demo"
	if err := sb.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		return err
	}
	d.say("Creating cluster %s/wc: %d control-plane Machines (one real etcd member each) and 2 workers", ns, sc.controlPlane)
	spec := sandbox.ClusterSpec{Namespace: ns, Name: "wc", ControlPlane: sc.controlPlane, Workers: 2}
	var history *sandbox.ReplicasHistory
	if sc.topology {
		spec.Topology = &sandbox.TopologySpec{}
		d.say("The Cluster is built from ClusterClass %s/wc-class (KubeadmControlPlaneTemplate, MachineDeployment class %s); CAPI's ClusterClass and topology controllers run too, and the Cluster topology controller applies Cluster spec.topology.controlPlane.replicas to KCP", ns, sandbox.TopologyWorkerClass)
	}
	d.wc, err = sb.CreateCluster(ctx, spec)
	if err != nil {
		return err
	}
	if sc.topology {
		if history, err = sb.WatchTopologyReplicas(ctx, d.wc); err != nil {
			return err
		}
		defer func() {
			if values, err := history.Stop(); err == nil {
				d.say("Replicas over time: Cluster spec.topology.controlPlane.replicas %v, KubeadmControlPlane spec.replicas %v", values["Cluster"], values["KubeadmControlPlane"])
			}
		}()
	}
	if d.machines, err = sb.ControlPlaneMachines(ctx, d.wc); err != nil {
		return err
	}
	d.say("Cluster ready; etcd members:")
	d.table(ctx)

	if err := sb.Client.Create(ctx, sandbox.ControlPlaneHealthCheck(ns, "control-plane", d.wc.Name, 3)); err != nil {
		return err
	}
	d.say("CAPR MachineHealthCheck created for the control plane: Node not Ready for 3s, or etcd member unhealthy for 10s")
	capr, err := sb.StartCAPR(ctx, sandbox.CAPROptions{Options: controllers.Options{StepObserver: func(e controlplane.StepEvent) {
		d.mu.Lock()
		d.steps = append(d.steps, e)
		d.mu.Unlock()
	}}})
	if err != nil {
		return err
	}
	defer capr.Stop()
	d.say("CAPR started (health checker + control-plane remediator)")

	faultAt := time.Now()
	victims, err := sc.inject(ctx, d)
	if err != nil {
		return err
	}
	d.say("FAULT injected; Machine(s) to remediate: %s", strings.Join(victims, ", "))
	d.table(ctx)
	return d.follow(ctx, sc, victims, faultAt)
}

// follow prints what happens until every victim is remediated and the control plane is whole (or,
// for quorum loss, until CAPR says it will not act).
func (d *demo) follow(ctx context.Context, sc scenario, victims []string, faultAt time.Time) error {
	seenLog := faultAt
	marked := map[string]time.Time{}
	printedSteps := 0
	lastWait := map[string]string{}
	phase := map[string]caprv1.RemediationPhase{}
	done := map[string]bool{}
	for {
		select {
		case <-ctx.Done():
			d.explain(victims)
			return fmt.Errorf("timed out waiting for the remediation")
		case <-time.After(100 * time.Millisecond):
		}
		var lines []line
		for _, e := range d.sb.Log.Since(d.wc.LogKey(), seenLog) {
			lines = append(lines, line{at: e.Time, text: "world: " + e.Text})
			seenLog = e.Time
		}
		d.mu.Lock()
		newSteps := d.steps[printedSteps:]
		printedSteps = len(d.steps)
		d.mu.Unlock()
		for _, e := range newSteps {
			mr := &caprv1.MachineRemediation{}
			msg := ""
			if d.sb.Client.Get(ctx, client.ObjectKey{Namespace: e.Remediation.Namespace, Name: e.Remediation.Name}, mr) == nil {
				for _, s := range mr.Status.Steps {
					if s.Name == e.Step {
						msg = s.Message
					}
				}
			}
			if e.Done {
				lines = append(lines, line{at: e.Time, text: fmt.Sprintf("step %-18s done   (%s) %s", e.Step, e.Remediation.Name, msg), table: true})
			} else {
				lines = append(lines, line{at: e.Time, text: fmt.Sprintf("step %-18s issued (%s)", e.Step, e.Remediation.Name)})
			}
		}
		sort.SliceStable(lines, func(i, j int) bool { return lines[i].at.Before(lines[j].at) })
		for i, l := range lines {
			d.sayAt(l.at, "%s", l.text)
			// The member table after the last step seen in this round shows the state it left.
			if l.table && !slicesContainTableAfter(lines[i+1:]) {
				d.table(ctx)
			}
		}
		for _, v := range victims {
			m := &clusterv1.Machine{}
			if _, ok := marked[v]; !ok && d.sb.Client.Get(ctx, client.ObjectKey{Namespace: d.wc.Namespace, Name: v}, m) == nil {
				if mark := conditions.Get(m, caprv1.MachineCAPRHealthCheckSucceededCondition); mark != nil && mark.Status == metav1.ConditionFalse {
					marked[v] = time.Now()
					d.say("DETECTED and MARKED %s: %s (%s)", v, mark.Reason, mark.Message)
				}
			}
			mr := &caprv1.MachineRemediation{}
			if d.sb.Client.Get(ctx, client.ObjectKey{Namespace: d.wc.Namespace, Name: v}, mr) != nil {
				continue
			}
			if mr.Status.Phase != phase[v] {
				phase[v] = mr.Status.Phase
				switch mr.Status.Phase {
				case caprv1.MachineRemediationPhaseRunning:
					d.say("REMEDIATION of %s started, order %s: %s", v, mr.Status.ControlPlane.Order, mr.Status.ControlPlane.OrderReason)
				case caprv1.MachineRemediationPhaseSucceeded:
					d.say("REMEDIATION of %s succeeded: replaced by %s", v, mr.Status.ControlPlane.Replacement)
					done[v] = true
				case caprv1.MachineRemediationPhaseFailed:
					return fmt.Errorf("remediation of %s failed: %s", v, mr.Status.LastError)
				}
			}
			if c := conditions.Get(mr, caprv1.MachineRemediationProgressingCondition); c != nil && c.Status == metav1.ConditionFalse && c.Reason != caprv1.MachineRemediationSucceededReason {
				if lastWait[v] != c.Message {
					lastWait[v] = c.Message
					d.say("%s waits (%s): %s", v, c.Reason, c.Message)
				}
				if c.Reason == caprv1.MachineRemediationWouldLoseFailureMarginReason && (mr.Spec.ControlPlane == nil || mr.Spec.ControlPlane.Order != caprv1.ControlPlaneOrderRemoveMemberFirst) {
					// What an operator does to let it proceed: accept the margin on this request.
					d.say("as an operator would: accepting no failure margin for %s until its replacement votes (spec.controlPlane.order: RemoveMemberFirst)", v)
					base := mr.DeepCopy()
					if mr.Spec.ControlPlane == nil {
						mr.Spec.ControlPlane = &caprv1.ControlPlaneRemediationSpec{}
					}
					mr.Spec.ControlPlane.Order = caprv1.ControlPlaneOrderRemoveMemberFirst
					if err := d.sb.Client.Patch(ctx, mr, client.MergeFrom(base)); err != nil {
						return fmt.Errorf("setting the order of %s: %w", v, err)
					}
				}
				if sc.quorumLost && c.Reason == caprv1.MachineRemediationQuorumLostReason {
					d.table(ctx)
					d.say("CAPR did nothing automatic: quorum is lost; the Machine stays, no member is removed, no replica changes")
					return nil
				}
			}
		}
		if len(done) == len(victims) {
			if err := d.sb.WaitForControlPlane(ctx, d.wc, int(sc.controlPlane), time.Minute); err != nil {
				return err
			}
			d.say("CONTROL PLANE WHOLE AGAIN: %d control-plane Machines, %d healthy voting etcd members", sc.controlPlane, sc.controlPlane)
			d.table(ctx)
			d.summary(faultAt, marked)
			return nil
		}
	}
}

// explain prints what the health checks, the victims and their requests say, when the demo gives up.
func (d *demo) explain(victims []string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conds := func(cs []metav1.Condition) string {
		out := make([]string, 0, len(cs))
		for _, c := range cs {
			out = append(out, fmt.Sprintf("%s=%s %s %q", c.Type, c.Status, c.Reason, c.Message))
		}
		return strings.Join(out, "; ")
	}
	checks := &caprv1.MachineHealthCheckList{}
	if err := d.sb.Client.List(ctx, checks, client.InNamespace(d.wc.Namespace)); err != nil {
		d.say("listing the health checks: %v", err)
	}
	for _, c := range checks.Items {
		d.say("health check %s: %s", c.Name, conds(c.Status.Conditions))
	}
	for _, v := range victims {
		m := &clusterv1.Machine{}
		if err := d.sb.Client.Get(ctx, client.ObjectKey{Namespace: d.wc.Namespace, Name: v}, m); err != nil {
			d.say("Machine %s: %v", v, err)
		} else {
			d.say("Machine %s (deleting: %t): %s", v, !m.DeletionTimestamp.IsZero(), conds(m.Status.Conditions))
		}
		mr := &caprv1.MachineRemediation{}
		if err := d.sb.Client.Get(ctx, client.ObjectKey{Namespace: d.wc.Namespace, Name: v}, mr); err != nil {
			d.say("MachineRemediation %s: %v", v, err)
		} else {
			d.say("MachineRemediation %s, phase %q: %s", v, mr.Status.Phase, conds(mr.Status.Conditions))
		}
	}
}

func (d *demo) summary(faultAt time.Time, marked map[string]time.Time) {
	fmt.Println()
	fmt.Println("Summary (seconds):")
	d.mu.Lock()
	defer d.mu.Unlock()
	byMR := map[string][]controlplane.StepEvent{}
	var order []string
	for _, e := range d.steps {
		if _, ok := byMR[e.Remediation.Name]; !ok {
			order = append(order, e.Remediation.Name)
		}
		byMR[e.Remediation.Name] = append(byMR[e.Remediation.Name], e)
	}
	for _, name := range order {
		fmt.Printf("  %s\n", name)
		if t, ok := marked[name]; ok {
			fmt.Printf("    %-22s %6.2f\n", "fault → marked", t.Sub(faultAt).Seconds())
		}
		issued := map[caprv1.StepName]time.Time{}
		var last time.Time
		for _, e := range byMR[name] {
			if !e.Done {
				issued[e.Step] = e.Time
				continue
			}
			fmt.Printf("    %-22s %6.2f\n", e.Step, e.Time.Sub(issued[e.Step]).Seconds())
			last = e.Time
		}
		fmt.Printf("    %-22s %6.2f\n", "fault → replaced", last.Sub(faultAt).Seconds())
	}
}

func slicesContainTableAfter(rest []line) bool {
	for _, l := range rest {
		if l.table {
			return true
		}
	}
	return false
}
