package sandbox

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/utils/ptr"
	capikcpv1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/etcdutil"
	controlplanev1 "github.com/capr-io/capr/test/sandbox/api/controlplane/v1alpha1"
	infrav1 "github.com/capr-io/capr/test/sandbox/api/infrastructure/v1alpha1"
)

// machineFinalizer keeps a sandbox Machine until its host (kubelet, etcd member, Node) is gone.
const machineFinalizer = "sandbox.capr.io/machine"

func ctrlConfigSkipNameValidation() config.Controller {
	// Tests start several managers in one process (sandboxes, restarted controllers).
	return config.Controller{SkipNameValidation: ptr.To(true)}
}

// controlPlaneReconciler is the sandbox control-plane provider: it keeps spec.replicas control-plane
// Machines, one change at a time (like KCP it waits for a new Machine to be provisioned, or a deleted
// one to be gone, before the next change), and picks the scale-down victim by the
// cluster.x-k8s.io/delete-machine annotation first, then the oldest Machine.
type controlPlaneReconciler struct {
	s *Sandbox
	c client.Client
	// seenReplicas is the spec.replicas last logged per SandboxControlPlane: a change (CAPR's surge
	// and its return) goes into the event log as the provider first sees it.
	seenReplicas sync.Map
	// expected is, per SandboxControlPlane, the Machine the provider last created or deleted until its
	// cache shows that (expectations, as Kubernetes' ReplicaSet controller keeps them). Without it,
	// a reconcile brought by its own status patch lists Machines from a cache that does not show the
	// Machine it just created yet, creates a second one, and then scales down the oldest Machine, which
	// may be an unhealthy one, unfenced.
	expected sync.Map
	// refused is, per SandboxControlPlane, why it last did not scale up (KCPPreflightAnnotation),
	// logged when it changes.
	refused sync.Map
}

// expectation is a Machine the provider created (or deleted) and waits to see in its cache.
type expectation struct {
	machine string
	deleted bool
	at      time.Time
}

// expectationTimeout bounds the wait for the cache: after it the provider acts on what it sees.
const expectationTimeout = 30 * time.Second

// awaited reports whether the cache does not show the provider's last change yet.
func (r *controlPlaneReconciler) awaited(key types.NamespacedName, machines []clusterv1.Machine) bool {
	v, ok := r.expected.Load(key)
	if !ok {
		return false
	}
	e, _ := v.(expectation)
	seen := e.deleted // a deleted Machine the list does not have is gone: seen
	for _, m := range machines {
		if m.Name == e.machine {
			seen = !e.deleted || !m.DeletionTimestamp.IsZero()
			break
		}
	}
	if seen || time.Since(e.at) > expectationTimeout {
		r.expected.Delete(key)
		return false
	}
	return true
}

