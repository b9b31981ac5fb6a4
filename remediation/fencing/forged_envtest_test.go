//go:build envtest

package fencing_test

import (
	"testing"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/remediation/fencing"
)

// A fence object is found by its name, which anyone can use: a backend confirms only the object CAPR
// created for this remediation (its marks and the spec CAPR gives it); any other object of that name,
// stale or forged, is reported and replaced, never believed.

// forgeNetworkFence creates the NetworkFence of class under the name CAPR uses, with everything CAPR
// would give it, as csi-addons would report it fenced, then changed by mutate.
func (f *fixture) forgeNetworkFence(class string, cidrs []any, mutate func(*unstructured.Unstructured)) {
	f.t.Helper()
	nf := &unstructured.Unstructured{}
	nf.SetGroupVersionKind(fencing.NetworkFenceGVK)
	nf.SetName(f.name(class))
	nf.SetLabels(map[string]string{fencing.ManagedByLabel: fencing.ManagedBy})
	nf.SetAnnotations(map[string]string{
		fencing.NetworkFenceNodeAnnotation: f.node, fencing.RemediationUIDAnnotation: string(f.remediation),
		fencing.NetworkFenceMachineAnnotation: f.machine.Namespace + "/" + f.machine.Name,
	})
	nf.Object["spec"] = map[string]any{"networkFenceClassName": class, "fenceState": "Fenced", "cidrs": cidrs}
	mutate(nf)
	f.g.Expect(k8sClient.Create(ctx, nf)).To(Succeed())
	f.report(class, "Succeeded", fencedMessage)
}

// ofAnotherRemediation marks obj as made for another MachineRemediation.
func ofAnotherRemediation(obj *unstructured.Unstructured) {
	a := obj.GetAnnotations() // a copy
	a[fencing.RemediationUIDAnnotation] = "another-uid"
	obj.SetAnnotations(a)
}

// TestForgedNetworkFenceIsNotBelieved: a NetworkFence under the expected name, reported fenced by
// csi-addons, is not confirmed unless CAPR made it for this remediation with the intended spec; it is
// deleted, and CAPR's own is created once it is gone and confirmed only when csi-addons fences it.
func TestForgedNetworkFenceIsNotBelieved(t *testing.T) {
	for _, tt := range []struct {
		name   string
		cidrs  []any
		mutate func(*unstructured.Unstructured)
		why    string
	}{
		{"without the marks of CAPR", []any{"10.0.9.7/32"}, func(nf *unstructured.Unstructured) {
			nf.SetLabels(nil)
			nf.SetAnnotations(map[string]string{fencing.NetworkFenceNodeAnnotation: "node-x"})
		}, `label app.kubernetes.io/managed-by is "", not "capr"`},
		{"of another remediation", []any{"10.0.9.7/32"}, func(nf *unstructured.Unstructured) {
			ofAnotherRemediation(nf)
		}, `is "another-uid", not this remediation's`},
		{"other addresses", []any{"192.0.2.1/32"}, func(*unstructured.Unstructured) {}, "spec.cidrs [192.0.2.1/32] lacks [10.0.9.7/32]"},
		{"another class", []any{"10.0.9.7/32"}, func(nf *unstructured.Unstructured) {
			nf.Object["spec"].(map[string]any)["networkFenceClassName"] = "nfs"
		}, `spec.networkFenceClassName is "nfs", not "ceph"`},
		{"a driver of its own", []any{"10.0.9.7/32"}, func(nf *unstructured.Unstructured) {
			nf.Object["spec"].(map[string]any)["driver"] = "other.csi.example.com"
		}, "spec.driver is set"},
		{"a copy of everything CAPR gives it", []any{"10.0.9.7/32"}, func(*unstructured.Unstructured) {},
			"is not one CAPR recorded creating it"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, addresses("10.0.9.7")...)
			createClass(f.g, "ceph")
			f.forgeNetworkFence("ceph", tt.cidrs, tt.mutate)
			forged := f.get("ceph").GetUID()

			pf := &fencing.PolicyFencer{Workload: f.backend.Workload, Backends: map[caprv1.FencingBackendType]fencing.Backend{caprv1.FencingBackendNetworkFence: f.backend}}
			res := f.policyFence(pf, "ceph")
			f.g.Expect(res.Outcome).To(Equal(fencing.Waiting), "a forged confirmation is never believed")
			f.g.Expect(res.Message).To(And(ContainSubstring("is not the fence CAPR made for this remediation"), ContainSubstring(tt.why)),
				"reported in the Result (the condition and event)")
			f.g.Expect(f.get("ceph")).To(BeNil(), "deleted (no csi-addons finalizer here)")

			done, msg := f.fence("ceph")
			f.g.Expect(done).To(BeFalse())
			f.g.Expect(msg).To(ContainSubstring("waiting for csi-addons"))
			mine := f.get("ceph")
			f.g.Expect(mine.GetUID()).NotTo(Equal(forged))
			f.g.Expect(mine.GetLabels()).To(HaveKeyWithValue(fencing.ManagedByLabel, fencing.ManagedBy))
			f.g.Expect(mine.GetAnnotations()).To(HaveKeyWithValue(fencing.RemediationUIDAnnotation, string(f.remediation)))
			done, _ = f.fence("ceph")
			f.g.Expect(done).To(BeFalse(), "CAPR's own object is confirmed only by csi-addons")
			f.report("ceph", "Succeeded", fencedMessage)
			done, _ = f.fence("ceph")
			f.g.Expect(done).To(BeTrue())
		})
	}
}

