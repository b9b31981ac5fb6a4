package sandbox

import (
	"context"
	"fmt"

	"sigs.k8s.io/controller-runtime/pkg/client"
)

// AnnotateControlPlane sets an annotation on the cluster's control-plane object (SandboxControlPlane,
// or KubeadmControlPlane on the full stack), e.g. caprv1.EtcdLearnerJoinsAnnotation.
func (s *Sandbox) AnnotateControlPlane(ctx context.Context, wc *WorkloadCluster, key, value string) error {
	cp, err := s.ControlPlaneObject(ctx, wc)
	if err != nil {
		return fmt.Errorf("reading the control-plane object of %s: %w", wc.LogKey(), err)
	}
	base := cp.DeepCopy()
	a := cp.GetAnnotations()
	if a == nil {
		a = map[string]string{}
	}
	a[key] = value
	cp.SetAnnotations(a)
	if err := s.Client.Patch(ctx, cp, client.MergeFrom(base)); err != nil {
		return fmt.Errorf("annotating %s %s with %s: %w", cp.GetKind(), cp.GetName(), key, err)
	}
	return nil
}
