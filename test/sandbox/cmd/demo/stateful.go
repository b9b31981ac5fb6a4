package main

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/remediation/fencing"
	"github.com/capr-io/capr/test/sandbox"
	"github.com/capr-io/capr/test/storage"
)

// workerStateful is the worker-stateful scenario: a worker with a stateful Pod on a ReadWriteOnce
// volume dies; CAPR fences it (csi-addons NetworkFence, then the out-of-service taint), Kubernetes'
// own controllers move the volume, CAPI's MachineSet replaces the worker, and CAPR unfences.
const (
	workerStateful            = "worker-stateful"
	workerStatefulDescription = "a worker running a Pod with a ReadWriteOnce volume loses its kubelet: fenced, volume moved, Machine replaced, unfenced"
)

// milestone is one point of the worker-stateful timeline.
type milestone struct {
	name string
	at   time.Time
}

type statefulRun struct {
	d        *demo
	ns       string
	w        storage.Workload
	victim   clusterv1.Machine
	node     string
	other    string
	cidr     string
	pv       string
	handle   string
	faultAt  time.Time
	seen     map[string]time.Time
	order    []milestone
	moved    bool
	oldNames []string
}

func (r *statefulRun) reach(name, format string, args ...any) {
	if _, ok := r.seen[name]; ok {
		return
	}
	now := time.Now()
	r.seen[name] = now
	r.order = append(r.order, milestone{name: name, at: now})
	r.d.sayAt(now, format, args...)
}

func (r *statefulRun) reached(name string) bool {
	_, ok := r.seen[name]
	return ok
}

func runWorkerStateful(ctx context.Context) error {
	d := &demo{start: time.Now()}
	d.say("Scenario %q: %s", workerStateful, workerStatefulDescription)
	d.say("Starting kube-apiserver v1.36.3, etcd v3.6.14, kube-controller-manager v1.36.3 (node lifecycle, attach/detach, taint eviction, pod GC, volume binding), CAPI v1.14.2's core, kubeadm bootstrap and KubeadmControlPlane controllers, the CSI external-attacher v4.12.0 and csi-addons' controller v0.14.0; stand-ins: the CSI driver and its csi-addons sidecar, the kubelets")
	sb, err := sandbox.StartWithOptions(ctx, sandbox.Options{Provider: sandbox.ProviderKubeadm, Storage: true})
	if err != nil {
		return err
	}
	d.sb = sb
	defer func() {
		d.say("Stopping the storage components, every etcd member, kubelet stand-in, the API server and etcd")
		sb.Stop()
	}()
	r := &statefulRun{d: d, ns: "demo", seen: map[string]time.Time{}}
	if err := sb.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: r.ns}}); err != nil {
		return err
	}
	d.say("Creating cluster %s/wc: 1 control-plane Machine and a MachineDeployment of 2 workers", r.ns)
	if d.wc, err = sb.CreateCluster(ctx, sandbox.ClusterSpec{Namespace: r.ns, Name: "wc", ControlPlane: 1, Workers: 2}); err != nil {
		return err
	}
	workers, err := workerMachines(ctx, sb, r.ns)
	if err != nil {
		return err
	}
	if len(workers) != 2 {
		return fmt.Errorf("want 2 worker Machines, have %d", len(workers))
	}
	r.victim, r.node, r.other = workers[0], workers[0].Status.NodeRef.Name, workers[1].Status.NodeRef.Name
	for _, m := range workers {
		r.oldNames = append(r.oldNames, m.Name)
	}
	if err := r.deployStatefulPod(ctx); err != nil {
		return err
	}
	if err := r.startCAPR(ctx); err != nil {
		return err
	}
	defer r.stopCAPR()

	r.faultAt = time.Now()
	if err := sb.StopKubelet(ctx, d.wc, r.node); err != nil {
		return err
	}
	d.say("FAULT: the kubelet of %s (Machine %s) stopped; its Pod still shows Running and its volume attached", r.node, r.victim.Name)
	if err := r.follow(ctx); err != nil {
		r.diagnose()
		return err
	}
	r.summary()
	return nil
}

