package remediation

import (
	"sync"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// SeenVersions remembers, per MachineRemediation, the resourceVersion of the newest copy a
// remediator wrote or read live, so that a cached copy can be trusted without a live read when it
// is known to be no older than that: a step must never be decided from a copy older than the
// remediator's last write (its status is the record of what was done), and a live read per
// reconcile costs the API server a read of etcd for every request event (two per new request: its
// create event and the remediator's own first write). Its zero value is ready to use; it is safe
// for concurrent use.
type SeenVersions struct {
	mu   sync.Mutex
	seen map[types.NamespacedName]string
}

// Current reports whether the cached copy of a request may be decided from without a live read:
//   - its resourceVersion is the one last seen (written or read live) here: the cache holds that
//     write or a copy at least as new (resourceVersions are compared for equality only, as the API
//     asks);
//   - nothing was seen here and its status is empty: nothing was ever recorded in it, so a decision
//     made from an outdated copy can only be recorded by Persist, whose resourceVersion precondition
//     refuses it, before any action.
//
// Otherwise (someone else wrote it since, or this process never saw a request that has a record:
// a restart, a leader change) the request is to be read live.
func (s *SeenVersions) Current(cached *caprv1.MachineRemediation) bool {
	s.mu.Lock()
	rv, ok := s.seen[types.NamespacedName{Namespace: cached.Namespace, Name: cached.Name}]
	s.mu.Unlock()
	if ok {
		return rv == cached.ResourceVersion
	}
	return equality.Semantic.DeepEqual(cached.Status, caprv1.MachineRemediationStatus{})
}

// Saw records the request's resourceVersion as the newest seen here: after a live read or a write.
func (s *SeenVersions) Saw(mr *caprv1.MachineRemediation) {
	if mr.ResourceVersion == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seen == nil {
		s.seen = map[types.NamespacedName]string{}
	}
	s.seen[types.NamespacedName{Namespace: mr.Namespace, Name: mr.Name}] = mr.ResourceVersion
}

// Forget drops what was seen of a request that is gone.
func (s *SeenVersions) Forget(key types.NamespacedName) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.seen, key)
}
