package main

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/remediation/controlplane"
	"github.com/capr-io/capr/test/sandbox"
)

// system is who detects and remediates.
type system string

const (
	systemKCP  system = "CAPI MHC + KCP"
	systemCAPR system = "CAPR"
)

// systems are the columns of every table, in this order.
var systems = []system{systemKCP, systemCAPR}

// run is one scenario under one system, and what was measured.
type run struct {
	sb      *sandbox.Sandbox
	wc      *sandbox.WorkloadCluster
	initial []clusterv1.Machine
	system  system
	n       int

	fault        time.Time
	victims      []string
	marked       map[string]time.Time
	seen         map[string]bool
	replacement  time.Time
	fullStrength time.Time
	minMargin    int
	atMostZero   time.Duration
	fenced       string
	// waiting is what CAPR's requests say while a run has not reached full voting strength.
	waiting string
	// diagnosis is, for a stalled KCP run, what KCP itself says (progress log only).
	diagnosis string
}

func runOnce(ctx context.Context, sb *sandbox.Sandbox, sc scenario, sys system, ns string, timeout time.Duration) (*run, error) {
	if err := sb.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		return nil, err
	}
	spec := sandbox.ClusterSpec{Namespace: ns, Name: "wc", ControlPlane: sc.controlPlane, ExternalEtcd: sc.externalEtcd}
	if sc.topology {
		spec.Topology = &sandbox.TopologySpec{}
	}
	wc, err := sb.CreateCluster(ctx, spec)
	if err != nil {
		return nil, err
	}
	defer sb.DestroyCluster(ctx, wc)
	initial, err := sb.ControlPlaneMachines(ctx, wc)
	if err != nil {
		return nil, err
	}
	r := &run{sb: sb, wc: wc, initial: initial, system: sys, n: int(sc.controlPlane), marked: map[string]time.Time{}, seen: map[string]bool{}}
	for _, m := range initial {
		r.seen[m.Name] = true
	}
	switch sys {
	case systemCAPR:
		if err := sb.Client.Create(ctx, sandbox.ControlPlaneHealthCheck(ns, "cp", wc.Name, 2)); err != nil {
			return nil, err
		}
		capr, err := sb.StartCAPR(ctx, sandbox.CAPROptions{})
		if err != nil {
			return nil, err
		}
		defer capr.Stop()
	case systemKCP:
		if err := sb.Client.Create(ctx, capiControlPlaneHealthCheck(ns, wc.Name)); err != nil {
			return nil, err
		}
	}
	if err := writeAPIServerData(ctx, wc); err != nil {
		return nil, err
	}
	quorum := sb.WatchQuorum(ctx, wc)
	r.fault = time.Now()
	if r.victims, err = sc.inject(ctx, r); err != nil {
		return nil, err
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(250 * time.Millisecond) // the sampling period
	defer tick.Stop()
	// Until full voting strength, or the deadline: a run that has not reached it is "stalled".
sampling:
	for r.fullStrength.IsZero() {
		r.sample(ctx)
		select {
		case <-deadline.C:
			break sampling
		case <-ctx.Done(): // interrupted: the caller stops the full stack
			break sampling
		case <-tick.C:
		}
	}
	_, _ = quorum.Stop()
	r.minMargin, _, r.atMostZero = quorum.Margin()
	r.fenced = r.fencing(ctx)
	if r.fullStrength.IsZero() {
		r.waiting = r.waitingReasons(ctx)
		r.diagnosis = r.controlPlaneConditions(ctx)
	}
	return r, nil
}

// apiServerWrites is how many writes each run puts into the workload cluster's etcd before the
// fault: the data a real cluster's etcd holds from its API server. etcd 3.6 snapshots in memory every
// 100 applied entries and then compacts its raft log (etcdserver memorySnapshotCount, compactRaftLog),
// so in a real cluster every joining member catches up from a snapshot, and such a member can lose its
// first attempt to publish itself and serve no client for etcd's request timeout (6 s here). The
// sandbox's etcd holds no API server data: without these writes only runs whose own etcd calls had
// passed 100 entries (CAPR's inspections: AlarmList goes through raft) met that, and KCP's never
// (seen in etcd's own logs, kept for one set of runs).
const apiServerWrites = 200

// apiServerWritesTimeout bounds writeAPIServerData.
const apiServerWritesTimeout = 30 * time.Second

