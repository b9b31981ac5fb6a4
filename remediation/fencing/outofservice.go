package fencing

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// OutOfServiceTaint is the taint that tells Kubernetes a node is shut down for good: the pod GC
// controller force-deletes its pods and the attach/detach controller detaches its volumes at once,
// instead of waiting its 6-minute maxWaitForUnmountDuration (KEP-2268, beta and on by default since
// Kubernetes 1.28).
var OutOfServiceTaint = corev1.Taint{Key: corev1.TaintNodeOutOfService, Value: "nodeshutdown", Effect: corev1.TaintEffectNoExecute}

// minOutOfServiceVersion is the first Kubernetes version where the out-of-service taint is on by
// default (NodeOutOfServiceVolumeDetach beta); before it, kube-controller-manager ignores the taint
// unless the feature gate was turned on, which CAPR cannot see.
var minOutOfServiceVersion = version.MustParseGeneric("1.28.0")

// OutOfServiceTaintBackend taints the workload Node out-of-service and waits until no VolumeAttachment
// names the node. It must only act on a node that cannot write any more: PolicyFencer calls it only
// after every backend before it confirmed (the API refuses it as the first backend). It never deletes
// or edits a VolumeAttachment: detaching is kube-controller-manager's.
type OutOfServiceTaintBackend struct {
	Workload WorkloadClientFunc
	// ServerVersion returns the workload cluster's API server version (e.g. "v1.31.2"), read from the
	// workload cluster itself (its discovery), never the management cluster's.
	ServerVersion func(ctx context.Context, cluster client.ObjectKey) (string, error)
}

var (
	_ Backend         = &OutOfServiceTaintBackend{}
	_ BackendUnfencer = &OutOfServiceTaintBackend{}
)

// Fence implements Backend.
func (b *OutOfServiceTaintBackend) Fence(ctx context.Context, req Request, _ caprv1.FencingBackend) (bool, string, error) {
	if err := b.checkVersion(ctx, req); err != nil {
		return false, "", err
	}
	c, err := workloadClient(ctx, b.Workload, req)
	if err != nil {
		return false, "", err
	}
	node := &corev1.Node{}
	err = c.Get(ctx, client.ObjectKey{Name: req.Node}, node)
	switch {
	case apierrors.IsNotFound(err):
		// Gone: nothing to taint; its volumes are still waited for below.
	case err != nil:
		return false, "", fmt.Errorf("reading Node %s: %w", req.Node, err)
	case !hasOutOfServiceTaint(node):
		base := node.DeepCopy()
		// When it was added lets the pod deletion tell a taint-eviction controller that is about to
		// act from one that does not run (pods.go, evictable).
		taint := OutOfServiceTaint
		taint.TimeAdded = ptr.To(metav1.Now())
		node.Spec.Taints = append(node.Spec.Taints, taint)
		if err := c.Patch(ctx, node, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
			return false, "", fmt.Errorf("tainting Node %s %s: %w", req.Node, OutOfServiceTaint.ToString(), err)
		}
	}
	attached, err := volumeAttachmentsOf(ctx, c, req.Node)
	if err != nil {
		return false, "", err
	}
	if len(attached) > 0 {
		return false, fmt.Sprintf("Node %s tainted %s; waiting for kube-controller-manager to detach %d volume(s): %v",
			req.Node, OutOfServiceTaint.ToString(), len(attached), attached), nil
	}
	return true, fmt.Sprintf("Node %s tainted %s, no volume attached", req.Node, OutOfServiceTaint.ToString()), nil
}

// Unfence implements BackendUnfencer: the taint comes off the Node (a Node that is gone took it along).
func (b *OutOfServiceTaintBackend) Unfence(ctx context.Context, req Request, _ caprv1.FencingBackend) (bool, string, error) {
	c, err := workloadClient(ctx, b.Workload, req)
	if err != nil {
		return false, "", err
	}
	node := &corev1.Node{}
	if err := c.Get(ctx, client.ObjectKey{Name: req.Node}, node); err != nil {
		if apierrors.IsNotFound(err) {
			return true, fmt.Sprintf("Node %s is gone", req.Node), nil
		}
		return false, "", fmt.Errorf("reading Node %s: %w", req.Node, err)
	}
	if !hasOutOfServiceTaint(node) {
		return true, fmt.Sprintf("Node %s is not tainted out-of-service", req.Node), nil
	}
	base := node.DeepCopy()
	node.Spec.Taints = slices.DeleteFunc(node.Spec.Taints, func(t corev1.Taint) bool { return t.MatchTaint(&OutOfServiceTaint) })
	if err := c.Patch(ctx, node, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
		return false, "", fmt.Errorf("removing %s from Node %s: %w", OutOfServiceTaint.ToString(), req.Node, err)
	}
	return true, fmt.Sprintf("taint %s removed from Node %s", OutOfServiceTaint.ToString(), req.Node), nil
}

func (b *OutOfServiceTaintBackend) checkVersion(ctx context.Context, req Request) error {
	if b.ServerVersion == nil {
		return fmt.Errorf("%w: the workload cluster's version cannot be read", ErrNotAvailable)
	}
	raw, err := b.ServerVersion(ctx, client.ObjectKeyFromObject(req.Cluster))
	if err != nil {
		return fmt.Errorf("reading the workload cluster's version: %w", err)
	}
	v, err := version.ParseGeneric(raw)
	if err != nil {
		return fmt.Errorf("the workload cluster reports version %q: %w", raw, err)
	}
	if v.LessThan(minOutOfServiceVersion) {
		return fmt.Errorf("%w: the workload cluster's API server is %s; the out-of-service taint needs Kubernetes %s or newer",
			ErrNotAvailable, raw, minOutOfServiceVersion)
	}
	return nil
}

func hasOutOfServiceTaint(node *corev1.Node) bool {
	return slices.ContainsFunc(node.Spec.Taints, func(t corev1.Taint) bool { return t.MatchTaint(&OutOfServiceTaint) })
}

// volumeAttachmentsOf returns the names of the VolumeAttachments that name node.
func volumeAttachmentsOf(ctx context.Context, c client.Client, node string) ([]string, error) {
	list := &storagev1.VolumeAttachmentList{}
	if err := c.List(ctx, list); err != nil {
		return nil, fmt.Errorf("listing VolumeAttachments: %w", err)
	}
	var out []string
	for _, va := range list.Items {
		if va.Spec.NodeName == node {
			out = append(out, va.Name)
		}
	}
	slices.Sort(out)
	return out, nil
}

// DiscoveryServerVersion is OutOfServiceTaintBackend.ServerVersion read through the workload
// cluster's discovery, with the REST config restConfig returns for it (e.g. ClusterCache's
// GetRESTConfig).
func DiscoveryServerVersion(restConfig func(ctx context.Context, cluster client.ObjectKey) (*rest.Config, error)) func(context.Context, client.ObjectKey) (string, error) {
	return func(ctx context.Context, cluster client.ObjectKey) (string, error) {
		cfg, err := restConfig(ctx, cluster)
		if err != nil {
			return "", err
		}
		d, err := discovery.NewDiscoveryClientForConfig(cfg)
		if err != nil {
			return "", fmt.Errorf("creating a discovery client: %w", err)
		}
		v, err := d.ServerVersion()
		if err != nil {
			return "", fmt.Errorf("reading the server version: %w", err)
		}
		return v.GitVersion, nil
	}
}
