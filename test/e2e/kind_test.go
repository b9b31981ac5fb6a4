//go:build kind

package e2e_test

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// The kind faults (make e2e-kind): real CAPD nodes, a fault injected in a node's container, CAPR as
// installed by clusterctl, and the observer (observer_kind_test.go) judging the run. Built only with
// the tag kind; TestMain refuses to run them anywhere but on a kind management cluster.
func init() { kindOnly = true }

// kindCluster is the workload cluster the kind faults share: three control-plane Machines and two
// workers, CAPR's health checks on both, the workers fenced by powering their container off.
type kindCluster struct {
	ns, name string
	// controlPlane and workers are how many Machines of each the cluster has when whole.
	controlPlane, workers int
}

var (
	sharedOnce sync.Once
	shared     kindCluster
	sharedErr  error
)

const powerFenceTemplate = "power-off"

func kindEnv(t *testing.T) *kindPlatform {
	t.Helper()
	p, ok := env.(*kindPlatform)
	if !ok {
		t.Fatalf("the kind faults run on the kind platform only, not on %s", env.name())
	}
	return p
}

// sharedCluster creates the shared cluster on first use, in the first test that asks; it is deleted
// after the last test (TestMain's afterAll), and kind-down removes what a failed deletion leaves.
func sharedCluster(t *testing.T) kindCluster {
	t.Helper()
	p := kindEnv(t)
	sharedOnce.Do(func() {
		sharedErr = errors.New("creating the shared workload cluster failed in an earlier test")
		g := NewWithT(t)
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "capr-kind-"}}
		g.Expect(p.c.Create(ctx, ns)).To(Succeed())
		installPowerFence(t, p, ns.Name)
		const controlPlane, workers = 3, 2
		name := p.createClusterOf(t, ns.Name, "kind", controlPlane, workers, func(f func()) { afterAll = append(afterAll, f) })
		cp, w := p.healthChecks(ns.Name, name)
		g.Expect(p.c.Create(ctx, cp)).To(Succeed())
		w.Spec.Remediation.Fencing = &caprv1.FencingSpec{
			Policy:         caprv1.FencingRequired,
			TimeoutSeconds: ptr.To[int32](300),
			Backends: []caprv1.FencingBackend{{Type: caprv1.FencingBackendExternal, TemplateRef: &caprv1.TemplateReference{
				APIVersion: "fencing.kind.capr.io/v1alpha1", Kind: "DockerPowerFenceTemplate", Name: powerFenceTemplate}}},
		}
		g.Expect(p.c.Create(ctx, w)).To(Succeed())
		shared = kindCluster{ns: ns.Name, name: name, controlPlane: controlPlane, workers: workers}
		sharedErr = nil
	})
	if sharedErr != nil {
		t.Fatal(sharedErr)
	}
	return shared
}

// installPowerFence installs the power-fencing provider's CRDs and RBAC, and its template in ns.
func installPowerFence(t *testing.T, p *kindPlatform, ns string) {
	t.Helper()
	g := NewWithT(t)
	out, err := exec.CommandContext(ctx, p.env["KUBECTL"], "--kubeconfig", os.Getenv(kubeconfigEnv), "apply", "--server-side",
		"-f", filepath.Join(repoRoot(), "test", "kind", "manifests", "powerfence.yaml")).CombinedOutput()
	g.Expect(err).NotTo(HaveOccurred(), "%s", out)
	tmpl := &unstructured.Unstructured{}
	tmpl.SetGroupVersionKind(schema.GroupVersionKind{Group: "fencing.kind.capr.io", Version: "v1alpha1", Kind: "DockerPowerFenceTemplate"})
	tmpl.SetNamespace(ns)
	tmpl.SetName(powerFenceTemplate)
	g.Expect(unstructured.SetNestedField(tmpl.Object, "SIGKILL", "spec", "template", "spec", "signal")).To(Succeed())
	g.Eventually(func() error { return p.c.Create(ctx, tmpl) }, time.Minute, time.Second).Should(Succeed())
}

