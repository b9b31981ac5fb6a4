package worker

import (
	"fmt"
	"math"
	"sort"
	"time"
)

// Unlimited is the maxInFlight of a MachineSet without a MachineDeployment, or of a
// MachineDeployment without spec.remediation.maxInFlight (CAPI's default: all at once).
const Unlimited = math.MaxInt

// Candidate is a Pending worker remediation of one MachineDeployment (or MachineSet) that may start.
type Candidate struct {
	Name string
	// Requested is an explicit request: the Machine has cluster.x-k8s.io/remediate-machine (not
	// spec.source Manual, which anyone who may write a request can set).
	Requested bool
	// Created is when the request was created.
	Created time.Time
}

// Admission is the decision for one request.
type Admission struct {
	// Start is true when the request may start now.
	Start bool
	// Message says why not (or, when it starts, how many are in flight).
	Message string
}

// Order sorts candidates in the order they start: explicit requests first, then the oldest request,
// then by name. CAPI's MachineSet also puts cluster.x-k8s.io/remediate-machine first; among the
// others it prefers the newest Machine (likely not hosting workloads yet), while CAPR serves requests
// first come, first served, so a request that waits for a free slot is never overtaken by later ones.
func Order(cands []Candidate) []Candidate {
	out := append([]Candidate(nil), cands...)
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Requested != b.Requested {
			return a.Requested
		}
		if !a.Created.Equal(b.Created) {
			return a.Created.Before(b.Created)
		}
		return a.Name < b.Name
	})
	return out
}

// Admit decides whether the request self may start. maxInFlight is the limit (Unlimited for none),
// inFlight the number of remediations of the same group already Running, waiting every Pending
// candidate of the group (self included). The free slots go to the first candidates in Order.
func Admit(maxInFlight, inFlight int, waiting []Candidate, self string) Admission {
	free := maxInFlight - inFlight
	if maxInFlight == Unlimited {
		free = Unlimited
	}
	limit := "unlimited"
	if maxInFlight != Unlimited {
		limit = fmt.Sprintf("%d", maxInFlight)
	}
	if free <= 0 {
		return Admission{Message: fmt.Sprintf("waiting: %d remediation(s) already in flight, maxInFlight is %s", inFlight, limit)}
	}
	ordered := Order(waiting)
	for i, c := range ordered {
		if c.Name != self {
			continue
		}
		if i < free {
			return Admission{Start: true, Message: fmt.Sprintf("%d remediation(s) in flight before this one, maxInFlight is %s", inFlight, limit)}
		}
		ahead := ordered[:i]
		names := make([]string, 0, len(ahead))
		for _, a := range ahead {
			names = append(names, a.Name)
		}
		return Admission{Message: fmt.Sprintf("waiting: %d remediation(s) in flight, maxInFlight is %s, and %d go first: %v",
			inFlight, limit, len(ahead), names)}
	}
	return Admission{Message: "waiting: this request is not a candidate (being deleted or paused)"}
}
