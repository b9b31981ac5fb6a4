package envtest

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The status.message csi-addons v0.14.0 writes on a NetworkFence once its operation succeeded.
const (
	CSIAddonsFenced   = "fencing operation successful"
	CSIAddonsUnfenced = "unfencing operation successful"
)

// ReportNetworkFence writes, as csi-addons' NetworkFence controller does after an operation, result
// Succeeded and message into nf's status: the envtest suites run no csi-addons controller (test/storage
// runs the real one) and play it with this.
func ReportNetworkFence(ctx context.Context, c client.Client, nf *unstructured.Unstructured, message string) error {
	if err := unstructured.SetNestedField(nf.Object, "Succeeded", "status", "result"); err != nil {
		return err
	}
	if err := unstructured.SetNestedField(nf.Object, message, "status", "message"); err != nil {
		return err
	}
	if err := c.Status().Update(ctx, nf); err != nil {
		return fmt.Errorf("reporting NetworkFence %s %q: %w", nf.GetName(), message, err)
	}
	return nil
}

// FenceState returns a NetworkFence's spec.fenceState (Fenced or Unfenced).
func FenceState(nf *unstructured.Unstructured) string {
	s, _, _ := unstructured.NestedString(nf.Object, "spec", "fenceState")
	return s
}
