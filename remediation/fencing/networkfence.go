package fencing

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// The csi-addons NetworkFence API (github.com/csi-addons/kubernetes-csi-addons v0.14.0,
// api/csiaddons/v1alpha1/networkfence_types.go), used as unstructured so that no field is invented
// and no typed default (its Go types have driver and networkFenceClassName without omitempty) is
// sent. Both kinds are cluster-scoped and live in the workload cluster.
var (
	// NetworkFenceGVK is csi-addons' NetworkFence.
	NetworkFenceGVK = schema.GroupVersionKind{Group: "csiaddons.openshift.io", Version: "v1alpha1", Kind: "NetworkFence"}
	// NetworkFenceClassGVK is csi-addons' NetworkFenceClass.
	NetworkFenceClassGVK = schema.GroupVersionKind{Group: "csiaddons.openshift.io", Version: "v1alpha1", Kind: "NetworkFenceClass"}
)

// Values of the NetworkFence API: spec.fenceState, status.result, and the status.message csi-addons
// writes on success (FenceOperationSuccessfulMessage, UnFenceOperationSuccessfulMessage). The API has
// no observedGeneration: after spec.fenceState changes, the previous result stays until csi-addons
// has acted, so only the message tells which operation succeeded.
const (
	networkFenceFenced          = "Fenced"
	networkFenceUnfenced        = "Unfenced"
	networkFenceSucceeded       = "Succeeded"
	networkFenceFencedMessage   = "fencing operation successful"
	networkFenceUnfencedMessage = "unfencing operation successful"
)

// Annotations CAPR puts on the NetworkFences it creates, saying for whom (a NetworkFence is
// cluster-scoped in the workload cluster; the Machine lives in the management cluster), with the
// marks of owned.go.
const (
	NetworkFenceMachineAnnotation = "remediation.cluster.x-k8s.io/machine"
	NetworkFenceNodeAnnotation    = "remediation.cluster.x-k8s.io/node"
	// NetworkFenceManagedByLabel marks the NetworkFences CAPR created (value "capr").
	NetworkFenceManagedByLabel = "app.kubernetes.io/managed-by"
)

// WorkloadClientFunc returns a client of a Cluster's workload cluster (e.g. ClusterCache's
// GetUncachedClient: fences are few and must be read as they are, not from a cache that would
// start informers for kinds the workload cluster may not have).
type WorkloadClientFunc func(ctx context.Context, cluster client.ObjectKey) (client.Client, error)

// NetworkFenceBackend fences a node's IP addresses through csi-addons: for each configured
// NetworkFenceClass one NetworkFence, fenceState Fenced, with the node's addresses as /32 (/128)
// CIDRs; fenced when csi-addons reports success for every class. Unfencing sets Unfenced, waits for
// success and only then deletes (deleting alone does not unfence, and a new node may get the address).
type NetworkFenceBackend struct {
	Workload WorkloadClientFunc
}

var _ Backend = &NetworkFenceBackend{}

// NetworkFenceName is the name of the NetworkFence of a node of a Cluster for a class: deterministic,
// so a crash between create and record never makes a second one; a hash, because node and class
// names together can be longer than a name may be, and the same node name can exist in two Clusters
// sharing storage.
func NetworkFenceName(cluster client.ObjectKey, node, class string) string {
	sum := sha256.Sum256([]byte(cluster.Namespace + "/" + cluster.Name + "\x00" + node + "\x00" + class))
	prefix := "capr-" + node
	if len(prefix) > 200 {
		prefix = prefix[:200]
	}
	return strings.TrimRight(prefix, ".-") + "-" + hex.EncodeToString(sum[:])[:10]
}

// Fence implements Backend.
func (b *NetworkFenceBackend) Fence(ctx context.Context, req Request, spec caprv1.FencingBackend) (bool, string, error) {
	if req.Remediation == "" {
		return false, "", errNoRemediation
	}
	c, err := workloadClient(ctx, b.Workload, req)
	if err != nil {
		return false, "", err
	}
	cidrs, err := nodeCIDRs(ctx, c, req)
	if err != nil {
		return false, "", err
	}
	return forEachClass(spec.NetworkFenceClassNames, func(class string) (bool, string, error) {
		return b.fenceOne(ctx, c, req, class, cidrs)
	}, fmt.Sprintf("NetworkFence %s for classes %v", strings.Join(cidrs, ","), spec.NetworkFenceClassNames))
}