// writeAPIServerData puts apiServerWrites keys into the workload cluster's etcd (its stacked or
// external cluster). A healthy etcd takes well under a second; an etcd that does not answer fails the
// run after apiServerWritesTimeout instead of hanging it.
func writeAPIServerData(ctx context.Context, wc *sandbox.WorkloadCluster) error {
	ctx, cancel := context.WithTimeout(ctx, apiServerWritesTimeout)
	defer cancel()
	cli, err := wc.Etcd.Client(ctx)
	if err != nil {
		return fmt.Errorf("reaching the etcd of cluster %s: %w", wc.Name, err)
	}
	defer func() { _ = cli.Close() }()
	for i := range apiServerWrites {
		if _, err := cli.Put(ctx, fmt.Sprintf("/registry/compare-kcp/%d", i%20), strconv.Itoa(i)); err != nil {
			return fmt.Errorf("writing to the etcd of cluster %s: %w", wc.Name, err)
		}
	}
	return nil
}

// requests are CAPR's MachineRemediations of the victims that exist.
func (r *run) requests(ctx context.Context) []*caprv1.MachineRemediation {
	var out []*caprv1.MachineRemediation
	for _, v := range r.victims {
		mr := &caprv1.MachineRemediation{}
		if err := r.sb.Client.Get(ctx, client.ObjectKey{Namespace: r.wc.Namespace, Name: v}, mr); err == nil {
			out = append(out, mr)
		}
	}
	return out
}

// waitingReasons is the Progressing reason of each of CAPR's requests that has not succeeded, or for
// KCP the OwnerRemediated condition (reason: message) of each victim that still exists.
func (r *run) waitingReasons(ctx context.Context) string {
	var out []string
	if r.system == systemKCP {
		for _, v := range r.victims {
			m := &clusterv1.Machine{}
			if err := r.sb.Client.Get(ctx, client.ObjectKey{Namespace: r.wc.Namespace, Name: v}, m); err != nil {
				continue
			}
			if c := conditions.Get(m, clusterv1.MachineOwnerRemediatedCondition); c != nil {
				out = append(out, fmt.Sprintf("%s %s: %s", clusterv1.MachineOwnerRemediatedCondition, c.Reason, c.Message))
			}
		}
		return strings.Join(out, ", ")
	}
	for _, mr := range r.requests(ctx) {
		if mr.Status.Phase != caprv1.MachineRemediationPhaseSucceeded {
			out = append(out, fmt.Sprintf("%s (%s)", mr.Status.Phase, conditions.GetReason(mr, caprv1.MachineRemediationProgressingCondition)))
		}
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}

// capiControlPlaneHealthCheck is CAPI's MachineHealthCheck for the control plane with the same
// timeouts as CAPR's health check (a Node not Ready for 2 s; an etcd member unhealthy for 10 s) and no
// remediation template: KCP remediates. CAPI v1.14 can check KCP's Machine conditions: EtcdMemberHealthy
// (membership, learner, alarms: KCP does not ask whether the member answers) and EtcdPodHealthy (the
// kubelet reports the crashed etcd container), the best a CAPI user can configure for a dead member.
func capiControlPlaneHealthCheck(ns, cluster string) *clusterv1.MachineHealthCheck {
	cond := func(status corev1.ConditionStatus) clusterv1.UnhealthyNodeCondition {
		return clusterv1.UnhealthyNodeCondition{Type: corev1.NodeReady, Status: status, TimeoutSeconds: ptr.To(int32(2))}
	}
	etcd := func(condition string, status metav1.ConditionStatus) clusterv1.UnhealthyMachineCondition {
		return clusterv1.UnhealthyMachineCondition{Type: condition, Status: status, TimeoutSeconds: ptr.To(int32(10))}
	}
	return &clusterv1.MachineHealthCheck{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "cp"},
		Spec: clusterv1.MachineHealthCheckSpec{
			ClusterName: cluster,
			Selector:    metav1.LabelSelector{MatchLabels: map[string]string{clusterv1.MachineControlPlaneLabel: ""}},
			Checks: clusterv1.MachineHealthCheckChecks{
				UnhealthyNodeConditions: []clusterv1.UnhealthyNodeCondition{cond(corev1.ConditionUnknown), cond(corev1.ConditionFalse)},
				UnhealthyMachineConditions: []clusterv1.UnhealthyMachineCondition{
					etcd(controlplanev1.KubeadmControlPlaneMachineEtcdMemberHealthyCondition, metav1.ConditionFalse),
					etcd(controlplanev1.KubeadmControlPlaneMachineEtcdMemberHealthyCondition, metav1.ConditionUnknown),
					etcd(controlplanev1.KubeadmControlPlaneMachineEtcdPodHealthyCondition, metav1.ConditionFalse),
				},
			},
		},
	}
}

