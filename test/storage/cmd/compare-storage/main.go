// Command compare-storage (`make compare-storage`) runs one storage failover twice on the real
// kube-controller-manager and CSI external-attacher (test/storage): a pod with a ReadWriteOnce
// volume on node A, A's kubelet stops, and the remediation is decided (the health check's timeout,
// the same for both, is not counted). Once as Kubernetes does it by default when CAPI deletes the
// Machine (the Node is deleted; CAPI skips drain and the volume-detach wait for an unreachable node),
// and three times as CAPR does it (a NetworkFence through csi-addons' real controller, then the
// out-of-service taint and the force-deletion of the node's pods, fencing.FenceRecorded as the
// remediators call it; the Machine is deleted afterwards). It prints the timelines and, for CAPR, the
// median of the time from the fence confirmed (csi-addons' NetworkFence Succeeded, as CAPR records it)
// to the volume attached on the other node. The default path waits for kube-controller-manager's
// 6-minute force detach, so a run takes about 9 minutes (-default=false skips it).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/remediation/fencing"
	capienv "github.com/capr-io/capr/test/envtest"
	"github.com/capr-io/capr/test/storage"
)

// timeline is what one run measured, from the moment the remediation acts.
type timeline struct {
	// fenced is when the fence was confirmed (CAPR only; zero for the default).
	fenced                      time.Duration
	podGone, detached, attached time.Duration
}

func main() {
	timeout := flag.Duration("timeout", 12*time.Minute, "how long each run may take")
	runs := flag.Int("runs", 3, "how many CAPR failovers to run (the median is reported)")
	withDefault := flag.Bool("default", true, "also run Kubernetes' default failover once (about 7 minutes)")
	flag.Parse()
	// The fencer logs through controller-runtime; the report is what this prints.
	ctrl.SetLogger(logr.Discard())
	if err := run(*timeout, max(*runs, 1), *withDefault); err != nil {
		fmt.Fprintln(os.Stderr, "compare-storage:", err)
		os.Exit(1)
	}
}

func run(timeout time.Duration, runs int, withDefault bool) error {
	ctx := context.Background()
	crds, err := storage.CRDDir()
	if err != nil {
		return err
	}
	env, err := capienv.Start(capienv.Options{WithoutManagerIdentity: true, ExtraCRDDirs: []string{crds}})
	if err != nil {
		return err
	}
	defer func() { _ = env.Stop() }()
	stack, err := storage.StartStack(ctx, env)
	if err != nil {
		return err
	}
	defer stack.Stop()

	class := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"provisioner": storage.DriverName}}}
	class.SetGroupVersionKind(fencing.NetworkFenceClassGVK)
	class.SetName("fake-storage")
	if err := env.Client.Create(ctx, class); err != nil {
		return err
	}
	workload := func(context.Context, client.ObjectKey) (client.Client, error) { return env.Client, nil }
	fencer := &fencing.PolicyFencer{Workload: workload, Backends: map[caprv1.FencingBackendType]fencing.Backend{
		caprv1.FencingBackendNetworkFence: &fencing.NetworkFenceBackend{Workload: workload},
		caprv1.FencingBackendOutOfServiceTaint: &fencing.OutOfServiceTaintBackend{Workload: workload,
			ServerVersion: fencing.DiscoveryServerVersion(func(context.Context, client.ObjectKey) (*rest.Config, error) { return env.Config, nil })},
	}, Pods: &fencing.PodDeleter{Workload: workload}}
	var withCAPR []timeline
	for i := range runs {
		tl, err := caprFailover(ctx, env, fencer, i, timeout)
		if err != nil {
			return fmt.Errorf("CAPR run %d: %w\n%s", i+1, err, stack.Logs(30))
		}
		withCAPR = append(withCAPR, tl)
	}
	var byDefault timeline
	if withDefault {
		fmt.Println("Kubernetes default: CAPI deletes the Machine, which deletes the Node")
		byDefault, err = failover(ctx, env, "default", "10.2.0", timeout, func(_ storage.Workload, node string) (func() time.Time, error) {
			return nil, env.Client.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}})
		})
		if err != nil {
			return fmt.Errorf("default run: %w\n%s", err, stack.Logs(30))
		}
	}
	med := median(withCAPR)
	r := func(d time.Duration) string { return "+" + d.Round(100*time.Millisecond).String() }
	row := func(name string, a, b time.Duration) {
		def := "(not run)"
		if withDefault {
			def = r(a)
		}
		fmt.Printf("| %s | %s | %s |\n", name, def, r(b))
	}
	fmt.Println()
	fmt.Printf("| from the remediation's first action | Kubernetes default (Machine deleted) | CAPR (NetworkFence, then pod deletion and out-of-service taint; median of %d) |\n", len(withCAPR))
	fmt.Println("|---|---|---|")
	row("old pod gone", byDefault.podGone, med.podGone)
	row("volume detached from the dead node", byDefault.detached, med.detached)
	row("volume attached on the other node", byDefault.attached, med.attached)
	fmt.Println()
	var after []string
	for _, tl := range withCAPR {
		after = append(after, (tl.attached - tl.fenced).Round(10*time.Millisecond).String())
	}
	fmt.Printf("CAPR: volume attached elsewhere %s after the fence was confirmed (median of %d runs: %v)\n",
		(med.attached - med.fenced).Round(10*time.Millisecond), len(withCAPR), after)
	fmt.Printf("second writers refused by the stand-in driver: %d\n", len(stack.Driver.Refused()))
	return nil
}