// forEachClass runs one class's operation for every class, all of them even when one is not done
// (each says what it waits for), and is done when every one is.
func forEachClass(classes []string, op func(class string) (bool, string, error), doneMessage string) (bool, string, error) {
	var waiting []string
	for _, class := range classes {
		done, msg, err := op(class)
		if err != nil {
			return false, "", err
		}
		if !done {
			waiting = append(waiting, msg)
		}
	}
	if len(waiting) > 0 {
		return false, strings.Join(waiting, "; "), nil
	}
	return true, doneMessage, nil
}

func (b *NetworkFenceBackend) fenceOne(ctx context.Context, c client.Client, req Request, class string, cidrs []string) (bool, string, error) {
	name := NetworkFenceName(client.ObjectKeyFromObject(req.Cluster), req.Node, class)
	nf, err := getNetworkFence(ctx, c, name)
	switch {
	case err != nil:
		return false, "", err
	case nf == nil:
		return b.create(ctx, c, req, name, class, cidrs)
	}
	if !nf.GetDeletionTimestamp().IsZero() {
		// An earlier unfence deleted it (csi-addons' finalizer holds it): a new one is created once
		// it is gone, so csi-addons fences again from a clean object.
		return false, fmt.Sprintf("NetworkFence %s of an earlier unfence is being deleted; fencing again once it is gone", name), nil
	}
	if why := notThisNetworkFence(nf, req, class, cidrs); len(why) > 0 {
		msg, err := replace(ctx, c, nf, "NetworkFence "+name, why)
		return false, msg, err
	}
	// This fence, unfenced meanwhile (an unfence of this remediation that has not finished, or a hand
	// edit): fence again (the object is kept, so csi-addons sees a spec change).
	if patched, err := ensureFenceState(ctx, c, nf, networkFenceFenced); patched || err != nil {
		return false, fmt.Sprintf("NetworkFence %s set back to %s, waiting for csi-addons", name, networkFenceFenced), err
	}
	result, message := fenceResult(nf)
	switch {
	case result == networkFenceSucceeded && message == networkFenceFencedMessage:
		return true, "", nil
	case result == "":
		return false, fmt.Sprintf("NetworkFence %s (class %s): no result from csi-addons yet", name, class), nil
	}
	return false, fmt.Sprintf("NetworkFence %s (class %s): %s: %s", name, class, result, message), nil
}

func (b *NetworkFenceBackend) create(ctx context.Context, c client.Client, req Request, name, class string, cidrs []string) (bool, string, error) {
	fc := &unstructured.Unstructured{}
	fc.SetGroupVersionKind(NetworkFenceClassGVK)
	if err := c.Get(ctx, client.ObjectKey{Name: class}, fc); err != nil {
		if apierrors.IsNotFound(err) {
			// Not created without its class: csi-addons could neither fence nor, later, finalize it.
			return false, fmt.Sprintf("NetworkFenceClass %s does not exist in the workload cluster; no NetworkFence created", class), nil
		}
		if isNoMatch(err) {
			return false, "", notInstalled(NetworkFenceClassGVK)
		}
		return false, "", fmt.Errorf("reading NetworkFenceClass %s: %w", class, err)
	}
	nf := &unstructured.Unstructured{}
	nf.SetGroupVersionKind(NetworkFenceGVK)
	nf.SetName(name)
	nf.SetAnnotations(map[string]string{NetworkFenceMachineAnnotation: req.Machine.Namespace + "/" + req.Machine.Name})
	markOwned(nf, req)
	nf.Object["spec"] = map[string]any{
		"networkFenceClassName": class,
		"fenceState":            networkFenceFenced,
		"cidrs":                 toAny(cidrs),
	}
	switch err := c.Create(ctx, nf); {
	case apierrors.IsAlreadyExists(err):
		// Made meanwhile by someone else: not recorded, so replaced when read next (owned.go).
	case err != nil:
		return false, "", fmt.Errorf("creating NetworkFence %s: %w", name, err)
	default:
		created(req, nf)
	}
	return false, fmt.Sprintf("NetworkFence %s created (class %s, %s), waiting for csi-addons", name, class, strings.Join(cidrs, ",")), nil
}