func (r *controlPlaneReconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, reterr error) {
	cp := &controlplanev1.SandboxControlPlane{}
	if err := r.c.Get(ctx, req.NamespacedName, cp); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	clusterName := cp.Labels[clusterv1.ClusterNameLabel]
	if r.s.cluster(cp.Namespace, clusterName) == nil {
		return ctrl.Result{}, nil // destroyed (DestroyCluster) or not made by CreateCluster
	}
	// The generation read is recorded as observed at the end of a reconcile that returned no error,
	// as KCP does (cluster-api v1.14.2, controlplane/kubeadm/reconcilers/kubeadmcontrolplane:
	// kubeadmcontrolplane_controller.go, the deferred patch with patch.WithStatusObservedGeneration):
	// once status.observedGeneration reaches a generation, no reconcile that read an older spec is
	// still running, which CAPR's undo waits for (remediation/controlplane/undo.go).
	generation := cp.Generation
	defer func() {
		if reterr == nil {
			reterr = r.observed(ctx, cp, generation)
		}
	}()
	if replicas := ptr.Deref(cp.Spec.Replicas, 1); replicas != ptr.Deref(r.loadSeenReplicas(req.NamespacedName), -1) {
		r.seenReplicas.Store(req.NamespacedName, replicas)
		r.s.Log.Add(LogKey(cp.Namespace, clusterName), "control-plane provider sees replicas %d", replicas)
	}
	list := &clusterv1.MachineList{}
	if err := r.c.List(ctx, list, client.InNamespace(cp.Namespace),
		client.MatchingLabels{clusterv1.ClusterNameLabel: clusterName}, client.HasLabels{clusterv1.MachineControlPlaneLabel}); err != nil {
		return ctrl.Result{}, err
	}
	machines := list.Items
	ready, busy := 0, false
	for _, m := range machines {
		if !m.DeletionTimestamp.IsZero() || !m.Status.NodeRef.IsDefined() {
			busy = true
		} else {
			ready++
		}
	}
	if err := r.updateStatus(ctx, cp, clusterName, int32(len(machines)), int32(ready)); err != nil {
		return ctrl.Result{}, err
	}
	if busy {
		return ctrl.Result{}, nil // a Machine event will bring us back
	}
	if r.awaited(req.NamespacedName, machines) {
		return ctrl.Result{RequeueAfter: 100 * time.Millisecond}, nil // the Machine event is on its way
	}
	desired := int(ptr.Deref(cp.Spec.Replicas, 1))
	switch {
	case len(machines) < desired:
		if why, err := r.kcpScaleUpRefusal(ctx, cp, machines); err != nil || why != "" {
			if last, _ := r.refused.Swap(req.NamespacedName, why); why != "" && last != why {
				r.s.Log.Add(LogKey(cp.Namespace, clusterName), "control-plane provider does not scale up: %s", why)
			}
			return ctrl.Result{RequeueAfter: time.Second}, err
		}
		r.refused.Delete(req.NamespacedName)
		name, err := r.createMachine(ctx, cp, clusterName, fmt.Sprintf("replicas %d, saw %s", desired, machineNames(machines)))
		if name != "" {
			r.expected.Store(req.NamespacedName, expectation{machine: name, at: time.Now()})
		}
		if err == nil {
			err = r.consumeRemediationInProgress(ctx, cp)
		}
		return ctrl.Result{}, err
	case len(machines) > desired:
		victim := pickScaleDownVictim(machines)
		_, marked := victim.Annotations[clusterv1.DeleteMachineAnnotation]
		r.s.Log.Add(LogKey(cp.Namespace, clusterName), "control-plane provider scales down: deleting Machine %s (replicas %d, saw %s; delete-machine on it: %t)",
			victim.Name, desired, machineNames(machines), marked)
		r.expected.Store(req.NamespacedName, expectation{machine: victim.Name, deleted: true, at: time.Now()})
		return ctrl.Result{}, client.IgnoreNotFound(r.c.Delete(ctx, victim))
	}
	return ctrl.Result{}, nil
}

// KCPPreflightAnnotation on a SandboxControlPlane ("true") makes the sandbox's provider scale up as
// KubeadmControlPlane does (controlplane/kubeadm reconcilers/kubeadmcontrolplane preflight.go,
// helpers.go createMachine): a Machine is created only when every control-plane Machine's Node is
// Ready, or when the control plane carries KCP's remediation-in-progress annotation, which the
// provider removes once it created the Machine. So with one unhealthy Machine it creates one
// replacement per annotation, not as many as the replicas ask for: what lets CAPR ask KCP for one
// replacement with a surge of two (remediation/controlplane firstreplacement.go).
const KCPPreflightAnnotation = "sandbox.capr.io/kcp-preflight"

