package machinehealthcheck

import (
	"cmp"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util"
	"sigs.k8s.io/cluster-api/util/annotations"
	"sigs.k8s.io/cluster-api/util/conditions"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// This file holds the health decision: plain functions over plain data, no API calls.

// checkConfig is a MachineHealthCheck's checks with defaults applied.
type checkConfig struct {
	// checker identifies the health check in marks ("<namespace>/<name>").
	checker            string
	nodeStartupTimeout time.Duration // 0 disables the check
	// nodeDeletingTimeout is checks.nodeDeletingTimeoutSeconds; 0 disables the check.
	nodeDeletingTimeout time.Duration
	nodeConditions      []caprv1.UnhealthyNodeCondition
	machineConditions   []caprv1.UnhealthyMachineCondition
	etcdMemberTimeout   time.Duration // 0 disables the check
}

// clusterFacts are the Cluster conditions the decision depends on.
type clusterFacts struct {
	infrastructureReady     bool
	infrastructureReadyTime time.Time
	controlPlaneInitialized bool
	controlPlaneInitTime    time.Time
}

// etcdMemberFact is what the etcd member check observed for a control-plane Machine.
type etcdMemberFact struct {
	healthy bool
	// problem says what is wrong (missing, unreachable, alarm NOSPACE, learner).
	problem string
	// since is when the member was first seen unhealthy.
	since time.Time
}

// target is one Machine with what was read about it.
type target struct {
	machine *clusterv1.Machine
	// node is the Machine's Node in the workload cluster, nil when unknown or absent.
	node *corev1.Node
	// nodeMissing is true when the Machine has a nodeRef but the Node does not exist.
	nodeMissing bool
	// etcd is nil when the etcd member check does not apply or was not run.
	etcd *etcdMemberFact
}

// verdict is the outcome of a health evaluation.
type verdict int

const (
	// verdictPending: neither healthy nor unhealthy yet (starting, a timeout still running, no Node,
	// deleting). Counts as not healthy for the short-circuit, as in CAPI.
	verdictPending verdict = iota
	verdictHealthy
	verdictUnhealthy
)

// evaluation is the result for one target.
type evaluation struct {
	verdict verdict
	reason  string
	message string
	// nextCheck > 0 is when the target must be evaluated again because a timeout will expire.
	nextCheck time.Duration
}

// isControlPlane is CAPI's util.IsControlPlaneMachine.
// TODO(etcd): only observeEtcdMembers still calls it; drop it when that function moves.
var isControlPlane = util.IsControlPlaneMachine

// maxForeignMarkMessage bounds the message a hand-written mark gives its Machine's mark condition.
// Anyone who may annotate a Machine writes it, up to the 256 KiB of all its annotations, while the
// condition's message takes 32,768 characters (metav1.Condition) and holds one entry per health
// check over the Machine: a longer one made every write of the mark refused, so the Machine was never
// marked (TestHugeHandWrittenMarkIsCut).
const maxForeignMarkMessage = 1024

// cutForeignMessage returns a hand-written mark's message cut to maxForeignMarkMessage bytes, at a
// character boundary, saying how long it was.
func cutForeignMessage(msg string) string {
	if len(msg) <= maxForeignMarkMessage {
		return msg
	}
	note := fmt.Sprintf(" … (cut: the annotation's message has %d bytes)", len(msg))
	return cutUTF8(msg, maxForeignMarkMessage-len(note)) + note
}

// cutUTF8 returns the longest prefix of s of at most n bytes that does not split a character.
func cutUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// foreignMark returns the mark on the Machine when it was written by someone other than checker
// (a person, or another tool): such marks are requests, and this health check never clears them.
func foreignMark(m *clusterv1.Machine, checker string) (*caprv1.MarkRecord, bool) {
	value, ok := m.Annotations[caprv1.UnhealthyAnnotation]
	if !ok {
		return nil, false
	}
	rec, err := caprv1.MarkRecordFromAnnotation(value)
	if err != nil {
		// A mark that is not JSON is still a request by a person; keep its text as the message.
		return &caprv1.MarkRecord{Reason: caprv1.MachineCAPRHealthCheckManualRequestReason, Message: value}, true
	}
	if rec.Checker == checker {
		return nil, false
	}
	return rec, true
}

// evaluate decides whether one target is healthy, unhealthy or pending at time now. It follows CAPI's
// MachineHealthCheck semantics (sigs.k8s.io/cluster-api core/reconcilers/machinehealthcheck
// machinehealthcheck_targets.go, needsRemediation) and adds the etcd member check and
// hand-written marks.
func evaluate(t target, cfg checkConfig, cluster clusterFacts, now time.Time) evaluation {
	m := t.machine

	// Requests by a person come first and need no timeout.
	if annotations.HasRemediateMachine(m) {
		return evaluation{verdict: verdictUnhealthy, reason: caprv1.MachineCAPRHealthCheckManualRequestReason,
			message: "Machine has the " + clusterv1.RemediateMachineAnnotation + " annotation"}
	}
	if rec, ok := foreignMark(m, cfg.checker); ok {
		msg := cutForeignMessage(rec.Message)
		if msg == "" {
			msg = "Machine was marked unhealthy by " + cmp.Or(rec.Checker, "hand")
		}
		return evaluation{verdict: verdictUnhealthy, reason: caprv1.MachineCAPRHealthCheckManualRequestReason, message: msg}
	}

	// Workers are not checked before the control plane is up; control-plane Machines are, so that
	// the first control-plane Machine can be remediated.
	if !cluster.controlPlaneInitialized && !util.IsControlPlaneMachine(m) {
		return evaluation{verdict: verdictPending}
	}
	if !cluster.infrastructureReady {
		return evaluation{verdict: verdictPending}
	}

	var failures []string
	reason := ""
	var next time.Duration
	fail := func(r, msg string) {
		failures = append(failures, msg)
		if reason == "" {
			reason = r
		}
	}
	wait := func(d time.Duration) {
		if next == 0 || d < next {
			next = d
		}
	}

	// Machine conditions.
	conditionTimeout := func(matches bool, since time.Time, timeoutSeconds *int32, reason, message string) {
		if !matches {
			return
		}
		timeout := seconds(timeoutSeconds)
		if expired, remaining := timedOut(since, timeout, now); expired {
			fail(reason, fmt.Sprintf("%s for more than %s", message, timeout))
		} else {
			wait(remaining)
		}
	}
	for _, c := range cfg.machineConditions {
		if cond := conditions.Get(m, c.Type); cond != nil {
			conditionTimeout(cond.Status == c.Status, cond.LastTransitionTime.Time, c.TimeoutSeconds, caprv1.MachineCAPRHealthCheckUnhealthyMachineReason,
				fmt.Sprintf("Condition %s on Machine is reporting status %s", c.Type, c.Status))
		}
	}

	// Node checks.
	switch {
	case t.nodeMissing:
		fail(caprv1.MachineCAPRHealthCheckNodeDeletedReason, fmt.Sprintf("Node %s has been deleted", m.Status.NodeRef.Name))
	case t.node == nil:
		if cfg.nodeStartupTimeout > 0 {
			start := latest(m.CreationTimestamp.Time, cluster.infrastructureReadyTime, cluster.controlPlaneInitTime,
				conditionTime(m, clusterv1.MachineInfrastructureReadyCondition))
			if expired, remaining := timedOut(start, cfg.nodeStartupTimeout, now); expired {
				fail(caprv1.MachineCAPRHealthCheckNodeStartupTimeoutReason, fmt.Sprintf("Health check failed: Node failed to report startup in %s", cfg.nodeStartupTimeout))
			} else {
				wait(remaining)
			}
		}
	default:
		if d := t.node.DeletionTimestamp; cfg.nodeDeletingTimeout > 0 && d != nil && m.DeletionTimestamp.IsZero() {
			if expired, remaining := timedOut(d.Time, cfg.nodeDeletingTimeout, now); expired {
				fail(caprv1.MachineCAPRHealthCheckNodeDeletingReason, fmt.Sprintf("Node %s has been deleting for more than %s", t.node.Name, cfg.nodeDeletingTimeout))
			} else {
				wait(remaining)
			}
		}
		for _, c := range cfg.nodeConditions {
			if cond := nodeCondition(t.node, c.Type); cond != nil {
				conditionTimeout(cond.Status == c.Status, cond.LastTransitionTime.Time, c.TimeoutSeconds, caprv1.MachineCAPRHealthCheckUnhealthyNodeReason,
					fmt.Sprintf("Condition %s on Node is reporting status %s", c.Type, c.Status))
			}
		}
	}

	// etcd member (control-plane Machines only, when configured and observed).
	if cfg.etcdMemberTimeout > 0 && t.etcd != nil && !t.etcd.healthy && util.IsControlPlaneMachine(m) {
		if expired, remaining := timedOut(t.etcd.since, cfg.etcdMemberTimeout, now); expired {
			fail(caprv1.MachineCAPRHealthCheckUnhealthyEtcdMemberReason, fmt.Sprintf("etcd member is %s for more than %s", t.etcd.problem, cfg.etcdMemberTimeout))
		} else {
			wait(remaining)
		}
	}

	if len(failures) > 0 {
		return evaluation{verdict: verdictUnhealthy, reason: reason, message: strings.Join(failures, "; ")}
	}
	if next > 0 {
		return evaluation{verdict: verdictPending, nextCheck: next}
	}
	if t.node != nil && m.DeletionTimestamp.IsZero() {
		return evaluation{verdict: verdictHealthy}
	}
	return evaluation{verdict: verdictPending}
}

// timedOut reports whether start+timeout is before now and, if not, how long until it is (plus one
// second, so the requeue lands after the expiry rather than on it).
func timedOut(start time.Time, timeout time.Duration, now time.Time) (bool, time.Duration) {
	deadline := start.Add(timeout)
	if deadline.Before(now) {
		return true, 0
	}
	return false, deadline.Sub(now) + expirySlack
}

// expirySlack is what timedOut adds to the time left before a timeout expires; nextCheck carries it.
// The requeue does not need it (round.requeueAfter): the work queue never fires early.
const expirySlack = time.Second

func seconds(s *int32) time.Duration {
	if s == nil {
		return 0
	}
	return time.Duration(*s) * time.Second
}

func nodeCondition(n *corev1.Node, t corev1.NodeConditionType) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == t {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

func conditionTime(obj conditions.Getter, t string) time.Time {
	if c := conditions.Get(obj, t); c != nil && c.Status == metav1.ConditionTrue {
		return c.LastTransitionTime.Time
	}
	return time.Time{}
}

func latest(times ...time.Time) time.Time {
	var out time.Time
	for _, t := range times {
		if t.After(out) {
			out = t
		}
	}
	return out
}
