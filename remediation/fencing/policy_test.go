package fencing

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

func TestStrictest(t *testing.T) {
	nf := caprv1.FencingBackend{Type: caprv1.FencingBackendNetworkFence, NetworkFenceClassNames: []string{"ceph"}}
	nf2 := caprv1.FencingBackend{Type: caprv1.FencingBackendNetworkFence, NetworkFenceClassNames: []string{"nfs"}}
	ext := caprv1.FencingBackend{Type: caprv1.FencingBackendExternal, TemplateRef: &caprv1.TemplateReference{Kind: "PowerFenceTemplate", Name: "ipmi"}}
	taint := caprv1.FencingBackend{Type: caprv1.FencingBackendOutOfServiceTaint}
	spec := func(p caprv1.FencingPolicy, timeout *int32, backends ...caprv1.FencingBackend) *caprv1.FencingSpec {
		return &caprv1.FencingSpec{Policy: p, Backends: backends, TimeoutSeconds: timeout}
	}
	hc := func(name string, s *caprv1.FencingSpec) Source { return Source{HealthCheck: name, Spec: s} }
	many := make([]caprv1.FencingBackend, 0, maxBackends)
	for i := range maxBackends {
		many = append(many, caprv1.FencingBackend{Type: caprv1.FencingBackendNetworkFence, NetworkFenceClassNames: []string{string(rune('a' + i))}})
	}

	for _, tc := range []struct {
		name    string
		own     *caprv1.FencingSpec
		checks  []Source
		want    *caprv1.AppliedFencing
		wantErr string
	}{{
		name: "no fencing anywhere is Disabled",
		want: &caprv1.AppliedFencing{Policy: caprv1.FencingDisabled},
	}, {
		name: "the request's own fencing applies as written when no health check covers the Machine",
		own:  spec(caprv1.FencingBestEffort, ptr.To[int32](60), nf),
		want: &caprv1.AppliedFencing{Policy: caprv1.FencingBestEffort, Backends: []caprv1.FencingBackend{nf}, TimeoutSeconds: ptr.To[int32](60)},
	}, {
		name:   "a hand-written request without fencing gets the Required health check's",
		checks: []Source{hc("hc", spec(caprv1.FencingRequired, nil, nf))},
		want:   &caprv1.AppliedFencing{Policy: caprv1.FencingRequired, Backends: []caprv1.FencingBackend{nf}, RaisedBy: []string{"hc"}},
	}, {
		name:   "a request saying Disabled cannot lower a Required health check",
		own:    spec(caprv1.FencingDisabled, nil, ext),
		checks: []Source{hc("hc", spec(caprv1.FencingRequired, nil, nf))},
		want:   &caprv1.AppliedFencing{Policy: caprv1.FencingRequired, Backends: []caprv1.FencingBackend{nf}, RaisedBy: []string{"hc"}},
	}, {
		name:   "a Required request with a backend of its own cannot replace the health check's backend",
		own:    spec(caprv1.FencingRequired, nil, ext),
		checks: []Source{hc("hc", spec(caprv1.FencingBestEffort, nil, nf))},
		want:   &caprv1.AppliedFencing{Policy: caprv1.FencingRequired, Backends: []caprv1.FencingBackend{ext, nf}, RaisedBy: []string{"hc"}},
	}, {
		name:   "a health check that adds nothing does not raise",
		own:    spec(caprv1.FencingRequired, ptr.To[int32](600), nf),
		checks: []Source{hc("same", spec(caprv1.FencingBestEffort, ptr.To[int32](60), nf)), hc("off", spec(caprv1.FencingDisabled, nil, ext)), hc("none", nil)},
		want:   &caprv1.AppliedFencing{Policy: caprv1.FencingRequired, Backends: []caprv1.FencingBackend{nf}, TimeoutSeconds: ptr.To[int32](600)},
	}, {
		name: "the strictest policy, every backend once in name order with the taint last, the longest timeout",
		own:  spec(caprv1.FencingBestEffort, ptr.To[int32](30), nf),
		checks: []Source{
			hc("b", spec(caprv1.FencingRequired, nil, nf, taint)),
			hc("a", spec(caprv1.FencingBestEffort, ptr.To[int32](900), nf2)),
		},
		want: &caprv1.AppliedFencing{Policy: caprv1.FencingRequired, Backends: []caprv1.FencingBackend{nf, nf2, taint},
			TimeoutSeconds: ptr.To[int32](900), RaisedBy: []string{"a", "b"}},
	}, {
		name:   "a health check's default timeout lengthens a request's short one",
		own:    spec(caprv1.FencingBestEffort, ptr.To[int32](30), nf),
		checks: []Source{hc("hc", spec(caprv1.FencingBestEffort, nil, nf))},
		want:   &caprv1.AppliedFencing{Policy: caprv1.FencingBestEffort, Backends: []caprv1.FencingBackend{nf}, TimeoutSeconds: ptr.To[int32](300), RaisedBy: []string{"hc"}},
	}, {
		name:    "more backends than one remediation can apply is an error naming the field",
		own:     spec(caprv1.FencingRequired, nil, many...),
		checks:  []Source{hc("hc", spec(caprv1.FencingRequired, nil, ext))},
		wantErr: "spec.fencing.backends and spec.remediation.fencing.backends of MachineHealthChecks hc together name 9 distinct backends",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			got, err := Strictest(tc.own, tc.checks)
			if tc.wantErr != "" {
				g.Expect(err).To(MatchError(ContainSubstring(tc.wantErr)))
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(got).To(Equal(tc.want))
		})
	}
}

