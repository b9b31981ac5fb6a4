package storage

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capienv "github.com/capr-io/capr/test/envtest"
)

// Controllers are the kube-controller-manager v1.36 controllers that decide storage failover. The
// node lifecycle controller registers the pod index by node that taint eviction reads; the stack
// runs it with a grace period long enough that it never judges a node (a test says when a kubelet
// stops).
var Controllers = []string{
	capienv.NodeLifecycleController,
	capienv.AttachDetachController,
	capienv.PodGarbageCollectorController,
	"taint-eviction-controller",
	"persistentvolume-binder-controller",
}

// CRDDir is the directory of csi-addons' CRDs, which an environment running a Stack installs
// (capienv.Options.ExtraCRDDirs).
func CRDDir() (string, error) {
	root, err := capienv.ModuleRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "test", "crds", "csiaddons"), nil
}

// Stack is the storage-failover stack on an environment: kube-controller-manager, the stand-in CSI
// driver and the external-attacher, csi-addons' controller and the stand-in csi-addons sidecar.
type Stack struct {
	KCM       *capienv.KubeControllerManager
	Driver    *Driver
	Attacher  *Attacher
	Sidecar   *Sidecar
	CSIAddons *CSIAddons
	dir       string
}

// StackOptions configure StartStackWith.
type StackOptions struct {
	// WithoutKubeControllerManager: the environment already runs kube-controller-manager with
	// Controllers (e.g. the kubeadm sandbox's, whose node lifecycle controller must stay its own).
	WithoutKubeControllerManager bool
}

// StartStack starts the stack (the driver before the attacher, which exits without it; the sidecar
// before its registration) and registers the driver (CSIDriver, attach required). The environment
// must have csi-addons' CRDs (CRDDir).
func StartStack(ctx context.Context, env *capienv.Environment) (*Stack, error) {
	return StartStackWith(ctx, env, StackOptions{})
}

// StartStackWith is StartStack with options.
func StartStackWith(ctx context.Context, env *capienv.Environment, opts StackOptions) (*Stack, error) {
	dir, err := os.MkdirTemp("", "capr-storage-")
	if err != nil {
		return nil, err
	}
	s := &Stack{dir: dir}
	if !opts.WithoutKubeControllerManager {
		if s.KCM, err = env.StartKubeControllerManager(ctx, capienv.KubeControllerManagerOptions{
			Controllers: Controllers, NodeMonitorGracePeriod: 24 * time.Hour}); err != nil {
			s.Stop()
			return nil, err
		}
	}
	if s.Driver, err = StartDriver(dir); err != nil {
		s.Stop()
		return nil, err
	}
	if s.Attacher, err = StartAttacher(ctx, env, s.Driver, dir); err != nil {
		s.Stop()
		return nil, err
	}
	if s.Sidecar, err = StartSidecar(); err != nil {
		s.Stop()
		return nil, err
	}
	if s.CSIAddons, err = StartCSIAddons(ctx, env, dir); err != nil {
		s.Stop()
		return nil, err
	}
	if err := s.Sidecar.Register(ctx, env.Client); err != nil {
		s.Stop()
		return nil, fmt.Errorf("registering the csi-addons sidecar: %w", err)
	}
	err = env.Client.Create(ctx, &storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: DriverName},
		Spec: storagev1.CSIDriverSpec{AttachRequired: ptr.To(true)}})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		s.Stop()
		return nil, fmt.Errorf("registering the CSI driver: %w", err)
	}
	return s, nil
}

// Logs returns the last lines of the attacher's and kube-controller-manager's logs.
func (s *Stack) Logs(n int) string {
	out := ""
	if s.Attacher != nil {
		out += "csi-attacher log (last lines):\n" + s.Attacher.LogTail(n) + "\n"
	}
	if s.CSIAddons != nil {
		out += "csi-addons log (last lines):\n" + s.CSIAddons.LogTail(n) + "\n"
	}
	if s.KCM != nil {
		out += "kube-controller-manager log (last lines):\n" + s.KCM.LogTail(n) + "\n"
	}
	return out
}

// Stop stops the attacher before the driver (it exits when the socket goes), then the rest.
func (s *Stack) Stop() {
	if s.CSIAddons != nil {
		s.CSIAddons.Kill()
	}
	if s.Sidecar != nil {
		s.Sidecar.Stop()
	}
	if s.Attacher != nil {
		s.Attacher.Stop()
	}
	if s.Driver != nil {
		s.Driver.Stop()
	}
	if s.KCM != nil {
		s.KCM.Stop()
	}
	_ = os.RemoveAll(s.dir)
}

// Workload writes what the kubelet, the scheduler and a user would write in a namespace: Nodes,
// a volume, pods, and a live kubelet's status. Status is patched, never updated: kube-controller-
// manager writes the same Nodes and Pods (taints, volumesAttached), and an update would conflict.
type Workload struct {
	C  client.Client
	NS string
}

