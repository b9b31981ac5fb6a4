package machinehealthcheck

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/metrics"
)

// seriesOf returns the names of the capr_machinehealthcheck_* metric families that have a series
// of health check namespace/name.
func seriesOf(g Gomega, namespace, name string) []string {
	families, err := ctrlmetrics.Registry.Gather()
	g.Expect(err).NotTo(HaveOccurred())
	var out []string
	for _, f := range families {
		for _, m := range f.GetMetric() {
			if labelValue(m, "namespace") == namespace && labelValue(m, "name") == name {
				out = append(out, f.GetName())
				break
			}
		}
	}
	return out
}

func labelValue(m *dto.Metric, label string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == label {
			return l.GetValue()
		}
	}
	return ""
}

// A health check whose finalizer was removed by hand is deleted without reconcileDelete: the round
// that finds it gone drops what the process kept for it (keyed by name or by UID) and its metric
// series, and keeps those of the health checks that still exist.
func TestHealthCheckFoundGoneIsForgotten(t *testing.T) {
	g := NewWithT(t)
	scheme := runtime.NewScheme()
	g.Expect(caprv1.AddToScheme(scheme)).To(Succeed())
	live := &caprv1.MachineHealthCheck{ObjectMeta: metav1.ObjectMeta{Namespace: "gone-test", Name: "live", UID: "uid-live", Generation: 1}}
	gone := &caprv1.MachineHealthCheck{ObjectMeta: metav1.ObjectMeta{Namespace: "gone-test", Name: "gone", UID: "uid-gone", Generation: 1}}
	r := &Reconciler{Client: fake.NewClientBuilder().WithScheme(scheme).WithObjects(live).Build()}
	for _, mhc := range []*caprv1.MachineHealthCheck{live, gone} {
		r.state.reported.swap(mhc.UID, caprv1.MachineHealthCheckRemediationAllowedCondition, "", "SomeReason")
		r.state.templates.done(mhc, now)
		metrics.HealthCheckRound(mhc.Namespace, mhc.Name, 3, 1)
		metrics.Marked(mhc.Namespace, mhc.Name, "UnhealthyNode")
	}
	g.Expect(seriesOf(g, "gone-test", "gone")).NotTo(BeEmpty())

	_, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(gone)})
	g.Expect(err).NotTo(HaveOccurred())

	g.Expect(r.state.reported.last).NotTo(HaveKey(types.UID("uid-gone")))
	g.Expect(r.state.templates.last).NotTo(HaveKey(types.UID("uid-gone")))
	g.Expect(seriesOf(g, "gone-test", "gone")).To(BeEmpty())

	g.Expect(r.state.reported.last).To(HaveKey(types.UID("uid-live")))
	g.Expect(r.state.templates.last).To(HaveKey(types.UID("uid-live")))
	g.Expect(seriesOf(g, "gone-test", "live")).To(ContainElements("capr_machinehealthcheck_targets", "capr_machinehealthcheck_marks_total"))
}