// Unfence undoes Fence: each NetworkFence of the node is set Unfenced, and deleted once csi-addons
// reports the unfence; done when none is left. A node without NetworkFences (never fenced, or
// already unfenced) is done at once.
func (b *NetworkFenceBackend) Unfence(ctx context.Context, req Request, spec caprv1.FencingBackend) (bool, string, error) {
	c, err := workloadClient(ctx, b.Workload, req)
	if err != nil {
		return false, "", err
	}
	return forEachClass(spec.NetworkFenceClassNames, func(class string) (bool, string, error) {
		return unfenceOne(ctx, c, req, NetworkFenceName(client.ObjectKeyFromObject(req.Cluster), req.Node, class))
	}, fmt.Sprintf("no NetworkFence left for node %s", req.Node))
}

func unfenceOne(ctx context.Context, c client.Client, req Request, name string) (bool, string, error) {
	nf, err := getNetworkFence(ctx, c, name)
	switch {
	case errors.Is(err, ErrNotAvailable) || err == nil && nf == nil:
		return true, "", nil // none left, or csi-addons is not installed: nothing can be fenced
	case err != nil:
		return false, "", err
	case ofAnotherRemediation(nf, req):
		// Ours was replaced (fenceOne): this one is another remediation's to undo.
		return true, "", nil
	}
	if !nf.GetDeletionTimestamp().IsZero() {
		return false, fmt.Sprintf("NetworkFence %s is being deleted (csi-addons' finalizer)", name), nil
	}
	if patched, err := ensureFenceState(ctx, c, nf, networkFenceUnfenced); patched || err != nil {
		return false, fmt.Sprintf("NetworkFence %s set to %s, waiting for csi-addons", name, networkFenceUnfenced), err
	}
	result, message := fenceResult(nf)
	if result != networkFenceSucceeded || message != networkFenceUnfencedMessage {
		// Not deleted before csi-addons confirms: deleting alone leaves the address fenced.
		return false, fmt.Sprintf("NetworkFence %s: waiting for csi-addons to unfence (result %q: %s)", name, result, message), nil
	}
	if err := c.Delete(ctx, nf); err != nil && !apierrors.IsNotFound(err) {
		return false, "", fmt.Errorf("deleting unfenced NetworkFence %s: %w", name, err)
	}
	return false, fmt.Sprintf("NetworkFence %s unfenced, deleting", name), nil
}

// notThisNetworkFence lists why nf is not the NetworkFence CAPR creates for req and class with cidrs
// (nil when it is): its marks (notMarkedFor), its class, no driver of its own (CAPR names a class
// only; csi-addons' deprecated spec.driver would fence through something else), and every address
// to fence among its cidrs. fenceState is not checked here: this fence set to Unfenced is fenced
// again, not replaced (fenceOne).
func notThisNetworkFence(nf *unstructured.Unstructured, req Request, class string, cidrs []string) []string {
	why := notMarkedFor(nf, req)
	if v, _, _ := unstructured.NestedString(nf.Object, "spec", "networkFenceClassName"); v != class {
		why = append(why, fmt.Sprintf("spec.networkFenceClassName is %q, not %q", v, class))
	}
	if v, found, _ := unstructured.NestedFieldNoCopy(nf.Object, "spec", "driver"); found && v != nil && v != "" {
		why = append(why, fmt.Sprintf("spec.driver is set (%v); CAPR names only a class", v))
	}
	have, _, _ := unstructured.NestedStringSlice(nf.Object, "spec", "cidrs")
	var missing []string
	for _, cidr := range cidrs {
		if !slices.Contains(have, cidr) {
			missing = append(missing, cidr)
		}
	}
	if len(missing) > 0 {
		why = append(why, fmt.Sprintf("spec.cidrs %v lacks %v", have, missing))
	}
	return why
}