// Node creates a Ready Node whose volumes kube-controller-manager attaches and detaches, and its
// CSINode (what the kubelet and the driver's node-driver-registrar register).
func (w Workload) Node(ctx context.Context, name, ip string) error {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{
		"volumes.kubernetes.io/controller-managed-attach-detach": "true"}}}
	if err := w.C.Create(ctx, n); err != nil {
		return err
	}
	base := n.DeepCopy()
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	if err := w.C.Status().Patch(ctx, n, client.MergeFrom(base)); err != nil {
		return err
	}
	return w.C.Create(ctx, &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: storagev1.CSINodeSpec{
		Drivers: []storagev1.CSINodeDriver{{Name: DriverName, NodeID: name}}}})
}

// AttachableNode makes an existing Node one whose volumes kube-controller-manager attaches and
// detaches (the annotation the kubelet sets) with the stand-in driver registered on it (its CSINode).
func (w Workload) AttachableNode(ctx context.Context, name string) error {
	n := &corev1.Node{}
	if err := w.C.Get(ctx, client.ObjectKey{Name: name}, n); err != nil {
		return err
	}
	base := n.DeepCopy()
	if n.Annotations == nil {
		n.Annotations = map[string]string{}
	}
	n.Annotations["volumes.kubernetes.io/controller-managed-attach-detach"] = "true"
	if err := w.C.Patch(ctx, n, client.MergeFrom(base)); err != nil {
		return err
	}
	return w.C.Create(ctx, &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: storagev1.CSINodeSpec{
		Drivers: []storagev1.CSINodeDriver{{Name: DriverName, NodeID: name}}}})
}

// Volume creates a single-node-writer PersistentVolume pv-<name> of the stand-in driver pre-bound to
// claim <name>, and the claim (the binder controller binds them). It returns the volume handle.
func (w Workload) Volume(ctx context.Context, name string) (string, error) {
	handle := "vol-" + w.NS + "-" + name
	if err := w.C.Create(ctx, &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: w.PV(name)}, Spec: corev1.PersistentVolumeSpec{
		Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
		AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
		ClaimRef:                      &corev1.ObjectReference{Namespace: w.NS, Name: name},
		PersistentVolumeSource:        corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: DriverName, VolumeHandle: handle}},
	}}); err != nil {
		return "", err
	}
	return handle, w.C.Create(ctx, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: w.NS, Name: name}, Spec: corev1.PersistentVolumeClaimSpec{
		AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		VolumeName:       w.PV(name),
		StorageClassName: ptr.To(""),
	}})
}

// PV is the name of the PersistentVolume of claim name.
func (w Workload) PV(name string) string { return "pv-" + w.NS + "-" + name }

// Pod creates a pod on a node (the scheduler's part) using the claim.
func (w Workload) Pod(ctx context.Context, name, claim, nodeName string) (*corev1.Pod, error) {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: w.NS, Name: name}, Spec: corev1.PodSpec{
		NodeName:   nodeName,
		Containers: []corev1.Container{{Name: "db", Image: "db", VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}},
		Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}},
	}}
	return p, w.C.Create(ctx, p)
}

// AttachedTo returns the nodes the PersistentVolume's VolumeAttachments are attached to.
func (w Workload) AttachedTo(ctx context.Context, pv string) ([]string, error) {
	list := &storagev1.VolumeAttachmentList{}
	if err := w.C.List(ctx, list); err != nil {
		return nil, err
	}
	var out []string
	for _, va := range list.Items {
		if ptr.Deref(va.Spec.Source.PersistentVolumeName, "") == pv && va.Status.Attached {
			out = append(out, va.Spec.NodeName)
		}
	}
	return out, nil
}

// RunningOn plays the kubelet of a live node once the volume is attached: the volume is in use and
// the pod runs (what a dead kubelet leaves frozen).
func (w Workload) RunningOn(ctx context.Context, p *corev1.Pod, nodeName, handle string) error {
	n := &corev1.Node{}
	if err := w.C.Get(ctx, client.ObjectKey{Name: nodeName}, n); err != nil {
		return err
	}
	base := n.DeepCopy()
	n.Status.VolumesInUse = []corev1.UniqueVolumeName{corev1.UniqueVolumeName("kubernetes.io/csi/" + DriverName + "^" + handle)}
	if err := w.C.Status().Patch(ctx, n, client.MergeFrom(base)); err != nil {
		return err
	}
	if err := w.C.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
		return err
	}
	podBase := p.DeepCopy()
	p.Status.Phase = corev1.PodRunning
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "db", Image: "db", Ready: true, State: corev1.ContainerState{
		Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}}}
	return w.C.Status().Patch(ctx, p, client.MergeFrom(podBase))
}

// NotReady is what kube-controller-manager's node lifecycle controller makes of a node whose kubelet
// stopped: Ready=Unknown.
func (w Workload) NotReady(ctx context.Context, nodeName string) error {
	n := &corev1.Node{}
	if err := w.C.Get(ctx, client.ObjectKey{Name: nodeName}, n); err != nil {
		return err
	}
	base := n.DeepCopy()
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionUnknown, Reason: "NodeStatusUnknown",
		Message: "Kubelet stopped posting node status.", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	return w.C.Status().Patch(ctx, n, client.MergeFrom(base))
}