// kcpScaleUpRefusal says why a control plane with KCPPreflightAnnotation would not get a Machine now
// ("" when it would, or without the annotation).
func (r *controlPlaneReconciler) kcpScaleUpRefusal(ctx context.Context, cp *controlplanev1.SandboxControlPlane, machines []clusterv1.Machine) (string, error) {
	if cp.Annotations[KCPPreflightAnnotation] != "true" {
		return "", nil
	}
	if _, ok := cp.Annotations[capikcpv1.RemediationInProgressAnnotation]; ok {
		return "", nil
	}
	for _, m := range machines {
		node := &corev1.Node{}
		if err := r.c.Get(ctx, client.ObjectKey{Name: m.Status.NodeRef.Name}, node); err != nil {
			return "", client.IgnoreNotFound(err)
		}
		ready := false
		for _, c := range node.Status.Conditions {
			ready = ready || c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue
		}
		if !ready {
			return fmt.Sprintf("the Node of Machine %s is not Ready and %s is not set (KCP's preflight)", m.Name, capikcpv1.RemediationInProgressAnnotation), nil
		}
	}
	return "", nil
}

// consumeRemediationInProgress removes KCP's remediation-in-progress once a Machine was created for
// it, as KCP does.
func (r *controlPlaneReconciler) consumeRemediationInProgress(ctx context.Context, cp *controlplanev1.SandboxControlPlane) error {
	if _, ok := cp.Annotations[capikcpv1.RemediationInProgressAnnotation]; !ok || cp.Annotations[KCPPreflightAnnotation] != "true" {
		return nil
	}
	base := cp.DeepCopy()
	delete(cp.Annotations, capikcpv1.RemediationInProgressAnnotation)
	return r.c.Patch(ctx, cp, client.MergeFrom(base))
}

// observed records generation as the control plane's status.observedGeneration (never lowering it).
func (r *controlPlaneReconciler) observed(ctx context.Context, cp *controlplanev1.SandboxControlPlane, generation int64) error {
	if cp.Status.ObservedGeneration >= generation {
		return nil
	}
	base := cp.DeepCopy()
	cp.Status.ObservedGeneration = generation
	return client.IgnoreNotFound(r.c.Status().Patch(ctx, cp, client.MergeFrom(base)))
}

func pickScaleDownVictim(machines []clusterv1.Machine) *clusterv1.Machine {
	sort.Slice(machines, func(i, j int) bool {
		_, di := machines[i].Annotations[clusterv1.DeleteMachineAnnotation]
		_, dj := machines[j].Annotations[clusterv1.DeleteMachineAnnotation]
		if di != dj {
			return di
		}
		if !machines[i].CreationTimestamp.Equal(&machines[j].CreationTimestamp) {
			return machines[i].CreationTimestamp.Before(&machines[j].CreationTimestamp)
		}
		return machines[i].Name < machines[j].Name
	})
	return &machines[0]
}

func (r *controlPlaneReconciler) loadSeenReplicas(key types.NamespacedName) *int32 {
	v, ok := r.seenReplicas.Load(key)
	if !ok {
		return nil
	}
	n, _ := v.(int32)
	return &n
}

// machineNames lists the Machines' names, for the event log (what the provider saw when it acted).
func machineNames(machines []clusterv1.Machine) string {
	names := make([]string, 0, len(machines))
	for _, m := range machines {
		names = append(names, m.Name)
	}
	sort.Strings(names)
	return fmt.Sprintf("%d Machines %v", len(names), names)
}