// powerFencer is the power-fencing provider: for each DockerPowerFence CAPR creates in ns, it kills
// the node's container and, once docker reports it stopped, sets Fenced=True. Before it confirms, it
// reads the fenced Machine: whether it was already deleting then is what "fenced before delete" is
// judged on (a deletionTimestamp has a resolution of one second, too coarse to compare times with).
type powerFencer struct {
	mu     sync.Mutex
	fenced map[string]fenceRecord // by Machine name
	done   chan struct{}
	wg     sync.WaitGroup
}

type fenceRecord struct {
	at time.Time
	// machineDeleting: the Machine was already deleting when its node was found powered off.
	machineDeleting bool
}

func startPowerFencer(t *testing.T, c client.Client, ns string) *powerFencer {
	f := &powerFencer{fenced: map[string]fenceRecord{}, done: make(chan struct{})}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for {
			list := &unstructured.UnstructuredList{}
			list.SetGroupVersionKind(schema.GroupVersionKind{Group: "fencing.kind.capr.io", Version: "v1alpha1", Kind: "DockerPowerFenceList"})
			if err := c.List(ctx, list, client.InNamespace(ns)); err == nil {
				for i := range list.Items {
					f.fence(t, c, &list.Items[i])
				}
			}
			select {
			case <-f.done:
				return
			case <-time.After(time.Second):
			}
		}
	}()
	return f
}

func (f *powerFencer) fence(t *testing.T, c client.Client, obj *unstructured.Unstructured) {
	machine := obj.GetName()
	f.mu.Lock()
	_, done := f.fenced[machine]
	f.mu.Unlock()
	if done || !obj.GetDeletionTimestamp().IsZero() {
		return
	}
	node := obj.GetAnnotations()["remediation.cluster.x-k8s.io/node"]
	signal, _, _ := unstructured.NestedString(obj.Object, "spec", "signal")
	if node == "" || signal == "" {
		return
	}
	running, err := dockerOutput("inspect", "-f", "{{.State.Running}}", node)
	if err != nil && !strings.Contains(err.Error(), "No such") {
		t.Logf("power fence of %s: %v", node, err)
		return
	}
	if strings.TrimSpace(running) == "true" {
		if err := dockerRun("kill", "--signal", signal, node); err != nil {
			t.Logf("power fence of %s: %v", node, err)
			return
		}
		return // confirmed on a later round, once docker reports it stopped
	}
	m := &clusterv1.Machine{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: obj.GetNamespace(), Name: machine}, m); err != nil && !apierrors.IsNotFound(err) {
		t.Logf("power fence of %s: reading Machine %s: %v", node, machine, err)
		return
	}
	rec := fenceRecord{at: time.Now(), machineDeleting: !m.DeletionTimestamp.IsZero() || m.Name == ""}
	patch := map[string]any{"status": map[string]any{"conditions": []any{map[string]any{
		"type": "Fenced", "status": "True", "reason": "PoweredOff", "message": "the node's container is stopped",
		"lastTransitionTime": time.Now().UTC().Format(time.RFC3339),
	}}}}
	raw, _ := json.Marshal(patch)
	if err := c.Status().Patch(ctx, obj, client.RawPatch("application/merge-patch+json", raw)); err != nil {
		t.Logf("power fence of %s: confirming: %v", node, err)
		return
	}
	f.mu.Lock()
	f.fenced[machine] = rec
	f.mu.Unlock()
}

func (f *powerFencer) record(machine string) (fenceRecord, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.fenced[machine]
	return r, ok
}

func (f *powerFencer) stop() {
	close(f.done)
	f.wg.Wait()
}

