package machinehealthcheck

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/clustercache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// TestSelectorsFollowTheHealthChecksVersion: a health check's selector is parsed again when the
// health check is another version (resourceVersion) or another object of the same name (UID), or
// was forgotten; an unstored health check is parsed every time. The oracle is which Machine labels
// the returned selector matches: a selector kept too long matches the old pool.
func TestSelectorsFollowTheHealthChecksVersion(t *testing.T) {
	hc := func(uid types.UID, rv, pool string) *caprv1.MachineHealthCheck {
		mhc := &caprv1.MachineHealthCheck{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "hc", UID: uid, ResourceVersion: rv}}
		mhc.Spec.ClusterName = "c"
		mhc.Spec.Selector = caprv1.MachineSelector{MatchLabels: map[string]caprv1.LabelValue{"pool": caprv1.LabelValue(pool)}}
		return mhc
	}
	machineOf := func(pool string) labels.Set { return labels.Set{"pool": pool, clusterv1.ClusterNameLabel: "c"} }
	tests := []struct {
		name     string
		first    *caprv1.MachineHealthCheck
		forget   bool
		second   *caprv1.MachineHealthCheck
		wantPool string // the pool the second selector matches
	}{
		{name: "same version", first: hc("u1", "1", "a"), second: hc("u1", "1", "a"), wantPool: "a"},
		{name: "edited: new resourceVersion", first: hc("u1", "1", "a"), second: hc("u1", "2", "b"), wantPool: "b"},
		{name: "recreated: new UID, same resourceVersion", first: hc("u1", "1", "a"), second: hc("u2", "1", "b"), wantPool: "b"},
		{name: "forgotten", first: hc("u1", "1", "a"), forget: true, second: hc("u1", "1", "b"), wantPool: "b"},
		{name: "never stored", first: hc("", "", "a"), second: hc("", "", "b"), wantPool: "b"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			var s selectors
			first, err := s.of(tt.first)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(first.Matches(machineOf(string(tt.first.Spec.Selector.MatchLabels["pool"])))).To(BeTrue())
			if tt.forget {
				s.forget(types.NamespacedName{Namespace: "ns", Name: "hc"})
			}
			second, err := s.of(tt.second)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(second.Matches(machineOf(tt.wantPool))).To(BeTrue())
			other := map[string]string{"a": "b", "b": "a"}[tt.wantPool]
			g.Expect(second.Matches(machineOf(other))).To(BeFalse())
		})
	}
}

// TestSelectorsKeepAnInvalidSelectorsError: a selector that does not parse gives its error for as
// long as that version is asked for.
func TestSelectorsKeepAnInvalidSelectorsError(t *testing.T) {
	g := NewWithT(t)
	mhc := &caprv1.MachineHealthCheck{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "hc", UID: "u1", ResourceVersion: "1"}}
	mhc.Spec.ClusterName = "c"
	mhc.Spec.Selector = caprv1.MachineSelector{MatchLabels: map[string]caprv1.LabelValue{"not a key!": "x"}}
	var s selectors
	for range 2 {
		_, err := s.of(mhc)
		g.Expect(err).To(MatchError(ContainSubstring("invalid spec.selector")))
	}
}

// reachableCache is a ClusterCache whose every workload cluster is reachable (a fake client).
type reachableCache struct {
	clustercache.ClusterCache
	remote client.Client
}

func (c reachableCache) GetClient(context.Context, client.ObjectKey) (client.Client, error) {
	return c.remote, nil
}

func (reachableCache) Watch(context.Context, client.ObjectKey, clustercache.Watcher) error {
	return nil
}

// TestInvalidSelectorIsReportedAsSuch: a health check whose selector does not parse (stored before
// admission checked selectors) is reported with reason InvalidSelector and a Warning event, once,
// while its workload cluster stays reported reachable. Before, the parse error came out of the
// round's observation and was taken for a workload cluster that cannot be reached.
func TestInvalidSelectorIsReportedAsSuch(t *testing.T) {
	g := NewWithT(t)
	scheme := runtime.NewScheme()
	g.Expect(caprv1.AddToScheme(scheme)).To(Succeed())
	g.Expect(clusterv1.AddToScheme(scheme)).To(Succeed())
	c := fake.NewClientBuilder().WithScheme(scheme).Build()
	recorder := events.NewFakeRecorder(10)
	r := &Reconciler{Client: c, ClusterCache: reachableCache{remote: c}, recorder: recorder}

	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c1", UID: types.UID("c-uid")}}
	cluster.Status.Conditions = []metav1.Condition{{Type: clusterv1.ClusterControlPlaneInitializedCondition, Status: metav1.ConditionTrue,
		Reason: "Initialized", LastTransitionTime: metav1.Now()}}
	mhc := &caprv1.MachineHealthCheck{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "hc", UID: "u1", ResourceVersion: "1"}}
	mhc.Spec.ClusterName = "c1"
	mhc.Spec.Selector = caprv1.MachineSelector{MatchLabels: map[string]caprv1.LabelValue{"pool": "not a value!"}}

	for range 2 {
		res, err := r.reconcileNormal(context.Background(), cluster, mhc)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(res.RequeueAfter).To(BeZero(), "an invalid selector waits for the spec to change")
	}
	allowed := meta.FindStatusCondition(mhc.Status.Conditions, caprv1.MachineHealthCheckRemediationAllowedCondition)
	g.Expect(allowed).NotTo(BeNil())
	g.Expect(allowed.Status).To(Equal(metav1.ConditionFalse))
	g.Expect(allowed.Reason).To(Equal(caprv1.MachineHealthCheckInvalidSelectorReason))
	g.Expect(allowed.Message).To(ContainSubstring("spec.selector"))
	g.Expect(mhc.Status.RemediationsAllowed).To(HaveValue(BeZero()))
	if reach := meta.FindStatusCondition(mhc.Status.Conditions, caprv1.MachineHealthCheckWorkloadClusterReachableCondition); reach != nil {
		g.Expect(reach.Reason).NotTo(Equal(caprv1.MachineHealthCheckWorkloadClusterUnreachableReason))
	}
	g.Expect(recorder.Events).To(HaveLen(1))
	g.Expect(<-recorder.Events).To(HavePrefix("Warning " + caprv1.EventInvalidSelector + " No Machine is checked until spec.selector is fixed"))
}