// getNetworkFence reads the NetworkFence name: nil when there is none, an error wrapping
// ErrNotAvailable when the workload cluster has no NetworkFence kind.
func getNetworkFence(ctx context.Context, c client.Client, name string) (*unstructured.Unstructured, error) {
	nf := &unstructured.Unstructured{}
	nf.SetGroupVersionKind(NetworkFenceGVK)
	err := c.Get(ctx, client.ObjectKey{Name: name}, nf)
	switch {
	case isNoMatch(err):
		return nil, notInstalled(NetworkFenceGVK)
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading NetworkFence %s: %w", name, err)
	}
	return nf, nil
}

// ensureFenceState sets the NetworkFence's spec.fenceState to state unless it is already; it reports
// whether it changed it.
func ensureFenceState(ctx context.Context, c client.Client, nf *unstructured.Unstructured, state string) (bool, error) {
	if current, _, _ := unstructured.NestedString(nf.Object, "spec", "fenceState"); current == state {
		return false, nil
	}
	patch := client.MergeFrom(nf.DeepCopy())
	if err := unstructured.SetNestedField(nf.Object, state, "spec", "fenceState"); err != nil {
		return false, err
	}
	if err := c.Patch(ctx, nf, patch); err != nil {
		return false, fmt.Errorf("setting NetworkFence %s to %s: %w", nf.GetName(), state, err)
	}
	return true, nil
}

// workloadClient returns the client of the request's workload cluster.
func workloadClient(ctx context.Context, workload WorkloadClientFunc, req Request) (client.Client, error) {
	if workload == nil {
		return nil, errors.New("no workload cluster client configured")
	}
	c, err := workload(ctx, client.ObjectKeyFromObject(req.Cluster))
	if err != nil {
		return nil, fmt.Errorf("connecting to the workload cluster of Cluster %s: %w", req.Cluster.Name, err)
	}
	return c, nil
}

// nodeCIDRs returns the node's IP addresses as host CIDRs, sorted: from the workload Node's
// status.addresses, or, when the Node is gone, from the Machine's (an address the Machine reported
// is still one the machine may write from).
func nodeCIDRs(ctx context.Context, c client.Client, req Request) ([]string, error) {
	var ips []string
	node := &corev1.Node{}
	err := c.Get(ctx, client.ObjectKey{Name: req.Node}, node)
	switch {
	case err == nil:
		for _, a := range node.Status.Addresses {
			if a.Type == corev1.NodeInternalIP || a.Type == corev1.NodeExternalIP {
				ips = append(ips, a.Address)
			}
		}
	case !apierrors.IsNotFound(err):
		return nil, fmt.Errorf("reading Node %s: %w", req.Node, err)
	}
	if req.Machine != nil {
		for _, a := range req.Machine.Status.Addresses {
			if a.Type == clusterv1.MachineInternalIP || a.Type == clusterv1.MachineExternalIP {
				ips = append(ips, a.Address)
			}
		}
	}
	var cidrs []string
	for _, ip := range ips {
		addr, err := netip.ParseAddr(ip)
		if err != nil {
			continue // not an IP (a provider's odd value): nothing to fence with it
		}
		cidrs = append(cidrs, netip.PrefixFrom(addr, addr.BitLen()).String())
	}
	slices.Sort(cidrs)
	cidrs = slices.Compact(cidrs)
	if len(cidrs) == 0 {
		return nil, fmt.Errorf("no IP address is known for node %s (neither the Node nor the Machine reports one): nothing to fence", req.Node)
	}
	return cidrs, nil
}

func fenceResult(nf *unstructured.Unstructured) (result, message string) {
	result, _, _ = unstructured.NestedString(nf.Object, "status", "result")
	message, _, _ = unstructured.NestedString(nf.Object, "status", "message")
	return result, message
}

func isNoMatch(err error) bool {
	return err != nil && (meta.IsNoMatchError(err) || apierrors.IsNotFound(err) && strings.Contains(err.Error(), "the server could not find the requested resource"))
}

// ErrNotAvailable is wrapped by the error of a backend whose API is not installed in the workload
// cluster.
var ErrNotAvailable = errors.New("not available")

func notInstalled(gvk schema.GroupVersionKind) error {
	return fmt.Errorf("%w: the workload cluster has no %s %s (csi-addons is not installed)", ErrNotAvailable, gvk.GroupVersion(), gvk.Kind)
}

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}