// whole is the observer's judgement that the cluster is back at full strength without the victim:
// c.controlPlane voting etcd members, all healthy, no learner, none named after the victim's node;
// as many control-plane and c.workers worker Nodes, all Ready, the victim's Node gone; the victim
// Machine gone.
// With no victim ("") it is the state a fault may be injected in.
func whole(g Gomega, p *kindPlatform, o *observer, c kindCluster, victimMachine, victimNode string) {
	cpCount, workerCount := c.controlPlane, c.workers
	if victimMachine != "" {
		err := p.c.Get(ctx, client.ObjectKey{Namespace: c.ns, Name: victimMachine}, &clusterv1.Machine{})
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the victim Machine %s is still there (%v)", victimMachine, err)
	}
	requests := &caprv1.MachineRemediationList{}
	g.Expect(p.c.List(ctx, requests, client.InNamespace(c.ns))).To(Succeed())
	for _, mr := range requests.Items {
		g.Expect(mr.Status.Phase).To(BeElementOf(caprv1.MachineRemediationPhaseSucceeded, caprv1.MachineRemediationPhaseFailed),
			"MachineRemediation %s is %s", mr.Name, mr.Status.Phase)
	}
	cpMachines, workerMachines := machinesOf(g, c.ns, c.name)
	g.Expect(cpMachines).To(HaveLen(cpCount))
	g.Expect(workerMachines).To(HaveLen(workerCount))
	v, ok := o.latest()
	g.Expect(ok).To(BeTrue(), "no etcd reading yet")
	g.Expect(time.Since(v.At)).To(BeNumerically("<", 30*time.Second), "the last etcd reading is old: %+v", v)
	g.Expect(v.Voters).To(Equal(cpCount), "etcd: %+v", v)
	g.Expect(v.HealthyVoter).To(Equal(cpCount), "etcd: %+v", v)
	g.Expect(v.Learners).To(BeZero(), "etcd: %+v", v)
	g.Expect(v.Names).NotTo(ContainElement(victimNode), "etcd: %+v", v)
	nodes, err := workloadNodes(p.c, c.ns, c.name)
	g.Expect(err).NotTo(HaveOccurred())
	var cps, workers int
	for _, n := range nodes {
		g.Expect(n.Name).NotTo(Equal(victimNode), "the victim's Node is still there")
		g.Expect(nodeReady(n)).To(BeTrue(), "Node %s is not Ready", n.Name)
		if _, ok := n.Labels["node-role.kubernetes.io/control-plane"]; ok {
			cps++
		} else {
			workers++
		}
	}
	g.Expect(cps).To(Equal(cpCount), "control-plane Nodes")
	g.Expect(workers).To(Equal(workerCount), "worker Nodes")
}

// kindResult is one line of the results file (E2E_KIND_RESULTS).
type kindResult struct {
	Date            string   `json:"date"`
	Commit          string   `json:"commit"`
	Test            string   `json:"test"`
	Fault           string   `json:"fault"`
	Victim          string   `json:"victim"`
	VictimWasLeader bool     `json:"victimWasLeader"`
	Passed          bool     `json:"passed"`
	SecondsToMark   float64  `json:"secondsToMark"`
	SecondsToWhole  float64  `json:"secondsToWhole"`
	FencedBeforeDel *bool    `json:"fencedBeforeDelete,omitempty"`
	Observer        summary  `json:"observer"`
	Notes           []string `json:"notes,omitempty"`
}

// startCommit is the commit of the tree when the test binary started, "+dirty" when it had changes
// outside the results: go test built the binary from it, and make kind-up CAPR's image just before.
// Read at the end of a run it could name a commit made during the run.
var startCommit = func() string {
	commit, _ := exec.Command("git", "-C", repoRoot(), "rev-parse", "--short", "HEAD").Output()
	c := strings.TrimSpace(string(commit))
	if dirty, _ := exec.Command("git", "-C", repoRoot(), "status", "--porcelain", "--", ".", ":!test/e2e/results").Output(); len(dirty) > 0 {
		c += "+dirty"
	}
	return c
}()

