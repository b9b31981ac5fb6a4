//go:build kind

package e2e_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// The comparison on kind (make compare-kind, docs/design/kcp-comparison.md): each control-plane
// fault of compareFaults, injected in a real CAPD node, remediated by CAPI's MachineHealthCheck with
// KCP's own remediation and by CAPR, each with its shipped defaults and the same health-check
// timeouts, judged by the observer (observer_kind_test.go), which uses no CAPR or CAPI predicate.
// The number of runs is fixed before the campaign and written first to its results file; every run
// is appended as it ends, passed or not; a campaign that has to stop records the runs it did not make.
// Each run's manager logs are kept beside the file, in <file>.logs/<fault>-<system>-<run>/ (not
// committed: they explain a run's timings, the file holds its figures).

const (
	// compareResultsEnv names the campaign's results file; make compare-kind sets it.
	compareResultsEnv = "E2E_KIND_COMPARE"
	// compareRunsEnv is the number of runs per fault and system (default 5).
	compareRunsEnv = "E2E_KIND_COMPARE_RUNS"
	// compareFaultsEnv lists the faults to run, comma separated (default: every one).
	compareFaultsEnv = "E2E_KIND_COMPARE_FAULTS"
)

// compareSystem is the remediation under test in a run.
type compareSystem string

const (
	// systemKCP is CAPI's MachineHealthCheck, with no remediation template: KCP remediates.
	systemKCP compareSystem = "kcp"
	// systemCAPR is CAPR's MachineHealthCheck and control-plane remediation.
	systemCAPR compareSystem = "capr"
)

// The health checks' settings, the same on both sides. A node silent for a minute is unhealthy, a
// node Ready=False for five (a joining node is Ready=False until its pod network runs; see
// kindPlatform.healthChecks). An etcd member unhealthy for five minutes: CAPR's etcd member check
// asks etcd, CAPI's health check reads KCP's etcd conditions on the Machine, and both take the
// etcd check's default of CAPR (300 s). Shorter is not equal on real nodes: KCP reports a joining
// Machine's EtcdMemberHealthy Unknown (InspectionFailed) until its member is listed, and with ten
// seconds CAPI's health check marked a Machine of a new cluster before it had joined, then its
// replacement (a remediation loop, seen here); CAPR's check with ten seconds once marked a
// replacement whose member had just been promoted, for one poll (docs/developer/kind.md).
const (
	silentNodeSeconds   = 60
	notReadyNodeSeconds = 300
	etcdSeconds         = 300
)

// compareFault is one row of the comparison: a fault injected in the victim's node.
type compareFault struct {
	name, description string
	// leader: the victim is the etcd leader's Machine; otherwise a follower's.
	leader bool
	inject func(node string) error
	// undo brings a node whose Machine was not replaced back, so that the next run starts whole.
	undo func(node string) error
}

var compareFaults = []compareFault{
	{
		name:        "follower-kubelet-stopped",
		description: "a follower's kubelet stopped (systemctl stop kubelet), its etcd member alive",
		inject:      func(node string) error { return dockerRun("exec", node, "systemctl", "stop", "kubelet") },
		undo:        func(node string) error { return dockerRun("exec", node, "systemctl", "start", "kubelet") },
	},
	{
		name:        "follower-etcd-killed",
		description: "a follower's etcd stopped for good (its static pod manifest moved out of /etc/kubernetes/manifests); the node goes Ready=Unknown, its kubelet reporting to the node's own API server",
		inject: func(node string) error {
			return dockerRun("exec", node, "mv", "/etc/kubernetes/manifests/etcd.yaml", "/root/etcd.yaml")
		},
		undo: func(node string) error {
			return dockerRun("exec", node, "mv", "/root/etcd.yaml", "/etc/kubernetes/manifests/etcd.yaml")
		},
	},
	{
		name:        "follower-node-paused",
		description: "a follower's node container paused (docker pause): every process frozen, its etcd member among them, the node unreachable",
		inject:      func(node string) error { return dockerRun("pause", node) },
		undo:        func(node string) error { return dockerRun("unpause", node) },
	},
	{
		name: "follower-node-blackholed",
		description: "every packet to and from a follower's node dropped (iptables DROP in its INPUT and OUTPUT chains, loopback spared): " +
			"its processes run, nothing reaches them and no error comes back",
		inject: func(node string) error {
			return blackhole(node, "-I")
		},
		undo: func(node string) error { return blackhole(node, "-D") },
	},
	{
		name:        "follower-node-stopped",
		description: "a follower's node container stopped (docker stop): the machine powered off",
		inject:      func(node string) error { return dockerRun("stop", node) },
		// docker start may give the container another address on the network, which its etcd peer
		// URL and certificates do not name: restore then waits its ten minutes and the campaign stops.
		undo: func(node string) error { return dockerRun("start", node) },
	},
}