// TestCoveringChecks: the health checks whose fencing counts are those of the Machine's namespace and
// cluster whose selector selects it; one whose selector cannot be parsed is an error naming it.
func TestCoveringChecks(t *testing.T) {
	g := NewWithT(t)
	scheme := testScheme(g)
	required := &caprv1.FencingSpec{Policy: caprv1.FencingRequired, Backends: []caprv1.FencingBackend{{Type: caprv1.FencingBackendOutOfServiceTaint}}}
	mhc := func(ns, name, cluster string, sel caprv1.MachineSelector) *caprv1.MachineHealthCheck {
		return &caprv1.MachineHealthCheck{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: caprv1.MachineHealthCheckSpec{
			ClusterName: cluster, Selector: sel, Remediation: caprv1.MachineHealthCheckRemediation{Fencing: required},
		}}
	}
	pool := func(v string) caprv1.MachineSelector {
		return caprv1.MachineSelector{MatchLabels: map[string]caprv1.LabelValue{"pool": caprv1.LabelValue(v)}}
	}
	m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m", Labels: map[string]string{"pool": "a", clusterv1.ClusterNameLabel: "c1"}},
		Spec: clusterv1.MachineSpec{ClusterName: "c1"}}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		mhc("ns", "covers", "c1", pool("a")),
		mhc("ns", "by-expression", "c1", caprv1.MachineSelector{MatchExpressions: []caprv1.MachineSelectorRequirement{{Key: "pool", Operator: metav1.LabelSelectorOpIn, Values: []string{"a", "b"}}}}),
		mhc("ns", "other-pool", "c1", pool("b")),
		mhc("ns", "other-cluster", "c2", pool("a")),
		mhc("other", "other-namespace", "c1", pool("a")),
	).Build()
	got, err := CoveringChecks(ctx, c, m)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got).To(ConsistOf(Source{HealthCheck: "covers", Spec: required}, Source{HealthCheck: "by-expression", Spec: required}))

	broken := mhc("ns", "broken", "c1", caprv1.MachineSelector{MatchExpressions: []caprv1.MachineSelectorRequirement{{Key: "pool", Operator: "Near"}}})
	g.Expect(c.Create(ctx, broken)).To(Succeed())
	_, err = CoveringChecks(ctx, c, m)
	g.Expect(err).To(MatchError(ContainSubstring("MachineHealthCheck broken covers Machine m: invalid spec.selector")))
}

// TestDecide: the applied fencing is decided once, and never for a request whose fence was begun
// under its spec.fencing (it is undone with those backends).
func TestDecide(t *testing.T) {
	g := NewWithT(t)
	required := &caprv1.FencingSpec{Policy: caprv1.FencingRequired, Backends: []caprv1.FencingBackend{{Type: caprv1.FencingBackendOutOfServiceTaint}}}
	m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m", Labels: map[string]string{"pool": "a", clusterv1.ClusterNameLabel: "c1"}},
		Spec: clusterv1.MachineSpec{ClusterName: "c1"}}
	c := fake.NewClientBuilder().WithScheme(testScheme(g)).WithObjects(&caprv1.MachineHealthCheck{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "hc"},
		Spec: caprv1.MachineHealthCheckSpec{ClusterName: "c1", Selector: caprv1.MachineSelector{MatchLabels: map[string]caprv1.LabelValue{"pool": "a"}},
			Remediation: caprv1.MachineHealthCheckRemediation{Fencing: required}},
	}).Build()

	mr := &caprv1.MachineRemediation{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m"}}
	raised, err := Decide(ctx, c, mr, m)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(raised).To(ContainSubstring("fencing Required with backends [OutOfServiceTaint] applies, from MachineHealthCheck(s) hc covering the Machine (the request's spec.fencing says Disabled)"))
	g.Expect(SpecOf(mr)).To(Equal(required))
	g.Expect(HookNeeded(SpecOf(mr), "node")).To(BeTrue())

	begun := &caprv1.MachineRemediation{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m"},
		Status: caprv1.MachineRemediationStatus{Fencing: &caprv1.FencingStatus{NodeName: "node"}}}
	raised, err = Decide(ctx, c, begun, m)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(raised).To(BeEmpty())
	g.Expect(begun.Status.AppliedFencing).To(BeNil())
	g.Expect(SpecOf(begun)).To(BeNil())
}

var ctx = context.Background()

func testScheme(g *WithT) *runtime.Scheme {
	s := runtime.NewScheme()
	g.Expect(caprv1.AddToScheme(s)).To(Succeed())
	return s
}