// record appends r to the results file, whatever the test's outcome: every run is reported.
func record(t *testing.T, r kindResult) {
	path := os.Getenv("E2E_KIND_RESULTS")
	if path == "" {
		return
	}
	r.Commit = startCommit
	r.Date = time.Now().UTC().Format(time.RFC3339)
	r.Passed = !t.Failed()
	raw, err := json.Marshal(r)
	if err != nil {
		t.Errorf("encoding the result: %v", err)
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

// markedAt waits in the background for the victim's MachineRemediation and returns when it was seen.
func markedAt(c client.Client, ns, machine string, stop <-chan struct{}) func() (time.Time, bool) {
	return pollUntil(stop, func() time.Time {
		mr := &caprv1.MachineRemediation{}
		if c.Get(ctx, client.ObjectKey{Namespace: ns, Name: machine}, mr) != nil {
			return time.Time{}
		}
		return mr.CreationTimestamp.Time
	})
}

// pollUntil calls read every second in the background until it returns a time that is not zero, or
// stop is closed. The function it returns gives that time, and whether there is one yet.
func pollUntil(stop <-chan struct{}, read func() time.Time) func() (time.Time, bool) {
	var mu sync.Mutex
	var at time.Time
	go func() {
		for {
			if t := read(); !t.IsZero() {
				mu.Lock()
				at = t
				mu.Unlock()
				return
			}
			select {
			case <-stop:
				return
			case <-time.After(time.Second):
			}
		}
	}()
	return func() (time.Time, bool) {
		mu.Lock()
		defer mu.Unlock()
		return at, !at.IsZero()
	}
}

// recordRun starts the run of a fault about to be injected in victim: from now on the time to its
// mark is measured, and when the test ends, whatever its outcome, the state is dumped on failure and
// the run recorded with the observer's figures. It returns the fault's time.
func recordRun(t *testing.T, p *kindPlatform, o *observer, c kindCluster, victim string, r *kindResult) time.Time {
	t.Helper()
	stopMark := make(chan struct{})
	marked := markedAt(p.c, c.ns, victim, stopMark)
	fault := time.Now()
	t.Cleanup(func() {
		close(stopMark)
		p.dumpOnFailure(t, c.ns)
		r.Observer = o.summarize()
		if at, ok := marked(); ok {
			r.SecondsToMark = at.Sub(fault).Seconds()
		}
		record(t, *r)
	})
	return fault
}

// observeWhole starts the observer of c, stopped when the test ends, and waits until c is whole: the
// state a fault may be injected in.
func observeWhole(t *testing.T, p *kindPlatform, c kindCluster) *observer {
	t.Helper()
	o := startObserver(p.c, c.ns, c.name)
	t.Cleanup(o.stop)
	NewWithT(t).Eventually(func(g Gomega) { whole(g, p, o, c, "", "") }, 10*time.Minute, 5*time.Second).Should(Succeed(), "the cluster is not whole before the fault")
	return o
}

// faultUntilWhole injects the platform's fault in the victim's node and waits until the observer finds
// the cluster whole again. The run is recorded when the test ends, whatever its outcome.
func faultUntilWhole(t *testing.T, p *kindPlatform, o *observer, c kindCluster, victim clusterv1.Machine, r *kindResult) {
	t.Helper()
	node := victim.Status.NodeRef.Name
	fault := recordRun(t, p, o, c, victim.Name, r)
	p.breakNode(t, c.ns, c.name, node)
	// A stopped kubelet leaves the victim's etcd answering; asking only the others keeps the
	// readings independent of the victim.
	o.avoidNode(node)
	NewWithT(t).Eventually(func(g Gomega) {
		whole(g, p, o, c, victim.Name, node)
	}, p.remediationTimeout(), 5*time.Second).Should(Succeed())
	r.SecondsToWhole = time.Since(fault).Seconds()
}

// TestKindControlPlaneKubeletStopped: the kubelet of a control-plane node that is not the etcd
// leader stops; its etcd member, a static pod, goes on running and voting. CAPR marks the Machine
// and replaces it. The observer holds it to what CAPR promises for a live member: the failure margin
// never below 1, one Machine created, and the cluster whole again.
func TestKindControlPlaneKubeletStopped(t *testing.T) {
	controlPlaneKubeletStopped(t, false)
}

// TestKindLeaderKubeletStopped: the same fault on the etcd leader's node.
func TestKindLeaderKubeletStopped(t *testing.T) {
	controlPlaneKubeletStopped(t, true)
}

// TestKindLeaderKubeletStoppedRemoveMemberFirst: the same fault on the leader's node, with the order
// a person sets to accept a lower failure margin (RemoveMemberFirst, which CAPR's
// WouldLoseFailureMargin message names). KCP creates no Machine while another is deleting, so the
// victim is deleted without a surge; KCP's own deletion would remove the member only after moving
// leadership off it, through the leader's node whose kubelet is stopped (CAPI #8465). The member must
// leave through another member, and the cluster be whole again with one Machine created.
func TestKindLeaderKubeletStoppedRemoveMemberFirst(t *testing.T) {
	g := NewWithT(t)
	c := sharedCluster(t)
	p := kindEnv(t)
	setControlPlaneRemediation(t, p, c, func(s *caprv1.ControlPlaneRemediationSpec) { s.Order = caprv1.ControlPlaneOrderRemoveMemberFirst })
	victim, s := kubeletStopped(t, true, 0)
	mr := &caprv1.MachineRemediation{}
	g.Expect(p.c.Get(ctx, client.ObjectKey{Namespace: c.ns, Name: victim}, mr)).To(Succeed())
	g.Expect(mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhaseSucceeded), "%+v", mr.Status.Conditions)
	g.Expect(s.MachinesCreated).To(HaveLen(1), "Machines created: %v", s.MachinesCreated)
}

func controlPlaneKubeletStopped(t *testing.T, leader bool) {
	_, s := kubeletStopped(t, leader, 1)
	NewWithT(t).Expect(s.MachinesCreated).To(HaveLen(1), "Machines created: %v", s.MachinesCreated)
}

// kubeletStopped stops the kubelet of a control-plane node, the etcd leader's or a follower's, waits
// until the cluster is whole again, and checks the failure margin never fell below minMargin. It
// returns the victim Machine and what the observer saw.
func kubeletStopped(t *testing.T, leader bool, minMargin int) (string, summary) {
	g := NewWithT(t)
	p := kindEnv(t)
	c := sharedCluster(t)
	o := observeWhole(t, p, c)

	cp, _ := machinesOf(g, c.ns, c.name)
	g.Expect(cp).To(HaveLen(3))
	victim, leaderNode := pickVictim(g, o, cp, leader)
	node := victim.Status.NodeRef.Name
	r := &kindResult{Test: t.Name(), Fault: "kubelet stopped (docker exec systemctl stop kubelet), etcd member alive", Victim: node, VictimWasLeader: leaderNode == node}
	faultUntilWhole(t, p, o, c, victim, r)
	s := o.summarize()
	// The seconds in which only the just-promoted replacement fails its health read are the join's
	// (summary.MinMarginSettled), recorded in the results and left out here.
	g.Expect(s.MinMarginSettled).To(BeNumerically(">=", minMargin), "the failure margin fell below %d with a live member: %+v", minMargin, s)
	return victim.Name, s
}

// TestKindWorkerNodeStopped: a worker's node container stops. CAPR marks the Machine, fences it
// through the power-fencing provider before the Machine is deleted, and the MachineDeployment
// replaces it.
func TestKindWorkerNodeStopped(t *testing.T) {
	g := NewWithT(t)
	p := kindEnv(t)
	c := sharedCluster(t)
	fencer := startPowerFencer(t, p.c, c.ns)
	defer fencer.stop()
	o := observeWhole(t, p, c)

	_, workers := machinesOf(g, c.ns, c.name)
	g.Expect(workers).To(HaveLen(2))
	victim := workers[0]
	node := victim.Status.NodeRef.Name
	r := &kindResult{Test: t.Name(), Fault: "worker node container stopped (docker stop)", Victim: node}
	faultUntilWhole(t, p, o, c, victim, r)
	fenced, ok := fencer.record(victim.Name)
	g.Expect(ok).To(BeTrue(), "the worker was never fenced")
	_, ok = o.deletingSince(victim.Name)
	g.Expect(ok).To(BeTrue(), "the watch never saw the worker deleting")
	before := !fenced.machineDeleting
	r.FencedBeforeDel = &before
	g.Expect(before).To(BeTrue(), "the Machine was already deleting (or gone) when its node was found powered off at %s", fenced.at)
	s := o.summarize()
	g.Expect(slices.ContainsFunc(o.created, func(m machineEvent) bool { return !m.ControlPlane })).To(BeTrue(), "no worker created: %+v", s)
	g.Expect(s.MinMargin).To(BeNumerically(">=", 1), "a worker's fault moved etcd: %+v", s)
}

// TestKindReplacementThatNeverComesUp: a follower's node container stops, its etcd member dead, so
// the victim's member is removed and the victim deleted before its replacement exists (DeleteFirst);
// the kubeadm bootstrap provider is stopped meanwhile, so the replacement KCP creates never gets its
// bootstrap data and never comes up. Past the replacement timeout the remediation must end, Failed
// with StepTimedOut, nothing undone and the control plane released (waiting for ever would hold every
// other request of the cluster); once the bootstrap provider runs again the replacement comes up and
// the cluster is whole.
func TestKindReplacementThatNeverComesUp(t *testing.T) {
	const replacementTimeout = 120
	g := NewWithT(t)
	c := sharedCluster(t)
	p := kindEnv(t)
	setControlPlaneRemediation(t, p, c, func(s *caprv1.ControlPlaneRemediationSpec) {
		s.ReplacementTimeoutSeconds = ptr.To[int32](replacementTimeout)
	})
	o := observeWhole(t, p, c)

	cp, _ := machinesOf(g, c.ns, c.name)
	victim, _ := pickVictim(g, o, cp, false)
	node := victim.Status.NodeRef.Name
	r := &kindResult{Test: t.Name(), Fault: "control-plane node container stopped (docker stop), the kubeadm bootstrap provider stopped until the remediation ended", Victim: node}
	fault := recordRun(t, p, o, c, victim.Name, r)
	scaleDeployment(t, p, "capi-kubeadm-bootstrap-system", "capi-kubeadm-bootstrap-controller-manager", 0)
	bootstrapBack := func() {
		scaleDeployment(t, p, "capi-kubeadm-bootstrap-system", "capi-kubeadm-bootstrap-controller-manager", 1)
	}
	restored := false
	t.Cleanup(func() {
		if !restored {
			bootstrapBack()
		}
	})
	g.Expect(dockerRun("stop", node)).To(Succeed())
	o.avoidNode(node)

	key := client.ObjectKey{Namespace: c.ns, Name: victim.Name}
	g.Eventually(func(g Gomega) {
		mr := &caprv1.MachineRemediation{}
		g.Expect(p.c.Get(ctx, key, mr)).To(Succeed())
		g.Expect(mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhaseFailed), "%s %+v", mr.Status.CurrentStep, mr.Status.Conditions)
		g.Expect(mr.Status.Conditions).To(ContainElement(And(
			HaveField("Type", caprv1.MachineRemediationSucceededCondition),
			HaveField("Reason", caprv1.MachineRemediationStepTimedOutReason))))
	}, p.remediationTimeout(), 5*time.Second).Should(Succeed())
	g.Expect(apierrors.IsNotFound(p.c.Get(ctx, key, &clusterv1.Machine{}))).To(BeTrue(), "the victim was deleted before the remediation ended")
	kcp := &unstructured.Unstructured{}
	kcp.SetGroupVersionKind(schema.GroupVersionKind{Group: "controlplane.cluster.x-k8s.io", Version: "v1beta2", Kind: "KubeadmControlPlane"})
	g.Expect(p.c.Get(ctx, client.ObjectKey{Namespace: c.ns, Name: c.name + "-control-plane"}, kcp)).To(Succeed())
	g.Expect(kcp.GetAnnotations()).NotTo(HaveKey(caprv1.ControlPlaneLockAnnotation), "the control plane is released")

	bootstrapBack()
	restored = true
	g.Eventually(func(g Gomega) { whole(g, p, o, c, victim.Name, node) }, p.remediationTimeout(), 5*time.Second).Should(Succeed())
	r.SecondsToWhole = time.Since(fault).Seconds()
	s := o.summarize()
	g.Expect(s.MinMargin).To(BeNumerically(">=", 0), "quorum was lost: %+v", s)
}