// blackhole inserts (op "-I") or deletes ("-D") the rules that drop every packet of node's network
// namespace but its loopback's, first in the chains, so that no established connection is spared.
// Static pods use the host's network, so etcd, the API server and the kubelet are cut off alike.
func blackhole(node, op string) error {
	if err := dockerRun("exec", node, "iptables", op, "INPUT", "!", "-i", "lo", "-j", "DROP"); err != nil {
		return err
	}
	return dockerRun("exec", node, "iptables", op, "OUTPUT", "!", "-o", "lo", "-j", "DROP")
}

// compareCampaign is the first line of a campaign's results file, written before any run.
type compareCampaign struct {
	Campaign    string   `json:"campaign"`
	Commit      string   `json:"commit"`
	Started     string   `json:"started"`
	Machine     string   `json:"machine"`
	LoadAverage string   `json:"loadAverage"`
	Faults      []string `json:"faults"`
	Systems     []string `json:"systems"`
	RunsPerRow  int      `json:"runsPerRow"`
	Settings    string   `json:"settings"`
	// Notes are added by hand afterwards, where a campaign needs a word of explanation.
	Notes []string `json:"notes,omitempty"`
}

// compareResult is one run.
type compareResult struct {
	Campaign        string        `json:"campaign"`
	Fault           string        `json:"fault"`
	System          compareSystem `json:"system"`
	Run             int           `json:"run"`
	Date            string        `json:"date"`
	Victim          string        `json:"victim,omitempty"`
	VictimWasLeader bool          `json:"victimWasLeader"`
	LoadAverage     string        `json:"loadAverage,omitempty"`
	// Made is false for a run the campaign did not make (it stopped first); Error says why.
	Made           bool    `json:"made"`
	Passed         bool    `json:"passed"`
	SecondsToMark  float64 `json:"secondsToMark"`
	SecondsToWhole float64 `json:"secondsToWhole"`
	Observer       summary `json:"observer"`
	Error          string  `json:"error,omitempty"`
}

// TestKindCompare runs a comparison campaign (make compare-kind). It needs the campaign's results
// file in E2E_KIND_COMPARE and fails without it: make e2e-kind leaves it out with -skip.
func TestKindCompare(t *testing.T) {
	path := os.Getenv(compareResultsEnv)
	if path == "" {
		t.Fatalf("%s must name the campaign's results file: run make compare-kind", compareResultsEnv)
	}
	runs := 5
	if v := os.Getenv(compareRunsEnv); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive number of runs", compareRunsEnv, v)
		}
		runs = n
	}
	faults, err := selectFaults(os.Getenv(compareFaultsEnv))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); err == nil {
		t.Fatalf("%s exists: a campaign writes a results file of its own", path)
	}
	systems := []compareSystem{systemKCP, systemCAPR}
	campaign := compareCampaign{
		Campaign:    time.Now().UTC().Format("20060102T150405Z"),
		Commit:      startCommit,
		Started:     time.Now().UTC().Format(time.RFC3339),
		Machine:     machineDescription(),
		LoadAverage: loadAverage(),
		RunsPerRow:  runs,
		Settings: fmt.Sprintf("workload cluster: 3 control-plane Machines, no workers; both health checks: Ready=Unknown %d s, Ready=False %d s, "+
			"no node startup timeout; etcd: CAPR's etcd member check and CAPI's KCP conditions EtcdMemberHealthy False/Unknown and "+
			"EtcdPodHealthy False %d s; remediation with each system's defaults; no fencing; "+
			"CAPR's manager as installed by clusterctl",
			silentNodeSeconds, notReadyNodeSeconds, etcdSeconds),
	}
	for _, f := range faults {
		campaign.Faults = append(campaign.Faults, f.name)
	}
	for _, s := range systems {
		campaign.Systems = append(campaign.Systems, string(s))
	}
	appendJSON(t, path, campaign)

	p := kindEnv(t)
	g := NewWithT(t)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "capr-compare-"}}
	g.Expect(p.c.Create(ctx, ns)).To(Succeed())
	name := p.createClusterOf(t, ns.Name, "cmp", 3, 0, t.Cleanup)
	c := kindCluster{ns: ns.Name, name: name, controlPlane: 3}

	stopped := ""
	for _, f := range faults {
		for run := 1; run <= runs; run++ {
			// Which system goes first alternates, so that neither always runs on the fresher cluster.
			order := systems
			if run%2 == 0 {
				order = []compareSystem{systems[1], systems[0]}
			}
			for _, s := range order {
				r := compareResult{Campaign: campaign.Campaign, Fault: f.name, System: s, Run: run}
				if stopped != "" {
					r.Date, r.Error = time.Now().UTC().Format(time.RFC3339), "not made: "+stopped
					appendJSON(t, path, r)
					continue
				}
				ok := t.Run(fmt.Sprintf("%s/%s/%d", f.name, s, run), func(t *testing.T) {
					compareRun(t, p, c, f, &r)
				})
				if !ok && !restore(t, p, c, f, r.Victim) {
					stopped = fmt.Sprintf("the cluster was not whole again after the failed run %s/%s/%d", f.name, s, run)
					t.Error(stopped)
				}
			}
		}
	}
}

