package machinehealthcheck

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// A round that marks, requests and clears many Machines records machineEventsPerRound events of each
// reason on Machines and one event on the health check for the rest, which counts and names them.
func TestARoundsEventsAreAggregatedPastTheLimit(t *testing.T) {
	g := NewWithT(t)
	recorder := events.NewFakeRecorder(200)
	r := &Reconciler{recorder: recorder}
	mhc := &caprv1.MachineHealthCheck{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "hc"}}
	roundEvents := newRoundEvents(mhc, "ns/hc", nil)
	machine := func(i int) *clusterv1.Machine {
		return &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("m-%02d", i)}}
	}
	unhealthy := evaluation{verdict: verdictUnhealthy, reason: "UnhealthyNode", message: "Node not ready"}
	for i := range 35 { // marked, every other one with its request
		r.markEvent(context.Background(), roundEvents, machine(i), markSet, i%2 == 0, unhealthy)
	}
	for i := 40; i < 43; i++ { // requested in a later round than their mark: under the limit
		r.markEvent(context.Background(), roundEvents, machine(i), markUnchanged, true, unhealthy)
	}
	for i := 50; i < 62; i++ {
		r.markEvent(context.Background(), roundEvents, machine(i), markCleared, false, evaluation{verdict: verdictHealthy})
	}
	r.markEvent(context.Background(), roundEvents, machine(70), markUnchanged, false, unhealthy) // nothing to say
	roundEvents.flush(recorder)
	close(recorder.Events)

	count := map[string]int{}
	var aggregated []string
	for e := range recorder.Events {
		fields := strings.SplitN(e, " ", 3)
		count[fields[1]]++
		if strings.Contains(e, "without an event of their own") {
			aggregated = append(aggregated, e)
		}
	}
	g.Expect(count).To(Equal(map[string]int{
		caprv1.EventMachineMarkedUnhealthy: machineEventsPerRound + 1,
		caprv1.EventRemediationRequested:   3,
		caprv1.EventMachineMarkCleared:     machineEventsPerRound + 1,
	}))
	g.Expect(aggregated).To(HaveLen(2))
	// m-10 … m-34: 25 more, the 13 even ones with a request.
	g.Expect(aggregated[0]).To(HavePrefix("Normal " + caprv1.EventMachineMarkedUnhealthy + " 25 more Machines marked as unhealthy (remediation requested for 13 of them) by ns/hc"))
	g.Expect(aggregated[0]).To(HaveSuffix(": m-10, m-11, m-12, m-13, m-14, m-15, m-16, m-17, m-18, m-19, m-20, m-21, m-22, m-23, m-24, m-25, m-26, m-27, m-28, m-29 and 5 more"))
	g.Expect(aggregated[1]).To(Equal("Normal " + caprv1.EventMachineMarkCleared + " 2 more Machines healthy again, their marks cleared by ns/hc in this round, without an event of their own: m-60, m-61"))
}

// TestMachineEventsOfANamespaceShareABudget: the health checks of one namespace record together at
// most machineEventsPerSecond events of a reason on Machines per second; the others are recorded in
// each round's aggregated event on its health check. Other namespaces have their own budget.
func TestMachineEventsOfANamespaceShareABudget(t *testing.T) {
	budget := &machineEventBudget{}
	t0 := time.Date(2026, 11, 27, 9, 0, 0, 0, time.UTC)
	unhealthy := evaluation{verdict: verdictUnhealthy, reason: "UnhealthyNode", message: "Node not ready"}
	type recorded struct{ onMachines, aggregated int }
	round := func(ns, hc string, marks int, at time.Time) recorded {
		recorder := events.NewFakeRecorder(100)
		r := &Reconciler{recorder: recorder}
		mhc := &caprv1.MachineHealthCheck{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: hc}}
		e := newRoundEvents(mhc, ns+"/"+hc, budget)
		e.now = at
		for i := range marks {
			m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("%s-m-%d", hc, i)}}
			r.markEvent(context.Background(), e, m, markSet, true, unhealthy)
		}
		e.flush(recorder)
		close(recorder.Events)
		var out recorded
		for ev := range recorder.Events {
			if strings.Contains(ev, "without an event of their own") {
				out.aggregated++
			} else {
				out.onMachines++
			}
		}
		return out
	}
	g := NewWithT(t)
	g.Expect(round("a", "hc-1", 6, t0)).To(Equal(recorded{onMachines: 6}))
	g.Expect(round("a", "hc-2", 6, t0)).To(Equal(recorded{onMachines: 4, aggregated: 1}), "the namespace's budget is spent")
	g.Expect(round("b", "hc-1", 6, t0)).To(Equal(recorded{onMachines: 6}), "another namespace")
	g.Expect(round("a", "hc-3", 6, t0.Add(300*time.Millisecond))).To(Equal(recorded{onMachines: 3, aggregated: 1}), "3 more after 0.3 s")
	g.Expect(round("a", "hc-4", 12, t0.Add(time.Minute))).To(Equal(recorded{onMachines: 10, aggregated: 1}), "never more than a round's own limit")
}
