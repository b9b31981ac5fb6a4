package machinehealthcheck

import (
	"fmt"
	"regexp"
	"strconv"

	"k8s.io/apimachinery/pkg/util/intstr"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/etcdutil/quorum"
)

// This file holds the "max unhealthy" decisions: triggerIf (as CAPI) and the quorum-safe limit for
// control-plane targets (design §5). They are the one place where these limits are enforced.

// limitDecision is whether remediation is allowed for a group of targets.
type limitDecision struct {
	allowed bool
	// remaining is how many more targets may become unhealthy (0 when not allowed).
	remaining int
	// limit is the largest number of unhealthy targets allowed (-1: no limit from this rule).
	limit int
	// message explains a refusal.
	message string
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
			return limitDecision{limit: hi, message: fmt.Sprintf(
				"Remediation is not allowed, the number of not started or unhealthy machines does not fall within the range (total: %d, unhealthy: %d, unhealthyInRange: %s)",
				expected, unhealthy, t.UnhealthyInRange)}, nil
		}
		return limitDecision{allowed: true, remaining: hi - unhealthy, limit: hi}, nil
	}

	maxUnhealthy := intstr.FromString("100%")
	if t != nil && t.UnhealthyLessThanOrEqualTo != nil {
		maxUnhealthy = *t.UnhealthyLessThanOrEqualTo
	}
	limit, err := intstr.GetScaledValueFromIntOrPercent(&maxUnhealthy, expected, false)
	if err != nil {
		return limitDecision{}, fmt.Errorf("invalid unhealthyLessThanOrEqualTo %q: %w", maxUnhealthy.String(), err)
	}
	if unhealthy > limit {
		return limitDecision{limit: limit, message: fmt.Sprintf(
			"Remediation is not allowed, the number of not started or unhealthy machines exceeds unhealthyLessThanOrEqualTo (total: %d, unhealthy: %d, unhealthyLessThanOrEqualTo: %s)",
			expected, unhealthy, maxUnhealthy.String())}, nil
	}
	return limitDecision{allowed: true, remaining: limit - unhealthy, limit: limit}, nil
}

// controlPlaneDecision applies the quorum-safe limit min(userLimit, floor((N-1)/2)) to the
// control-plane targets, of which unhealthy are not healthy. userLimit < 0 means none.
func controlPlaneDecision(userLimit, desiredReplicas, unhealthy int) limitDecision {
	limit := quorum.EffectiveControlPlaneLimit(userLimit, desiredReplicas)
	if unhealthy > limit {
		return limitDecision{limit: limit, message: fmt.Sprintf(
			"Remediation of control-plane Machines is not allowed, %d of %d desired control-plane Machines are not started or unhealthy and the quorum-safe limit is %d",
			unhealthy, desiredReplicas, limit)}
	}
	return limitDecision{allowed: true, remaining: limit - unhealthy, limit: limit}
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