// setControlPlaneRemediation changes the control-plane health check's remediation options for the
// test, and sets them back when it ends.
func setControlPlaneRemediation(t *testing.T, p *kindPlatform, c kindCluster, change func(*caprv1.ControlPlaneRemediationSpec)) {
	t.Helper()
	mhc := &caprv1.MachineHealthCheck{}
	key := client.ObjectKey{Namespace: c.ns, Name: "control-plane"}
	NewWithT(t).Expect(p.c.Get(ctx, key, mhc)).To(Succeed())
	before := mhc.Spec.Remediation.ControlPlane.DeepCopy()
	if mhc.Spec.Remediation.ControlPlane == nil {
		mhc.Spec.Remediation.ControlPlane = &caprv1.ControlPlaneRemediationSpec{}
	}
	change(mhc.Spec.Remediation.ControlPlane)
	NewWithT(t).Expect(p.c.Update(ctx, mhc)).To(Succeed())
	t.Cleanup(func() {
		NewWithT(t).Eventually(func() error {
			if err := p.c.Get(ctx, key, mhc); err != nil {
				return err
			}
			mhc.Spec.Remediation.ControlPlane = before
			return p.c.Update(ctx, mhc)
		}, time.Minute, time.Second).Should(Succeed())
	})
}

// scaleDeployment sets a management-cluster Deployment's replicas and waits until it runs that many.
func scaleDeployment(t *testing.T, p *kindPlatform, ns, name string, replicas int32) {
	t.Helper()
	g := NewWithT(t)
	g.Eventually(func() error {
		d := &appsv1.Deployment{}
		if err := p.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, d); err != nil {
			return err
		}
		d.Spec.Replicas = ptr.To(replicas)
		return p.c.Update(ctx, d)
	}, time.Minute, time.Second).Should(Succeed())
	g.Eventually(func(g Gomega) {
		d := &appsv1.Deployment{}
		g.Expect(p.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, d)).To(Succeed())
		g.Expect(d.Status.Replicas).To(Equal(replicas))
		g.Expect(d.Status.ReadyReplicas).To(Equal(replicas))
	}, 3*time.Minute, time.Second).Should(Succeed())
}