// caprFailover is CAPR's failover number i: the Fence step asks again until the fence is confirmed, as
// the remediators do, through fencing.FenceRecorded (the fence recorded in a request, then the node's
// pods force-deleted once it is confirmed). The fence is confirmed when the NetworkFence backend first
// reports it, as status.fencing.backends[0].fencedTime records.
func caprFailover(ctx context.Context, env *capienv.Environment, fencer *fencing.PolicyFencer, i int, timeout time.Duration) (timeline, error) {
	fmt.Printf("CAPR run %d: NetworkFence through csi-addons, then the node's pods deleted and the out-of-service taint (the Machine is deleted afterwards)\n", i+1)
	fenceCtx, stopFencing := context.WithCancel(ctx)
	defer stopFencing()
	return failover(ctx, env, fmt.Sprintf("capr%d", i+1), fmt.Sprintf("10.2.%d", i+1), timeout, func(w storage.Workload, node string) (func() time.Time, error) {
		spec := &caprv1.FencingSpec{Policy: caprv1.FencingRequired, Backends: []caprv1.FencingBackend{
			{Type: caprv1.FencingBackendNetworkFence, NetworkFenceClassNames: []string{"fake-storage"}},
			{Type: caprv1.FencingBackendOutOfServiceTaint},
		}}
		mr := &caprv1.MachineRemediation{ObjectMeta: metav1.ObjectMeta{Namespace: w.NS, Name: "m-a", UID: types.UID("compare-" + w.NS)},
			Spec: caprv1.MachineRemediationSpec{Fencing: spec}}
		req := fencing.Request{Cluster: &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: w.NS, Name: "wc"}},
			Machine: &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: w.NS, Name: "m-a"}}, Node: node, Spec: spec, Started: time.Now()}
		var mu sync.Mutex
		var fenced time.Time
		go func() {
			_ = wait.PollUntilContextCancel(fenceCtx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
				res, err := fencing.FenceRecorded(ctx, fencer, mr, req, time.Now(), func(context.Context) error { return nil })
				if err != nil {
					return false, nil //nolint:nilerr // asked again on the next tick, as the remediators do after an error
				}
				if t := mr.Status.Fencing.Backends[0].FencedTime; t != nil {
					mu.Lock()
					fenced = t.Time
					mu.Unlock()
				}
				return res.Outcome == fencing.Fenced, nil
			})
		}()
		return func() time.Time { mu.Lock(); defer mu.Unlock(); return fenced }, nil
	})
}

// median is the run whose time from the fence confirmed to the volume attached is the median.
func median(runs []timeline) timeline {
	sorted := slices.Clone(runs)
	slices.SortFunc(sorted, func(a, b timeline) int { return int((a.attached - a.fenced) - (b.attached - b.fenced)) })
	return sorted[len(sorted)/2]
}

