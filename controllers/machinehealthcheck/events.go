package machinehealthcheck

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/metrics"
)

// markEvent logs a mark set or cleared, or a request created, and records one event on the Machine
// (past machineEventsPerRound of its kind in the round, one event on the health check for all the
// others: roundEvents).
func (r *Reconciler) markEvent(ctx context.Context, evs *roundEvents, m *clusterv1.Machine, change markChange, requested bool, ev evaluation) {
	checker := evs.checker
	switch {
	case change == markSet:
		ns, name, _ := strings.Cut(checker, "/")
		metrics.Marked(ns, name, ev.reason)
		ctrl.LoggerFrom(ctx).Info("Machine marked unhealthy", "Machine", klog.KObj(m), "reason", ev.reason, "message", ev.message, "remediationRequested", requested)
		// One event per mark: a request created in the same round is reported in it, not in an event
		// of its own, so that a wave of marks costs the API server one event write per Machine.
		outcome := ""
		if requested {
			outcome = "; remediation requested"
		}
		evs.add(r.recorder, m, caprv1.EventMachineMarkedUnhealthy, requested,
			"Machine %s has been marked as unhealthy by %s: %s%s", m.Name, checker, ev.message, outcome)
	case requested:
		evs.add(r.recorder, m, caprv1.EventRemediationRequested, true,
			"Remediation of Machine %s requested by %s: %s", m.Name, checker, ev.reason)
	case change == markCleared:
		others := ""
		if markedByOthers(m, checker) {
			others = "; another health check still marks it (see its condition " + caprv1.MachineCAPRHealthCheckSucceededCondition + ")"
		}
		ctrl.LoggerFrom(ctx).Info("Machine healthy again, mark cleared", "Machine", klog.KObj(m), "markedByOthers", others != "")
		evs.add(r.recorder, m, caprv1.EventMachineMarkCleared, false,
			"Machine %s is healthy again; mark by %s cleared%s", m.Name, checker, others)
	}
}

// machineEventsPerRound is how many events of one reason (marked, remediation requested, cleared) a
// round records on Machines, and machineEventsPerSecond how many the health checks of one namespace
// record together (machineEventBudget). The others of a round are reported in one event of that reason
// on the health check, which counts and names them: the way client-go's EventCorrelator aggregates
// similar events of one object, across the Machines of one health check. A storm of N marks then
// costs the API server about machineEventsPerSecond event writes per second and one per health check
// and round instead of N; each Machine's condition still says why it is marked, and the log has a
// line per Machine.
const (
	machineEventsPerRound  = 10
	machineEventsPerSecond = 10
)

// aggregatedNames is how many Machines an aggregated event names.
const aggregatedNames = 20

// roundEvents collects a round's events beyond machineEventsPerRound or the namespace's budget, by
// reason.
type roundEvents struct {
	mhc     *caprv1.MachineHealthCheck
	checker string
	budget  *machineEventBudget
	now     time.Time // when the round records its events
	sent    map[string]int
	// more are the Machines of each reason past the limit, in the round's order, and requested how
	// many of them had their remediation requested.
	more      map[string][]string
	requested map[string]int
	reasons   []string
}

func newRoundEvents(mhc *caprv1.MachineHealthCheck, checker string, budget *machineEventBudget) *roundEvents {
	return &roundEvents{mhc: mhc, checker: checker, budget: budget, now: time.Now(), sent: map[string]int{}, more: map[string][]string{}, requested: map[string]int{}}
}

// add records an event of reason on Machine m, or keeps it for the aggregated event once the round
// recorded machineEventsPerRound of that reason or the namespace's budget for it is spent.
func (e *roundEvents) add(rec events.EventRecorder, m *clusterv1.Machine, reason string, requested bool, format string, args ...any) {
	if e.sent[reason] < machineEventsPerRound && e.budget.allow(m.Namespace, reason, e.now) {
		e.sent[reason]++
		rec.Eventf(m, nil, corev1.EventTypeNormal, reason, "HealthCheck", format, args...)
		return
	}
	if _, ok := e.more[reason]; !ok {
		e.reasons = append(e.reasons, reason)
	}
	e.more[reason] = append(e.more[reason], m.Name)
	if requested {
		e.requested[reason]++
	}
}

