package packaging_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/external"
	utilyaml "sigs.k8s.io/cluster-api/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// Every sample in config/samples is created with strict field validation against the CRDs
// clusterctl installed (CAPR's, with their CEL rules) and CAPI's: a field that does not exist, or a
// combination CAPR's API refuses, fails here instead of in a user's cluster.
func TestSamplesAreAcceptedByTheInstalledCRDs(t *testing.T) {
	g := NewWithT(t)
	_, err := installCAPR()
	g.Expect(err).NotTo(HaveOccurred())

	const ns = "samples"
	g.Expect(testEnv.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
	files, err := filepath.Glob(filepath.Join(root, "config", "samples", "*.yaml"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(files).NotTo(BeEmpty())
	created := 0
	for _, file := range files {
		raw, err := os.ReadFile(file)
		g.Expect(err).NotTo(HaveOccurred())
		objs, err := utilyaml.ToUnstructured(raw)
		g.Expect(err).NotTo(HaveOccurred(), file)
		g.Expect(objs).NotTo(BeEmpty(), file)
		for i := range objs {
			o := &objs[i]
			g.Expect(o.GetNamespace()).To(BeEmpty(), "%s: samples take the namespace they are applied to", file)
			o.SetNamespace(ns)
			g.Expect(testEnv.Client.Create(ctx, o, client.FieldValidation(metav1.FieldValidationStrict))).To(Succeed(), file)
			created++
		}
	}
	g.Expect(created).To(Equal(len(files)), "one object per sample file")

	// What the samples must show.
	healthChecks := &caprv1.MachineHealthCheckList{}
	g.Expect(testEnv.Client.List(ctx, healthChecks, client.InNamespace(ns))).To(Succeed())
	var controlPlane, workers int
	for _, mhc := range healthChecks.Items {
		if _, ok := mhc.Spec.Selector.MatchLabels[clusterv1.MachineControlPlaneLabel]; ok {
			controlPlane++
		} else {
			workers++
		}
	}
	g.Expect(controlPlane).To(BeNumerically(">=", 1), "a control-plane health check")
	g.Expect(workers).To(BeNumerically(">=", 1), "a worker health check")

	templates := &caprv1.MachineRemediationTemplateList{}
	g.Expect(testEnv.Client.List(ctx, templates, client.InNamespace(ns))).To(Succeed())
	backends := map[string]bool{}
	for _, tmpl := range templates.Items {
		if f := tmpl.Spec.Template.Spec.Fencing; f != nil {
			for _, b := range f.Backends {
				backends[string(b.Type)] = true
			}
		}
	}
	g.Expect(backends).To(HaveLen(len(fencingBackendTypes(g))), "one sample per fencing backend type the API accepts")
	for _, want := range fencingBackendTypes(g) {
		g.Expect(backends).To(HaveKey(want))
	}

	// CAPI's MachineHealthCheck points at a sample template, and CAPI's own code resolves CAPR's
	// kind through the CRD's contract label (cluster.x-k8s.io/v1beta2: v1alpha1).
	capiChecks := &clusterv1.MachineHealthCheckList{}
	g.Expect(testEnv.Client.List(ctx, capiChecks, client.InNamespace(ns))).To(Succeed())
	g.Expect(capiChecks.Items).To(HaveLen(1))
	ref := capiChecks.Items[0].Spec.Remediation.TemplateRef
	g.Expect(ref.APIVersion).To(Equal(caprv1.GroupVersion.String()))
	g.Expect(ref.Kind).To(Equal("MachineRemediationTemplate"))
	tmpl, err := external.GetObjectFromContractVersionedRef(ctx, testEnv.Client, clusterv1.ContractVersionedObjectReference{
		APIGroup: caprv1.GroupVersion.Group, Kind: ref.Kind, Name: ref.Name,
	}, ns)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(tmpl.GetAPIVersion()).To(Equal(caprv1.GroupVersion.String()))

	// A ClusterClass whose control-plane and worker health checks (CAPI v1beta2) are remediated by
	// CAPR: both point at a sample template.
	classes := &clusterv1.ClusterClassList{}
	g.Expect(testEnv.Client.List(ctx, classes, client.InNamespace(ns))).To(Succeed())
	g.Expect(classes.Items).To(HaveLen(1))
	class := classes.Items[0]
	refs := make([]clusterv1.MachineHealthCheckRemediationTemplateReference, 0, 1+len(class.Spec.Workers.MachineDeployments))
	refs = append(refs, class.Spec.ControlPlane.HealthCheck.Remediation.TemplateRef)
	g.Expect(class.Spec.Workers.MachineDeployments).NotTo(BeEmpty())
	for _, md := range class.Spec.Workers.MachineDeployments {
		refs = append(refs, md.HealthCheck.Remediation.TemplateRef)
	}
	for _, ref := range refs {
		g.Expect(ref.APIVersion).To(Equal(caprv1.GroupVersion.String()))
		g.Expect(ref.Kind).To(Equal("MachineRemediationTemplate"))
		g.Expect(testEnv.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: ref.Name}, &caprv1.MachineRemediationTemplate{})).To(Succeed(), "template %s", ref.Name)
	}
}

// fencingBackendTypes reads the backend types the installed CRD accepts (its enum), so that a new
// backend type without a sample fails the test.
func fencingBackendTypes(g Gomega) []string {
	crd := &apiextensionsv1.CustomResourceDefinition{}
	g.Expect(testEnv.Client.Get(ctx, client.ObjectKey{Name: "machineremediationtemplates.remediation.cluster.x-k8s.io"}, crd)).To(Succeed())
	g.Expect(crd.Spec.Versions).To(HaveLen(1))
	schema := crd.Spec.Versions[0].Schema.OpenAPIV3Schema
	for _, field := range []string{"spec", "template", "spec", "fencing", "backends"} {
		g.Expect(schema.Properties).To(HaveKey(field))
		next := schema.Properties[field]
		schema = &next
	}
	g.Expect(schema.Items).NotTo(BeNil())
	g.Expect(schema.Items.Schema.Properties).To(HaveKey("type"))
	enum := schema.Items.Schema.Properties["type"].Enum
	types := make([]string, 0, len(enum))
	for _, raw := range enum {
		var s string
		g.Expect(json.Unmarshal(raw.Raw, &s)).To(Succeed())
		types = append(types, s)
	}
	g.Expect(types).NotTo(BeEmpty())
	return types
}