// failover runs one failover in a namespace of its own with nodes <prefix>-a and <prefix>-b (addresses
// <subnet>.1 and .2); act is the remediation's first action on the dead node, and returns, for CAPR,
// when the fence was confirmed (zero until it is).
func failover(ctx context.Context, env *capienv.Environment, prefix, subnet string, timeout time.Duration,
	act func(w storage.Workload, node string) (func() time.Time, error)) (timeline, error) {
	ns, err := capienv.CreateNamespace(ctx, env.Client, prefix)
	if err != nil {
		return timeline{}, err
	}
	w := storage.Workload{C: env.Client, NS: ns}
	a, b := prefix+"-node-a", prefix+"-node-b"
	if err := errors.Join(w.Node(ctx, a, subnet+".1"), w.Node(ctx, b, subnet+".2")); err != nil {
		return timeline{}, err
	}
	handle, err := w.Volume(ctx, "data")
	if err != nil {
		return timeline{}, err
	}
	pod, err := w.Pod(ctx, "web-0", "data", a)
	if err != nil {
		return timeline{}, err
	}
	if err := until(ctx, 2*time.Minute, func() (bool, error) { return attachedTo(ctx, w, true, a) }); err != nil {
		return timeline{}, fmt.Errorf("volume never attached to %s: %w", a, err)
	}
	if err := w.RunningOn(ctx, pod, a, handle); err != nil {
		return timeline{}, err
	}
	if err := w.NotReady(ctx, a); err != nil {
		return timeline{}, err
	}
	start := time.Now()
	fencedAt, err := act(w, a)
	if err != nil {
		return timeline{}, err
	}
	var tl timeline
	if err := until(ctx, timeout, func() (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(pod), &corev1.Pod{})
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	}); err != nil {
		return tl, fmt.Errorf("the old pod was not deleted: %w", err)
	}
	tl.podGone = time.Since(start)
	fmt.Printf("  old pod gone after %s; its replacement is created on %s\n", tl.podGone.Round(100*time.Millisecond), b)
	moved, err := w.Pod(ctx, "web-0", "data", b)
	if err != nil {
		return tl, err
	}
	if err := until(ctx, timeout, func() (bool, error) {
		on, err := w.AttachedTo(ctx, w.PV("data"))
		return len(on) == 0 || on[0] != a, err
	}); err != nil {
		return tl, fmt.Errorf("the volume was not detached from %s: %w", a, err)
	}
	tl.detached = time.Since(start)
	fmt.Printf("  volume detached from %s after %s\n", a, tl.detached.Round(100*time.Millisecond))
	if err := until(ctx, timeout, func() (bool, error) { return attachedTo(ctx, w, true, b) }); err != nil {
		return tl, fmt.Errorf("the volume was not attached to %s: %w", b, err)
	}
	tl.attached = time.Since(start)
	fmt.Printf("  volume attached on %s after %s\n", b, tl.attached.Round(100*time.Millisecond))
	if fencedAt != nil {
		if f := fencedAt(); !f.IsZero() {
			tl.fenced = f.Sub(start)
			fmt.Printf("  fence confirmed after %s: volume attached elsewhere %s after the fence was confirmed\n",
				tl.fenced.Round(100*time.Millisecond), (tl.attached - tl.fenced).Round(10*time.Millisecond))
		}
	}
	return tl, w.RunningOn(ctx, moved, b, handle)
}

// attachedTo reports whether the volume of claim data is attached to node (and only to it when only).
func attachedTo(ctx context.Context, w storage.Workload, only bool, node string) (bool, error) {
	on, err := w.AttachedTo(ctx, w.PV("data"))
	if err != nil {
		return false, err
	}
	if only {
		return len(on) == 1 && on[0] == node, nil
	}
	for _, n := range on {
		if n == node {
			return true, nil
		}
	}
	return false, nil
}

func until(ctx context.Context, timeout time.Duration, cond func() (bool, error)) error {
	return wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(context.Context) (bool, error) { return cond() })
}