func (r *controlPlaneReconciler) createMachine(ctx context.Context, cp *controlplanev1.SandboxControlPlane, clusterName, why string) (string, error) {
	name := fmt.Sprintf("%s-%s", cp.Name, utilrand.String(5))
	infra := &infrav1.SandboxMachine{ObjectMeta: metav1.ObjectMeta{Namespace: cp.Namespace, Name: name,
		Labels: map[string]string{clusterv1.ClusterNameLabel: clusterName}}}
	if err := r.c.Create(ctx, infra); err != nil {
		return "", fmt.Errorf("creating SandboxMachine: %w", err)
	}
	m := &clusterv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: cp.Namespace, Name: name, Labels: map[string]string{
			clusterv1.ClusterNameLabel: clusterName, clusterv1.MachineControlPlaneLabel: "",
		}},
		Spec: clusterv1.MachineSpec{
			ClusterName: clusterName,
			Version:     cp.Spec.Version,
			Bootstrap:   clusterv1.Bootstrap{DataSecretName: ptr.To(name + "-bootstrap")},
			InfrastructureRef: clusterv1.ContractVersionedObjectReference{
				APIGroup: infrav1.GroupVersion.Group, Kind: "SandboxMachine", Name: name,
			},
		},
	}
	if err := controllerutil.SetControllerReference(cp, m, r.c.Scheme()); err != nil {
		return "", err
	}
	if err := r.c.Create(ctx, m); err != nil {
		return "", fmt.Errorf("creating Machine: %w", err)
	}
	r.s.Log.Add(LogKey(cp.Namespace, clusterName), "control-plane provider scales up: created Machine %s (%s)", name, why)
	return name, nil
}

func (r *controlPlaneReconciler) updateStatus(ctx context.Context, cp *controlplanev1.SandboxControlPlane, clusterName string, replicas, ready int32) error {
	base := cp.DeepCopy()
	cp.Status.Replicas, cp.Status.ReadyReplicas = ptr.To(replicas), ptr.To(ready)
	cp.Status.AvailableReplicas, cp.Status.UpToDateReplicas = ptr.To(ready), ptr.To(replicas)
	cp.Status.Version = cp.Spec.Version
	if ready > 0 && !ptr.Deref(cp.Status.Initialization.ControlPlaneInitialized, false) {
		cp.Status.Initialization.ControlPlaneInitialized = ptr.To(true)
		// CAPI's Cluster controller would mirror this onto the Cluster.
		cluster := &clusterv1.Cluster{}
		if err := r.c.Get(ctx, client.ObjectKey{Namespace: cp.Namespace, Name: clusterName}, cluster); err != nil {
			return err
		}
		cbase := cluster.DeepCopy()
		conditions.Set(cluster, metav1.Condition{Type: clusterv1.ClusterControlPlaneInitializedCondition, Status: metav1.ConditionTrue, Reason: "Initialized"})
		cluster.Status.Initialization.ControlPlaneInitialized = ptr.To(true)
		if err := r.c.Status().Patch(ctx, cluster, client.MergeFrom(cbase)); err != nil {
			return err
		}
	}
	return r.c.Status().Patch(ctx, cp, client.MergeFrom(base))
}

// machineReconciler is the sandbox infrastructure provider plus the parts of CAPI's Machine
// controller the sandbox needs: provisioning a Machine starts its kubelet stand-in and, for a
// control-plane Machine, joins an etcd member (first member, or learner then promoted); it creates the
// Node and the etcd-<node> Pod and sets the Machine's nodeRef. Deleting a Machine does what
// `kubeadm reset` and CAPI's deletion do: remove the member if it is still there, stop it, delete the
// Node, and (standing in for the garbage collector) the objects the Machine owns.
type machineReconciler struct {
	s *Sandbox
	c client.Client
	// deleting records the Machines whose deletion was seen (logged once, at the first sight).
	deleting sync.Map
}

func (r *machineReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	m := &clusterv1.Machine{}
	if err := r.c.Get(ctx, req.NamespacedName, m); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if m.Spec.InfrastructureRef.Kind != "SandboxMachine" {
		return ctrl.Result{}, nil
	}
	wc := r.s.cluster(m.Namespace, m.Spec.ClusterName)
	if wc == nil {
		return ctrl.Result{}, nil
	}
	if !m.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, r.teardown(ctx, wc, m)
	}
	if controllerutil.AddFinalizer(m, machineFinalizer) {
		return ctrl.Result{}, r.c.Update(ctx, m)
	}
	if m.Status.NodeRef.IsDefined() {
		return ctrl.Result{}, nil
	}
	if wc.holdProvisioning.Load() {
		return ctrl.Result{RequeueAfter: time.Second}, nil
	}
	return ctrl.Result{}, r.provision(ctx, wc, m)
}