// TestNetworkFenceOfAnotherRemediationIsNotUnfenced: an unfence leaves alone a NetworkFence that
// another remediation made (e.g. one that replaced this remediation's): it is that one's to undo.
func TestNetworkFenceOfAnotherRemediationIsNotUnfenced(t *testing.T) {
	f := newFixture(t, addresses("10.0.10.7")...)
	createClass(f.g, "ceph")
	f.forgeNetworkFence("ceph", []any{"10.0.10.7/32"}, func(nf *unstructured.Unstructured) {
		ofAnotherRemediation(nf)
	})
	done, _ := f.unfence("ceph")
	f.g.Expect(done).To(BeTrue())
	f.g.Expect(fenceState(f.get("ceph"))).To(Equal("Fenced"))
}

// TestFencedNetworkFenceOfThisRemediationIsConfirmed: the checks do not refuse CAPR's own object with
// the intended spec, also when it fences more addresses than the Node has now.
func TestFencedNetworkFenceOfThisRemediationIsConfirmed(t *testing.T) {
	f := newFixture(t, addresses("10.0.11.7")...)
	createClass(f.g, "ceph")
	f.fence("ceph")
	nf := f.get("ceph")
	f.g.Expect(unstructured.SetNestedStringSlice(nf.Object, []string{"10.0.11.7/32", "10.0.11.8/32"}, "spec", "cidrs")).To(Succeed())
	f.g.Expect(k8sClient.Update(ctx, nf)).To(Succeed())
	f.report("ceph", "Succeeded", fencedMessage)
	done, msg := f.fence("ceph")
	f.g.Expect(done).To(BeTrue(), msg)
}

// TestFenceObjectRecreatedUnderItsNameIsNotBelieved: CAPR's own object, deleted and made again with
// everything it had (marks, spec, a confirmed status), is not CAPR's: only the UID recorded when
// CAPR created it is believed.
func TestFenceObjectRecreatedUnderItsNameIsNotBelieved(t *testing.T) {
	f := newExternalFixture(t)
	f.fence()
	obj := f.object()
	mine := obj.GetUID()
	f.g.Expect(k8sClient.Delete(ctx, obj)).To(Succeed())
	copied := &unstructured.Unstructured{Object: map[string]any{"spec": obj.Object["spec"]}}
	copied.SetGroupVersionKind(obj.GroupVersionKind())
	copied.SetNamespace(obj.GetNamespace())
	copied.SetName(obj.GetName())
	copied.SetLabels(obj.GetLabels())
	copied.SetAnnotations(obj.GetAnnotations())
	f.g.Expect(k8sClient.Create(ctx, copied)).To(Succeed())
	f.setFenced(metav1.ConditionTrue, "PoweredOff", "chassis power is off")

	done, msg := f.fence()
	f.g.Expect(done).To(BeFalse(), "a copy is never believed")
	f.g.Expect(msg).To(ContainSubstring("is not one CAPR recorded creating it"))
	f.g.Expect(f.object()).To(BeNil(), "deleted (no provider finalizer here)")
	f.fence()
	f.g.Expect(f.object().GetUID()).NotTo(Or(Equal(mine), Equal(copied.GetUID())), "CAPR's own made anew")
}

