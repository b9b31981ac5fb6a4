package main

import (
	"testing"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

func TestCheckCRDsNamesWhatIsMissing(t *testing.T) {
	g := NewWithT(t)
	mapper := meta.NewDefaultRESTMapper([]schema.GroupVersion{clusterv1.GroupVersion, caprv1.GroupVersion})
	for _, kind := range []string{"Cluster", "Machine"} {
		mapper.Add(clusterv1.GroupVersion.WithKind(kind), meta.RESTScopeNamespace)
	}
	err := checkCRDs(mapper)
	g.Expect(err).To(HaveOccurred())
	g.Expect(err.Error()).To(ContainSubstring("CRD for MachineHealthCheck.remediation.cluster.x-k8s.io is not installed"))
	g.Expect(err.Error()).To(ContainSubstring("make install"))
	g.Expect(err.Error()).NotTo(ContainSubstring("Machine.cluster.x-k8s.io"))

	for _, kind := range []string{"MachineHealthCheck", "MachineRemediation", "MachineRemediationTemplate"} {
		mapper.Add(schema.GroupVersionKind{Group: caprv1.GroupVersion.Group, Version: "v1alpha1", Kind: kind}, meta.RESTScopeNamespace)
	}
	g.Expect(checkCRDs(mapper)).To(Succeed())
}
