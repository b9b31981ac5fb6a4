package machinehealthcheck

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/external"
	"sigs.k8s.io/cluster-api/util"
	"sigs.k8s.io/cluster-api/util/conditions"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/etcdutil/quorum"
	"github.com/capr-io/capr/remediation"
)

// This file holds the "max unhealthy" decisions: triggerIf (as CAPI) and the quorum-safe limit for
// control-plane targets (etcdutil/quorum EffectiveControlPlaneLimit). They are the one place where these limits are enforced.

// limitDecision is whether remediation is allowed for a group of targets.
type limitDecision struct {
	allowed bool
	// remaining is how many more targets may become unhealthy (0 when not allowed).
	remaining int
	// limit is the largest number of unhealthy targets allowed (-1: no limit from this rule).
	limit int
	// reason and message explain a refusal (the RemediationAllowed condition's).
	reason, message string
	// storm is true when more targets are unhealthy than triggerIf allows (not when too few are, for
	// unhealthyInRange): what starts a storm cooldown.
	storm bool
	// single is set by controlPlaneDecision for one desired replica with stacked etcd, whose limit
	// depends on the etcd member (singleControlPlaneDecision); userLimit and unhealthy are its inputs.
	single               bool
	userLimit, unhealthy int
}

// limits are the decisions that apply to one health check's targets.
type limits struct {
	// trigger is spec.remediation.triggerIf, for all targets.
	trigger limitDecision
	// controlPlane is the quorum-safe limit and the etcd quorum, for control-plane targets (limit -1
	// when there are none).
	controlPlane limitDecision
	// storm is the next StormCooldown condition (nil: no cooldown configured) and cooldownEnds how
	// soon a running cooldown ends.
	storm        *metav1.Condition
	cooldownEnds time.Duration
}

// allow reports whether an unhealthy Machine may be remediated now.
func (l limits) allow(m *clusterv1.Machine) bool {
	return l.trigger.allowed && (!util.IsControlPlaneMachine(m) || l.controlPlane.allowed)
}

// refusal is the decision that refuses remediation, triggerIf first; nil when remediation is allowed.
func (l limits) refusal() *limitDecision {
	switch {
	case !l.trigger.allowed:
		return &l.trigger
	case !l.controlPlane.allowed:
		return &l.controlPlane
	default:
		return nil
	}
}

// remaining is how many more targets may become unhealthy and still be remediated: what triggerIf
// leaves, bounded by the control-plane limit when the health check has control-plane targets (the
// next unhealthy target may be one of them). 0 when remediation is refused.
func (l limits) remaining() int {
	if l.refusal() != nil {
		return 0
	}
	if l.controlPlane.limit >= 0 {
		return min(l.trigger.remaining, l.controlPlane.remaining)
	}
	return l.trigger.remaining
}

// triggerIfDecision applies spec.remediation.triggerIf to expected targets of which unhealthy are
// not healthy (unhealthy or not yet started, as CAPI counts them).
func triggerIfDecision(t *caprv1.MachineHealthCheckRemediationTriggerIf, expected, unhealthy int) (limitDecision, error) {
	if t != nil && t.UnhealthyInRange != "" {
		lo, hi, err := parseUnhealthyRange(t.UnhealthyInRange)
		if err != nil {
			return limitDecision{}, err
		}
		if unhealthy < lo || unhealthy > hi {
			return limitDecision{limit: hi, storm: unhealthy > hi, reason: caprv1.MachineHealthCheckTooManyUnhealthyReason, message: fmt.Sprintf(
				"Remediation is not allowed, the number of not started or unhealthy machines does not fall within the range (total: %d, unhealthy: %d, unhealthyInRange: %s)",
				expected, unhealthy, t.UnhealthyInRange)}, nil
		}
		return limitDecision{allowed: true, remaining: hi - unhealthy, limit: hi}, nil
	}

	maxUnhealthy := intstr.FromString("100%")
	if t != nil && t.UnhealthyLessThanOrEqualTo != nil {
		maxUnhealthy = *t.UnhealthyLessThanOrEqualTo
	}
	if p, err := strconv.Atoi(strings.TrimSuffix(maxUnhealthy.StrVal, "%")); maxUnhealthy.Type == intstr.String && err == nil && p > 100 {
		// Above 100% allows what 100% allows. Scaled as is, a large percentage overflows int in
		// intstr.GetScaledValueFromIntOrPercent (float64 to int) and reads as a negative limit, which
		// would refuse every remediation (found by FuzzTriggerIfDecision).
		maxUnhealthy = intstr.FromString("100%")
	}
	limit, err := intstr.GetScaledValueFromIntOrPercent(&maxUnhealthy, expected, false)
	if err != nil {
		return limitDecision{}, fmt.Errorf("invalid unhealthyLessThanOrEqualTo %q: %w", maxUnhealthy.String(), err)
	}
	if unhealthy > limit {
		return limitDecision{limit: limit, storm: true, reason: caprv1.MachineHealthCheckTooManyUnhealthyReason, message: fmt.Sprintf(
			"Remediation is not allowed, the number of not started or unhealthy machines exceeds unhealthyLessThanOrEqualTo (total: %d, unhealthy: %d, unhealthyLessThanOrEqualTo: %s)",
			expected, unhealthy, maxUnhealthy.String())}, nil
	}
	return limitDecision{allowed: true, remaining: limit - unhealthy, limit: limit}, nil
}

