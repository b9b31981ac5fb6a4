//go:build envtest

package fencing_test

import (
	"slices"
	"testing"

	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/remediation/fencing"
)

// externalFixture is a fixture with the External backend and a PowerFenceTemplate in the Machine's
// namespace (the stand-in provider's kinds, test/crds/externalfencing).
type externalFixture struct {
	*fixture
	backend *fencing.ExternalBackend
	spec    caprv1.FencingBackend
}

func newExternalFixture(t *testing.T) *externalFixture {
	t.Helper()
	f := &externalFixture{fixture: newFixture(t),
		backend: &fencing.ExternalBackend{Client: k8sClient, APIReader: k8sClient},
		spec: caprv1.FencingBackend{Type: caprv1.FencingBackendExternal, TemplateRef: &caprv1.TemplateReference{
			APIVersion: "fencing.example.com/v1alpha1", Kind: "PowerFenceTemplate", Name: "bmc-off"}},
	}
	template := &unstructured.Unstructured{Object: map[string]any{
		"spec": map[string]any{"template": map[string]any{"spec": map[string]any{"action": "power-off", "bmcSecret": "bmc"}}},
	}}
	template.SetAPIVersion("fencing.example.com/v1alpha1")
	template.SetKind("PowerFenceTemplate")
	template.SetNamespace(f.machine.Namespace)
	template.SetName("bmc-off")
	f.g.Expect(k8sClient.Create(ctx, template)).To(Succeed())
	return f
}

func (f *externalFixture) request() fencing.Request {
	return fencing.Request{Cluster: f.cluster, Machine: f.machine, Node: f.node, Remediation: f.remediation,
		Spec:    &caprv1.FencingSpec{Policy: caprv1.FencingRequired, Backends: []caprv1.FencingBackend{f.spec}},
		Objects: slices.Clone(f.objects), Created: f.record}
}

func (f *externalFixture) fence() (bool, string) {
	f.t.Helper()
	done, msg, err := f.backend.Fence(ctx, f.request(), f.spec)
	f.g.Expect(err).NotTo(HaveOccurred())
	return done, msg
}

func (f *externalFixture) unfence() (bool, string) {
	f.t.Helper()
	done, msg, err := f.backend.Unfence(ctx, f.request(), f.spec)
	f.g.Expect(err).NotTo(HaveOccurred())
	return done, msg
}

// object reads the PowerFence of the Machine (nil when there is none).
func (f *externalFixture) object() *unstructured.Unstructured {
	f.t.Helper()
	obj := &unstructured.Unstructured{}
	obj.SetAPIVersion("fencing.example.com/v1alpha1")
	obj.SetKind("PowerFence")
	err := k8sClient.Get(ctx, client.ObjectKey{Namespace: f.machine.Namespace, Name: f.machine.Name}, obj)
	if apierrors.IsNotFound(err) {
		return nil
	}
	f.g.Expect(err).NotTo(HaveOccurred())
	return obj
}

// setFenced sets the Fenced condition as the provider would.
func (f *externalFixture) setFenced(status metav1.ConditionStatus, reason, message string) {
	f.t.Helper()
	obj := f.object()
	f.g.Expect(obj).NotTo(BeNil())
	f.g.Expect(unstructured.SetNestedSlice(obj.Object, []any{map[string]any{
		"type": "Fenced", "status": string(status), "reason": reason, "message": message,
		"lastTransitionTime": metav1.Now().UTC().Format("2006-01-02T15:04:05Z"),
	}}, "status", "conditions")).To(Succeed())
	f.g.Expect(k8sClient.Status().Update(ctx, obj)).To(Succeed())
}

