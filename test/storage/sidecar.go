package storage

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"slices"
	"sync"
	"time"

	"github.com/csi-addons/spec/lib/go/identity"
	"google.golang.org/grpc"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	capienv "github.com/capr-io/capr/test/envtest"
	"github.com/capr-io/capr/test/storage/csiaddonsproto"
)

// The stand-in sidecar's place in the cluster, as the real sidecar would register it.
const (
	CSIAddonsNamespace = "csi-addons-system"
	sidecarPod         = "fakestorage-0"
)

// FenceCall is one fence or unfence the sidecar received from csi-addons' controller.
type FenceCall struct {
	Fence bool
	CIDRs []string
	Time  time.Time
}

// Sidecar stands in for the driver's csi-addons sidecar: it serves csi-addons' Identity service and
// the NetworkFence service csi-addons' controller calls (csiaddonsproto), on 127.0.0.1, and records
// which CIDRs the storage system has fenced. Register does the real sidecar's Kubernetes duties.
type Sidecar struct {
	identity.UnimplementedIdentityServer
	csiaddonsproto.UnimplementedNetworkFenceServer

	Port int

	mu     sync.Mutex
	fenced map[string]bool
	calls  []FenceCall
	server *grpc.Server
}

// StartSidecar serves the stand-in sidecar on a free port of 127.0.0.1.
func StartSidecar() (*Sidecar, error) {
	lis, err := capienv.Listen()
	if err != nil {
		return nil, fmt.Errorf("listening for the csi-addons sidecar: %w", err)
	}
	s := &Sidecar{Port: lis.Addr().(*net.TCPAddr).Port, fenced: map[string]bool{}, server: grpc.NewServer()}
	identity.RegisterIdentityServer(s.server, s)
	csiaddonsproto.RegisterNetworkFenceServer(s.server, s)
	go func() { _ = s.server.Serve(lis) }()
	return s, nil
}

// Stop stops serving.
func (s *Sidecar) Stop() { s.server.Stop() }

// GetIdentity implements identity.IdentityServer.
func (s *Sidecar) GetIdentity(context.Context, *identity.GetIdentityRequest) (*identity.GetIdentityResponse, error) {
	return &identity.GetIdentityResponse{Name: DriverName, VendorVersion: "v0.0.0-stand-in"}, nil
}

// GetCapabilities implements identity.IdentityServer: a controller service that fences networks.
func (s *Sidecar) GetCapabilities(context.Context, *identity.GetCapabilitiesRequest) (*identity.GetCapabilitiesResponse, error) {
	return &identity.GetCapabilitiesResponse{Capabilities: []*identity.Capability{
		{Type: &identity.Capability_Service_{Service: &identity.Capability_Service{Type: identity.Capability_Service_CONTROLLER_SERVICE}}},
		{Type: &identity.Capability_NetworkFence_{NetworkFence: &identity.Capability_NetworkFence{Type: identity.Capability_NetworkFence_NETWORK_FENCE}}},
	}}, nil
}

// Probe implements identity.IdentityServer.
func (s *Sidecar) Probe(context.Context, *identity.ProbeRequest) (*identity.ProbeResponse, error) {
	return &identity.ProbeResponse{}, nil
}

// FenceClusterNetwork implements csiaddonsproto.NetworkFenceServer.
func (s *Sidecar) FenceClusterNetwork(_ context.Context, req *csiaddonsproto.NetworkFenceRequest) (*csiaddonsproto.NetworkFenceResponse, error) {
	s.record(true, req.GetCidrs())
	return &csiaddonsproto.NetworkFenceResponse{}, nil
}

// UnFenceClusterNetwork implements csiaddonsproto.NetworkFenceServer.
func (s *Sidecar) UnFenceClusterNetwork(_ context.Context, req *csiaddonsproto.NetworkFenceRequest) (*csiaddonsproto.NetworkFenceResponse, error) {
	s.record(false, req.GetCidrs())
	return &csiaddonsproto.NetworkFenceResponse{}, nil
}

func (s *Sidecar) record(fence bool, cidrs []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range cidrs {
		s.fenced[c] = fence
	}
	s.calls = append(s.calls, FenceCall{Fence: fence, CIDRs: slices.Clone(cidrs), Time: time.Now()})
}

// Fenced reports whether the storage system currently refuses cidr.
func (s *Sidecar) Fenced(cidr string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fenced[cidr]
}