// stormCooldown applies spec.remediation.stormCooldownSeconds (medik8s NodeHealthCheck's storm
// recovery) to the triggerIf decision. A storm is trigger.storm; when it ends, remediation stays off
// for the cooldown. prev is the StormCooldown condition the last round left: the cooldown's start is
// its lastTransitionTime, so a restart neither forgets nor shortens a cooldown. It returns the next
// StormCooldown condition, the decision to use instead of trigger, and how soon the cooldown ends (0
// when none runs).
func stormCooldown(prev *metav1.Condition, cooldown time.Duration, trigger limitDecision, now time.Time) (metav1.Condition, limitDecision, time.Duration) {
	now = now.Truncate(time.Second) // as conditions store it
	cond := metav1.Condition{Type: caprv1.MachineHealthCheckStormCooldownCondition, Status: metav1.ConditionFalse, Reason: caprv1.MachineHealthCheckNoStormReason}
	if trigger.storm {
		cond.Reason = caprv1.MachineHealthCheckStormActiveReason
		cond.Message = fmt.Sprintf("More targets are unhealthy than triggerIf allows; when fewer are, no remediation starts for %s", cooldown)
		return cond, trigger, 0
	}
	var start time.Time
	switch {
	case prev != nil && prev.Status == metav1.ConditionTrue:
		start = prev.LastTransitionTime.Time
	case prev != nil && prev.Reason == caprv1.MachineHealthCheckStormActiveReason:
		start = now // the storm ended in this round
	default:
		return cond, trigger, 0
	}
	end := start.Add(cooldown)
	if !now.Before(end) {
		cond.Message = fmt.Sprintf("The cooldown after the storm that ended at %s is over", start.UTC().Format(time.RFC3339))
		return cond, trigger, 0
	}
	msg := fmt.Sprintf("A remediation storm ended at %s: no new remediation until %s (stormCooldownSeconds: %d)",
		start.UTC().Format(time.RFC3339), end.UTC().Format(time.RFC3339), int(cooldown/time.Second))
	cond = metav1.Condition{Type: caprv1.MachineHealthCheckStormCooldownCondition, Status: metav1.ConditionTrue,
		Reason: caprv1.MachineHealthCheckStormCooldownReason, Message: msg, LastTransitionTime: metav1.NewTime(start)}
	if trigger.allowed {
		trigger = limitDecision{limit: trigger.limit, reason: caprv1.MachineHealthCheckStormCooldownReason, message: "Remediation is not allowed: " + msg}
	}
	return cond, trigger, end.Sub(now)
}

// controlPlaneDecision applies the control-plane limit to the control-plane targets, of which
// unhealthy are not healthy: min(userLimit, floor((N-1)/2)) with stacked etcd (quorum), min(userLimit,
// N-1) with external etcd (one Machine serving). userLimit < 0 means none.
func controlPlaneDecision(userLimit, desiredReplicas, unhealthy int, placement caprv1.EtcdPlacement) limitDecision {
	external := placement == caprv1.EtcdPlacementExternal
	limit := quorum.EffectiveControlPlaneLimit(userLimit, desiredReplicas, external)
	var d limitDecision
	if unhealthy > limit {
		what := "the quorum-safe limit"
		if external {
			what = "with external etcd the limit (one Machine must keep serving)"
		}
		d = limitDecision{limit: limit, reason: caprv1.MachineHealthCheckControlPlaneQuorumLimitReason, message: fmt.Sprintf(
			"Remediation of control-plane Machines is not allowed, %d of %d desired control-plane Machines are not started or unhealthy and %s is %d",
			unhealthy, desiredReplicas, what, limit)}
	} else {
		d = limitDecision{allowed: true, remaining: limit - unhealthy, limit: limit}
	}
	if desiredReplicas == 1 && !external {
		// decided again from the etcd member (singleControlPlaneDecision)
		d.single, d.userLimit, d.unhealthy = true, userLimit, unhealthy
	}
	return d
}