func selectFaults(list string) ([]compareFault, error) {
	if list == "" {
		return compareFaults, nil
	}
	var out []compareFault
	for _, name := range strings.Split(list, ",") {
		i := -1
		for j, f := range compareFaults {
			if f.name == strings.TrimSpace(name) {
				i = j
			}
		}
		if i < 0 {
			var known []string
			for _, f := range compareFaults {
				known = append(known, f.name)
			}
			return nil, fmt.Errorf("%s: no fault %q (known: %s)", compareFaultsEnv, name, strings.Join(known, ", "))
		}
		out = append(out, compareFaults[i])
	}
	return out, nil
}

// compareRun makes one run: the system's health check in place, the cluster whole, the fault
// injected in the victim's node, then until the cluster is whole again. The result is appended to
// the campaign's file whatever the outcome.
func compareRun(t *testing.T, p *kindPlatform, c kindCluster, f compareFault, r *compareResult) {
	g := NewWithT(t)
	path := os.Getenv(compareResultsEnv)
	r.Made = true
	began := time.Now()
	t.Cleanup(func() {
		p.keepLogs(t, filepath.Join(path+".logs", fmt.Sprintf("%s-%s-%d", r.Fault, r.System, r.Run)), began)
	})
	t.Cleanup(func() {
		r.Passed = !t.Failed()
		r.Date = time.Now().UTC().Format(time.RFC3339)
		appendJSON(t, path, *r)
	})
	useSystem(t, p, c, r.System)
	o := observeWhole(t, p, c)
	t.Cleanup(func() {
		p.dumpOnFailure(t, c.ns)
		r.Observer = o.summarize()
	})

	cp, _ := machinesOf(g, c.ns, c.name)
	victim, leaderNode := pickVictim(g, o, cp, f.leader)
	node := victim.Status.NodeRef.Name
	r.Victim, r.VictimWasLeader = node, node == leaderNode

	stopMark := make(chan struct{})
	marked := markedBy(p.c, c.ns, victim.Name, r.System, stopMark)
	r.LoadAverage = loadAverage()
	fault := time.Now()
	t.Cleanup(func() {
		close(stopMark)
		if at, ok := marked(); ok {
			r.SecondsToMark = at.Sub(fault).Seconds()
		}
	})
	g.Expect(f.inject(node)).To(Succeed())
	o.avoidNode(node)
	g.Eventually(func(g Gomega) {
		whole(g, p, o, c, victim.Name, node)
	}, p.remediationTimeout(), 5*time.Second).Should(Succeed(), "not whole again after %s", p.remediationTimeout())
	r.SecondsToWhole = time.Since(fault).Seconds()
}

// useSystem leaves the control plane with the system's health check only, the other's deleted.
func useSystem(t *testing.T, p *kindPlatform, c kindCluster, s compareSystem) {
	t.Helper()
	g := NewWithT(t)
	capr, _ := p.healthChecks(c.ns, c.name)
	capr.Spec.Checks.EtcdMember = &caprv1.EtcdMemberCheck{TimeoutSeconds: ptr.To[int32](etcdSeconds)}
	capi := capiHealthCheck(c.ns, c.name)
	want, other := client.Object(capr), client.Object(capi)
	if s == systemKCP {
		want, other = capi, capr
	}
	g.Expect(client.IgnoreNotFound(p.c.Delete(ctx, other))).To(Succeed())
	g.Eventually(func() bool {
		return apierrors.IsNotFound(p.c.Get(ctx, client.ObjectKeyFromObject(other), other))
	}, 2*time.Minute, time.Second).Should(BeTrue(), "the other system's health check is still there")
	if err := p.c.Create(ctx, want); !apierrors.IsAlreadyExists(err) {
		g.Expect(err).NotTo(HaveOccurred())
	}
}