// sample records marks, new Machines, the first healthy replacement and full voting strength.
func (r *run) sample(ctx context.Context) {
	now := time.Now()
	machines, err := r.sb.ControlPlaneMachines(ctx, r.wc)
	if err != nil {
		return
	}
	for i := range machines {
		m := &machines[i]
		r.seen[m.Name] = true
		if _, ok := r.marked[m.Name]; !ok && r.isMarked(m) {
			r.marked[m.Name] = now
		}
	}
	if r.wc.ExternalEtcd {
		r.sampleServing(now, machines)
		return
	}
	state, err := r.sb.EtcdState(ctx, r.wc)
	if err != nil {
		return
	}
	if r.replacement.IsZero() {
		for _, m := range machines {
			if !r.isInitial(m.Name) && m.Status.NodeRef.IsDefined() {
				if member := state.ByName(m.Status.NodeRef.Name); member != nil && member.Healthy && !member.IsLearner {
					r.replacement = now
				}
			}
		}
	}
	c := state.Counts()
	whole := c.Voting == r.n && c.Healthy == r.n && c.Learners == 0 && len(machines) == r.n
	for _, v := range r.victims {
		for _, m := range machines {
			if m.Name == v {
				whole = false
			}
		}
	}
	for _, m := range machines {
		if !m.DeletionTimestamp.IsZero() || !m.Status.NodeRef.IsDefined() || !r.sb.EtcdRunning(r.wc, m.Status.NodeRef.Name) {
			whole = false
		}
	}
	if whole {
		r.fullStrength = now
	}
}

// sampleServing is sample's second half with external etcd, where no Machine has a member: a
// replacement is healthy when it serves the API (KCP's APIServerPodHealthy, ControllerManagerPodHealthy
// and SchedulerPodHealthy), and the control plane is whole with N serving Machines, no victim among them.
func (r *run) sampleServing(now time.Time, machines []clusterv1.Machine) {
	whole := len(machines) == r.n
	for i := range machines {
		m := &machines[i]
		serving := m.DeletionTimestamp.IsZero() && controlplane.KCP{}.ServesAPI(m) == ""
		if serving && !r.isInitial(m.Name) && r.replacement.IsZero() {
			r.replacement = now
		}
		if !serving || slices.Contains(r.victims, m.Name) {
			whole = false
		}
	}
	if whole {
		r.fullStrength = now
	}
}

func (r *run) isInitial(name string) bool {
	for _, m := range r.initial {
		if m.Name == name {
			return true
		}
	}
	return false
}

func (r *run) isMarked(m *clusterv1.Machine) bool {
	if r.system == systemCAPR {
		return conditions.IsFalse(m, caprv1.MachineCAPRHealthCheckSucceededCondition)
	}
	return conditions.IsFalse(m, clusterv1.MachineHealthCheckSucceededCondition)
}

func (r *run) fencing(ctx context.Context) string {
	if r.system == systemKCP {
		return "no (KCP does not fence)"
	}
	var out []string
	for _, mr := range r.requests(ctx) {
		for _, s := range mr.Status.Steps {
			if s.Name == caprv1.StepFence {
				out = append(out, fmt.Sprintf("%s: %s", s.Outcome, s.Message))
			}
		}
	}
	if len(out) == 0 {
		return "not reached"
	}
	sort.Strings(out)
	return strings.Join(out, "; ")
}

// controlPlaneConditions is, for KCP, its Remediating and EtcdClusterHealthy conditions and whether it
// holds a remediation in progress: where KCP stands when it stalled without a word on the Machine.
func (r *run) controlPlaneConditions(ctx context.Context) string {
	if r.system != systemKCP {
		return ""
	}
	obj, err := r.sb.ControlPlaneObject(ctx, r.wc)
	if err != nil {
		return err.Error()
	}
	kcp := &controlplanev1.KubeadmControlPlane{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, kcp); err != nil {
		return err.Error()
	}
	var out []string
	for _, t := range []string{controlplanev1.KubeadmControlPlaneRemediatingCondition, controlplanev1.KubeadmControlPlaneEtcdClusterHealthyCondition} {
		if c := conditions.Get(kcp, t); c != nil {
			out = append(out, fmt.Sprintf("KCP %s %s %s: %s", t, c.Status, c.Reason, c.Message))
		}
	}
	if v, ok := kcp.Annotations[controlplanev1.RemediationInProgressAnnotation]; ok {
		out = append(out, "KCP remediation in progress: "+v)
	}
	return strings.Join(out, "; ")
}
