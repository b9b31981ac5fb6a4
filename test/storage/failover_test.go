package storage_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/remediation/fencing"
	capienv "github.com/capr-io/capr/test/envtest"
	"github.com/capr-io/capr/test/storage"
)

var (
	testEnv  *capienv.Environment
	c        client.Client
	driver   *storage.Driver
	attacher *storage.Attacher
	kcm      *capienv.KubeControllerManager
	ctx      = context.Background()
)

// The controllers of kube-controller-manager that decide storage failover (names of v1.36). The node
// lifecycle controller registers the pod index by node that taint eviction reads; its grace period is
// long enough that it never judges a node here (the tests say when a kubelet stops).
var storageControllers = []string{
	capienv.NodeLifecycleController,
	capienv.AttachDetachController,
	capienv.PodGarbageCollectorController,
	"taint-eviction-controller",
	"persistentvolume-binder-controller",
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	var err error
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if testEnv, err = capienv.Start(capienv.Options{WithoutManagerIdentity: true}); err != nil {
		return fail(err)
	}
	defer func() { _ = testEnv.Stop() }()
	c = testEnv.Client
	dir, err := os.MkdirTemp("", "capr-storage-")
	if err != nil {
		return fail(err)
	}
	defer func() { _ = os.RemoveAll(dir) }()
	if kcm, err = testEnv.StartKubeControllerManager(ctx, capienv.KubeControllerManagerOptions{
		Controllers: storageControllers, NodeMonitorGracePeriod: time.Hour}); err != nil {
		return fail(err)
	}
	defer kcm.Stop()
	if driver, err = storage.StartDriver(dir); err != nil {
		return fail(err)
	}
	defer driver.Stop()
	if attacher, err = storage.StartAttacher(ctx, testEnv, driver, dir); err != nil {
		return fail(err)
	}
	defer attacher.Stop() // before the driver: it exits when the socket goes
	code := m.Run()
	if code != 0 {
		fmt.Fprintf(os.Stderr, "csi-attacher log (last lines):\n%s\nkube-controller-manager log (last lines):\n%s\n", attacher.LogTail(30), kcm.LogTail(30))
	}
	return code
}

// node creates a Ready Node whose volumes kube-controller-manager attaches and detaches, and its
// CSINode (what the kubelet and the driver's node-driver-registrar register).
func node(g Gomega, name, ip string) {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{
		"volumes.kubernetes.io/controller-managed-attach-detach": "true"}}}
	g.Expect(c.Create(ctx, n)).To(Succeed())
	// Status is patched, never updated, here and below: kube-controller-manager writes the same
	// Nodes and Pods (taints, volumesAttached), and an update would conflict with it.
	base := n.DeepCopy()
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	g.Expect(c.Status().Patch(ctx, n, client.MergeFrom(base))).To(Succeed())
	g.Expect(c.Create(ctx, &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: storagev1.CSINodeSpec{
		Drivers: []storagev1.CSINodeDriver{{Name: storage.DriverName, NodeID: name}}}})).To(Succeed())
}

// volume creates a single-node-writer PersistentVolume of the stand-in driver pre-bound to a claim
// in ns, and the claim (the binder controller binds them).
func volume(g Gomega, ns, name string) string {
	handle := "vol-" + name
	g.Expect(c.Create(ctx, &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-" + name}, Spec: corev1.PersistentVolumeSpec{
		Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
		AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
		ClaimRef:                      &corev1.ObjectReference{Namespace: ns, Name: name},
		PersistentVolumeSource:        corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: storage.DriverName, VolumeHandle: handle}},
	}})).To(Succeed())
	g.Expect(c.Create(ctx, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.PersistentVolumeClaimSpec{
		AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		VolumeName:       "pv-" + name,
		StorageClassName: ptr.To(""),
	}})).To(Succeed())
	return handle
}

// pod creates the workload's pod on a node (the scheduler's part) using the claim.
func pod(g Gomega, ns, name, claim, nodeName string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.PodSpec{
		NodeName:   nodeName,
		Containers: []corev1.Container{{Name: "db", Image: "db", VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}},
		Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}},
	}}
	g.Expect(c.Create(ctx, p)).To(Succeed())
	return p
}

// attachedTo returns the nodes the volume's VolumeAttachments are attached to.
func attachedTo(g Gomega, pv string) []string {
	list := &storagev1.VolumeAttachmentList{}
	g.Expect(c.List(ctx, list)).To(Succeed())
	var out []string
	for _, va := range list.Items {
		if ptr.Deref(va.Spec.Source.PersistentVolumeName, "") == pv && va.Status.Attached {
			out = append(out, va.Spec.NodeName)
		}
	}
	return out
}

// runningOn plays the kubelet of a live node once the volume is attached: the volume is in use and
// the pod runs (what a dead kubelet leaves frozen).
func runningOn(g Gomega, p *corev1.Pod, nodeName, handle string) {
	n := &corev1.Node{}
	g.Expect(c.Get(ctx, client.ObjectKey{Name: nodeName}, n)).To(Succeed())
	base := n.DeepCopy()
	n.Status.VolumesInUse = []corev1.UniqueVolumeName{corev1.UniqueVolumeName("kubernetes.io/csi/" + storage.DriverName + "^" + handle)}
	g.Expect(c.Status().Patch(ctx, n, client.MergeFrom(base))).To(Succeed())
	g.Expect(c.Get(ctx, client.ObjectKeyFromObject(p), p)).To(Succeed())
	podBase := p.DeepCopy()
	p.Status.Phase = corev1.PodRunning
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "db", Image: "db", Ready: true, State: corev1.ContainerState{
		Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}}}
	g.Expect(c.Status().Patch(ctx, p, client.MergeFrom(podBase))).To(Succeed())
}

