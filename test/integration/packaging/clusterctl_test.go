package packaging_test

import (
	"testing"

	. "github.com/onsi/gomega"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	clusterctlv1 "sigs.k8s.io/cluster-api/cmd/clusterctl/api/v1alpha3"
	"sigs.k8s.io/cluster-api/util/contract"
	utilyaml "sigs.k8s.io/cluster-api/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/hack/manifests"
)

const (
	targetNamespace = "capr-system"
	devImage        = "ghcr.io/capr-io/capr:dev"
)

// The rendered file is what the issue asks of a clusterctl provider before clusterctl touches it:
// one Namespace and the provider label on every object (clusterctl would add both itself, which
// would hide a file that only works through clusterctl).
func TestRenderedComponentsHaveOneNamespaceAndTheProviderLabelEverywhere(t *testing.T) {
	g := NewWithT(t)
	inst, err := installCAPR()
	g.Expect(err).NotTo(HaveOccurred())

	objs, err := utilyaml.ToUnstructured(inst.rendered)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(objs).NotTo(BeEmpty())
	var namespaces []string
	for _, o := range objs {
		g.Expect(o.GetLabels()).To(HaveKeyWithValue(clusterv1.ProviderNameLabel, manifests.ProviderLabel), "%s %s", o.GetKind(), o.GetName())
		if o.GetKind() == "Namespace" {
			namespaces = append(namespaces, o.GetName())
		}
		if o.GetNamespace() != "" {
			g.Expect(o.GetNamespace()).To(Equal(targetNamespace), "%s %s", o.GetKind(), o.GetName())
		}
	}
	g.Expect(namespaces).To(ConsistOf(targetNamespace))
}

func TestClusterctlInstallsCAPRAsAnAddonProvider(t *testing.T) {
	g := NewWithT(t)
	inst, err := installCAPR()
	g.Expect(err).NotTo(HaveOccurred())
	c := inst.components

	// What clusterctl read from the repository.
	g.Expect(c.Name()).To(Equal(manifests.ProviderName))
	g.Expect(c.Type()).To(Equal(clusterctlv1.AddonProviderType))
	g.Expect(c.ManifestLabel()).To(Equal(manifests.ProviderLabel))
	g.Expect(c.Version()).To(Equal(releaseVersion))
	g.Expect(c.TargetNamespace()).To(Equal(targetNamespace))
	g.Expect(c.Images()).To(ConsistOf(devImage))
	g.Expect(c.Variables()).To(ConsistOf(componentVariables))

	// clusterctl recorded the provider in its inventory.
	providers, err := inst.inventory.List(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	capr := providers.FilterByProviderNameAndType(manifests.ProviderName, clusterctlv1.AddonProviderType)
	g.Expect(capr).To(HaveLen(1))
	g.Expect(capr[0].Namespace).To(Equal(targetNamespace))
	g.Expect(capr[0].Version).To(Equal(releaseVersion))

	// Every object clusterctl installed exists, labelled as clusterctl's own (that is how
	// `clusterctl delete` and `clusterctl upgrade` find them).
	rendered, err := utilyaml.ToUnstructured(inst.rendered)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(c.Objs()).To(HaveLen(len(rendered)))
	for _, want := range c.Objs() {
		got := &unstructured.Unstructured{}
		got.SetGroupVersionKind(want.GroupVersionKind())
		g.Expect(testEnv.Client.Get(ctx, client.ObjectKeyFromObject(&want), got)).To(Succeed(), "%s %s", want.GetKind(), want.GetName())
		g.Expect(got.GetLabels()).To(HaveKey(clusterctlv1.ClusterctlLabel), "%s %s", want.GetKind(), want.GetName())
		g.Expect(got.GetLabels()).To(HaveKeyWithValue(clusterv1.ProviderNameLabel, manifests.ProviderLabel), "%s %s", want.GetKind(), want.GetName())
	}

	// The variables were substituted by their defaults: the manager gets main.go's defaults.
	deployment := &unstructured.Unstructured{}
	deployment.SetAPIVersion("apps/v1")
	deployment.SetKind("Deployment")
	g.Expect(testEnv.Client.Get(ctx, client.ObjectKey{Namespace: targetNamespace, Name: "capr-controller-manager"}, deployment)).To(Succeed())
	containers, _, err := unstructured.NestedSlice(deployment.Object, "spec", "template", "spec", "containers")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(containers).To(HaveLen(1))
	manager := containers[0].(map[string]any)
	g.Expect(manager["name"]).To(Equal(manifests.ManagerContainer))
	g.Expect(manager["image"]).To(Equal(devImage))
	g.Expect(manager["args"]).To(ConsistOf(
		"--leader-elect",
		"--diagnostics-address=:8443",
		"--insecure-diagnostics=false",
		"--zap-log-level=info",
		"--machinehealthcheck-concurrency=10",
		"--machineremediation-concurrency=10",
		"--clustercache-concurrency=100",
		"--clustercache-client-qps=20",
		"--clustercache-client-burst=30",
		"--etcd-dial-timeout-duration=10s",
		"--etcd-call-timeout-duration=15s",
		"--sync-period=10m",
		"--kube-api-qps=-1",
		"--kube-api-burst=200",
		"--machineremediation-ttl-after-finished=24h",
		"--machineremediation-max-finished-per-cluster=100",
		"--allow-etcd-endpoints-annotation=false",
	))
}

// clusterctl init refuses CRDs whose names differ from contract.CalculateCRDName (unless they carry
// its skip annotation): Init passing proves CAPR's pass; this says which check it was and that it was
// not skipped. The contract label is what CAPI reads to find the version of a referenced kind
// (samples_test.go resolves a template through it with CAPI's own code).
func TestCRDsPassClusterctlsNameCheckAndCarryTheContractLabel(t *testing.T) {
	g := NewWithT(t)
	inst, err := installCAPR()
	g.Expect(err).NotTo(HaveOccurred())

	var kinds []string
	for _, o := range inst.components.Objs() {
		if o.GetKind() != "CustomResourceDefinition" {
			continue
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		g.Expect(runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, crd)).To(Succeed())
		kinds = append(kinds, crd.Spec.Names.Kind)
		g.Expect(crd.Name).To(Equal(contract.CalculateCRDName(crd.Spec.Group, crd.Spec.Names.Kind)))
		g.Expect(crd.Annotations).NotTo(HaveKey(clusterctlv1.SkipCRDNamePreflightCheckAnnotation))
		g.Expect(crd.Labels).To(HaveKeyWithValue(clusterv1.GroupVersion.String(), caprv1.GroupVersion.Version))
	}
	g.Expect(kinds).To(ConsistOf("MachineHealthCheck", "MachineRemediation", "MachineRemediationTemplate"))
}
