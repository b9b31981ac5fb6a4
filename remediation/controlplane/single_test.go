package controlplane

import (
	"testing"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// TestLearnerJoinsAnnotation: the control-plane object declares learner joins; an invalid value is
// taken as voting joins (the stricter model) and the reason names the annotation and the value.
func TestLearnerJoinsAnnotation(t *testing.T) {
	cp := func(kind, group string, value *string) *unstructured.Unstructured {
		obj := &unstructured.Unstructured{}
		obj.SetAPIVersion(group + "/v1beta2")
		obj.SetKind(kind)
		obj.SetName("cp")
		if value != nil {
			obj.SetAnnotations(map[string]string{caprv1.EtcdLearnerJoinsAnnotation: *value})
		}
		return obj
	}
	yes, no, bad := "true", "false", "yes"
	for _, kind := range [][2]string{{"KubeadmControlPlane", "controlplane.cluster.x-k8s.io"}, {"SandboxControlPlane", "controlplane.sandbox.capr.io"}} {
		g := NewWithT(t)
		g.Expect(AdapterFor(cp(kind[0], kind[1], nil)).AddsLearners()).To(BeFalse(), kind[0])
		g.Expect(AdapterFor(cp(kind[0], kind[1], &yes)).AddsLearners()).To(BeTrue(), kind[0])
		g.Expect(AdapterFor(cp(kind[0], kind[1], &no)).AddsLearners()).To(BeFalse(), kind[0])
		g.Expect(AdapterFor(cp(kind[0], kind[1], &bad)).AddsLearners()).To(BeFalse(), kind[0])
	}
	// A KubeadmControlPlane's kubeadm joins learners from v1.34.0 on, whatever its configuration; the
	// annotation still decides when present. Another provider's version says nothing.
	versioned := func(kind, group, v string, value *string) *unstructured.Unstructured {
		obj := cp(kind, group, value)
		obj.Object["spec"] = map[string]any{"version": v}
		return obj
	}
	for _, tc := range []struct {
		kind, group, version string
		value                *string
		want                 bool
	}{
		{"KubeadmControlPlane", "controlplane.cluster.x-k8s.io", "v1.36.3", nil, true},
		{"KubeadmControlPlane", "controlplane.cluster.x-k8s.io", "v1.34.0", nil, true},
		{"KubeadmControlPlane", "controlplane.cluster.x-k8s.io", "v1.33.7", nil, false},
		{"KubeadmControlPlane", "controlplane.cluster.x-k8s.io", "not a version", nil, false},
		{"KubeadmControlPlane", "controlplane.cluster.x-k8s.io", "v1.36.3", &no, false},
		{"KubeadmControlPlane", "controlplane.cluster.x-k8s.io", "v1.33.7", &yes, true},
		{"SandboxControlPlane", "controlplane.sandbox.capr.io", "v1.36.3", nil, false},
	} {
		NewWithT(t).Expect(AdapterFor(versioned(tc.kind, tc.group, tc.version, tc.value)).AddsLearners()).To(Equal(tc.want), "%s %s %v", tc.kind, tc.version, tc.value)
	}
	learners, problem := learnerJoins(cp("KubeadmControlPlane", "controlplane.cluster.x-k8s.io", &bad))
	NewWithT(t).Expect(learners).To(BeFalse())
	NewWithT(t).Expect(problem).To(SatisfyAll(ContainSubstring(caprv1.EtcdLearnerJoinsAnnotation), ContainSubstring(`"yes"`), ContainSubstring("voting joins")))
}
