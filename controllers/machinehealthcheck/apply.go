package machinehealthcheck

import (
	"context"
	"errors"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kerrors "k8s.io/apimachinery/pkg/util/errors"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/annotations"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// maxParallelWrites bounds how many Machines the health checker writes at once, over all its
// rounds (health checks reconciled in parallel share the bound, so that many health checks do not
// multiply the load on the API server). The decisions (verdicts and limits) are made for the whole
// round before anything is written, so writing in parallel changes only how soon the writes land,
// never which ones are made.
const maxParallelWrites = 16

// writeSlots is the process-wide bound on writes in flight; its zero value is ready to use.
type writeSlots struct {
	once  sync.Once
	slots chan struct{}
}

func (w *writeSlots) get() chan struct{} {
	w.once.Do(func() { w.slots = make(chan struct{}, maxParallelWrites) })
	return w.slots
}

// applyResult is what applyMarksAndRequests reports besides errors.
type applyResult struct {
	// restricted is how many unhealthy targets the limits refused a request.
	restricted int
	// requestChanged says a withdrawal met a request newer than the cache's (errRequestChanged:
	// the round is to run again soon).
	requestChanged bool
	// standIn says a created request the cache did not show yet stood in for it (listRequests):
	// the round is to run again after standInRecheck.
	standIn bool
	// requestsDeferred says the round marked Machines whose requests the next round decides
	// (deferred.go): it is to run again at once.
	requestsDeferred bool
}

// applyMarksAndRequests writes each target's mark, requests remediation of the unhealthy targets
// the limits allow and withdraws the Pending requests of targets that are healthy again and of
// Machines no longer checked (skip-remediation, paused). It writes every mark first, then the
// requests, each pass at most maxParallelWrites at once: a Machine's request is only written
// after its own mark, and the marks, which are the health check's answer, are not queued behind
// the requests and the remediator's reaction to them. The request of a Machine marked in this round
// is left to the next round (deferred.go), which records the mark's event.
func (r *Reconciler) applyMarksAndRequests(ctx context.Context, cluster *clusterv1.Cluster, mhc *caprv1.MachineHealthCheck, cfg checkConfig,
	rd *round, lim limits, excluded []*clusterv1.Machine) (applyResult, error) {
	requests, standIn, err := r.listRequests(ctx, mhc)
	var unlistableErr *requestsUnlistableError
	// Requests that cannot be listed hold back the requests, never the marks: the health check says
	// why in RemediationTemplatesValid (checkRequestsListable).
	requestsKnown := !errors.As(err, &unlistableErr)
	if err != nil && requestsKnown {
		return applyResult{}, err
	}
	var (
		mu             sync.Mutex
		errs           []error
		restricted     int
		requestChanged bool
	)
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if errors.Is(err, errRequestChanged) {
			requestChanged = true
			return
		}
		errs = append(errs, err)
	}
	key := client.ObjectKeyFromObject(mhc)
	unreported := r.state.newMarks.take(key) // the marks the previous round wrote, their events due
	var work []int
	for i, t := range rd.targets {
		if needsWrite(t.machine, rd.evals[i], cfg.checker, requests) {
			work = append(work, i)
		}
	}
	requestsDeferred := false
	marked, changes, requested := make([]bool, len(work)), make([]markChange, len(work)), make([]bool, len(work))
	forEachParallel(len(work), r.writes.get(), func(k int) {
		t, ev := rd.targets[work[k]], rd.evals[work[k]]
		base := t.machine
		if prev, ok := unreported[base.Name]; ok && !isMarked(base, cfg.checker) {
			// The round the previous one queued at once may read the Machine before the cache shows
			// the mark written there: start from the copy written, not write the mark again.
			base = prev.machine
		}
		written, change, err := r.writeMark(ctx, base, ev, cfg.checker)
		if err != nil {
			fail(err)
			return
		}
		rd.targets[work[k]].machine = written // each call writes its own element
		marked[k], changes[k] = true, change
	})
	// The events are recorded once every mark and request is written: the recorder sends them in
	// the background, and they would otherwise compete with the remaining writes for the API server.
	defer r.recordMarkEvents(ctx, mhc, cfg.checker, rd, work, changes, requested, unreported)
	forEachParallel(len(work), r.writes.get(), func(k int) {
		if !marked[k] || !requestsKnown {
			return
		}
		t, ev := rd.targets[work[k]], rd.evals[work[k]]
		switch ev.verdict {
		case verdictUnhealthy:
			if changes[k] == markSet {
				mu.Lock()
				requestsDeferred = true
				mu.Unlock()
				return
			}
			if !t.machine.DeletionTimestamp.IsZero() || annotations.IsPaused(cluster, t.machine) {
				return
			}
			if !lim.allow(t.machine) {
				if _, ok := requests[t.machine.Name]; !ok {
					mu.Lock()
					restricted++
					mu.Unlock()
				}
				return
			}
			created, err := r.ensureRequest(ctx, mhc, t.machine, ev, requests)
			if err != nil {
				fail(err)
				return
			}
			requested[k] = created
		case verdictHealthy:
			if markedByOthers(t.machine, cfg.checker) {
				// Another health check still finds the Machine unhealthy and needs the request: it
				// withdraws it once it finds the Machine healthy too.
				return
			}
			if err := r.withdrawRequest(ctx, mhc, t.machine, requests, "the Machine is healthy again"); err != nil {
				fail(err)
			}
		}
	})
	if !requestsKnown {
		excluded = nil
	}
	forEachParallel(len(excluded), r.writes.get(), func(i int) {
		if err := r.withdrawRequest(ctx, mhc, excluded[i], requests, "remediation of the Machine is skipped or paused"); err != nil {
			fail(err)
		}
	})
	return applyResult{restricted: restricted, requestChanged: requestChanged, standIn: standIn, requestsDeferred: requestsDeferred}, kerrors.NewAggregate(errs)
}