// notReady is what kube-controller-manager's node lifecycle controller makes of a node whose kubelet
// stopped: Ready=Unknown.
func notReady(g Gomega, nodeName string) {
	n := &corev1.Node{}
	g.Expect(c.Get(ctx, client.ObjectKey{Name: nodeName}, n)).To(Succeed())
	base := n.DeepCopy()
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionUnknown, Reason: "NodeStatusUnknown",
		Message: "Kubelet stopped posting node status.", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	g.Expect(c.Status().Patch(ctx, n, client.MergeFrom(base))).To(Succeed())
}

// TestOutOfServiceTaintMovesTheVolumeWithoutASecondWriter: a pod with a ReadWriteOnce volume runs on
// node A; A's kubelet stops. Without the out-of-service taint the volume stays attached to A (its
// pod cannot finish terminating without a kubelet, and kube-controller-manager waits for the
// unmount). After CAPR's backend taints A (the fence having been confirmed before, see
// TestOutOfServiceTaintOnlyAfterAConfirmedFence), the real controllers evict and delete the pod and
// detach the volume; the backend confirms once no VolumeAttachment names A, and the pod's
// replacement on B gets the volume, never while A had it.
func TestOutOfServiceTaintMovesTheVolumeWithoutASecondWriter(t *testing.T) {
	g := NewWithT(t)
	ns, err := capienv.CreateNamespace(ctx, c, "failover")
	g.Expect(err).NotTo(HaveOccurred())
	node(g, "node-a", "10.1.0.1")
	node(g, "node-b", "10.1.0.2")
	g.Expect(c.Create(ctx, &storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: storage.DriverName},
		Spec: storagev1.CSIDriverSpec{AttachRequired: ptr.To(true)}})).To(Succeed())
	handle := volume(g, ns, "data")

	web := pod(g, ns, "web-0", "data", "node-a")
	g.Eventually(func(g Gomega) []string { return attachedTo(g, "pv-data") }, time.Minute, 200*time.Millisecond).Should(Equal([]string{"node-a"}))
	g.Expect(driver.PublishedTo(handle)).To(Equal("node-a"))
	runningOn(g, web, "node-a", handle)

	fault := time.Now()
	notReady(g, "node-a")
	// Longer than pod GC's period (20 s): nothing frees the volume without the taint.
	g.Consistently(func(g Gomega) []string { return attachedTo(g, "pv-data") }, 22*time.Second, time.Second).Should(Equal([]string{"node-a"}))

	backend := &fencing.OutOfServiceTaintBackend{
		Workload:      func(context.Context, client.ObjectKey) (client.Client, error) { return c, nil },
		ServerVersion: fencing.DiscoveryServerVersion(func(context.Context, client.ObjectKey) (*rest.Config, error) { return testEnv.Config, nil }),
	}
	spec := caprv1.FencingBackend{Type: caprv1.FencingBackendOutOfServiceTaint}
	req := fencing.Request{Cluster: &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "wc"}},
		Machine: &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "m-a"}}, Node: "node-a"}
	tainted := time.Now()
	done, msg, err := backend.Fence(ctx, req, spec)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(done).To(BeFalse())
	g.Expect(msg).To(ContainSubstring("waiting for kube-controller-manager to detach 1 volume(s)"))

	var podGone time.Time
	g.Eventually(func(g Gomega) {
		err := c.Get(ctx, client.ObjectKeyFromObject(web), &corev1.Pod{})
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "pod still there: %v", err)
	}, 2*time.Minute, 200*time.Millisecond).Should(Succeed(), "taint eviction and pod GC delete the pod of the out-of-service node")
	podGone = time.Now()
	var detached time.Time
	g.Eventually(func(g Gomega) {
		done, msg, err := backend.Fence(ctx, req, spec)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(done).To(BeTrue(), msg)
	}, 2*time.Minute, 200*time.Millisecond).Should(Succeed())
	detached = time.Now()
	g.Expect(driver.PublishedTo(handle)).To(BeEmpty(), "ControllerUnpublish reached the storage system")

	moved := pod(g, ns, "web-0", "data", "node-b") // the StatefulSet's replacement, scheduled to B
	g.Eventually(func(g Gomega) []string { return attachedTo(g, "pv-data") }, time.Minute, 200*time.Millisecond).Should(Equal([]string{"node-b"}))
	attached := time.Now()
	runningOn(g, moved, "node-b", handle)
	g.Expect(driver.PublishedTo(handle)).To(Equal("node-b"))
	g.Expect(driver.Refused()).To(BeEmpty(), "never asked to publish while published elsewhere")
	g.Expect(driver.CheckSingleWriter()).To(Succeed())

	done, _, err = backend.Unfence(ctx, req, spec)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(done).To(BeTrue())
	n := &corev1.Node{}
	g.Expect(c.Get(ctx, client.ObjectKey{Name: "node-a"}, n)).To(Succeed())
	g.Expect(n.Spec.Taints).NotTo(ContainElement(HaveField("Key", corev1.TaintNodeOutOfService)))

	t.Logf("timeline from the fault (node-a Ready=Unknown): waited %s without the taint (volume stayed on node-a); tainted at +%s; pod gone +%s; detached from node-a +%s; attached to node-b +%s",
		tainted.Sub(fault).Round(100*time.Millisecond), tainted.Sub(fault).Round(100*time.Millisecond), podGone.Sub(fault).Round(100*time.Millisecond),
		detached.Sub(fault).Round(100*time.Millisecond), attached.Sub(fault).Round(100*time.Millisecond))
}