// deployStatefulPod registers the driver on both workers, creates a NetworkFenceClass for it, and
// runs Pod db-0 with a ReadWriteOnce volume on the victim's Node.
func (r *statefulRun) deployStatefulPod(ctx context.Context) error {
	r.w = storage.Workload{C: r.d.sb.Client, NS: r.ns}
	for _, n := range []string{r.node, r.other} {
		if err := r.w.AttachableNode(ctx, n); err != nil {
			return fmt.Errorf("registering the CSI driver on %s: %w", n, err)
		}
	}
	class := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"provisioner": storage.DriverName}}}
	class.SetGroupVersionKind(fencing.NetworkFenceClassGVK)
	class.SetName("sandbox-storage")
	if err := r.d.sb.Client.Create(ctx, class); err != nil {
		return err
	}
	var err error
	if r.handle, err = r.w.Volume(ctx, "data"); err != nil {
		return err
	}
	r.pv = r.w.PV("data")
	pod, err := r.w.Pod(ctx, "db-0", "data", r.node)
	if err != nil {
		return err
	}
	if err := poll(ctx, time.Minute, func() (bool, error) {
		nodes, err := r.w.AttachedTo(ctx, r.pv)
		return slices.Equal(nodes, []string{r.node}), err
	}); err != nil {
		return fmt.Errorf("the volume never attached to %s: %w", r.node, err)
	}
	if err := r.w.RunningOn(ctx, pod, r.node, r.handle); err != nil {
		return err
	}
	n := &corev1.Node{}
	if err := r.d.sb.Client.Get(ctx, client.ObjectKey{Name: r.node}, n); err != nil {
		return err
	}
	r.cidr = n.Status.Addresses[0].Address + "/32"
	r.d.say("Pod %s/db-0 runs on %s with ReadWriteOnce volume %s, attached there by the external-attacher", r.ns, r.node, r.pv)
	return nil
}

func (r *statefulRun) startCAPR(ctx context.Context) error {
	mhc := sandbox.WorkerHealthCheck(r.ns, "workers", r.d.wc.Name, 2)
	mhc.Spec.Remediation.Fencing = &caprv1.FencingSpec{Policy: caprv1.FencingRequired, TimeoutSeconds: ptr.To[int32](300),
		Backends: []caprv1.FencingBackend{
			{Type: caprv1.FencingBackendNetworkFence, NetworkFenceClassNames: []string{"sandbox-storage"}},
			{Type: caprv1.FencingBackendOutOfServiceTaint},
		}}
	if err := r.d.sb.Client.Create(ctx, mhc); err != nil {
		return err
	}
	r.d.say("CAPR MachineHealthCheck for the workers: Node not Ready for 2s; fencing Required: NetworkFence (class sandbox-storage), then OutOfServiceTaint")
	capr, err := r.d.sb.StartCAPR(ctx, sandbox.CAPROptions{})
	if err != nil {
		return err
	}
	r.d.capr = capr
	r.d.say("CAPR started (health checker and remediators, the fencing backends as shipped)")
	return nil
}

func (r *statefulRun) stopCAPR() {
	if r.d.capr != nil {
		r.d.capr.Stop()
	}
}

// stallTimeout bounds the time between two milestones: every step of the timeline takes seconds
// (docs/performance.md), so a run that reaches nothing new for this long is stuck, and says where.
const stallTimeout = 3 * time.Minute

