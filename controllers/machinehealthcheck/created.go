package machinehealthcheck

import (
	"maps"
	"sync"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"
)

// This file holds the remediation requests this process created that its cache may not show yet.
// A round lists the requests from the cache; the next round often starts (the mark it just wrote is
// a Machine event) before the cache has received the request it created, and under load the cache
// may lag for seconds (its watch restarts). Without this, each of those rounds would create the
// request again, refused AlreadyExists: a wasted write per round and per request (bench results of
// 2026-11-27: 1,138 creates for 1,000 marks). The created object stands in for the cache's copy
// until the cache shows that object (the same UID), or until createdRequestTimeout, after which the
// cache is believed again: a request deleted before the cache ever showed it is created again then.

// createdRequestTimeout bounds how long a created request stands in for the cache's copy. The cache
// normally shows it within milliseconds; a request someone deleted before the cache saw it is missed
// for at most this long.
const createdRequestTimeout = 30 * time.Second

// standInRecheck is how soon a round in which a created request stood in for the cache's copy runs
// again. Scheduling the next look for the timeout instead would start a round 30 s after every
// request created, when the cache has long shown it.
const standInRecheck = time.Second

// requestScope is one kind of remediation request in one namespace: what listRequests lists.
type requestScope struct {
	kind, namespace string
}

// createdRequests is the requests created and not yet seen in the cache; its zero value is ready
// to use.
type createdRequests struct {
	mu sync.Mutex
	m  map[requestScope]map[string]createdRequest
}

type createdRequest struct {
	obj   client.Object
	until time.Time
}

// created records a request just created (obj as the API server returned it, with its UID).
func (c *createdRequests) created(scope requestScope, obj client.Object, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[requestScope]map[string]createdRequest{}
	}
	if c.m[scope] == nil {
		c.m[scope] = map[string]createdRequest{}
	}
	c.m[scope][obj.GetName()] = createdRequest{obj: obj.DeepCopyObject().(client.Object), until: now.Add(createdRequestTimeout)}
}

// deleted forgets a request this process deleted (withdrew or replaced), so that it no longer
// stands in for one.
func (c *createdRequests) deleted(scope requestScope, name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m[scope], name)
}

// standIn adds to cached (the cache's requests of the scope, by name) every request created in the
// scope that the cache does not show yet: missing, or another object of that name (an older one
// this process deleted and replaced). A request the cache shows, and one past its timeout, is
// forgotten. It reports whether any request stands in: the round is to look again after
// standInRecheck, until the cache shows it or it times out (a request deleted before the cache ever
// showed it makes no watch event that would start a round).
func (c *createdRequests) standIn(scope requestScope, cached map[string]client.Object, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	used := false
	maps.DeleteFunc(c.m[scope], func(name string, cr createdRequest) bool {
		if obj, ok := cached[name]; ok && obj.GetUID() == cr.obj.GetUID() {
			return true
		}
		if !now.Before(cr.until) {
			return true
		}
		cached[name] = cr.obj.DeepCopyObject().(client.Object)
		used = true
		return false
	})
	if len(c.m[scope]) == 0 {
		delete(c.m, scope)
	}
	return used
}