func (r *machineReconciler) provision(ctx context.Context, wc *WorkloadCluster, m *clusterv1.Machine) error {
	node := m.Name
	_, isCP := m.Labels[clusterv1.MachineControlPlaneLabel]
	target := ""
	if isCP {
		if wc.Etcd.Endpoint(node) == "" {
			first, err := wc.Etcd.Provision(ctx, node, func(first bool) {
				if !first {
					r.s.Log.Add(wc.LogKey(), "etcd member %s joining as a learner", node)
				}
			})
			if err != nil {
				return err
			}
			if first {
				r.s.Log.Add(wc.LogKey(), "etcd member %s started (first member)", node)
			} else {
				r.s.Log.Add(wc.LogKey(), "etcd member %s promoted to voter", node)
			}
		}
		target = wc.Etcd.Endpoint(node)
	}
	r.s.mu.Lock()
	k, ok := r.s.kubelets[node]
	if !ok {
		k = StartKubelet(target)
		r.s.kubelets[node] = k
	}
	r.s.mu.Unlock()
	host, port := k.Address()

	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, Labels: map[string]string{"sandbox.capr.io/cluster": wc.Name}}}
	if isCP {
		n.Labels["node-role.kubernetes.io/control-plane"] = ""
	}
	firstTime := true
	if err := r.c.Create(ctx, n); err != nil {
		if !isAlreadyExists(err) {
			return fmt.Errorf("creating Node %s: %w", node, err)
		}
		firstTime = false // a second pass from a stale cache: already provisioned
	}
	now := metav1.Now()
	n.Status = corev1.NodeStatus{
		Addresses:       []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: host}, {Type: corev1.NodeHostName, Address: host}},
		DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: port}},
		Conditions:      []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastTransitionTime: now, LastHeartbeatTime: now}},
	}
	if err := r.c.Status().Update(ctx, n); err != nil {
		return fmt.Errorf("setting Node %s status: %w", node, err)
	}
	if isCP {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: etcdutil.PodName(node), Labels: map[string]string{"component": "etcd"}},
			Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "etcd", Image: "registry.k8s.io/etcd:3.6.14"}}},
		}
		if err := r.c.Create(ctx, pod); err != nil && !isAlreadyExists(err) {
			return fmt.Errorf("creating Pod %s: %w", pod.Name, err)
		}
		pbase := pod.DeepCopy()
		pod.Status.Phase = corev1.PodRunning
		if err := r.c.Status().Patch(ctx, pod, client.MergeFrom(pbase)); err != nil {
			return fmt.Errorf("setting Pod %s running: %w", pod.Name, err)
		}
	}
	infra := &infrav1.SandboxMachine{}
	if err := r.c.Get(ctx, client.ObjectKey{Namespace: m.Namespace, Name: m.Spec.InfrastructureRef.Name}, infra); err == nil {
		ibase := infra.DeepCopy()
		infra.Spec.ProviderID = "sandbox://" + node
		if err := r.c.Patch(ctx, infra, client.MergeFrom(ibase)); err != nil {
			return err
		}
		infra.Status.Initialization.Provisioned = ptr.To(true)
		infra.Status.Addresses = []clusterv1.MachineAddress{{Type: clusterv1.MachineInternalIP, Address: host}}
		if err := r.c.Status().Patch(ctx, infra, client.MergeFrom(ibase)); err != nil {
			return err
		}
	}
	base := m.DeepCopy()
	m.Status.NodeRef = clusterv1.MachineNodeReference{Name: node}
	m.Status.Phase = string(clusterv1.MachinePhaseRunning)
	m.Status.Initialization.InfrastructureProvisioned = ptr.To(true)
	m.Status.Initialization.BootstrapDataSecretCreated = ptr.To(true)
	conditions.Set(m, metav1.Condition{Type: clusterv1.MachineInfrastructureReadyCondition, Status: metav1.ConditionTrue, Reason: "Provisioned"})
	if err := r.c.Status().Patch(ctx, m, client.MergeFrom(base)); err != nil {
		return fmt.Errorf("setting nodeRef of Machine %s: %w", m.Name, err)
	}
	if firstTime {
		r.s.Log.Add(wc.LogKey(), "Machine %s provisioned: Node %s Ready", m.Name, node)
	}
	return nil
}