// TestForgedExternalFenceIsNotBelieved: an object of the provider's kind named after the Machine,
// annotated with the Node and Fenced=True, is not confirmed unless CAPR made it for this remediation
// from the template; it is deleted and CAPR's own is created once it is gone.
func TestForgedExternalFenceIsNotBelieved(t *testing.T) {
	for _, tt := range []struct {
		name   string
		mutate func(*unstructured.Unstructured)
		why    string
	}{
		{"without the marks of CAPR", func(obj *unstructured.Unstructured) {
			obj.SetLabels(nil)
			obj.SetAnnotations(map[string]string{fencing.ExternalFenceNodeAnnotation: obj.GetAnnotations()[fencing.ExternalFenceNodeAnnotation]})
		}, `label app.kubernetes.io/managed-by is "", not "capr"`},
		{"of another remediation", func(obj *unstructured.Unstructured) {
			ofAnotherRemediation(obj)
		}, `is "another-uid", not this remediation's`},
		{"not the spec of the template", func(obj *unstructured.Unstructured) {
			obj.Object["spec"] = map[string]any{"action": "none", "bmcSecret": "bmc"}
		}, "spec is not the spec.template.spec of PowerFenceTemplate bmc-off"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newExternalFixture(t)
			f.fence() // CAPR's object, then changed as a stale or forged one would be
			obj := f.object()
			tt.mutate(obj)
			f.g.Expect(k8sClient.Update(ctx, obj)).To(Succeed())
			f.setFenced(metav1.ConditionTrue, "PoweredOff", "chassis power is off")
			forged := f.object().GetUID()

			done, msg := f.fence()
			f.g.Expect(done).To(BeFalse(), "a forged confirmation is never believed")
			f.g.Expect(msg).To(And(ContainSubstring("PowerFence "+f.machine.Name+" is not the fence CAPR made for this remediation"), ContainSubstring(tt.why)))
			f.g.Expect(f.object()).To(BeNil(), "deleted (no provider finalizer here)")

			done, msg = f.fence()
			f.g.Expect(done).To(BeFalse())
			f.g.Expect(msg).To(ContainSubstring("created from PowerFenceTemplate bmc-off"))
			f.g.Expect(f.object().GetUID()).NotTo(Equal(forged))
			done, _ = f.fence()
			f.g.Expect(done).To(BeFalse(), "CAPR's own object is confirmed only by the provider")
			f.setFenced(metav1.ConditionTrue, "PoweredOff", "chassis power is off")
			done, _ = f.fence()
			f.g.Expect(done).To(BeTrue())
		})
	}
}

// TestExternalFenceChecksAgainstTheTemplate: fields the provider adds to the spec (defaulting) do not
// make CAPR's object a stranger; without the template the spec cannot be checked, so the fence cannot
// be confirmed (nothing deleted); an object of another remediation is not unfenced.
func TestExternalFenceChecksAgainstTheTemplate(t *testing.T) {
	t.Run("defaulted fields", func(t *testing.T) {
		f := newExternalFixture(t)
		f.fence()
		obj := f.object()
		obj.Object["spec"].(map[string]any)["timeoutSeconds"] = int64(30)
		f.g.Expect(k8sClient.Update(ctx, obj)).To(Succeed())
		f.setFenced(metav1.ConditionTrue, "PoweredOff", "off")
		done, msg := f.fence()
		f.g.Expect(done).To(BeTrue(), msg)
	})
	t.Run("template gone", func(t *testing.T) {
		f := newExternalFixture(t)
		f.fence()
		f.setFenced(metav1.ConditionTrue, "PoweredOff", "off")
		f.spec.TemplateRef.Name = "gone"
		done, msg := f.fence()
		f.g.Expect(done).To(BeFalse())
		f.g.Expect(msg).To(ContainSubstring("cannot be confirmed: template PowerFenceTemplate gone not found"))
		f.g.Expect(f.object()).NotTo(BeNil())
	})
	t.Run("another remediation not unfenced", func(t *testing.T) {
		f := newExternalFixture(t)
		f.fence()
		mine := f.remediation
		f.remediation = "another-uid"
		done, _ := f.unfence()
		f.g.Expect(done).To(BeTrue())
		f.g.Expect(f.object()).NotTo(BeNil())
		f.remediation = mine
		done, _ = f.unfence()
		f.g.Expect(done).To(BeFalse(), "deleted by its own remediation")
		f.g.Expect(f.object()).To(BeNil())
	})
}