// follow watches the world until the remediation succeeded with the volume on the other worker.
func (r *statefulRun) follow(ctx context.Context) error {
	c := r.d.sb.Client
	for {
		last := r.faultAt
		if len(r.order) > 0 {
			last = r.order[len(r.order)-1].at
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("timed out; reached: %s", r.reachedNames())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Since(last) > stallTimeout {
			return fmt.Errorf("nothing new for %s; reached: %s", stallTimeout, r.reachedNames())
		}
		mr := &caprv1.MachineRemediation{}
		err := c.Get(ctx, client.ObjectKey{Namespace: r.ns, Name: r.victim.Name}, mr)
		if err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		if err == nil {
			r.reach("marked", "CAPR marked Machine %s (%s) and requested its remediation", r.victim.Name, mr.Spec.Reason)
			if err := r.watchFence(ctx, mr); err != nil {
				return err
			}
		}
		if err := r.watchVolume(ctx); err != nil {
			return err
		}
		if err := r.watchMachines(ctx); err != nil {
			return err
		}
		if err == nil && mr.Status.Phase == caprv1.MachineRemediationPhaseSucceeded && r.reached("pod running elsewhere") && r.reached("replaced") {
			r.reach("succeeded", "Remediation Succeeded: %s", conditions.GetMessage(mr, caprv1.MachineRemediationSucceededCondition))
			return r.checkClean(ctx)
		}
		if err == nil && mr.Status.Phase == caprv1.MachineRemediationPhaseFailed {
			return fmt.Errorf("the remediation failed: %s", mr.Status.LastError)
		}
	}
}

func (r *statefulRun) watchFence(ctx context.Context, mr *caprv1.MachineRemediation) error {
	if nf := r.networkFence(ctx); nf != nil {
		cidrs, _, _ := unstructured.NestedStringSlice(nf.Object, "spec", "cidrs")
		r.reach("NetworkFence created", "NetworkFence %s created: fenceState Fenced, cidrs %v, class sandbox-storage", nf.GetName(), cidrs)
		if result, _, _ := unstructured.NestedString(nf.Object, "status", "result"); result == "Succeeded" {
			r.reach("fence confirmed", "csi-addons confirmed NetworkFence %s (status.result Succeeded)", nf.GetName())
		}
	}
	if r.d.sb.Storage.Sidecar.Fenced(r.cidr) {
		r.reach("address fenced", "csi-addons fenced %s in the storage system (FenceClusterNetwork through the driver's sidecar)", r.cidr)
	}
	n := &corev1.Node{}
	if err := r.d.sb.Client.Get(ctx, client.ObjectKey{Name: r.node}, n); err == nil {
		for _, t := range n.Spec.Taints {
			if t.MatchTaint(&fencing.OutOfServiceTaint) {
				if !r.reached("address fenced") {
					return fmt.Errorf("node %s was tainted out-of-service before its address was fenced", r.node)
				}
				r.reach("tainted", "Node %s tainted %s (only after the fence was confirmed)", r.node, fencing.OutOfServiceTaint.ToString())
			}
		}
	}
	if rec := mr.Status.Fencing; rec != nil {
		fenced := len(rec.Backends) > 0
		for _, b := range rec.Backends {
			fenced = fenced && b.FencedTime != nil
		}
		if fenced {
			r.reach("fenced", "Fence step done: every backend confirmed (%s)", fencingRecord(rec))
		}
		if rec.UnfencedTime != nil {
			r.reach("unfenced", "Unfenced after the Machine and its Node were gone: %s", fencingRecord(rec))
		}
	}
	return nil
}

func fencingRecord(rec *caprv1.FencingStatus) string {
	parts := make([]string, 0, len(rec.Backends))
	for _, b := range rec.Backends {
		parts = append(parts, fmt.Sprintf("%s %s", b.Type, b.State))
	}
	return strings.Join(parts, ", ")
}

func (r *statefulRun) networkFence(ctx context.Context) *unstructured.Unstructured {
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(fencing.NetworkFenceGVK)
	if err := r.d.sb.Client.List(ctx, list); err != nil {
		return nil
	}
	for i := range list.Items {
		if list.Items[i].GetAnnotations()[fencing.NetworkFenceNodeAnnotation] == r.node {
			return &list.Items[i]
		}
	}
	return nil
}

// watchVolume follows the Pod and its volume, and plays the StatefulSet controller and the
// scheduler: once db-0 is gone from the failed node it is created again on the other worker.
func (r *statefulRun) watchVolume(ctx context.Context) error {
	pod := &corev1.Pod{}
	err := r.d.sb.Client.Get(ctx, client.ObjectKey{Namespace: r.ns, Name: "db-0"}, pod)
	podGone := apierrors.IsNotFound(err)
	if err != nil && !podGone {
		return err
	}
	if podGone && !r.moved {
		if !r.reached("address fenced") {
			return fmt.Errorf("pod db-0 was deleted from %s before its address was fenced", r.node)
		}
		r.reach("pod gone", "Pod db-0 deleted from %s (CAPR force-deletes a fenced node's pods once the fence is confirmed)", r.node)
	}
	nodes, err := r.w.AttachedTo(ctx, r.pv)
	if err != nil {
		return err
	}
	if r.moved && slices.Equal(nodes, []string{r.other}) {
		r.reach("attached elsewhere", "Volume %s attached to %s", r.pv, r.other)
	}
	if r.reached("tainted") && !slices.Contains(nodes, r.node) {
		r.reach("detached", "Volume %s detached from %s by kube-controller-manager's attach/detach controller (CAPR never touches a VolumeAttachment)", r.pv, r.node)
	}
	switch {
	case podGone && !r.moved:
		if _, err := r.w.Pod(ctx, "db-0", "data", r.other); err != nil {
			return err
		}
		r.moved = true
		r.d.say("Pod db-0 created again on %s (what its StatefulSet and the scheduler do)", r.other)
	case !podGone && r.moved && pod.DeletionTimestamp != nil:
		// Nothing here terminates a pod on the healthy worker: one marked for deletion would wait
		// forever (what kube-controller-manager's taint eviction did to it when CAPR deleted the old
		// pod after the out-of-service taint; remediation/fencing, pods.go).
		return fmt.Errorf("pod db-0's replacement on %s was marked for deletion (deletionTimestamp %s)", r.other, pod.DeletionTimestamp)
	case !podGone && r.moved && slices.Equal(nodes, []string{r.other}) && !r.reached("pod running elsewhere"):
		if err := r.w.RunningOn(ctx, pod, r.other, r.handle); err != nil {
			return err
		}
		if refused := r.d.sb.Storage.Driver.Refused(); len(refused) > 0 {
			return fmt.Errorf("the storage system was asked for a second writer: %v", refused)
		}
		r.reach("pod running elsewhere", "Volume attached to %s; Pod db-0 runs there (one writer at every moment)", r.other)
	}
	return nil
}

func (r *statefulRun) watchMachines(ctx context.Context) error {
	m := &clusterv1.Machine{}
	err := r.d.sb.Client.Get(ctx, client.ObjectKeyFromObject(&r.victim), m)
	switch {
	case apierrors.IsNotFound(err):
		r.reach("machine gone", "Machine %s deleted (drained, its Node deleted by CAPI's Machine controller)", r.victim.Name)
	case err != nil:
		return err
	}
	workers, err := workerMachines(ctx, r.d.sb, r.ns)
	if err != nil {
		return err
	}
	for _, w := range workers {
		if !slices.Contains(r.oldNames, w.Name) && w.Status.NodeRef.IsDefined() {
			r.reach("replaced", "MachineSet's replacement %s is up with Node %s", w.Name, w.Status.NodeRef.Name)
		}
	}
	return nil
}

func (r *statefulRun) reachedNames() string {
	names := make([]string, 0, len(r.order))
	for _, m := range r.order {
		names = append(names, fmt.Sprintf("%s (%.2f s)", m.name, m.at.Sub(r.faultAt).Seconds()))
	}
	return strings.Join(names, ", ")
}

// diagnose prints what a stuck run needs to be understood: the Pod, the VolumeAttachments, the
// Nodes' volume status, the storage system's view and the storage components' logs.
func (r *statefulRun) diagnose() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := r.d.sb.Client
	fmt.Println("\nState when the demo stopped:")
	pod := &corev1.Pod{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: r.ns, Name: "db-0"}, pod); err != nil {
		fmt.Printf("  Pod db-0: %v\n", err)
	} else {
		fmt.Printf("  Pod db-0: uid %s node %s phase %s deletionTimestamp %v\n", pod.UID, pod.Spec.NodeName, pod.Status.Phase, pod.DeletionTimestamp)
	}
	vas := &storagev1.VolumeAttachmentList{}
	if err := c.List(ctx, vas); err != nil {
		fmt.Printf("  VolumeAttachments: %v\n", err)
	}
	for _, va := range vas.Items {
		fmt.Printf("  VolumeAttachment %s: node %s attached %t deletionTimestamp %v finalizers %v attachError %v detachError %v\n",
			va.Name, va.Spec.NodeName, va.Status.Attached, va.DeletionTimestamp, va.Finalizers, va.Status.AttachError, va.Status.DetachError)
	}
	for _, name := range []string{r.node, r.other} {
		n := &corev1.Node{}
		if err := c.Get(ctx, client.ObjectKey{Name: name}, n); err != nil {
			fmt.Printf("  Node %s: %v\n", name, err)
			continue
		}
		fmt.Printf("  Node %s: volumesAttached %v volumesInUse %v taints %v\n", name, n.Status.VolumesAttached, n.Status.VolumesInUse, n.Spec.Taints)
	}
	events := &corev1.EventList{}
	if err := c.List(ctx, events, client.InNamespace(r.ns)); err == nil {
		for _, e := range events.Items {
			if e.InvolvedObject.Kind == "Pod" {
				fmt.Printf("  Event %s %s/%s %s: %s\n", e.LastTimestamp.Format(time.RFC3339), e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message)
			}
		}
	}
	st := r.d.sb.Storage
	fmt.Printf("  Storage system: %s published to %q; refused %v\n", r.handle, st.Driver.PublishedTo(r.handle), st.Driver.Refused())
	fmt.Println(st.Logs(80))
}

