package retention

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/remediation/fencing"
)

// DefaultTTL is how long a finished request is kept after its completionTime. It is the analogue
// of a Kubernetes Job's spec.ttlSecondsAfterFinished (the TTL-after-finished controller deletes a
// finished Job that long after its completion), which has no default; CAPR needs one because its
// requests are created for the user, not by them. A day: the request is the most detailed record of
// a remediation (its steps, times and messages) while the events about it expire after the API
// server's --event-ttl (one hour by default), so an operator paged at night still finds it the next
// working day; after that, the remediators' events in an event store and the metrics are the history.
const DefaultTTL = 24 * time.Hour

// DefaultMaxPerCluster is how many finished requests are kept per Cluster at most: enough for every
// remediation of a day in a pool that replaces a few Machines an hour, while bounding what every
// health-check round and remediator lists (the namespace's requests) when a large pool churns.
const DefaultMaxPerCluster = 100

// Settings bound the life of finished requests. Zero values disable the bound.
type Settings struct {
	// TTL is how long a finished request is kept after its completionTime; 0 keeps it without time
	// limit.
	TTL time.Duration
	// MaxPerCluster is how many finished requests of a Cluster are kept at most, the oldest deleted
	// first; 0 is no limit.
	MaxPerCluster int
}

// Validate returns an error naming the flag when a setting is out of range.
func (s Settings) Validate() error {
	if s.TTL < 0 {
		return fmt.Errorf("--machineremediation-ttl-after-finished must not be negative (0 keeps finished requests without time limit), got %s", s.TTL)
	}
	if s.MaxPerCluster < 0 {
		return fmt.Errorf("--machineremediation-max-finished-per-cluster must not be negative (0 is no limit), got %d", s.MaxPerCluster)
	}
	return nil
}

// Reasons a request is deleted (label reason of capr_remediation_requests_deleted_total).
const (
	ReasonExpired   = "Expired"
	ReasonOverLimit = "OverLimit"
)

// Record is what Decide needs of a finished request.
type Record struct {
	Name string
	// Finished is when the request finished.
	Finished time.Time
	// Keep says why the request must stay whatever its age and the limit ("" when it may go).
	Keep string
}

// Deletion is a request to delete and why (ReasonExpired, ReasonOverLimit).
type Deletion struct {
	Name   string
	Reason string
}

// Decision is what to delete now and when to look again.
type Decision struct {
	Delete []Deletion
	// RequeueAfter is when the next kept request expires; 0 when none will.
	RequeueAfter time.Duration
}

// Decide picks, among the finished requests of one Cluster, those to delete at now: every one past
// its TTL, then the oldest ones until at most MaxPerCluster are left. A record with Keep is never
// picked but counts towards the limit (the limit bounds what is listed, as far as safety allows).
// The requests it keeps that will expire bring the controller back at the first expiry; a kept
// request that becomes deletable (its Machine goes, its fence is undone) brings it back through its
// watch events, so nothing is polled.
func Decide(records []Record, now time.Time, s Settings) Decision {
	sorted := slices.Clone(records)
	slices.SortFunc(sorted, func(a, b Record) int {
		return cmp.Or(a.Finished.Compare(b.Finished), cmp.Compare(a.Name, b.Name))
	})
	var d Decision
	deleted := make([]bool, len(sorted))
	for i, r := range sorted {
		if r.Keep == "" && s.TTL > 0 && !now.Before(r.Finished.Add(s.TTL)) {
			d.Delete = append(d.Delete, Deletion{Name: r.Name, Reason: ReasonExpired})
			deleted[i] = true
		}
	}
	left := len(sorted) - len(d.Delete)
	for i, r := range sorted {
		if s.MaxPerCluster <= 0 || left <= s.MaxPerCluster {
			break
		}
		if r.Keep == "" && !deleted[i] {
			d.Delete = append(d.Delete, Deletion{Name: r.Name, Reason: ReasonOverLimit})
			deleted[i] = true
			left--
		}
	}
	if s.TTL > 0 {
		for i, r := range sorted {
			if r.Keep != "" || deleted[i] {
				continue
			}
			if after := r.Finished.Add(s.TTL).Sub(now); d.RequeueAfter == 0 || after < d.RequeueAfter {
				d.RequeueAfter = after
			}
		}
	}
	return d
}

// Finished reports whether a request has finished (Succeeded or Failed).
func Finished(mr *caprv1.MachineRemediation) bool {
	return mr.Status.Phase == caprv1.MachineRemediationPhaseSucceeded || mr.Status.Phase == caprv1.MachineRemediationPhaseFailed
}

// RecordOf is the Record of a finished request whose Machine is m (nil when it is gone).
// completionTime is when it finished; a finished request without one (a status not written by CAPR)
// counts from its creation.
func RecordOf(mr *caprv1.MachineRemediation, m *clusterv1.Machine) Record {
	r := Record{Name: mr.Name, Finished: mr.CreationTimestamp.Time}
	if mr.Status.CompletionTime != nil {
		r.Finished = mr.Status.CompletionTime.Time
	}
	r.Keep = keep(mr, m)
	return r
}

// keep says why a finished request must not be deleted, or "".
func keep(mr *caprv1.MachineRemediation, m *clusterv1.Machine) string {
	switch {
	case fencing.Owed(mr):
		// Its fence is still to be undone (remediation/fencing Owed): the remediator does that
		// while the request exists; deleted, the fence would stay.
		return "its fence is still to be undone"
	case mr.Status.Phase == caprv1.MachineRemediationPhaseFailed && hasRetry(mr):
		return "a retry was requested (annotation " + caprv1.RetryAnnotation + ")"
	case m != nil && !m.DeletionTimestamp.IsZero():
		// The health checker may still see the Machine: while the request exists it asks for no
		// other remediation of it (machinehealthcheck ensureRequest).
		return "its Machine is being deleted"
	case m != nil && mr.Status.Phase == caprv1.MachineRemediationPhaseFailed:
		// A Failed request is what stops the health checker from asking again for a Machine that
		// is still unhealthy: ensureRequest (controllers/machinehealthcheck) creates a request only
		// when none exists, and replaces only a Succeeded one whose Machine was kept. Deleted, a
		// new request would start the remediation that failed (or a retry a person must ask for,
		// RetryAnnotation) again on the next health-check round.
		return "it failed and its Machine still exists"
	}
	return ""
}

func hasRetry(mr *caprv1.MachineRemediation) bool {
	_, ok := mr.Annotations[caprv1.RetryAnnotation]
	return ok
}
