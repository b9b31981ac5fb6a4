package machinehealthcheck

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// TestCreatedRequestsStandInUntilTheCacheShowsThem: a request this process created stands in for
// the cache's copy while the cache shows none or another object of that name, and no longer once
// the cache shows it, once it timed out, or once this process deleted it.
func TestCreatedRequestsStandInUntilTheCacheShowsThem(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 8, 0, 0, 0, time.UTC)
	scope := requestScope{kind: "MachineRemediation.remediation.cluster.x-k8s.io", namespace: "ns"}
	request := func(uid types.UID) client.Object {
		return &caprv1.MachineRemediation{ObjectMeta: metav1.ObjectMeta{Name: "m1", Namespace: "ns", UID: uid}}
	}
	tests := []struct {
		name string
		// then runs after the request "m1" (UID new) was created at t0.
		then      func(c *createdRequests)
		cached    client.Object // the cache's copy of m1, nil for none
		at        time.Duration // after t0
		wantUID   types.UID     // of m1 in the merged map, "" for none
		wantUsed  bool          // whether the created request stood in
		wantAfter types.UID     // of m1 in a second merge with an empty cache at the same instant
	}{
		{name: "cache shows nothing yet", at: time.Second, wantUID: "new", wantUsed: true, wantAfter: "new"},
		{name: "cache shows it", cached: request("new"), at: time.Second, wantUID: "new", wantAfter: ""},
		{name: "cache shows the older object it replaced", cached: request("old"), at: time.Second, wantUID: "new",
			wantUsed: true, wantAfter: "new"},
		{name: "just before the timeout", at: createdRequestTimeout - time.Millisecond, wantUID: "new", wantUsed: true, wantAfter: "new"},
		{name: "timed out", at: createdRequestTimeout, wantUID: "", wantAfter: ""},
		{name: "timed out, cache shows the older object", cached: request("old"), at: createdRequestTimeout, wantUID: "old", wantAfter: ""},
		{name: "deleted by this process", then: func(c *createdRequests) { c.deleted(scope, "m1") }, at: time.Second, wantUID: "", wantAfter: ""},
		{name: "another scope's request", then: func(c *createdRequests) {
			c.created(requestScope{kind: scope.kind, namespace: "other"}, request("x"), t0)
		}, cached: request("new"), at: time.Second, wantUID: "new", wantAfter: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			c := &createdRequests{}
			c.created(scope, request("new"), t0)
			if tt.then != nil {
				tt.then(c)
			}
			cached := map[string]client.Object{}
			if tt.cached != nil {
				cached["m1"] = tt.cached
			}
			used := c.standIn(scope, cached, t0.Add(tt.at))
			g.Expect(uidIn(cached, "m1")).To(Equal(tt.wantUID))
			g.Expect(used).To(Equal(tt.wantUsed))

			again := map[string]client.Object{}
			c.standIn(scope, again, t0.Add(tt.at))
			g.Expect(uidIn(again, "m1")).To(Equal(tt.wantAfter))
		})
	}
}

// TestCreatedRequestsKeepScopesApart: a request stands in only for its own kind and namespace.
func TestCreatedRequestsKeepScopesApart(t *testing.T) {
	g := NewWithT(t)
	now := time.Now()
	c := &createdRequests{}
	a := requestScope{kind: "MachineRemediation.remediation.cluster.x-k8s.io", namespace: "a"}
	c.created(a, &caprv1.MachineRemediation{ObjectMeta: metav1.ObjectMeta{Name: "m1", Namespace: "a", UID: "u1"}}, now)
	for _, other := range []requestScope{{kind: a.kind, namespace: "b"}, {kind: "Reboot.example.io", namespace: "a"}} {
		cached := map[string]client.Object{}
		g.Expect(c.standIn(other, cached, now)).To(BeFalse())
		g.Expect(cached).To(BeEmpty())
	}
	cached := map[string]client.Object{}
	c.standIn(a, cached, now)
	g.Expect(uidIn(cached, "m1")).To(Equal(types.UID("u1")))
}

func uidIn(objs map[string]client.Object, name string) types.UID {
	if obj, ok := objs[name]; ok {
		return obj.GetUID()
	}
	return ""
}
