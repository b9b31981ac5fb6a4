package machinehealthcheck

import (
	"sync"

	"k8s.io/apimachinery/pkg/types"
)

// This file holds the condition reasons this process last set, so that a transition of a health
// check's condition is reported by one event (setStatusCondition). Losing them on a restart only
// falls back to the reasons on the object read at reconcile start.

// reportedReasons is the reason this process last set on each condition of each health check.
type reportedReasons struct {
	mu   sync.Mutex
	last map[types.UID]map[string]string
}

// swap records reason as the last one set on condition conditionType of health check uid and
// returns the previous one: the one recorded before, or fallback when none was (after a restart:
// the object's).
func (r *reportedReasons) swap(uid types.UID, conditionType, fallback, reason string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.last == nil {
		r.last = map[types.UID]map[string]string{}
	}
	byType, ok := r.last[uid]
	if !ok {
		byType = map[string]string{}
		r.last[uid] = byType
	}
	previous, ok := byType[conditionType]
	if !ok {
		previous = fallback
	}
	byType[conditionType] = reason
	return previous
}

// forget drops what was recorded for a deleted health check.
func (r *reportedReasons) forget(uid types.UID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.last, uid)
}