// controlPlaneObject reads the Cluster's control-plane object, which the control-plane limit (its
// replicas) and the etcd member check (its etcd placement) depend on. It is read live, not from the
// cache (controllers.ManagerClientOptions): its kind is whatever the Cluster names, and CAPR may
// have no role to list and watch it; a Forbidden read is reported in the limit's message.
func (r *Reconciler) controlPlaneObject(ctx context.Context, cluster *clusterv1.Cluster) (*unstructured.Unstructured, error) {
	if !cluster.Spec.ControlPlaneRef.IsDefined() {
		return nil, errors.New("the Cluster has no spec.controlPlaneRef")
	}
	cp, err := external.GetObjectFromContractVersionedRef(ctx, r.Client, cluster.Spec.ControlPlaneRef, cluster.Namespace)
	if err != nil {
		return nil, fmt.Errorf("cannot read the control plane's desired replicas: %w", err)
	}
	return cp, nil
}

// controlPlaneLimit applies the control-plane limit for the control plane's desired replicas (cp,
// or cpErr why it could not be read), with machines control-plane targets, notHealthy of them not
// healthy and starting of those only because they have no Node yet. While a CAPR remediation holds
// the control plane, its replicas are temporarily N+surge, or back at N with the victim and its one
// replacement N+1 Machines (remediation/controlplane firstreplacement.go): the N recorded in the lock
// is used instead, and the surge Machines still starting are not counted (see surgeStarting). When N
// cannot be read, control-plane remediation is not allowed.
func controlPlaneLimit(cp *unstructured.Unstructured, cpErr error, userLimit, machines, notHealthy, starting int) limitDecision {
	if cpErr != nil {
		return limitDecision{limit: 0, reason: caprv1.MachineHealthCheckControlPlaneQuorumLimitReason, message: "Remediation of control-plane Machines is not allowed: " + cpErr.Error()}
	}
	replicas, found, err := unstructured.NestedInt64(cp.Object, "spec", "replicas")
	if err != nil || !found {
		return limitDecision{limit: 0, reason: caprv1.MachineHealthCheckControlPlaneQuorumLimitReason, message: "Remediation of control-plane Machines is not allowed: the control plane has no spec.replicas"}
	}
	if v, ok := cp.GetAnnotations()[caprv1.ControlPlaneLockAnnotation]; ok {
		if rec, err := caprv1.ControlPlaneLockFromAnnotation(v); err == nil && rec.DesiredReplicas > 0 {
			notHealthy -= surgeStarting(max(int(replicas), machines), int(rec.DesiredReplicas), starting)
			replicas = int64(rec.DesiredReplicas)
		}
	}
	return controlPlaneDecision(userLimit, int(replicas), notHealthy, remediation.EtcdPlacementOf(cp))
}

// surgeStarting is how many of the starting control-plane Machines (no Node yet) are the surge of
// the remediation holding the control plane: at most size - desired, size being the larger of the
// replicas and the control-plane Machines. They are not counted
// against the quorum-safe limit, which is about the N desired Machines: a surge Machine is not an
// etcd member yet and is extra to N. Counting it would refuse a Machine whose member dies while a
// replacement is being provisioned, and the remediation in progress (which cannot safely remove a
// healthy member while another is down) could then only wait for its timeout.
func surgeStarting(size, desired, starting int) int {
	return max(0, min(starting, size-desired))
}

var unhealthyRangeRE = regexp.MustCompile(`^\[([0-9]+)-([0-9]+)\]$`)

// parseUnhealthyRange parses "[min-max]". The CRD already refuses anything else; this guards
// objects stored before that validation existed.
func parseUnhealthyRange(r string) (int, int, error) {
	parts := unhealthyRangeRE.FindStringSubmatch(r)
	if parts == nil {
		return 0, 0, fmt.Errorf("invalid unhealthyInRange %q: want [min-max]", r)
	}
	lo, err1 := strconv.Atoi(parts[1])
	hi, err2 := strconv.Atoi(parts[2])
	if err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("invalid unhealthyInRange %q: min and max must be integers", r)
	}
	if hi < lo {
		return 0, 0, fmt.Errorf("invalid unhealthyInRange %q: max is less than min", r)
	}
	return lo, hi, nil
}

