// Command compare-storage (`make compare-storage`) runs one storage failover twice on the real
// kube-controller-manager and CSI external-attacher (test/storage): a pod with a ReadWriteOnce
// volume on node A, A's kubelet stops, and the remediation is decided (the health check's timeout,
// the same for both, is not counted). Once as Kubernetes does it by default when CAPI deletes the
// Machine (the Node is deleted; CAPI skips drain and the volume-detach wait for an unreachable node),
// once as CAPR does it (a NetworkFence through csi-addons' real controller, then the out-of-service
// taint; the Machine is deleted afterwards). It
// prints both timelines. The default path waits for kube-controller-manager's 6-minute force detach,
// so a run takes about 8 minutes.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/remediation/fencing"
	capienv "github.com/capr-io/capr/test/envtest"
	"github.com/capr-io/capr/test/storage"
)

// timeline is what one run measured, from the moment the remediation acts.
type timeline struct {
	podGone, detached, attached time.Duration
}

func main() {
	timeout := flag.Duration("timeout", 12*time.Minute, "how long each run may take")
	flag.Parse()
	if err := run(*timeout); err != nil {
		fmt.Fprintln(os.Stderr, "compare-storage:", err)
		os.Exit(1)
	}
}

func run(timeout time.Duration) error {
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

	fmt.Println("CAPR: NetworkFence through csi-addons, then the out-of-service taint (the Machine is deleted afterwards)")
	class := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"provisioner": storage.DriverName}}}
	class.SetGroupVersionKind(fencing.NetworkFenceClassGVK)
	class.SetName("fake-storage")
	if err := env.Client.Create(ctx, class); err != nil {
		return err
	}
	workload := func(context.Context, client.ObjectKey) (client.Client, error) { return env.Client, nil }
	fencer := &fencing.PolicyFencer{Backends: map[caprv1.FencingBackendType]fencing.Backend{
		caprv1.FencingBackendNetworkFence: &fencing.NetworkFenceBackend{Workload: workload},
		caprv1.FencingBackendOutOfServiceTaint: &fencing.OutOfServiceTaintBackend{Workload: workload,
			ServerVersion: fencing.DiscoveryServerVersion(func(context.Context, client.ObjectKey) (*rest.Config, error) { return env.Config, nil })},
	}}
	fenceCtx, stopFencing := context.WithCancel(ctx)
	defer stopFencing()
	withCAPR, err := failover(ctx, env, "capr", timeout, func(w storage.Workload, node string) error {
		req := fencing.Request{Cluster: &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: w.NS, Name: "wc"}},
			Machine: &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: w.NS, Name: "m-a"}}, Node: node, Remediation: "compare-m-a",
			Spec: &caprv1.FencingSpec{Policy: caprv1.FencingRequired, Backends: []caprv1.FencingBackend{
				{Type: caprv1.FencingBackendNetworkFence, NetworkFenceClassNames: []string{"fake-storage"}},
				{Type: caprv1.FencingBackendOutOfServiceTaint},
			}}}
		// The Fence step asks again until the fence is confirmed, as the remediators do.
		go func() {
			_ = wait.PollUntilContextCancel(fenceCtx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
				res, err := fencer.Fence(ctx, req)
				return err == nil && res.Outcome == fencing.Fenced, nil
			})
		}()
		return nil
	})
	stopFencing()
	if err != nil {
		return fmt.Errorf("CAPR run: %w\n%s", err, stack.Logs(30))
	}
	fmt.Println("Kubernetes default: CAPI deletes the Machine, which deletes the Node")
	byDefault, err := failover(ctx, env, "default", timeout, func(_ storage.Workload, node string) error {
		return env.Client.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}})
	})
	if err != nil {
		return fmt.Errorf("default run: %w\n%s", err, stack.Logs(30))
	}
	row := func(name string, a, b time.Duration) {
		fmt.Printf("| %s | +%s | +%s |\n", name, a.Round(100*time.Millisecond), b.Round(100*time.Millisecond))
	}
	fmt.Println()
	fmt.Println("| from the remediation's first action | Kubernetes default (Machine deleted) | CAPR (NetworkFence, then out-of-service taint) |")
	fmt.Println("|---|---|---|")
	row("old pod gone", byDefault.podGone, withCAPR.podGone)
	row("volume detached from the dead node", byDefault.detached, withCAPR.detached)
	row("volume attached on the other node", byDefault.attached, withCAPR.attached)
	fmt.Printf("\nsecond writers refused by the stand-in driver: %d\n", len(stack.Driver.Refused()))
	return nil
}

// failover runs one failover in a namespace of its own with nodes <prefix>-a and <prefix>-b; act is
// the remediation's first action on the dead node.
func failover(ctx context.Context, env *capienv.Environment, prefix string, timeout time.Duration,
	act func(w storage.Workload, node string) error) (timeline, error) {
	ns, err := capienv.CreateNamespace(ctx, env.Client, prefix)
	if err != nil {
		return timeline{}, err
	}
	w := storage.Workload{C: env.Client, NS: ns}
	a, b := prefix+"-node-a", prefix+"-node-b"
	if err := errors.Join(w.Node(ctx, a, "10.2.0.1"), w.Node(ctx, b, "10.2.0.2")); err != nil {
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
	if err := act(w, a); err != nil {
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