// TestKindSingleControlPlaneKubeletStopped: a cluster of one control-plane Machine (no workers),
// whose only etcd member keeps running after its kubelet stopped. kubeadm joins members as learners
// (the control plane carries CAPR's etcd-learner-joins annotation to say so), so CAPR replaces the
// Machine scale-up-first: the healthy voters never fewer than the one before the fault. The observer
// asks the victim's etcd too (there is no other until the replacement joins); a reading it cannot
// confirm is refused.
func TestKindSingleControlPlaneKubeletStopped(t *testing.T) {
	g := NewWithT(t)
	p := kindEnv(t)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "capr-single-"}}
	g.Expect(p.c.Create(ctx, ns)).To(Succeed())
	name := p.createClusterOf(t, ns.Name, "single", 1, 0, t.Cleanup)
	c := kindCluster{ns: ns.Name, name: name, controlPlane: 1}
	kcp := &unstructured.Unstructured{}
	kcp.SetGroupVersionKind(schema.GroupVersionKind{Group: "controlplane.cluster.x-k8s.io", Version: "v1beta2", Kind: "KubeadmControlPlane"})
	g.Eventually(func() error {
		if err := p.c.Get(ctx, client.ObjectKey{Namespace: c.ns, Name: c.name + "-control-plane"}, kcp); err != nil {
			return err
		}
		a := kcp.GetAnnotations()
		if a == nil {
			a = map[string]string{}
		}
		a[caprv1.EtcdLearnerJoinsAnnotation] = "true"
		kcp.SetAnnotations(a)
		return p.c.Update(ctx, kcp)
	}, time.Minute, time.Second).Should(Succeed())
	cp, _ := p.healthChecks(c.ns, c.name)
	g.Expect(p.c.Create(ctx, cp)).To(Succeed())

	o := observeWhole(t, p, c)
	machines, _ := machinesOf(g, c.ns, c.name)
	g.Expect(machines).To(HaveLen(1))
	victim := machines[0]
	node := victim.Status.NodeRef.Name
	r := &kindResult{Test: t.Name(), Fault: "kubelet stopped (docker exec systemctl stop kubelet) on the only control-plane node, etcd member alive", Victim: node, VictimWasLeader: true}
	fault := recordRun(t, p, o, c, victim.Name, r)
	p.breakNode(t, c.ns, c.name, node)
	g.Eventually(func(g Gomega) { whole(g, p, o, c, victim.Name, node) }, p.remediationTimeout(), 5*time.Second).Should(Succeed())
	r.SecondsToWhole = time.Since(fault).Seconds()
	mr := &caprv1.MachineRemediation{}
	g.Expect(p.c.Get(ctx, client.ObjectKey{Namespace: c.ns, Name: victim.Name}, mr)).To(Succeed())
	g.Expect(mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhaseSucceeded), "%+v", mr.Status.Conditions)
	g.Expect(mr.Status.ControlPlane.Order).To(Equal(caprv1.ControlPlaneOrderScaleUpFirst), mr.Status.ControlPlane.OrderReason)
	s := o.summarize()
	g.Expect(s.MinHealthyVoters).To(BeNumerically(">=", 1), "no healthy voter read: %+v", s)
}