// flush records one event on the health check per reason that went past the limit.
func (e *roundEvents) flush(rec events.EventRecorder) {
	for _, reason := range e.reasons {
		names := e.more[reason]
		listed := strings.Join(names[:min(len(names), aggregatedNames)], ", ")
		if len(names) > aggregatedNames {
			listed += fmt.Sprintf(" and %d more", len(names)-aggregatedNames)
		}
		var what string
		switch reason {
		case caprv1.EventMachineMarkedUnhealthy:
			what = fmt.Sprintf("marked as unhealthy (remediation requested for %d of them)", e.requested[reason])
		case caprv1.EventRemediationRequested:
			what = "requested for remediation"
		default:
			what = "healthy again, their marks cleared"
		}
		rec.Eventf(e.mhc, nil, corev1.EventTypeNormal, reason, "HealthCheck",
			"%d more Machines %s by %s in this round, without an event of their own: %s", len(names), what, e.checker, listed)
	}
}

// machineEventBudget is how many events of each reason the health checks of a namespace may still
// record on Machines: machineEventsPerSecond per second, as many at once. Many health checks marking
// a few Machines each in the same second (a zone lost, spread over many pools) would otherwise each
// record an event per Machine. Its zero value is ready to use; a nil budget allows every event.
type machineEventBudget struct {
	mu      sync.Mutex
	buckets map[eventBucket]*rate.Limiter
}

type eventBucket struct {
	namespace, reason string
}

// allow takes one event of reason in namespace from the budget, if there is one left.
func (b *machineEventBudget) allow(namespace, reason string, now time.Time) bool {
	if b == nil {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.buckets == nil {
		b.buckets = map[eventBucket]*rate.Limiter{}
	}
	key := eventBucket{namespace: namespace, reason: reason}
	l := b.buckets[key]
	if l == nil {
		l = rate.NewLimiter(rate.Limit(machineEventsPerSecond), machineEventsPerSecond)
		b.buckets[key] = l
	}
	return l.AllowN(now, 1)
}

// recordMarkEvents records the events of a round's writes: for each Machine in work (indexes into
// rd.targets) its mark change and whether its request was created, and the marks of the previous
// round whose events were left to this one (unreported, deferred.go). A mark set in this round is
// kept for the next round, which reports it with its request.
func (r *Reconciler) recordMarkEvents(ctx context.Context, mhc *caprv1.MachineHealthCheck, checker string, rd *round,
	work []int, changes []markChange, requested []bool, unreported map[string]newMark) {
	key := client.ObjectKeyFromObject(mhc)
	evs := newRoundEvents(mhc, checker, &r.state.machineEvents)
	for k, i := range work {
		m := rd.targets[i].machine
		if changes[k] == markSet {
			r.state.newMarks.add(key, m, rd.evals[i]) // reported by the next round, with its request
			continue
		}
		if prev, ok := unreported[m.Name]; ok {
			delete(unreported, m.Name)
			if requested[k] && changes[k] == markUnchanged {
				r.markEvent(ctx, evs, m, markSet, true, prev.ev)
				continue
			}
			r.markEvent(ctx, evs, prev.machine, markSet, false, prev.ev)
		}
		r.markEvent(ctx, evs, m, changes[k], requested[k], rd.evals[i])
	}
	for _, name := range slices.Sorted(maps.Keys(unreported)) { // not requested in this round
		r.markEvent(ctx, evs, unreported[name].machine, markSet, false, unreported[name].ev)
	}
	evs.flush(r.recorder)
}