// checkClean verifies what the demo promises at the end: the fence is undone and nothing is left.
func (r *statefulRun) checkClean(ctx context.Context) error {
	if nf := r.networkFence(ctx); nf != nil {
		return fmt.Errorf("NetworkFence %s is left behind", nf.GetName())
	}
	if r.d.sb.Storage.Sidecar.Fenced(r.cidr) {
		return fmt.Errorf("the storage system still refuses %s", r.cidr)
	}
	r.d.say("NetworkFence removed and %s unfenced in the storage system; no second writer was ever asked for", r.cidr)
	return nil
}

func (r *statefulRun) summary() {
	fmt.Println()
	fmt.Println("Timeline from the fault (seconds):")
	rows := []struct{ name, label string }{
		{"marked", "fault → marked"},
		{"NetworkFence created", "→ NetworkFence created"},
		{"address fenced", "→ address fenced (csi-addons)"},
		{"fence confirmed", "→ NetworkFence confirmed"},
		{"tainted", "→ out-of-service taint"},
		{"fenced", "→ Fence step done"},
		{"pod gone", "→ Pod gone from the node"},
		{"detached", "→ volume detached"},
		{"attached elsewhere", "→ volume attached elsewhere"},
		{"pod running elsewhere", "→ Pod running elsewhere"},
		{"machine gone", "→ Machine deleted"},
		{"replaced", "→ Machine replaced"},
		{"unfenced", "→ unfenced, cleaned up"},
	}
	// In the order things happened (the Fence step ends when no volume is attached any more, after
	// the Pod moved).
	sort.SliceStable(rows, func(i, j int) bool { return r.seen[rows[i].name].Before(r.seen[rows[j].name]) })
	for _, row := range rows {
		if t, ok := r.seen[row.name]; ok {
			fmt.Printf("  %-32s %6.2f\n", row.label, t.Sub(r.faultAt).Seconds())
		}
	}
	confirmed, ok1 := r.seen["fence confirmed"]
	attached, ok2 := r.seen["attached elsewhere"]
	if ok1 && ok2 {
		fmt.Printf("Volume attached elsewhere %.2f s after the fence was confirmed.\n", attached.Sub(confirmed).Seconds())
	}
}

func workerMachines(ctx context.Context, sb *sandbox.Sandbox, ns string) ([]clusterv1.Machine, error) {
	list := &clusterv1.MachineList{}
	if err := sb.Client.List(ctx, list, client.InNamespace(ns)); err != nil {
		return nil, err
	}
	var out []clusterv1.Machine
	for _, m := range list.Items {
		if _, cp := m.Labels[clusterv1.MachineControlPlaneLabel]; cp || !m.DeletionTimestamp.IsZero() {
			continue
		}
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func poll(ctx context.Context, timeout time.Duration, f func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, err := f()
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			if err != nil {
				return err
			}
			return fmt.Errorf("not within %s", timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}