// TestKindTopologyControlPlaneKubeletStopped: a cluster built from a ClusterClass
// (templates/cluster-template-topology.yaml), where the topology controller owns the control plane's
// replicas through Cluster.spec.topology.controlPlane.replicas; a follower's kubelet stops, its etcd
// member alive. CAPR replaces the Machine with the failure margin never below 1 and one Machine
// created, through the topology's replicas, and leaves the Cluster as a GitOps tool wrote it: the
// replicas back at 3, and no managedFields entry of CAPR's on the Cluster, so that the tool's next
// apply owns the field alone again.
func TestKindTopologyControlPlaneKubeletStopped(t *testing.T) {
	g := NewWithT(t)
	p := kindEnv(t)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "capr-topology-"}}
	g.Expect(p.c.Create(ctx, ns)).To(Succeed())
	template := filepath.Join(repoRoot(), "test", "kind", "templates", "cluster-template-topology.yaml")
	name := p.createClusterFrom(t, template, ns.Name, "topo", 3, 0, t.Cleanup)
	c := kindCluster{ns: ns.Name, name: name, controlPlane: 3}
	cp, _ := p.healthChecks(c.ns, c.name)
	g.Expect(p.c.Create(ctx, cp)).To(Succeed())

	o := observeWhole(t, p, c)
	machines, _ := machinesOf(g, c.ns, c.name)
	victim, _ := pickVictim(g, o, machines, false)
	r := &kindResult{Test: t.Name(), Fault: "kubelet stopped (docker exec systemctl stop kubelet) on a follower of a ClusterClass cluster, etcd member alive",
		Victim: victim.Status.NodeRef.Name}
	faultUntilWhole(t, p, o, c, victim, r)
	s := o.summarize()
	g.Expect(s.MinMarginSettled).To(BeNumerically(">=", 1), "the failure margin fell below 1 with a live member: %+v", s)
	g.Expect(s.MachinesCreated).To(HaveLen(1), "Machines created: %v", s.MachinesCreated)

	mr := &caprv1.MachineRemediation{}
	g.Expect(p.c.Get(ctx, client.ObjectKey{Namespace: c.ns, Name: victim.Name}, mr)).To(Succeed())
	g.Expect(mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhaseSucceeded), "%+v", mr.Status.Conditions)
	g.Expect(mr.Status.ControlPlane).NotTo(BeNil())
	g.Expect(mr.Status.ControlPlane.Order).To(Equal(caprv1.ControlPlaneOrderScaleUpFirst), mr.Status.ControlPlane.OrderReason)
	g.Expect(mr.Status.ControlPlane.ReplicasField).To(Equal(caprv1.ReplicasFieldClusterTopology))
	g.Eventually(func(g Gomega) {
		cluster := &clusterv1.Cluster{}
		g.Expect(p.c.Get(ctx, client.ObjectKey{Namespace: c.ns, Name: c.name}, cluster)).To(Succeed())
		g.Expect(cluster.Spec.Topology.ControlPlane.Replicas).To(HaveValue(BeEquivalentTo(3)))
		// The field manager docs/user/topology.md names, written out rather than taken from the product.
		for _, mf := range cluster.ManagedFields {
			g.Expect(mf.Manager).NotTo(Equal("capr-controlplane-remediation"), "CAPR still manages fields of the Cluster: %s", mf.FieldsV1)
		}
	}, time.Minute, time.Second).Should(Succeed())
}

// pickVictim returns the control-plane Machine to break, the etcd leader's (leader) or a follower's,
// as the observer's latest reading names the leader, and the leader's node.
func pickVictim(g Gomega, o *observer, machines []clusterv1.Machine, leader bool) (clusterv1.Machine, string) {
	v, _ := o.latest()
	g.Expect(v.Leader).NotTo(BeEmpty(), "no etcd leader read: %+v", v)
	for _, m := range machines {
		if (m.Status.NodeRef.Name == v.Leader) == leader {
			return m, v.Leader
		}
	}
	g.Expect(false).To(BeTrue(), "no %s Machine among %d (leader %s)", map[bool]string{true: "leader's", false: "follower's"}[leader], len(machines), v.Leader)
	return clusterv1.Machine{}, v.Leader
}