// Calls returns the fence and unfence calls received, in order.
func (s *Sidecar) Calls() []FenceCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.calls)
}

// Register does what the real sidecar does in the cluster (kubernetes-csi-addons sidecar/main.go and
// internal/csiaddonsnode): a Pod whose IP csi-addons dials (status.podIP 127.0.0.1; no kubelet runs
// it), the Lease naming it the driver's leader, and the CSIAddonsNode with its endpoint
// pod://<pod>.<namespace>:<port>. Call it once the sidecar serves: csi-addons deletes a
// CSIAddonsNode it cannot connect to after three tries.
func (s *Sidecar) Register(ctx context.Context, c client.Client) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: CSIAddonsNamespace}}
	if err := c.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	// A stack started earlier on the same API server (another test) registered them already: they
	// are taken over, pointing at this sidecar.
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: CSIAddonsNamespace, Name: sidecarPod},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "csi-addons", Image: "csi-addons-sidecar"}}}}
	err := c.Create(ctx, pod)
	if apierrors.IsAlreadyExists(err) {
		err = c.Get(ctx, client.ObjectKeyFromObject(pod), pod)
	}
	if err != nil {
		return err
	}
	base := pod.DeepCopy()
	pod.Status.PodIP = "127.0.0.1"
	pod.Status.PodIPs = []corev1.PodIP{{IP: "127.0.0.1"}}
	if err := c.Status().Patch(ctx, pod, client.MergeFrom(base)); err != nil {
		return err
	}
	// csi-addons' connection pool finds the leader by the Lease <driver>-csi-addons
	// (internal/connection/connection_pool.go GetLeaderByDriver, util.NormalizeLeaseName).
	leaseName := regexp.MustCompile("[^a-zA-Z0-9-]").ReplaceAllString(DriverName, "-") + "-csi-addons"
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: CSIAddonsNamespace, Name: leaseName}}
	if _, err := controllerutil.CreateOrUpdate(ctx, c, lease, func() error {
		lease.Spec = coordinationv1.LeaseSpec{HolderIdentity: ptr.To(sidecarPod), LeaseDurationSeconds: ptr.To[int32](3600),
			RenewTime: &metav1.MicroTime{Time: time.Now()}}
		return nil
	}); err != nil {
		return err
	}
	node := &unstructured.Unstructured{}
	node.SetAPIVersion("csiaddons.openshift.io/v1alpha1")
	node.SetKind("CSIAddonsNode")
	node.SetNamespace(CSIAddonsNamespace)
	node.SetName(sidecarPod + "-" + CSIAddonsNamespace)
	// csi-addons' CSIAddonsNode controller writes the object too (its status, and its finalizer) when
	// a stack started earlier is still running: an update from a stale read conflicts, and is retried.
	return retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		_, err := controllerutil.CreateOrUpdate(ctx, c, node, func() error {
			node.Object["spec"] = map[string]any{"driver": map[string]any{
				"name": DriverName, "nodeID": "controller", "endpoint": fmt.Sprintf("pod://%s.%s:%d", sidecarPod, CSIAddonsNamespace, s.Port),
			}}
			return nil
		})
		return err
	})
}

// CSIAddons is a running csi-addons controller manager (v0.14.0, built by `make storage-assets`).
type CSIAddons struct {
	*capienv.Process
}

// StartCSIAddons runs csi-addons' controller manager against the environment's API server as a
// system:masters user, without TLS to the sidecar (--enable-auth=false: its TLS mode reads a
// ServiceAccount token from a fixed path in a Pod).
func StartCSIAddons(ctx context.Context, env *capienv.Environment, dir string) (*CSIAddons, error) {
	bin, kubeconfigPath, err := binaryAndKubeconfig(env, "csi-addons-manager", dir)
	if err != nil {
		return nil, err
	}
	proc, err := capienv.StartProcess(ctx, bin, []string{
		"--kubeconfig=" + kubeconfigPath, "--enable-auth=false", "--health-probe-bind-address=0",
		"--metrics-bind-address=0", "--leader-elect=false", "--namespace=" + CSIAddonsNamespace,
	}, filepath.Join(dir, "csi-addons.log"))
	if err != nil {
		return nil, err
	}
	return &CSIAddons{Process: proc}, nil
}