// needsWrite reports whether applying the evaluation may write anything for the Machine: a
// pending target is left as it is, and a healthy one that carries no mark of this health check,
// already reports healthy or is marked by another health check only, and has no request to
// withdraw needs nothing. It is the cheap filter in front of applyMark, which decides exactly.
func needsWrite(m *clusterv1.Machine, ev evaluation, checker string, requests map[string]client.Object) bool {
	switch ev.verdict {
	case verdictUnhealthy:
		return true
	case verdictHealthy:
		if _, ok := requests[m.Name]; ok {
			return true
		}
		if isMarked(m, checker) {
			return true
		}
		if conditions.IsFalse(m, caprv1.MachineCAPRHealthCheckSucceededCondition) {
			return false // another health check's mark, which this one leaves alone
		}
		return !hasSameCondition(m, metav1.Condition{Type: caprv1.MachineCAPRHealthCheckSucceededCondition,
			Status: metav1.ConditionTrue, Reason: caprv1.MachineCAPRHealthCheckSucceededReason})
	default:
		return false
	}
}

// forEachParallel calls fn(0..n-1), each holding a slot of sem (so at most cap(sem) at once, with
// whoever else shares sem), and returns when every call returned. fn must not take another slot.
func forEachParallel(n int, sem chan struct{}, fn func(i int)) {
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() {
				<-sem
				wg.Done()
			}()
			fn(i)
		}()
	}
	wg.Wait()
}

// writeMark writes the mark of one target when it changed and says what changed; markEvent
// reports it. The write is conditional on the version of the Machine the round read (updateMark).
// The Machine read from the cache is never modified (it is read without a copy, see getTargets):
// the written copy, or the one read again, is returned instead.
func (r *Reconciler) writeMark(ctx context.Context, m *clusterv1.Machine, ev evaluation, checker string) (*clusterv1.Machine, markChange, error) {
	change := markUnchanged
	written, err := r.updateMark(ctx, m, func(after *clusterv1.Machine) (bool, error) {
		var err error
		change, err = applyMark(after, ev, checker)
		return change != markUnchanged, err
	})
	if err != nil {
		if apierrors.IsNotFound(err) {
			return m, markUnchanged, nil // deleted meanwhile: nothing to mark
		}
		return m, markUnchanged, err
	}
	return written, change, nil
}