// etcdProblemNoLeader is the problem of an etcd member (EtcdMemberHealth.Problem, as etcdutil words
// it) that says something about the etcd cluster rather than about the member.
// TODO(etcd): EtcdMemberHealth should say it in a field of its own, as it says Learner.
const etcdProblemNoLeader = "has no leader"

// etcdQuorum is whether a cluster's etcd has quorum, derived from its members' health.
type etcdQuorum struct {
	// known is false when etcd was not read.
	known bool
	// counts are the voting members and, as Healthy, those that are up: healthy, alarmed (an alarmed
	// member votes: EtcdMemberHealth.Votes), or whose only problem is that there is no leader (during
	// an election every member has none).
	counts quorum.Counts
	// dead are the voting members that are not up, by Node.
	dead []string
	// readErr is why etcd could not be read when it was tried (known false).
	readErr error
}

// quorumOf derives the quorum from the member health the EtcdMemberSource reports, by Node name.
// Learners do not vote, whether or not they could be reached. A member whose only problem is that
// it has no leader is up: it is the cluster that has no leader, because too few members are up to
// elect one, or only until the election ends.
func quorumOf(health map[string]EtcdMemberHealth) etcdQuorum {
	q := etcdQuorum{known: true}
	for node, h := range health {
		if h.Learner {
			continue
		}
		q.counts.Voting++
		if h.Healthy || h.Votes || h.Problem == etcdProblemNoLeader {
			q.counts.Healthy++
		} else {
			q.dead = append(q.dead, node)
		}
	}
	sort.Strings(q.dead)
	return q
}

// lost reports whether etcd is known to have lost quorum: fewer voting members are up than a quorum.
func (q etcdQuorum) lost() bool {
	return q.known && q.counts.Voting > 0 && !quorum.Present(q.counts)
}

// quorumLostDecision refuses control-plane remediation while etcd has no quorum: no order of steps
// is quorum-safe then, and recovering etcd is a person's job. The limit stays the quorum-safe one.
func quorumLostDecision(cp limitDecision, q etcdQuorum) limitDecision {
	dead := "none"
	if len(q.dead) > 0 {
		dead = strings.Join(q.dead, ", ")
	}
	msg := fmt.Sprintf(
		"Remediation of control-plane Machines is not allowed: etcd has lost quorum, %d of %d voting members are up and a quorum is %d; dead members (by Node): %s; members that are up but have no leader are not marked",
		q.counts.Healthy, q.counts.Voting, quorum.Of(q.counts.Voting), dead)
	if q.counts.Voting == 1 {
		msg += "; " + quorum.SingleMemberRecovery
	}
	return limitDecision{limit: cp.limit, reason: caprv1.MachineHealthCheckEtcdQuorumLostReason, message: msg}
}

// excuseLeaderless drops the etcd observation of control-plane targets whose member's only problem
// is that it has no leader: while quorum is lost that is the cluster's state, not the member's fault,
// and marking its Machine would remove a surviving member.
func excuseLeaderless(targets []target) {
	for i := range targets {
		if e := targets[i].etcd; e != nil && !e.healthy && e.problem == etcdProblemNoLeader {
			targets[i].etcd = nil
		}
	}
}

// decideLimits applies triggerIf to all targets and, when there are control-plane targets, the
// control-plane limit (of cp, or cpErr why it could not be read) and the etcd quorum to them.
func (r *Reconciler) decideLimits(mhc *caprv1.MachineHealthCheck, rd *round, q etcdQuorum, cp *unstructured.Unstructured, cpErr error, now time.Time) (limits, error) {
	expected := rd.total
	trigger, err := triggerIfDecision(mhc.Spec.Remediation.TriggerIf, expected, expected-rd.healthy)
	if err != nil {
		return limits{}, err
	}
	lim := limits{}
	if c := mhc.Spec.Remediation.StormCooldownSeconds; c != nil {
		cond, decision, ends := stormCooldown(conditions.Get(mhc, caprv1.MachineHealthCheckStormCooldownCondition), time.Duration(*c)*time.Second, trigger, now)
		trigger, lim.storm, lim.cooldownEnds = decision, &cond, ends
	}
	cpLimit := limitDecision{allowed: true, limit: -1}
	if rd.cpTargets > 0 {
		cpLimit = etcdLimit(controlPlaneLimit(cp, cpErr, trigger.limit, rd.cpTargets, rd.cpNotHealthy, rd.cpStarting), q)
	}
	lim.trigger, lim.controlPlane = trigger, cpLimit
	return lim, nil
}