// powerOff is a machine going away: its kubelet stops and, as `kubeadm reset` does, its etcd member is
// removed if still there (a member that cannot be removed, e.g. without quorum, is left to the
// operator) and its process stopped either way.
func (s *Sandbox) powerOff(ctx context.Context, wc *WorkloadCluster, node string, controlPlane bool) {
	s.mu.Lock()
	k := s.kubelets[node]
	delete(s.kubelets, node)
	s.mu.Unlock()
	if k != nil {
		k.Stop()
	}
	if !controlPlane || wc.Etcd.Endpoint(node) == "" {
		return
	}
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := wc.Etcd.Leave(lctx, node); err != nil {
		s.Log.Add(wc.LogKey(), "etcd member %s could not be removed on teardown: %v", node, err)
	}
}

func (r *machineReconciler) teardown(ctx context.Context, wc *WorkloadCluster, m *clusterv1.Machine) error {
	if !controllerutil.ContainsFinalizer(m, machineFinalizer) {
		return nil
	}
	if _, seen := r.deleting.LoadOrStore(m.UID, true); !seen {
		r.s.Log.Add(wc.LogKey(), "Machine %s is being deleted", m.Name)
	}
	// As CAPI's Machine controller (core/reconcilers/machine reconcileDelete): nothing is drained or
	// deleted while a pre-drain hook remains, but pre-drain hooks count only for a Machine whose Node
	// it may delete (isDeleteNodeAllowed: a nodeRef, among others); then nothing is terminated while a
	// pre-terminate hook remains, whatever the Node. A hook's removal is an update of the Machine,
	// which reconciles it again.
	for k := range m.Annotations {
		if strings.HasPrefix(k, clusterv1.PreDrainDeleteHookAnnotationPrefix+"/") && m.Status.NodeRef.IsDefined() ||
			strings.HasPrefix(k, clusterv1.PreTerminateDeleteHookAnnotationPrefix+"/") {
			return nil
		}
	}
	node := m.Name
	_, isCP := m.Labels[clusterv1.MachineControlPlaneLabel]
	r.s.powerOff(ctx, wc, node, isCP)
	for _, o := range []client.Object{
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: etcdutil.PodName(node)}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}},
		&infrav1.SandboxMachine{ObjectMeta: metav1.ObjectMeta{Namespace: m.Namespace, Name: m.Spec.InfrastructureRef.Name}},
	} {
		if err := r.c.Delete(ctx, o); err != nil && !isNotFound(err) {
			return fmt.Errorf("deleting %T %s: %w", o, o.GetName(), err)
		}
	}
	// Garbage collection stand-in: a MachineRemediation still owned by the Machine goes with it.
	mr := &caprv1.MachineRemediation{}
	if err := r.c.Get(ctx, client.ObjectKey{Namespace: m.Namespace, Name: m.Name}, mr); err == nil {
		for _, ref := range mr.OwnerReferences {
			if ref.UID == m.UID {
				if err := r.c.Delete(ctx, mr); err != nil && !isNotFound(err) {
					return err
				}
			}
		}
	}
	controllerutil.RemoveFinalizer(m, machineFinalizer)
	if err := r.c.Update(ctx, m); err != nil {
		return err
	}
	r.s.Log.Add(wc.LogKey(), "Machine %s deleted (Node, kubelet and etcd process gone)", m.Name)
	return nil
}