func TestExternalFenceFollowsTheContract(t *testing.T) {
	f := newExternalFixture(t)
	done, msg := f.fence()
	f.g.Expect(done).To(BeFalse())
	f.g.Expect(msg).To(ContainSubstring("PowerFence " + f.machine.Name + " created from PowerFenceTemplate bmc-off"))
	obj := f.object()
	f.g.Expect(obj).NotTo(BeNil(), "named after the Machine, in its namespace, kind without Template")
	f.g.Expect(obj.Object["spec"]).To(Equal(map[string]any{"action": "power-off", "bmcSecret": "bmc"}))
	f.g.Expect(obj.GetLabels()).To(Equal(map[string]string{clusterv1.ClusterNameLabel: f.cluster.Name, fencing.ManagedByLabel: fencing.ManagedBy}))
	f.g.Expect(obj.GetAnnotations()).To(Equal(map[string]string{
		fencing.ExternalFenceMachineAnnotation: f.machine.Name, fencing.ExternalFenceNodeAnnotation: f.node,
		fencing.RemediationUIDAnnotation: string(f.remediation)}))
	f.g.Expect(obj.GetOwnerReferences()).To(BeEmpty(), "garbage collection must never unfence")

	done, msg = f.fence() // a crash after the create: nothing new
	f.g.Expect(done).To(BeFalse())
	f.g.Expect(msg).To(ContainSubstring("waiting for its Fenced condition"))

	f.setFenced(metav1.ConditionFalse, "BMCUnreachable", "cannot reach the BMC")
	done, msg = f.fence()
	f.g.Expect(done).To(BeFalse())
	f.g.Expect(msg).To(ContainSubstring("Fenced=False BMCUnreachable: cannot reach the BMC"))

	f.setFenced(metav1.ConditionTrue, "PoweredOff", "chassis power is off")
	done, msg = f.fence()
	f.g.Expect(done).To(BeTrue())
	f.g.Expect(msg).To(ContainSubstring("chassis power is off"))
}

func TestExternalUnfenceDeletesAndWaitsForTheProvider(t *testing.T) {
	f := newExternalFixture(t)
	f.fence()
	obj := f.object()
	obj.SetFinalizers([]string{"fencing.example.com/power-on"}) // the provider acts on unfence
	f.g.Expect(k8sClient.Update(ctx, obj)).To(Succeed())
	f.setFenced(metav1.ConditionTrue, "PoweredOff", "off")

	done, _ := f.unfence()
	f.g.Expect(done).To(BeFalse())
	done, msg := f.unfence()
	f.g.Expect(done).To(BeFalse())
	f.g.Expect(msg).To(ContainSubstring("being deleted"))

	// Broken again before the provider finished: not fenced by an object on its way out.
	done, msg = f.fence()
	f.g.Expect(done).To(BeFalse())
	f.g.Expect(msg).To(ContainSubstring("fencing again once it is gone"))

	obj = f.object()
	obj.SetFinalizers(nil)
	f.g.Expect(k8sClient.Update(ctx, obj)).To(Succeed())
	done, _ = f.unfence()
	f.g.Expect(done).To(BeTrue())
}

func TestExternalFenceWithoutTemplateOrOfAnotherNode(t *testing.T) {
	t.Run("template missing: nothing created, says so", func(t *testing.T) {
		f := newExternalFixture(t)
		f.spec.TemplateRef.Name = "missing"
		done, msg := f.fence()
		f.g.Expect(done).To(BeFalse())
		f.g.Expect(msg).To(ContainSubstring("template PowerFenceTemplate missing not found"))
		f.g.Expect(f.object()).To(BeNil())
	})
	t.Run("an object of the same name for another node is not this fence", func(t *testing.T) {
		f := newExternalFixture(t)
		f.fence()
		f.setFenced(metav1.ConditionTrue, "PoweredOff", "off")
		other := f.node
		f.node = "another-node"
		done, msg := f.fence()
		f.g.Expect(done).To(BeFalse())
		f.g.Expect(msg).To(ContainSubstring(`exists for node "` + other + `"`))
		done, _ = f.unfence()
		f.g.Expect(done).To(BeTrue())
		f.g.Expect(f.object()).NotTo(BeNil(), "another node's fence is not released")
	})
	t.Run("kind not installed: not available", func(t *testing.T) {
		f := newExternalFixture(t)
		f.spec.TemplateRef.APIVersion = "power.example.org/v1"
		_, _, err := f.backend.Fence(ctx, f.request(), f.spec)
		f.g.Expect(err).To(MatchError(fencing.ErrNotAvailable))
		done, _ := f.unfence()
		f.g.Expect(done).To(BeTrue())
	})
}