// capiHealthCheck is CAPI's MachineHealthCheck for the control plane, with the settings CAPR's has,
// and no remediation template: KCP remediates.
func capiHealthCheck(ns, cluster string) *clusterv1.MachineHealthCheck {
	node := func(status corev1.ConditionStatus, seconds int32) clusterv1.UnhealthyNodeCondition {
		return clusterv1.UnhealthyNodeCondition{Type: corev1.NodeReady, Status: status, TimeoutSeconds: ptr.To(seconds)}
	}
	etcd := func(condition string, status metav1.ConditionStatus) clusterv1.UnhealthyMachineCondition {
		return clusterv1.UnhealthyMachineCondition{Type: condition, Status: status, TimeoutSeconds: ptr.To[int32](etcdSeconds)}
	}
	return &clusterv1.MachineHealthCheck{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "control-plane-capi"},
		Spec: clusterv1.MachineHealthCheckSpec{
			ClusterName: cluster,
			Selector:    metav1.LabelSelector{MatchLabels: map[string]string{clusterv1.MachineControlPlaneLabel: ""}},
			Checks: clusterv1.MachineHealthCheckChecks{
				NodeStartupTimeoutSeconds: ptr.To[int32](0),
				UnhealthyNodeConditions:   []clusterv1.UnhealthyNodeCondition{node(corev1.ConditionUnknown, silentNodeSeconds), node(corev1.ConditionFalse, notReadyNodeSeconds)},
				UnhealthyMachineConditions: []clusterv1.UnhealthyMachineCondition{
					etcd(controlplanev1.KubeadmControlPlaneMachineEtcdMemberHealthyCondition, metav1.ConditionFalse),
					etcd(controlplanev1.KubeadmControlPlaneMachineEtcdMemberHealthyCondition, metav1.ConditionUnknown),
					etcd(controlplanev1.KubeadmControlPlaneMachineEtcdPodHealthyCondition, metav1.ConditionFalse),
				},
			},
		},
	}
}

// markedBy waits in the background for the system's health check to find the Machine unhealthy
// (its condition on the Machine turning False) and returns when the condition says it turned.
func markedBy(c client.Client, ns, machine string, s compareSystem, stop <-chan struct{}) func() (time.Time, bool) {
	condition := caprv1.MachineCAPRHealthCheckSucceededCondition
	if s == systemKCP {
		condition = clusterv1.MachineHealthCheckSucceededCondition
	}
	since := time.Now().Truncate(time.Second)
	return pollUntil(stop, func() time.Time {
		m := &clusterv1.Machine{}
		if c.Get(ctx, client.ObjectKey{Namespace: ns, Name: machine}, m) != nil {
			return time.Time{}
		}
		cond := meta.FindStatusCondition(m.Status.Conditions, condition)
		if cond == nil || cond.Status != metav1.ConditionFalse || cond.LastTransitionTime.Time.Before(since) {
			return time.Time{}
		}
		return cond.LastTransitionTime.Time
	})
}

// restore brings the cluster whole after a failed run: the fault undone on the victim's node if its
// Machine is still there, then the cluster whole within ten minutes. It reports whether it is.
func restore(t *testing.T, p *kindPlatform, c kindCluster, f compareFault, node string) bool {
	return t.Run("restore after "+f.name, func(t *testing.T) {
		if node != "" {
			if err := f.undo(node); err != nil {
				t.Logf("undoing %s on %s: %v", f.name, node, err)
			}
		}
		o := startObserver(p.c, c.ns, c.name)
		t.Cleanup(o.stop)
		NewWithT(t).Eventually(func(g Gomega) { whole(g, p, o, c, "", "") }, 10*time.Minute, 5*time.Second).Should(Succeed())
	})
}

// appendJSON appends v as one line to path.
func appendJSON(t *testing.T, path string, v any) {
	raw, err := json.Marshal(v)
	if err != nil {
		t.Errorf("encoding a result: %v", err)
		return
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Errorf("opening %s: %v", path, err)
		return
	}
	if _, err := f.Write(append(raw, '\n')); err != nil {
		t.Errorf("writing %s: %v", path, err)
	}
	if err := f.Close(); err != nil {
		t.Errorf("closing %s: %v", path, err)
	}
	t.Logf("result: %s", raw)
}

// machineDescription names the host: its CPUs, memory and kernel.
func machineDescription() string {
	host, _ := os.Hostname()
	mem := ""
	if raw, err := os.ReadFile("/proc/meminfo"); err == nil {
		if line, _, ok := strings.Cut(string(raw), "\n"); ok {
			mem = strings.Join(strings.Fields(line)[1:], " ")
		}
	}
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return fmt.Sprintf("%s: %d CPUs, MemTotal %s, Linux %s", host, runtime.NumCPU(), mem, strings.TrimSpace(string(kernel)))
}

// loadAverage is the host's 1, 5 and 15 minute load averages.
func loadAverage() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(raw))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}
