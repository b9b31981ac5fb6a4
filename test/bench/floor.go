package bench

import (
	"context"
	"fmt"
	"os"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	capienv "github.com/capr-io/capr/test/envtest"
)

// Floor is what the API server takes to accept the mark phase's Machine writes when nothing else
// runs: no controller, no Node batch, no other request. No health checker that writes each mark
// to its Machine (CAPI's and CAPR's both do) can mark the flipped Machines sooner on this machine.
type Floor struct {
	// Writes is how many Machine status writes each measurement made (the mark phase's flipped count).
	Writes int
	// Apply and MergePatch are the wall time of the writes, fleetWorkers in flight: CAPR's mark
	// (server-side apply of its one condition) and CAPI's (a JSON merge patch of status.conditions
	// with the resourceVersion, what CAPI's patch helper sends).
	Apply, MergePatch time.Duration
	// ApplyServerCPU and MergePatchServerCPU are kube-apiserver's and etcd's CPU seconds for them.
	ApplyServerCPU, MergePatchServerCPU float64
}

// MeasureFloor starts an API server on a copy of the image, watches Machines as a controller's cache
// does (every write is also sent to a watcher), and writes a condition to the Machines the mark
// phase flips: once by server-side apply, then, on as many other Machines, by merge patch.
func MeasureFloor(ctx context.Context, image *FleetImage) (Floor, error) {
	data, err := image.copy()
	if err != nil {
		return Floor{}, err
	}
	defer func() { _ = os.RemoveAll(data) }()
	env, err := capienv.Start(capienv.Options{EtcdDataDir: data})
	if err != nil {
		return Floor{}, err
	}
	defer func() { _ = env.Stop() }()
	env.Config.QPS, env.Config.Burst = -1, 0
	c, err := client.New(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		return Floor{}, fmt.Errorf("creating client: %w", err)
	}
	watched, err := cache.New(env.Config, cache.Options{Scheme: env.Scheme, DefaultNamespaces: map[string]cache.Config{image.namespace: {}}})
	if err != nil {
		return Floor{}, fmt.Errorf("creating the Machine cache: %w", err)
	}
	cacheCtx, stop := context.WithCancel(ctx)
	defer stop()
	if _, err := watched.GetInformer(cacheCtx, &clusterv1.Machine{}); err != nil {
		return Floor{}, fmt.Errorf("watching Machines: %w", err)
	}
	go func() { _ = watched.Start(cacheCtx) }()
	if !watched.WaitForCacheSync(cacheCtx) {
		return Floor{}, fmt.Errorf("the Machine cache did not sync")
	}

	f := &fleet{cfg: Config{Machines: image.Machines}}
	flipped := f.flipSet()
	others := make([]int, len(flipped))
	for k, i := range flipped {
		others[k] = i + 1 // the next Machine of each flipped one: never flipped (flipSet takes every 10th)
	}
	cond := metav1.Condition{Type: caprv1.MachineCAPRHealthCheckSucceededCondition, Status: metav1.ConditionFalse,
		Reason: "NodeConditionsFailed", Message: "Node condition Ready is False for more than 5m0s", LastTransitionTime: metav1.Now()}
	fl := Floor{Writes: len(flipped)}
	fl.Apply, fl.ApplyServerCPU, err = timeWrites(ctx, c, watched, image.namespace, flipped, cond, func(m *clusterv1.Machine) error {
		return c.Status().Apply(ctx, client.ApplyConfigurationFromUnstructured(conditionApply(m, cond)),
			client.FieldOwner("bench-floor"), client.ForceOwnership)
	})
	if err != nil {
		return Floor{}, fmt.Errorf("server-side apply: %w", err)
	}
	cond.Type = clusterv1.MachineHealthCheckSucceededCondition
	fl.MergePatch, fl.MergePatchServerCPU, err = timeWrites(ctx, c, watched, image.namespace, others, cond, func(m *clusterv1.Machine) error {
		base := m.DeepCopy()
		conditions.Set(m, cond)
		return c.Status().Patch(ctx, m, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}))
	})
	if err != nil {
		return Floor{}, fmt.Errorf("merge patch: %w", err)
	}
	return fl, nil
}

// timeWrites reads the Machines first (not timed), then writes each of them, fleetWorkers at once,
// and returns the time until the watch has seen every Machine with the condition (as the benchmark's
// observer sees a mark), and the API server's and etcd's CPU seconds until then.
func timeWrites(ctx context.Context, c client.Client, watched cache.Cache, namespace string, idx []int, cond metav1.Condition,
	write func(*clusterv1.Machine) error) (time.Duration, float64, error) {
	machines := make([]*clusterv1.Machine, len(idx))
	if err := parallel(len(idx), func(k int) error {
		machines[k] = &clusterv1.Machine{}
		return c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: machineName(idx[k])}, machines[k])
	}); err != nil {
		return 0, 0, fmt.Errorf("reading the Machines: %w", err)
	}
	cpu, begin := serverCPU(), time.Now()
	if err := parallel(len(machines), func(k int) error { return write(machines[k]) }); err != nil {
		return 0, 0, err
	}
	seen := 0
	err := wait.PollUntilContextTimeout(ctx, 5*time.Millisecond, phaseTimeout, true, func(ctx context.Context) (bool, error) {
		seen = 0
		for _, i := range idx {
			m := &clusterv1.Machine{}
			if err := watched.Get(ctx, client.ObjectKey{Namespace: namespace, Name: machineName(i)}, m); err != nil {
				return false, fmt.Errorf("reading Machine %s from the cache: %w", machineName(i), err)
			}
			if got := conditions.Get(m, cond.Type); got != nil && got.Status == cond.Status && got.Reason == cond.Reason {
				seen++
			}
		}
		return seen == len(idx), nil
	})
	if err != nil {
		return 0, 0, fmt.Errorf("waiting for the watch to see the writes (%d of %d seen): %w", seen, len(idx), err)
	}
	return time.Since(begin), serverCPU() - cpu, nil
}

// conditionApply is a server-side apply configuration of one entry of a Machine's status.conditions.
func conditionApply(m *clusterv1.Machine, cond metav1.Condition) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": clusterv1.GroupVersion.String(),
		"kind":       "Machine",
		"metadata":   map[string]any{"name": m.Name, "namespace": m.Namespace, "uid": string(m.UID)},
		"status": map[string]any{"conditions": []any{map[string]any{
			"type": cond.Type, "status": string(cond.Status), "reason": cond.Reason, "message": cond.Message,
			"lastTransitionTime": cond.LastTransitionTime.UTC().Format(time.RFC3339),
		}}},
	}}
}

// Line renders the floor for the report, with CAPR's and CAPI's time to the last mark over it.
func (fl Floor) Line(results []*Result) string {
	s := fmt.Sprintf("Floor: with no controller running, the harness writes a condition to the %d flipped Machines, %d in flight, while "+
		"one watch follows Machines: %.2f s by server-side apply (CAPR's mark; API server + etcd CPU %.2f s), %.2f s by merge patch "+
		"(CAPI's; CPU %.2f s).", fl.Writes, fleetWorkers, fl.Apply.Seconds(), fl.ApplyServerCPU, fl.MergePatch.Seconds(), fl.MergePatchServerCPU)
	floor := min(fl.Apply, fl.MergePatch)
	for _, r := range results {
		if r.Mark.Done == r.Mark.Changed && floor > 0 {
			s += fmt.Sprintf(" Last mark, %s: %.1f× the floor.", r.Config.Variant.Name, r.Mark.Max.Seconds()/floor.Seconds())
		}
	}
	return s + "\n"
}
