package remediation

import (
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// EtcdPlacementOf says where a control plane's etcd runs, read from its control-plane object. A
// KubeadmControlPlane is External when spec.kubeadmConfigSpec.clusterConfiguration.etcd.external is
// set (KCP's own test, ControlPlane.IsEtcdManaged in controlplane/kubeadm/internal/control_plane.go).
// Any other provider is taken as Stacked: CAPI's control-plane contract does not say, and Stacked is
// the placement whose rules (quorum, member removal) are the stricter ones; if such a provider's etcd
// cannot be reached through its Nodes, the remediation waits with reason EtcdUnreachable.
// This function is the one place where the placement is decided: the health checker's control-plane
// limit and the control-plane remediator both use it. It lives here, not in etcdutil, because it reads
// a provider's object and speaks CAPR's API: etcd access knows no CRDs.
func EtcdPlacementOf(cp *unstructured.Unstructured) caprv1.EtcdPlacement {
	if cp == nil || cp.GroupVersionKind().Group != controlplanev1.GroupVersion.Group || cp.GetKind() != "KubeadmControlPlane" {
		return caprv1.EtcdPlacementStacked
	}
	if external, found, err := unstructured.NestedMap(cp.Object, "spec", "kubeadmConfigSpec", "clusterConfiguration", "etcd", "external"); err == nil && found && external != nil {
		return caprv1.EtcdPlacementExternal
	}
	return caprv1.EtcdPlacementStacked
}
