//go:build envtest

package machinehealthcheck_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/cluster-api/util/kubeconfig"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/controllers/machinehealthcheck"
	"github.com/capr-io/capr/metrics"
	"github.com/capr-io/capr/test/builder"
	capienv "github.com/capr-io/capr/test/envtest"
)

const (
	eventually = 20 * time.Second
	poll       = 100 * time.Millisecond
)

// fakeEtcdSource stands in for etcd in the health checker's tests only: the health checker is under
// test here, and real etcd membership is tested against a real etcd cluster in etcdutil and the
// sandbox.
type fakeEtcdSource struct {
	mu     sync.Mutex
	health map[string]machinehealthcheck.EtcdMemberHealth
}

// MemberHealth returns the members of the cluster's namespace: every test has its own namespace and
// names its Nodes "<namespace>-<machine>", so tests running in parallel never see each other's members.
func (f *fakeEtcdSource) MemberHealth(_ context.Context, cluster *clusterv1.Cluster) (map[string]machinehealthcheck.EtcdMemberHealth, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]machinehealthcheck.EtcdMemberHealth{}
	for k, v := range f.health {
		if strings.HasPrefix(k, cluster.Namespace+"-") {
			out[k] = v
		}
	}
	return out, nil
}

func (f *fakeEtcdSource) set(node string, h machinehealthcheck.EtcdMemberHealth) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.health[node] = h
}

var fakeEtcd = &fakeEtcdSource{health: map[string]machinehealthcheck.EtcdMemberHealth{}}

// fixture is one namespace with one Cluster whose workload cluster is the envtest API server.
type fixture struct {
	ns      string
	cluster *clusterv1.Cluster
}

func newFixture(t *testing.T, g *WithT, cpReplicas int32) *fixture {
	t.Helper()
	ns, err := capienv.CreateNamespace(ctx, k8sClient, "mhc")
	g.Expect(err).NotTo(HaveOccurred())
	f := &fixture{ns: ns}
	var cpRef clusterv1.ContractVersionedObjectReference
	if cpReplicas > 0 {
		cp := newControlPlane(ns, "cp", cpReplicas)
		g.Expect(k8sClient.Create(ctx, cp)).To(Succeed())
		cpRef = clusterv1.ContractVersionedObjectReference{APIGroup: "controlplane.cluster.x-k8s.io", Kind: "KubeadmControlPlane", Name: "cp"}
	}
	f.cluster = capienv.NewCluster(ns, "c1", cpRef)
	g.Expect(k8sClient.Create(ctx, f.cluster)).To(Succeed())
	g.Expect(capienv.SetClusterReady(ctx, k8sClient, f.cluster, capienv.ControlPlaneInitialized)).To(Succeed())
	g.Expect(capienv.CreateKubeconfigSecret(ctx, k8sClient, testEnv.Config, f.cluster)).To(Succeed())
	return f
}

// newControlPlane returns a KubeadmControlPlane with the fields its CRD requires; no KCP controller
// runs here, the health checker only reads spec.replicas.
func newControlPlane(ns, name string, replicas int32) *unstructured.Unstructured {
	cp := &unstructured.Unstructured{Object: map[string]interface{}{
		"apiVersion": "controlplane.cluster.x-k8s.io/v1beta2",
		"kind":       "KubeadmControlPlane",
		"metadata":   map[string]interface{}{"namespace": ns, "name": name},
		"spec": map[string]interface{}{
			"replicas": int64(replicas),
			"version":  "v1.36.3",
			"machineTemplate": map[string]interface{}{"spec": map[string]interface{}{
				"infrastructureRef": map[string]interface{}{"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "SandboxMachineTemplate", "name": "t"},
			}},
		},
	}}
	return cp
}

// machineSpec is what fixture.machine creates; machineOptions change it.
type machineSpec struct {
	controlPlane bool
	ready        corev1.ConditionStatus
	since        time.Time
	annotations  map[string]string
}

type machineOption func(*machineSpec)

// controlPlane makes the Machine a control-plane Machine.
func controlPlane() machineOption { return func(s *machineSpec) { s.controlPlane = true } }

// nodeReady gives the Machine's Node the Ready status ready, last changed at since.
func nodeReady(ready corev1.ConditionStatus, since time.Time) machineOption {
	return func(s *machineSpec) { s.ready, s.since = ready, since }
}

// withAnnotations creates the Machine with these annotations.
// pool labels a Machine into the pool the fixture's health checks select.
var pool = map[string]string{"pool": "a"}

func withAnnotations(a map[string]string) machineOption {
	return func(s *machineSpec) { s.annotations = a }
}

// machine creates a worker Machine in pool "a" with a Node that has been Ready for an hour, changed
// by options.
func (f *fixture) machine(g *WithT, name string, options ...machineOption) *clusterv1.Machine {
	spec := machineSpec{ready: corev1.ConditionTrue, since: time.Now().Add(-time.Hour)}
	for _, o := range options {
		o(&spec)
	}
	b := builder.Machine(f.ns, f.cluster.Name, name).WithLabels(pool).WithAnnotations(spec.annotations)
	if spec.controlPlane {
		b.ControlPlane()
	}
	m := b.Build()
	g.Expect(k8sClient.Create(ctx, m)).To(Succeed())
	nodeName := f.ns + "-" + name
	g.Expect(capienv.CreateNode(ctx, k8sClient, capienv.NewNode(nodeName, spec.ready, spec.since))).To(Succeed())
	g.Expect(capienv.SetMachineNode(ctx, k8sClient, m, nodeName)).To(Succeed())
	return m
}

func (f *fixture) healthCheck(g *WithT, mutate func(*caprv1.MachineHealthCheck)) *caprv1.MachineHealthCheck {
	mhc := capienv.NewHealthCheck(f.ns, f.cluster.Name, "a", 5)
	if mutate != nil {
		mutate(mhc)
	}
	g.Expect(k8sClient.Create(ctx, mhc)).To(Succeed())
	return mhc
}

func getMachine(g Gomega, ns, name string) *clusterv1.Machine {
	m := &clusterv1.Machine{}
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, m)).To(Succeed())
	return m
}

// markOf returns the Machine's mark (nil when not marked) and the health check's condition. The
// mark is the record of the annotation when a person wrote one (a request), else the condition at
// False read as a record (since is its lastTransitionTime): the health checker writes only the
// condition.
func markOf(g Gomega, ns, name string) (*caprv1.MarkRecord, *metav1.Condition) {
	m := getMachine(g, ns, name)
	cond := conditions.Get(m, caprv1.MachineCAPRHealthCheckSucceededCondition)
	if v, ok := m.Annotations[caprv1.UnhealthyAnnotation]; ok {
		rec := &caprv1.MarkRecord{}
		g.Expect(json.Unmarshal([]byte(v), rec)).To(Succeed())
		return rec, cond
	}
	if cond == nil || cond.Status != metav1.ConditionFalse {
		return nil, cond
	}
	return &caprv1.MarkRecord{Reason: cond.Reason, Message: cond.Message, Since: cond.LastTransitionTime}, cond
}

func remediationExists(ns, name string) bool {
	err := k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &caprv1.MachineRemediation{})
	return err == nil
}

func getHealthCheck(g Gomega, ns string) *caprv1.MachineHealthCheck {
	mhc := &caprv1.MachineHealthCheck{}
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "hc"}, mhc)).To(Succeed())
	return mhc
}

func eventsFor(g Gomega, ns, object, reason string) []corev1.Event {
	list := &corev1.EventList{}
	g.Expect(k8sClient.List(ctx, list, client.InNamespace(ns))).To(Succeed())
	var out []corev1.Event
	for _, e := range list.Items {
		if e.InvolvedObject.Name == object && e.Reason == reason {
			out = append(out, e)
		}
	}
	return out
}

// emissions counts how often the Event with reason was recorded about the health check "hc", read from the
// events.k8s.io/v1 API: the recorder folds repeats of the same event into one Event with a series
// (count 2 from the second repeat on), so each Event counts once, or series.count times.
func emissions(g Gomega, ns, reason string) int {
	list := &eventsv1.EventList{}
	g.Expect(k8sClient.List(ctx, list, client.InNamespace(ns))).To(Succeed())
	n := 0
	for _, e := range list.Items {
		if e.Regarding.Name != "hc" || e.Reason != reason {
			continue
		}
		if e.Series != nil && e.Series.Count > 1 {
			n += int(e.Series.Count)
		} else {
			n++
		}
	}
	return n
}

// notesOf returns the notes of the Events with reason about the health check "hc".
func notesOf(g Gomega, ns, reason string) []string {
	list := &eventsv1.EventList{}
	g.Expect(k8sClient.List(ctx, list, client.InNamespace(ns))).To(Succeed())
	var out []string
	for _, e := range list.Items {
		if e.Regarding.Name == "hc" && e.Reason == reason {
			out = append(out, e.Note)
		}
	}
	return out
}

func TestMarksUnhealthyMachineAndRequestsRemediation(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	f := newFixture(t, g, 0)
	long := time.Now().Add(-time.Hour)
	f.machine(g, "healthy", nodeReady(corev1.ConditionTrue, long))
	f.machine(g, "sick", nodeReady(corev1.ConditionFalse, long))
	escalation := []caprv1.EscalationStep{{
		TemplateRef:    caprv1.TemplateReference{APIVersion: "example.com/v1", Kind: "RebootTemplate", Name: "reboot"},
		TimeoutSeconds: 120,
	}}
	f.healthCheck(g, func(mhc *caprv1.MachineHealthCheck) { mhc.Spec.Remediation.Escalation = escalation })

	g.Eventually(func(g Gomega) {
		rec, cond := markOf(g, f.ns, "sick")
		g.Expect(rec).NotTo(BeNil())
		g.Expect(rec.Reason).To(Equal(caprv1.MachineCAPRHealthCheckUnhealthyNodeReason))
		g.Expect(rec.Since.IsZero()).To(BeFalse())
		g.Expect(getMachine(g, f.ns, "sick").Annotations).NotTo(HaveKey(caprv1.UnhealthyAnnotation), "the mark is the condition alone")
		g.Expect(cond).NotTo(BeNil())
		g.Expect(cond.Status).To(Equal(metav1.ConditionFalse))
		g.Expect(cond.Reason).To(Equal(caprv1.MachineCAPRHealthCheckUnhealthyNodeReason))
		g.Expect(cond.Message).To(ContainSubstring("Condition Ready on Node is reporting status False"))
	}, eventually, poll).Should(Succeed())

	g.Eventually(func(g Gomega) {
		mr := &caprv1.MachineRemediation{}
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: "sick"}, mr)).To(Succeed())
		g.Expect(mr.Spec.Source).To(Equal(caprv1.MachineRemediationSourceHealthCheck))
		g.Expect(mr.Spec.Reason).To(Equal(caprv1.MachineCAPRHealthCheckUnhealthyNodeReason))
		g.Expect(mr.OwnerReferences).To(ContainElement(HaveField("Name", "sick")))
		g.Expect(mr.Labels).To(HaveKeyWithValue(machinehealthcheck.HealthCheckLabel, "hc"))
		g.Expect(mr.Spec.Escalation).To(Equal(escalation), "the escalation chain is copied into the request")
	}, eventually, poll).Should(Succeed())

	g.Eventually(func(g Gomega) {
		rec, cond := markOf(g, f.ns, "healthy")
		g.Expect(rec).To(BeNil())
		g.Expect(cond).NotTo(BeNil())
		g.Expect(cond.Status).To(Equal(metav1.ConditionTrue))
		mhc := getHealthCheck(g, f.ns)
		g.Expect(mhc.Status.ExpectedMachines).To(HaveValue(BeEquivalentTo(2)))
		g.Expect(mhc.Status.CurrentHealthy).To(HaveValue(BeEquivalentTo(1)))
		g.Expect(mhc.Status.Targets).To(Equal([]string{"healthy", "sick"}))
		g.Expect(mhc.Status.UnhealthyMachines).To(Equal([]string{"sick"}))
		g.Expect(conditions.IsTrue(mhc, caprv1.MachineHealthCheckRemediationAllowedCondition)).To(BeTrue())
		g.Expect(conditions.IsTrue(mhc, caprv1.MachineHealthCheckWorkloadClusterReachableCondition)).To(BeTrue())
		// One event for the mark and the request made in the same round.
		marked := eventsFor(g, f.ns, "sick", caprv1.EventMachineMarkedUnhealthy)
		g.Expect(marked).To(HaveLen(1))
		g.Expect(marked[0].Message).To(HaveSuffix("; remediation requested"))
	}, eventually, poll).Should(Succeed())
	g.Expect(eventsFor(g, f.ns, "sick", caprv1.EventRemediationRequested)).To(BeEmpty())
	g.Expect(remediationExists(f.ns, "healthy")).To(BeFalse())
	// CAPI's own condition is never written: KCP and MachineSets would act on it.
	g.Expect(conditions.Get(getMachine(g, f.ns, "sick"), clusterv1.MachineHealthCheckSucceededCondition)).To(BeNil())
}

func TestClearsMarkAndWithdrawsPendingRequestWhenHealthyAgain(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	f := newFixture(t, g, 0)
	f.machine(g, "flaky", nodeReady(corev1.ConditionFalse, time.Now().Add(-time.Hour)))
	f.healthCheck(g, nil)
	g.Eventually(func() bool { return remediationExists(f.ns, "flaky") }, eventually, poll).Should(BeTrue())

	g.Expect(capienv.SetNodeReady(ctx, k8sClient, f.ns+"-flaky", corev1.ConditionTrue)).To(Succeed())
	g.Eventually(func(g Gomega) {
		rec, cond := markOf(g, f.ns, "flaky")
		g.Expect(rec).To(BeNil())
		g.Expect(cond.Status).To(Equal(metav1.ConditionTrue))
		g.Expect(remediationExists(f.ns, "flaky")).To(BeFalse())
		g.Expect(eventsFor(g, f.ns, "flaky", caprv1.EventMachineMarkCleared)).NotTo(BeEmpty())
	}, eventually, poll).Should(Succeed())
}

func TestRunningRemediationIsNotWithdrawn(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	f := newFixture(t, g, 0)
	f.machine(g, "m", nodeReady(corev1.ConditionFalse, time.Now().Add(-time.Hour)))
	f.healthCheck(g, nil)
	g.Eventually(func() bool { return remediationExists(f.ns, "m") }, eventually, poll).Should(BeTrue())
	// A remediator started it: from here on it must finish even if the Machine recovers.
	setPhase(g, f.ns, "m", caprv1.MachineRemediationPhaseRunning)

	g.Expect(capienv.SetNodeReady(ctx, k8sClient, f.ns+"-m", corev1.ConditionTrue)).To(Succeed())
	g.Eventually(func(g Gomega) {
		rec, _ := markOf(g, f.ns, "m")
		g.Expect(rec).To(BeNil())
	}, eventually, poll).Should(Succeed())
	g.Consistently(func() bool { return remediationExists(f.ns, "m") }, 2*time.Second, poll).Should(BeTrue())
}

func TestShortCircuitMarksButDoesNotRequest(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	f := newFixture(t, g, 0)
	long := time.Now().Add(-time.Hour)
	f.machine(g, "a", nodeReady(corev1.ConditionTrue, long))
	f.machine(g, "b", nodeReady(corev1.ConditionFalse, long))
	f.machine(g, "c", nodeReady(corev1.ConditionUnknown, long))
	f.healthCheck(g, func(mhc *caprv1.MachineHealthCheck) {
		mhc.Spec.Remediation.TriggerIf = &caprv1.MachineHealthCheckRemediationTriggerIf{
			UnhealthyLessThanOrEqualTo: ptr.To(intstr.FromString("40%")), // 40% of 3 rounds down to 1
		}
	})
	g.Eventually(func(g Gomega) {
		mhc := getHealthCheck(g, f.ns)
		cond := conditions.Get(mhc, caprv1.MachineHealthCheckRemediationAllowedCondition)
		g.Expect(cond).NotTo(BeNil())
		g.Expect(cond.Status).To(Equal(metav1.ConditionFalse))
		g.Expect(cond.Reason).To(Equal(caprv1.MachineHealthCheckTooManyUnhealthyReason))
		g.Expect(cond.Message).To(ContainSubstring("total: 3, unhealthy: 2"))
		g.Expect(mhc.Status.RemediationsAllowed).To(HaveValue(BeEquivalentTo(0)))
		for _, name := range []string{"b", "c"} {
			rec, _ := markOf(g, f.ns, name)
			g.Expect(rec).NotTo(BeNil(), "the mark is written even when short-circuited")
		}
		g.Expect(eventsFor(g, f.ns, "hc", caprv1.EventRemediationRestricted)).NotTo(BeEmpty())
	}, eventually, poll).Should(Succeed())
	g.Consistently(func() bool { return remediationExists(f.ns, "b") || remediationExists(f.ns, "c") }, 2*time.Second, poll).Should(BeFalse())

	// c recovers: b, marked in an earlier round, is requested now, with an event of its own.
	g.Expect(capienv.SetNodeReady(ctx, k8sClient, f.ns+"-c", corev1.ConditionTrue)).To(Succeed())
	g.Eventually(func(g Gomega) {
		g.Expect(remediationExists(f.ns, "b")).To(BeTrue())
		g.Expect(eventsFor(g, f.ns, "b", caprv1.EventRemediationRequested)).To(HaveLen(1))
	}, eventually, poll).Should(Succeed())
	marked := eventsFor(g, f.ns, "b", caprv1.EventMachineMarkedUnhealthy)
	g.Expect(marked).To(HaveLen(1))
	g.Expect(marked[0].Message).NotTo(ContainSubstring("remediation requested"), "the mark's round did not request")
}

// TestStormCooldownHoldsRemediationAfterAStorm: two of three targets are unhealthy where triggerIf
// allows one (a storm); when one recovers, the other is not requested until the cooldown is over.
func TestStormCooldownHoldsRemediationAfterAStorm(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	f := newFixture(t, g, 0)
	long := time.Now().Add(-time.Hour)
	f.machine(g, "a", nodeReady(corev1.ConditionTrue, long))
	f.machine(g, "b", nodeReady(corev1.ConditionFalse, long))
	f.machine(g, "c", nodeReady(corev1.ConditionFalse, long))
	const cooldown = 6 * time.Second
	f.healthCheck(g, func(mhc *caprv1.MachineHealthCheck) {
		mhc.Spec.Remediation.TriggerIf = &caprv1.MachineHealthCheckRemediationTriggerIf{UnhealthyLessThanOrEqualTo: ptr.To(intstr.FromInt32(1))}
		mhc.Spec.Remediation.StormCooldownSeconds = ptr.To(int32(cooldown / time.Second))
	})
	g.Eventually(func(g Gomega) {
		mhc := getHealthCheck(g, f.ns)
		g.Expect(conditions.GetReason(mhc, caprv1.MachineHealthCheckStormCooldownCondition)).To(Equal(caprv1.MachineHealthCheckStormActiveReason))
		g.Expect(conditions.GetReason(mhc, caprv1.MachineHealthCheckRemediationAllowedCondition)).To(Equal(caprv1.MachineHealthCheckTooManyUnhealthyReason))
	}, eventually, poll).Should(Succeed())
	g.Expect(remediationExists(f.ns, "b") || remediationExists(f.ns, "c")).To(BeFalse())

	// The storm ends: c recovers, one unhealthy target is within triggerIf, but the cooldown runs.
	g.Expect(capienv.SetNodeReady(ctx, k8sClient, f.ns+"-c", corev1.ConditionTrue)).To(Succeed())
	var ended time.Time
	g.Eventually(func(g Gomega) {
		mhc := getHealthCheck(g, f.ns)
		c := conditions.Get(mhc, caprv1.MachineHealthCheckStormCooldownCondition)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Status).To(Equal(metav1.ConditionTrue))
		g.Expect(c.Reason).To(Equal(caprv1.MachineHealthCheckStormCooldownReason))
		allowed := conditions.Get(mhc, caprv1.MachineHealthCheckRemediationAllowedCondition)
		g.Expect(allowed.Status).To(Equal(metav1.ConditionFalse))
		g.Expect(allowed.Reason).To(Equal(caprv1.MachineHealthCheckStormCooldownReason))
		g.Expect(allowed.Message).To(ContainSubstring("no new remediation until"))
		g.Expect(notesOf(g, f.ns, caprv1.EventStormCooldownStarted)).NotTo(BeEmpty())
		ended = c.LastTransitionTime.Time
	}, eventually, poll).Should(Succeed())

	// b is requested once the cooldown is over, not before.
	mr := &caprv1.MachineRemediation{}
	g.Eventually(func() error {
		return k8sClient.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: "b"}, mr)
	}, eventually, poll).Should(Succeed())
	g.Expect(mr.CreationTimestamp.Time).To(BeTemporally(">=", ended.Add(cooldown)), "requested during the cooldown")
	g.Expect(remediationExists(f.ns, "c")).To(BeFalse())
	g.Eventually(func(g Gomega) {
		mhc := getHealthCheck(g, f.ns)
		g.Expect(conditions.GetReason(mhc, caprv1.MachineHealthCheckStormCooldownCondition)).To(Equal(caprv1.MachineHealthCheckNoStormReason))
		g.Expect(conditions.IsTrue(mhc, caprv1.MachineHealthCheckRemediationAllowedCondition)).To(BeTrue())
		g.Expect(notesOf(g, f.ns, caprv1.EventStormCooldownEnded)).NotTo(BeEmpty())
	}, eventually, poll).Should(Succeed())
}

func TestUnhealthyInRange(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	f := newFixture(t, g, 0)
	long := time.Now().Add(-time.Hour)
	f.machine(g, "a", nodeReady(corev1.ConditionTrue, long))
	f.machine(g, "b", nodeReady(corev1.ConditionFalse, long))
	f.healthCheck(g, func(mhc *caprv1.MachineHealthCheck) {
		mhc.Spec.Remediation.TriggerIf = &caprv1.MachineHealthCheckRemediationTriggerIf{UnhealthyInRange: "[2-3]"}
	})
	g.Eventually(func(g Gomega) {
		cond := conditions.Get(getHealthCheck(g, f.ns), caprv1.MachineHealthCheckRemediationAllowedCondition)
		g.Expect(cond).NotTo(BeNil())
		g.Expect(cond.Status).To(Equal(metav1.ConditionFalse))
		g.Expect(cond.Message).To(ContainSubstring("unhealthyInRange: [2-3]"))
	}, eventually, poll).Should(Succeed())
	g.Expect(remediationExists(f.ns, "b")).To(BeFalse())

	// A second unhealthy Machine brings the count into the range.
	g.Expect(capienv.SetNodeReady(ctx, k8sClient, f.ns+"-a", corev1.ConditionFalse)).To(Succeed())
	// Its condition just changed: the 5s timeout runs first, then both are requested.
	g.Eventually(func() bool { return remediationExists(f.ns, "a") && remediationExists(f.ns, "b") }, eventually, poll).Should(BeTrue())
}

func TestRequeuesAtTimeoutExpiry(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	f := newFixture(t, g, 0)
	const timeout = 10 * time.Second
	f.machine(g, "m", nodeReady(corev1.ConditionFalse, time.Now()))
	f.healthCheck(g, func(mhc *caprv1.MachineHealthCheck) {
		for i := range mhc.Spec.Checks.UnhealthyNodeConditions {
			mhc.Spec.Checks.UnhealthyNodeConditions[i].TimeoutSeconds = ptr.To(int32(timeout / time.Second))
		}
	})
	// The timeout runs from the Node condition's lastTransitionTime as the API stores it, in whole
	// seconds (up to a second before the Node was written), and a loaded machine may take seconds to
	// get here: the expiry is taken from the stored time, not from this test's clock (a 3.97 s mark
	// after a start taken here failed a 4 s bound on a loaded machine, 2026-11-28).
	node := &corev1.Node{}
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Name: f.ns + "-m"}, node)).To(Succeed())
	var expiry time.Time
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			expiry = c.LastTransitionTime.Add(timeout)
		}
	}
	g.Expect(expiry.IsZero()).To(BeFalse(), "the Node has a Ready condition")
	// Nothing changes in the API after this point: only the requeue at expiry can mark the Machine.
	window := time.Until(expiry) - time.Second
	g.Expect(window).To(BeNumerically(">=", 2*time.Second), "too little of the timeout left to see an early mark")
	g.Consistently(func(g Gomega) {
		rec, _ := markOf(g, f.ns, "m")
		g.Expect(rec).To(BeNil())
	}, window, poll).Should(Succeed())
	var marked metav1.Time
	g.Eventually(func(g Gomega) {
		rec, _ := markOf(g, f.ns, "m")
		g.Expect(rec).NotTo(BeNil())
		marked = rec.Since
	}, eventually, poll).Should(Succeed())
	// Whole seconds both, and the expiry a whole second: a mark before it has an earlier time.
	g.Expect(marked.Time).To(BeTemporally(">=", expiry), "marked before the timeout expired")
}

func TestNodeStartupTimeoutAndMissingNode(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	f := newFixture(t, g, 0)
	noNode := builder.Machine(f.ns, f.cluster.Name, "no-node").WithLabels(pool).Build()
	g.Expect(k8sClient.Create(ctx, noNode)).To(Succeed())
	gone := builder.Machine(f.ns, f.cluster.Name, "gone").WithLabels(pool).Build()
	g.Expect(k8sClient.Create(ctx, gone)).To(Succeed())
	g.Expect(capienv.SetMachineNode(ctx, k8sClient, gone, f.ns+"-never-created")).To(Succeed())
	f.healthCheck(g, func(mhc *caprv1.MachineHealthCheck) {
		mhc.Spec.Checks.NodeStartupTimeoutSeconds = ptr.To[int32](30)
	})
	g.Eventually(func(g Gomega) {
		rec, _ := markOf(g, f.ns, "gone")
		g.Expect(rec).NotTo(BeNil())
		g.Expect(rec.Reason).To(Equal(caprv1.MachineCAPRHealthCheckNodeDeletedReason))
	}, eventually, poll).Should(Succeed())
	// Within its 30s startup window the Node-less Machine is neither healthy nor marked.
	rec, cond := markOf(g, f.ns, "no-node")
	g.Expect(rec).To(BeNil())
	g.Expect(cond).To(BeNil())
	// The status is patched after the marks, at the end of the round.
	g.Eventually(func(g Gomega) {
		g.Expect(getHealthCheck(g, f.ns).Status.CurrentHealthy).To(HaveValue(BeEquivalentTo(0)))
	}, eventually, poll).Should(Succeed())
}

func TestManualRequests(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	f := newFixture(t, g, 0)
	long := time.Now().Add(-time.Hour)
	m1 := f.machine(g, "annotated", nodeReady(corev1.ConditionTrue, long))
	m2 := f.machine(g, "hand-marked", nodeReady(corev1.ConditionTrue, long))
	f.healthCheck(g, nil)
	waitCheckedHealthy(g, f.ns, "annotated")

	patchAnnotation(g, m1, clusterv1.RemediateMachineAnnotation, "")
	patchAnnotation(g, m2, caprv1.UnhealthyAnnotation, `{"reason":"ManualRequest","message":"disk is failing","checker":"alice"}`)
	g.Eventually(func(g Gomega) {
		for _, name := range []string{"annotated", "hand-marked"} {
			_, cond := markOf(g, f.ns, name)
			g.Expect(cond.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(cond.Reason).To(Equal(caprv1.MachineCAPRHealthCheckManualRequestReason))
			g.Expect(remediationExists(f.ns, name)).To(BeTrue())
		}
	}, eventually, poll).Should(Succeed())
	// A hand-written mark is never rewritten or cleared by the health check.
	rec, cond := markOf(g, f.ns, "hand-marked")
	g.Expect(rec.Checker).To(Equal("alice"))
	g.Expect(caprv1.MarkEntriesFromMessage(cond.Message)).To(Equal(caprv1.MarkEntries{
		{Checker: f.ns + "/hc", Reason: caprv1.MachineCAPRHealthCheckManualRequestReason, Message: "disk is failing"}}))
}

// TestHugeHandWrittenMarkIsCut: anyone who may annotate a Machine writes the mark's message. An
// annotation may hold up to 256 KiB, a condition's message 32 KiB: taken whole, a hand-written mark
// of 40 KiB made every write of the Machine's mark condition fail, so the Machine was never marked
// and no remediation was requested. The message is cut (maxForeignMarkMessage) and says so.
func TestHugeHandWrittenMarkIsCut(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	f := newFixture(t, g, 0)
	long := time.Now().Add(-time.Hour)
	m := f.machine(g, "hand-marked", nodeReady(corev1.ConditionTrue, long))
	f.healthCheck(g, nil)
	waitCheckedHealthy(g, f.ns, "hand-marked")

	value, err := json.Marshal(caprv1.MarkRecord{Reason: caprv1.MachineCAPRHealthCheckManualRequestReason, Checker: "alice",
		Message: "disk is failing: " + strings.Repeat("x", 40*1024)})
	g.Expect(err).NotTo(HaveOccurred())
	patchAnnotation(g, m, caprv1.UnhealthyAnnotation, string(value))
	g.Eventually(func(g Gomega) {
		_, cond := markOf(g, f.ns, "hand-marked")
		g.Expect(cond.Status).To(Equal(metav1.ConditionFalse))
		g.Expect(cond.Reason).To(Equal(caprv1.MachineCAPRHealthCheckManualRequestReason))
		g.Expect(remediationExists(f.ns, "hand-marked")).To(BeTrue())
	}, eventually, poll).Should(Succeed())
	_, cond := markOf(g, f.ns, "hand-marked")
	entries, err := caprv1.MarkEntriesFromMessage(cond.Message)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(entries).To(HaveLen(1))
	g.Expect(entries[0].Message).To(HavePrefix("disk is failing: x"))
	g.Expect(entries[0].Message).To(HaveSuffix("(cut: the annotation's message has 40977 bytes)"))
	g.Expect(len(entries[0].Message)).To(BeNumerically("<=", 1024))
	g.Expect(utf8.ValidString(entries[0].Message)).To(BeTrue())
}

// waitCheckedHealthy waits until the health check has judged Machine name healthy (its condition True).
func waitCheckedHealthy(g *WithT, ns, name string) {
	g.Eventually(func(g Gomega) {
		_, cond := markOf(g, ns, name)
		g.Expect(cond).NotTo(BeNil())
		g.Expect(cond.Status).To(Equal(metav1.ConditionTrue))
	}, eventually, poll).Should(Succeed())
}

// setPhase sets a MachineRemediation's phase as a remediator would; the remediators running in the
// manager write its status too, so a conflict is retried on a fresh read.
func setPhase(g *WithT, ns, name string, phase caprv1.RemediationPhase) {
	g.Eventually(func() error {
		mr := &caprv1.MachineRemediation{}
		if err := k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, mr); err != nil {
			return err
		}
		mr.Status.Phase = phase
		return k8sClient.Status().Update(ctx, mr)
	}, eventually, poll).Should(Succeed())
}

func patchAnnotation(g *WithT, m *clusterv1.Machine, key, value string) {
	g.Eventually(func() error {
		cur := &clusterv1.Machine{}
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(m), cur); err != nil {
			return err
		}
		base := cur.DeepCopy()
		if cur.Annotations == nil {
			cur.Annotations = map[string]string{}
		}
		cur.Annotations[key] = value
		return k8sClient.Patch(ctx, cur, client.MergeFrom(base))
	}, eventually, poll).Should(Succeed())
}

func TestSkipRemediationAndPausedMachinesAreNotTargets(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	f := newFixture(t, g, 0)
	long := time.Now().Add(-time.Hour)
	skipped := builder.Machine(f.ns, f.cluster.Name, "skipped").WithLabels(pool).
		WithAnnotations(map[string]string{clusterv1.MachineSkipRemediationAnnotation: ""}).Build()
	g.Expect(k8sClient.Create(ctx, skipped)).To(Succeed())
	paused := builder.Machine(f.ns, f.cluster.Name, "paused").WithLabels(pool).
		WithAnnotations(map[string]string{clusterv1.PausedAnnotation: ""}).Build()
	g.Expect(k8sClient.Create(ctx, paused)).To(Succeed())
	f.machine(g, "normal", nodeReady(corev1.ConditionTrue, long))
	f.healthCheck(g, nil)
	g.Eventually(func(g Gomega) {
		g.Expect(getHealthCheck(g, f.ns).Status.Targets).To(Equal([]string{"normal"}))
	}, eventually, poll).Should(Succeed())
}

// A paused Cluster stops the health check; unpausing resumes it. Unpausing patches only the health
// check's Paused condition, a status update that starts no round by itself (healthCheckChanged):
// the round must still come.
func TestPausedClusterStopsTheHealthCheckUntilUnpaused(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	f := newFixture(t, g, 0)
	setClusterPaused(g, f.cluster, true)
	f.machine(g, "sick", nodeReady(corev1.ConditionFalse, time.Now().Add(-time.Hour)))
	f.healthCheck(g, nil)
	g.Eventually(func(g Gomega) {
		g.Expect(conditions.IsTrue(getHealthCheck(g, f.ns), caprv1.MachineHealthCheckPausedCondition)).To(BeTrue())
	}, eventually, poll).Should(Succeed())
	// Longer than the wait for the workload cluster's first connection (the ClusterCache retries every
	// 2 s, and a round waiting for it asks again 2 s later), after which a round that ignored the
	// pause would mark.
	g.Consistently(func(g Gomega) {
		rec, _ := markOf(g, f.ns, "sick")
		g.Expect(rec).To(BeNil())
	}, 5*time.Second, poll).Should(Succeed())

	setClusterPaused(g, f.cluster, false)
	g.Eventually(func(g Gomega) {
		rec, _ := markOf(g, f.ns, "sick")
		g.Expect(rec).NotTo(BeNil())
	}, eventually, poll).Should(Succeed())
}

// setClusterPaused sets the Cluster's spec.paused (a merge patch: CAPR does not write Clusters).
func setClusterPaused(g *WithT, cluster *clusterv1.Cluster, paused bool) {
	base := cluster.DeepCopy()
	cluster.Spec.Paused = ptr.To(paused)
	g.Expect(k8sClient.Patch(ctx, cluster, client.MergeFrom(base))).To(Succeed())
}

// unreachableCluster creates a ready Cluster "far" in a new namespace (returned) whose kubeconfig
// points at a port nothing listens on: its workload cluster cannot be reached.
func unreachableCluster(g Gomega) string {
	ns, err := capienv.CreateNamespace(ctx, k8sClient, "mhc")
	g.Expect(err).NotTo(HaveOccurred())
	cluster := capienv.NewCluster(ns, "far", clusterv1.ContractVersionedObjectReference{})
	g.Expect(k8sClient.Create(ctx, cluster)).To(Succeed())
	g.Expect(capienv.SetClusterReady(ctx, k8sClient, cluster, capienv.ControlPlaneInitialized)).To(Succeed())
	cfg := *testEnv.Config
	cfg.Host = "https://127.0.0.1:1"
	g.Expect(k8sClient.Create(ctx, kubeconfig.GenerateSecret(cluster, kubeconfig.FromEnvTestConfig(&cfg, cluster)))).To(Succeed())
	return ns
}

func TestUnreachableWorkloadClusterMarksNothing(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ns := unreachableCluster(g)
	// Even a remediate-machine request waits: nothing is marked while the cluster cannot be seen.
	m := builder.Machine(ns, "far", "m").WithLabels(pool).
		WithAnnotations(map[string]string{clusterv1.RemediateMachineAnnotation: ""}).Build()
	g.Expect(k8sClient.Create(ctx, m)).To(Succeed())
	g.Expect(capienv.SetMachineNode(ctx, k8sClient, m, "far-node")).To(Succeed())
	mhc := builder.HealthCheck(ns, "hc", "far").Pool("a").Build()
	g.Expect(k8sClient.Create(ctx, mhc)).To(Succeed())
	g.Eventually(func(g Gomega) {
		cond := conditions.Get(getHealthCheck(g, ns), caprv1.MachineHealthCheckWorkloadClusterReachableCondition)
		g.Expect(cond).NotTo(BeNil())
		g.Expect(cond.Status).To(Equal(metav1.ConditionFalse))
		g.Expect(cond.Reason).To(Equal(caprv1.MachineHealthCheckWorkloadClusterUnreachableReason))
		g.Expect(eventsFor(g, ns, "hc", caprv1.EventWorkloadClusterUnreachable)).NotTo(BeEmpty())
	}, eventually, poll).Should(Succeed())
	g.Consistently(func(g Gomega) {
		rec, cond := markOf(g, ns, "m")
		g.Expect(rec).To(BeNil())
		g.Expect(cond).To(BeNil())
		g.Expect(remediationExists(ns, "m")).To(BeFalse())
	}, 2*time.Second, poll).Should(Succeed())
}

func TestControlPlaneQuorumSafeLimit(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		replicas, unhealthy int
		allowed             bool
	}{
		{replicas: 3, unhealthy: 1, allowed: true},
		{replicas: 3, unhealthy: 2, allowed: false},
		{replicas: 5, unhealthy: 2, allowed: true},
		{replicas: 5, unhealthy: 3, allowed: false},
	} {
		t.Run(fmt.Sprintf("%d_of_%d", tt.unhealthy, tt.replicas), func(t *testing.T) {
			t.Parallel()
			g := NewWithT(t)
			f := newFixture(t, g, int32(tt.replicas))
			long := time.Now().Add(-time.Hour)
			for i := range tt.replicas {
				ready := corev1.ConditionTrue
				if i < tt.unhealthy {
					ready = corev1.ConditionFalse
				}
				f.machine(g, fmt.Sprintf("cp-%d", i), controlPlane(), nodeReady(ready, long))
			}
			f.healthCheck(g, nil)
			g.Eventually(func(g Gomega) {
				mhc := getHealthCheck(g, f.ns)
				g.Expect(mhc.Status.ControlPlaneUnhealthyLimit).To(HaveValue(BeEquivalentTo((tt.replicas - 1) / 2)))
				g.Expect(mhc.Status.UnhealthyMachines).To(HaveLen(tt.unhealthy))
				cond := conditions.Get(mhc, caprv1.MachineHealthCheckRemediationAllowedCondition)
				g.Expect(cond).NotTo(BeNil())
				if tt.allowed {
					g.Expect(cond.Status).To(Equal(metav1.ConditionTrue))
					for i := range tt.unhealthy {
						g.Expect(remediationExists(f.ns, fmt.Sprintf("cp-%d", i))).To(BeTrue())
					}
				} else {
					g.Expect(cond.Status).To(Equal(metav1.ConditionFalse))
					g.Expect(cond.Reason).To(Equal(caprv1.MachineHealthCheckControlPlaneQuorumLimitReason))
				}
				// remediationsAllowed is how many more targets may become unhealthy and still be
				// remediated: the control-plane limit bounds it, and it is 0 whenever remediation is
				// not allowed.
				g.Expect(mhc.Status.RemediationsAllowed).To(HaveValue(BeEquivalentTo(max(0, (tt.replicas-1)/2-tt.unhealthy))))
			}, eventually, poll).Should(Succeed())
			if !tt.allowed {
				g.Consistently(func() bool { return remediationExists(f.ns, "cp-0") }, time.Second, poll).Should(BeFalse())
			}
		})
	}
}

func TestTemplateRefToMachineRemediationTemplate(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	f := newFixture(t, g, 0)
	tmpl := &caprv1.MachineRemediationTemplate{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "tmpl"},
		Spec: caprv1.MachineRemediationTemplateSpec{Template: caprv1.MachineRemediationTemplateResource{
			Spec: caprv1.MachineRemediationSpec{ControlPlane: &caprv1.ControlPlaneRemediationSpec{MaxRetry: ptr.To[int32](2)}},
		}},
	}
	g.Expect(k8sClient.Create(ctx, tmpl)).To(Succeed())
	f.machine(g, "m", nodeReady(corev1.ConditionFalse, time.Now().Add(-time.Hour)))
	f.healthCheck(g, func(mhc *caprv1.MachineHealthCheck) {
		mhc.Spec.Remediation.TemplateRef = &caprv1.TemplateReference{
			APIVersion: caprv1.GroupVersion.String(), Kind: "MachineRemediationTemplate", Name: "tmpl",
		}
	})
	g.Eventually(func(g Gomega) {
		mr := &caprv1.MachineRemediation{}
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: "m"}, mr)).To(Succeed())
		g.Expect(mr.Spec.ControlPlane).NotTo(BeNil())
		g.Expect(mr.Spec.ControlPlane.MaxRetry).To(HaveValue(BeEquivalentTo(2)))
		g.Expect(mr.Spec.Source).To(Equal(caprv1.MachineRemediationSourceHealthCheck))
		g.Expect(mr.Annotations).To(HaveKeyWithValue(clusterv1.TemplateClonedFromNameAnnotation, "tmpl"))
	}, eventually, poll).Should(Succeed())
}

// TestMissingTemplatesAreReportedWhenTheHealthCheckIsCreated: an escalation step names a kind that
// does not exist, then the templateRef a template that does not exist; the health check says so at
// once, naming the field, with a Warning event, and turns True once the template exists. (An
// escalation step may not name a MachineRemediationTemplate: admission refuses it, the object would be
// the request itself; and templateRef and escalation are mutually exclusive.)
func TestMissingTemplatesAreReportedWhenTheHealthCheckIsCreated(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	f := newFixture(t, g, 0)
	f.machine(g, "m")
	f.healthCheck(g, func(mhc *caprv1.MachineHealthCheck) {
		mhc.Spec.Remediation.Escalation = []caprv1.EscalationStep{
			{TemplateRef: caprv1.TemplateReference{APIVersion: "power.example.com/v1", Kind: "PowerCycleTemplate", Name: "cycle"}, TimeoutSeconds: 60},
		}
	})
	expectNotFound := func(field string) {
		g.Eventually(func(g Gomega) {
			c := conditions.Get(getHealthCheck(g, f.ns), caprv1.MachineHealthCheckRemediationTemplatesValidCondition)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Reason).To(Equal(caprv1.MachineHealthCheckRemediationTemplateNotFoundReason))
			g.Expect(c.Message).To(ContainSubstring(field))
			g.Expect(notesOf(g, f.ns, caprv1.MachineHealthCheckRemediationTemplateNotFoundReason)).NotTo(BeEmpty())
		}, eventually, poll).Should(Succeed())
	}
	expectNotFound("spec.remediation.escalation[0].templateRef: PowerCycleTemplate " + f.ns + "/cycle not found")

	// The escalation goes; the templateRef names a template that does not exist yet.
	g.Eventually(func(g Gomega) { // the health checker writes the object too: retry on conflicts
		mhc := getHealthCheck(g, f.ns)
		mhc.Spec.Remediation.Escalation = nil
		mhc.Spec.Remediation.TemplateRef = &caprv1.TemplateReference{APIVersion: caprv1.GroupVersion.String(), Kind: "MachineRemediationTemplate", Name: "reboot"}
		g.Expect(k8sClient.Update(ctx, mhc)).To(Succeed())
	}, eventually, poll).Should(Succeed())
	expectNotFound("spec.remediation.templateRef: MachineRemediationTemplate " + f.ns + "/reboot not found")

	// The template appears.
	g.Expect(k8sClient.Create(ctx, &caprv1.MachineRemediationTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "reboot"}})).To(Succeed())
	g.Eventually(func(g Gomega) {
		g.Expect(conditions.IsTrue(getHealthCheck(g, f.ns), caprv1.MachineHealthCheckRemediationTemplatesValidCondition)).To(BeTrue())
	}, eventually, poll).Should(Succeed())
}

func TestEtcdMemberCheck(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	f := newFixture(t, g, 3)
	long := time.Now().Add(-time.Hour)
	for i := range 3 {
		f.machine(g, fmt.Sprintf("cp-%d", i), controlPlane(), nodeReady(corev1.ConditionTrue, long))
		fakeEtcd.set(fmt.Sprintf("%s-cp-%d", f.ns, i), machinehealthcheck.EtcdMemberHealth{Healthy: true})
	}
	fakeEtcd.set(f.ns+"-cp-1", machinehealthcheck.EtcdMemberHealth{Problem: "alarmed (NOSPACE)"})
	f.healthCheck(g, func(mhc *caprv1.MachineHealthCheck) {
		mhc.Spec.Checks.EtcdMember = &caprv1.EtcdMemberCheck{TimeoutSeconds: ptr.To[int32](10)}
	})
	// The member has been seen unhealthy only now: the 10s timeout runs first.
	g.Consistently(func(g Gomega) {
		rec, _ := markOf(g, f.ns, "cp-1")
		g.Expect(rec).To(BeNil())
	}, 3*time.Second, poll).Should(Succeed())
	g.Eventually(func(g Gomega) *int32 { // the first round may wait for the workload cluster's connection
		return getHealthCheck(g, f.ns).Status.CurrentHealthy
	}, eventually, poll).Should(HaveValue(BeEquivalentTo(2)))
	g.Eventually(func(g Gomega) {
		rec, _ := markOf(g, f.ns, "cp-1")
		g.Expect(rec).NotTo(BeNil())
		g.Expect(rec.Reason).To(Equal(caprv1.MachineCAPRHealthCheckUnhealthyEtcdMemberReason))
		g.Expect(rec.Message).To(ContainSubstring("alarmed (NOSPACE)"))
		g.Expect(remediationExists(f.ns, "cp-1")).To(BeTrue())
	}, eventually, poll).Should(Succeed())
	for _, healthy := range []string{"cp-0", "cp-2"} {
		rec, _ := markOf(g, f.ns, healthy)
		g.Expect(rec).To(BeNil())
	}
}

func TestDeletingTheHealthCheckClearsItsMarks(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	f := newFixture(t, g, 0)
	f.machine(g, "m", nodeReady(corev1.ConditionFalse, time.Now().Add(-time.Hour)))
	mhc := f.healthCheck(g, nil)
	g.Eventually(func(g Gomega) {
		rec, _ := markOf(g, f.ns, "m")
		g.Expect(rec).NotTo(BeNil())
	}, eventually, poll).Should(Succeed())
	g.Expect(k8sClient.Delete(ctx, mhc)).To(Succeed())
	g.Eventually(func(g Gomega) {
		rec, cond := markOf(g, f.ns, "m")
		g.Expect(rec).To(BeNil())
		g.Expect(cond).To(BeNil())
		g.Expect(remediationExists(f.ns, "m")).To(BeFalse())
		err := k8sClient.Get(ctx, client.ObjectKeyFromObject(mhc), &caprv1.MachineHealthCheck{})
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue())
	}, eventually, poll).Should(Succeed())
}

func TestRemediateMachineAnnotationRequestsAManualRemediation(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	f := newFixture(t, g, 0)
	f.machine(g, "asked", withAnnotations(map[string]string{clusterv1.RemediateMachineAnnotation: ""}))
	f.machine(g, "sick", nodeReady(corev1.ConditionFalse, time.Now().Add(-time.Hour)))
	f.healthCheck(g, nil)
	// The remediator reads only the MachineRemediation: the request says who asked for it.
	g.Eventually(func(g Gomega) {
		mr := &caprv1.MachineRemediation{}
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: "asked"}, mr)).To(Succeed())
		g.Expect(mr.Spec.Source).To(Equal(caprv1.MachineRemediationSourceManual))
		g.Expect(mr.Spec.Reason).To(Equal(caprv1.MachineCAPRHealthCheckManualRequestReason))
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: "sick"}, mr)).To(Succeed())
		g.Expect(mr.Spec.Source).To(Equal(caprv1.MachineRemediationSourceHealthCheck))
	}, eventually, poll).Should(Succeed())
}

func TestSkipRemediationOrPausedWithdrawsPendingRequest(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	f := newFixture(t, g, 0)
	long := time.Now().Add(-time.Hour)
	skip := f.machine(g, "skip", nodeReady(corev1.ConditionFalse, long))
	pause := f.machine(g, "pause", nodeReady(corev1.ConditionFalse, long))
	running := f.machine(g, "running", nodeReady(corev1.ConditionFalse, long))
	f.healthCheck(g, nil)
	g.Eventually(func() bool {
		return remediationExists(f.ns, "skip") && remediationExists(f.ns, "pause") && remediationExists(f.ns, "running")
	}, eventually, poll).Should(BeTrue())
	// A remediator started this one: it is completed whatever happens to the Machine.
	setPhase(g, f.ns, "running", caprv1.MachineRemediationPhaseRunning)

	patchAnnotation(g, skip, clusterv1.MachineSkipRemediationAnnotation, "")
	patchAnnotation(g, pause, clusterv1.PausedAnnotation, "")
	patchAnnotation(g, running, clusterv1.MachineSkipRemediationAnnotation, "")
	g.Eventually(func(g Gomega) {
		g.Expect(remediationExists(f.ns, "skip")).To(BeFalse(), "a Pending request of a skip-remediation Machine is withdrawn")
		g.Expect(remediationExists(f.ns, "pause")).To(BeFalse(), "a Pending request of a paused Machine is withdrawn")
	}, eventually, poll).Should(Succeed())
	g.Consistently(func() bool { return remediationExists(f.ns, "running") }, 2*time.Second, poll).Should(BeTrue())
}

func TestEtcdQuorumLossIsReportedAndTheSurvivorIsNotMarked(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	f := newFixture(t, g, 3)
	for i := range 3 {
		f.machine(g, fmt.Sprintf("cp-%d", i), controlPlane())
	}
	// Two of three members are dead; the survivor answers but has no leader: quorum is lost.
	fakeEtcd.set(f.ns+"-cp-0", machinehealthcheck.EtcdMemberHealth{Problem: "has no leader"})
	fakeEtcd.set(f.ns+"-cp-1", machinehealthcheck.EtcdMemberHealth{Problem: "unreachable"})
	fakeEtcd.set(f.ns+"-cp-2", machinehealthcheck.EtcdMemberHealth{Problem: "unreachable"})
	f.healthCheck(g, func(mhc *caprv1.MachineHealthCheck) {
		mhc.Spec.Checks.EtcdMember = &caprv1.EtcdMemberCheck{TimeoutSeconds: ptr.To[int32](10)}
	})
	// The dead members are marked once their 10s timeout expires, within a 5s poll.
	g.Eventually(func(g Gomega) {
		mhc := getHealthCheck(g, f.ns)
		cond := conditions.Get(mhc, caprv1.MachineHealthCheckRemediationAllowedCondition)
		g.Expect(cond).NotTo(BeNil())
		g.Expect(cond.Status).To(Equal(metav1.ConditionFalse))
		g.Expect(cond.Reason).To(Equal(caprv1.MachineHealthCheckEtcdQuorumLostReason))
		g.Expect(cond.Message).To(ContainSubstring("1 of 3 voting members are up and a quorum is 2"))
		g.Expect(cond.Message).To(ContainSubstring(f.ns + "-cp-1"))
		g.Expect(mhc.Status.RemediationsAllowed).To(HaveValue(BeEquivalentTo(0)))
		for _, dead := range []string{"cp-1", "cp-2"} {
			rec, _ := markOf(g, f.ns, dead)
			g.Expect(rec).NotTo(BeNil())
			g.Expect(rec.Reason).To(Equal(caprv1.MachineCAPRHealthCheckUnhealthyEtcdMemberReason))
		}
		notes := notesOf(g, f.ns, caprv1.EventEtcdQuorumLost)
		g.Expect(notes).To(HaveLen(1))
		g.Expect(notes[0]).To(ContainSubstring(f.ns + "-cp-1"))
		g.Expect(notes[0]).To(ContainSubstring(f.ns + "-cp-2"))
		g.Expect(notes[0]).NotTo(ContainSubstring(f.ns + "-cp-0"))
	}, 2*eventually, poll).Should(Succeed())
	// The survivor's "no leader" is the cluster's state, not its own fault; nothing is requested while
	// quorum is lost; the Warning is given once, not on every reconcile (the check polls every 5s).
	g.Consistently(func(g Gomega) {
		rec, _ := markOf(g, f.ns, "cp-0")
		g.Expect(rec).To(BeNil())
		for i := range 3 {
			g.Expect(remediationExists(f.ns, fmt.Sprintf("cp-%d", i))).To(BeFalse())
		}
		g.Expect(emissions(g, f.ns, caprv1.EventEtcdQuorumLost)).To(Equal(1))
	}, 7*time.Second, poll).Should(Succeed())
}

func TestNoUnreachableWarningBeforeTheFirstConnection(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	f := newFixture(t, g, 0)
	f.machine(g, "sick", nodeReady(corev1.ConditionFalse, time.Now().Add(-time.Hour)))
	f.healthCheck(g, nil)
	g.Eventually(func(g Gomega) {
		g.Expect(conditions.IsTrue(getHealthCheck(g, f.ns), caprv1.MachineHealthCheckWorkloadClusterReachableCondition)).To(BeTrue())
		g.Expect(remediationExists(f.ns, "sick")).To(BeTrue())
	}, eventually, poll).Should(Succeed())
	// The ClusterCache had not connected when the health check was first reconciled: that is not an
	// unreachable workload cluster.
	g.Expect(emissions(g, f.ns, caprv1.EventWorkloadClusterUnreachable)).To(BeZero())
}

func TestUnreachableWarningOncePerTransition(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	ns := unreachableCluster(g)
	g.Expect(k8sClient.Create(ctx, builder.HealthCheck(ns, "hc", "far").Pool("a").Build())).To(Succeed())
	// A burst of Machine events while the health check is being reconciled, as on a manager's start:
	// reconciles follow each other faster than the health check's own status patch reaches the cache.
	machines := make([]*clusterv1.Machine, 0, 5)
	for i := range 5 {
		m := builder.Machine(ns, "far", fmt.Sprintf("m-%d", i)).WithLabels(pool).Build()
		g.Expect(k8sClient.Create(ctx, m)).To(Succeed())
		machines = append(machines, m)
	}
	for round := range 10 {
		for _, m := range machines {
			patchAnnotation(g, m, "touch", fmt.Sprint(round))
		}
	}
	g.Eventually(func(g Gomega) {
		g.Expect(emissions(g, ns, caprv1.EventWorkloadClusterUnreachable)).To(BeNumerically(">=", 1))
	}, eventually, poll).Should(Succeed())
	// Rounds keep coming (each Machine change starts one, and some start from a cache without the
	// health check's status patch): still one Warning for the one transition.
	touches := 0
	g.Consistently(func(cg Gomega) {
		patchAnnotation(g, machines[touches%len(machines)], "touch", fmt.Sprintf("again-%d", touches))
		touches++
		cg.Expect(emissions(cg, ns, caprv1.EventWorkloadClusterUnreachable)).To(Equal(1))
	}, 6*time.Second, poll).Should(Succeed())
}

// TestFinishedRequestIsReplacedWhenUnhealthyAgain: a Succeeded request of a Machine that is still
// there (it recovered during its escalation, worker or control plane) does not stop a new remediation when
// the Machine is unhealthy again: the health checker replaces it.
func TestFinishedRequestIsReplacedWhenUnhealthyAgain(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	f := newFixture(t, g, 0)
	m := f.machine(g, "m", nodeReady(corev1.ConditionFalse, time.Now().Add(-time.Hour)))
	// A remediation that ended by recovery during its escalation (its Machine kept).
	old := &caprv1.MachineRemediation{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: m.Name},
		Spec: caprv1.MachineRemediationSpec{Escalation: []caprv1.EscalationStep{{
			TemplateRef: caprv1.TemplateReference{APIVersion: "example.com/v1", Kind: "RebootTemplate", Name: "r"}, TimeoutSeconds: 60}}}}
	// The worker remediator in this manager records a new request as Pending; with the Cluster paused
	// it only writes its Paused condition, so the finished status written here is not overwritten.
	setClusterPaused(g, f.cluster, true)
	g.Expect(k8sClient.Create(ctx, old)).To(Succeed())
	g.Eventually(func(g Gomega) { // the remediator writes the request's conditions: retry on conflicts
		mr := &caprv1.MachineRemediation{}
		g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(old), mr)).To(Succeed())
		mr.Status.Phase = caprv1.MachineRemediationPhaseSucceeded
		mr.Status.Steps = []caprv1.RemediationStep{{Name: caprv1.EscalationStepName(0), Outcome: caprv1.StepOutcomeSucceeded}}
		g.Expect(k8sClient.Status().Update(ctx, mr)).To(Succeed())
	}, eventually, poll).Should(Succeed())
	setClusterPaused(g, f.cluster, false)
	f.healthCheck(g, nil)

	g.Eventually(func(g Gomega) {
		mr := &caprv1.MachineRemediation{}
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: "m"}, mr)).To(Succeed())
		g.Expect(mr.UID).NotTo(Equal(old.UID))
		g.Expect(mr.Status.Phase).NotTo(Equal(caprv1.MachineRemediationPhaseSucceeded))
		g.Expect(mr.Spec.Source).To(Equal(caprv1.MachineRemediationSourceHealthCheck))
	}, eventually, poll).Should(Succeed())
}

// TestMarkAndClearKeepOtherConditionsAndAnnotations: the mark is written without reading the Machine
// first (a merge patch of one annotation, a server-side apply of one condition), so conditions and
// annotations written by others between the health check's reads must survive it, in both directions.
func TestMarkAndClearKeepOtherConditionsAndAnnotations(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	f := newFixture(t, g, 0)
	f.machine(g, "sick", nodeReady(corev1.ConditionFalse, time.Now().Add(-time.Hour)))
	m := getMachine(g, f.ns, "sick")
	base := m.DeepCopy()
	m.Status.Conditions = append(m.Status.Conditions, metav1.Condition{Type: "example.com/Other", Status: metav1.ConditionTrue,
		Reason: "ByOthers", LastTransitionTime: metav1.Now()})
	g.Expect(k8sClient.Status().Patch(ctx, m, client.MergeFrom(base))).To(Succeed())
	base = m.DeepCopy()
	m.Annotations = map[string]string{"example.com/other": "kept"}
	g.Expect(k8sClient.Patch(ctx, m, client.MergeFrom(base))).To(Succeed())

	f.healthCheck(g, nil)
	g.Eventually(func(g Gomega) {
		rec, cond := markOf(g, f.ns, "sick")
		g.Expect(rec).NotTo(BeNil())
		g.Expect(cond).To(HaveField("Status", metav1.ConditionFalse))
	}, eventually, poll).Should(Succeed())
	m = getMachine(g, f.ns, "sick")
	g.Expect(conditions.Get(m, "example.com/Other")).To(HaveField("Reason", "ByOthers"))
	g.Expect(m.Annotations).To(HaveKeyWithValue("example.com/other", "kept"))

	g.Expect(capienv.SetNodeReady(ctx, k8sClient, f.ns+"-sick", corev1.ConditionTrue)).To(Succeed())
	g.Eventually(func(g Gomega) {
		rec, cond := markOf(g, f.ns, "sick")
		g.Expect(rec).To(BeNil())
		g.Expect(cond).To(HaveField("Status", metav1.ConditionTrue))
	}, eventually, poll).Should(Succeed())
	m = getMachine(g, f.ns, "sick")
	g.Expect(conditions.Get(m, "example.com/Other")).To(HaveField("Reason", "ByOthers"))
	g.Expect(m.Annotations).To(HaveKeyWithValue("example.com/other", "kept"))
}

// A round started by one changed Node evaluates what changed, not every target: after the first
// rounds (full passes) no round evaluates the whole fleet again, and marking one Machine out of 20
// costs fewer target evaluations than one full pass.
func TestAChangedNodeIsEvaluatedWithoutEveryTarget(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	f := newFixture(t, g, 0)
	const n = 20
	for i := range n {
		f.machine(g, fmt.Sprintf("m%02d", i))
	}
	f.healthCheck(g, nil)
	g.Eventually(func(g Gomega) {
		g.Expect(getHealthCheck(g, f.ns).Status.CurrentHealthy).To(HaveValue(BeEquivalentTo(n)))
		for i := range n {
			_, cond := markOf(g, f.ns, fmt.Sprintf("m%02d", i))
			g.Expect(cond).NotTo(BeNil())
			g.Expect(cond.Status).To(Equal(metav1.ConditionTrue))
		}
	}, eventually, poll).Should(Succeed())
	// The first rounds are full passes, and so is the one after the ClusterCache connects: wait until
	// none has run for 2 s.
	var full, changed float64
	g.Eventually(func(g Gomega) {
		full = evaluated(g, f.ns, metrics.PassFull)
		g.Consistently(func(g Gomega) {
			g.Expect(evaluated(g, f.ns, metrics.PassFull)).To(Equal(full))
		}, 2*time.Second, poll).Should(Succeed())
	}, eventually, poll).Should(Succeed())
	g.Expect(full).To(BeNumerically(">=", n), "the first round evaluates every target")
	changed = evaluated(g, f.ns, metrics.PassChanged)

	g.Expect(capienv.SetNodeReady(ctx, k8sClient, f.ns+"-m07", corev1.ConditionFalse)).To(Succeed())
	g.Eventually(func() bool { return remediationExists(f.ns, "m07") }, eventually, poll).Should(BeTrue())
	g.Eventually(func(g Gomega) {
		hc := getHealthCheck(g, f.ns)
		g.Expect(hc.Status.UnhealthyMachines).To(Equal([]string{"m07"}))
		// The counts of the targets not evaluated come from memory.
		g.Expect(hc.Status.ExpectedMachines).To(HaveValue(BeEquivalentTo(n)))
		g.Expect(hc.Status.CurrentHealthy).To(HaveValue(BeEquivalentTo(n - 1)))
		g.Expect(hc.Status.Targets).To(HaveLen(n))
	}, eventually, poll).Should(Succeed())
	g.Expect(evaluated(g, f.ns, metrics.PassFull)).To(Equal(full), "a full pass ran for one changed Node")
	g.Expect(evaluated(g, f.ns, metrics.PassChanged)-changed).To(And(BeNumerically(">=", 2), BeNumerically("<", n)),
		"targets evaluated from the Node's change to the request (its change, its expiry, its mark, its request)")

	// CAPI updates the Cluster's status whenever its Machines change: that alone is no reason for a
	// full pass (what a round reads of the Cluster is read afresh, or part of the memory's key).
	cluster := &clusterv1.Cluster{}
	g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(f.cluster), cluster)).To(Succeed())
	conditions.Set(cluster, metav1.Condition{Type: clusterv1.ClusterWorkersAvailableCondition, Status: metav1.ConditionFalse, Reason: "SomeWorkersUnavailable"})
	g.Expect(k8sClient.Status().Update(ctx, cluster)).To(Succeed())

	// Healthy again, from memory too: the mark is cleared and the Pending request withdrawn.
	g.Expect(capienv.SetNodeReady(ctx, k8sClient, f.ns+"-m07", corev1.ConditionTrue)).To(Succeed())
	g.Eventually(func(g Gomega) {
		rec, cond := markOf(g, f.ns, "m07")
		g.Expect(rec).To(BeNil())
		g.Expect(cond.Status).To(Equal(metav1.ConditionTrue))
		g.Expect(remediationExists(f.ns, "m07")).To(BeFalse())
		hc := getHealthCheck(g, f.ns)
		g.Expect(hc.Status.UnhealthyMachines).To(BeEmpty())
		g.Expect(hc.Status.CurrentHealthy).To(HaveValue(BeEquivalentTo(n)))
	}, eventually, poll).Should(Succeed())
	g.Expect(evaluated(g, f.ns, metrics.PassFull)).To(Equal(full), "a full pass ran for the Cluster's update or the recovery")
}

// evaluated is capr_machinehealthcheck_targets_evaluated_total of the health check "hc" in ns for pass.
func evaluated(g Gomega, ns, pass string) float64 {
	families, err := ctrlmetrics.Registry.Gather()
	g.Expect(err).NotTo(HaveOccurred())
	for _, mf := range families {
		if mf.GetName() != "capr_machinehealthcheck_targets_evaluated_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["namespace"] == ns && labels["name"] == "hc" && labels["pass"] == pass {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// TestARequestTheCacheDoesNotShowYetIsNotCreatedAgain: the round after the one that created a
// request often runs before the manager's cache shows it (the mark just written is a Machine event),
// and under load the cache lags for seconds: the health checker does not create the request again
// (every such try was refused AlreadyExists, a wasted write per round). A request deleted before the
// cache ever showed it is created again once the one created stops standing in for it.
func TestARequestTheCacheDoesNotShowYetIsNotCreatedAgain(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	f := newFixture(t, g, 0)
	hidden.set(f.ns, "sick", true)
	t.Cleanup(func() { hidden.set(f.ns, "sick", false) })
	m := f.machine(g, "sick", nodeReady(corev1.ConditionFalse, time.Now().Add(-time.Hour)))
	f.healthCheck(g, nil)
	creates := func() int {
		return requests.Of(http.MethodPost, fmt.Sprintf("/apis/%s/namespaces/%s/machineremediations", caprv1.GroupVersion.String(), f.ns))
	}
	first := &caprv1.MachineRemediation{}
	g.Eventually(func() error { return k8sClient.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: "sick"}, first) }, eventually, poll).Should(Succeed())
	g.Eventually(creates, eventually, poll).Should(Equal(1))

	// Rounds that evaluate the Machine again while the cache does not show its request.
	rounds := func(g Gomega) float64 {
		return evaluated(g, f.ns, metrics.PassFull) + evaluated(g, f.ns, metrics.PassChanged)
	}
	for i := range 3 {
		before := rounds(g)
		patchAnnotation(g, m, "example.com/touched", strconv.Itoa(i))
		g.Eventually(rounds, eventually, poll).Should(BeNumerically(">", before))
	}
	g.Consistently(creates, 2*time.Second, poll).Should(Equal(1))

	// Deleted before the cache showed it: created again, once the first stops standing in.
	g.Expect(k8sClient.Delete(ctx, first)).To(Succeed())
	g.Eventually(func(g Gomega) {
		mr := &caprv1.MachineRemediation{}
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: "sick"}, mr)).To(Succeed())
		g.Expect(mr.UID).NotTo(Equal(first.UID))
	}, time.Minute, poll).Should(Succeed())
	// The recorder counts a create when its response reaches the manager, which can be after the
	// object is readable here.
	g.Eventually(creates, eventually, poll).Should(Equal(2))
}

// TestStatusCountsAreWrittenAtMostOncePerSecond: while Nodes turn unhealthy one after another, each
// starts a round whose counts differ; the health check writes its status at once for the first and
// then at most once per second (statusWriteInterval), and the status ends right. The interval is
// measured between the writes' responses: the next counts-only write is sent at least a second after
// the previous one's response came back, so no two responses are closer, however long the test runs.
func TestStatusCountsAreWrittenAtMostOncePerSecond(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	f := newFixture(t, g, 0)
	const n, flipped = 10, 6
	for i := range n {
		f.machine(g, fmt.Sprintf("m%02d", i))
	}
	// Timeouts long enough that nothing is marked: the rounds change counts only.
	f.healthCheck(g, func(mhc *caprv1.MachineHealthCheck) {
		for i := range mhc.Spec.Checks.UnhealthyNodeConditions {
			mhc.Spec.Checks.UnhealthyNodeConditions[i].TimeoutSeconds = ptr.To[int32](600)
		}
	})
	g.Eventually(func(g Gomega) {
		g.Expect(getHealthCheck(g, f.ns).Status.CurrentHealthy).To(HaveValue(BeEquivalentTo(n)))
	}, eventually, poll).Should(Succeed())
	statusPath := fmt.Sprintf("/apis/%s/namespaces/%s/machinehealthchecks/hc/status", caprv1.GroupVersion.String(), f.ns)
	statusWrites := func() int { return requests.Of(http.MethodPatch, statusPath) }
	rounds := func(g Gomega) float64 {
		return evaluated(g, f.ns, metrics.PassFull) + evaluated(g, f.ns, metrics.PassChanged)
	}
	// Wait until no write is due (the first rounds wrote the status).
	var before int
	g.Eventually(func(g Gomega) {
		before = statusWrites()
		g.Consistently(statusWrites, 2*time.Second, poll).Should(Equal(before))
	}, eventually, poll).Should(Succeed())

	for i := range flipped {
		r := rounds(g)
		g.Expect(capienv.SetNodeReady(ctx, k8sClient, fmt.Sprintf("%s-m%02d", f.ns, i), corev1.ConditionFalse)).To(Succeed())
		g.Eventually(rounds, eventually, 10*time.Millisecond).Should(BeNumerically(">", r), "each Node's round")
	}
	g.Eventually(func(g Gomega) {
		g.Expect(getHealthCheck(g, f.ns).Status.CurrentHealthy).To(HaveValue(BeEquivalentTo(n - flipped)))
	}, eventually, poll).Should(Succeed())
	// The last write may still be due: wait until none has come for longer than the interval.
	g.Eventually(func(g Gomega) {
		w := statusWrites()
		g.Consistently(statusWrites, 2*time.Second, poll).Should(Equal(w))
	}, eventually, poll).Should(Succeed())
	answered := requests.AnsweredAt(http.MethodPatch, statusPath)[before:]
	g.Expect(len(answered)).To(BeNumerically(">=", 2), "%d rounds wrote the status %d times", flipped, len(answered))
	for i := 1; i < len(answered); i++ {
		g.Expect(answered[i].Sub(answered[i-1])).To(BeNumerically(">=", time.Second),
			"status writes %d and %d of the %d rounds' came back %s apart", i, i+1, flipped, answered[i].Sub(answered[i-1]))
	}
}

// TestANodeHeldDeletingMakesItsMachineUnhealthy: the node-deletion signal. A Node deleted but
// held by a finalizer still reports Ready from its last heartbeat; with checks.nodeDeletingTimeoutSeconds
// its Machine is unhealthy once the Node has been deleting that long (NodeDeleting), and its
// remediation is requested.
func TestANodeHeldDeletingMakesItsMachineUnhealthy(t *testing.T) {
	t.Parallel()
	g := NewWithT(t)
	f := newFixture(t, g, 0)
	f.machine(g, "m")
	nodeName := f.ns + "-m"
	n := &corev1.Node{}
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Name: nodeName}, n)).To(Succeed())
	base := n.DeepCopy()
	n.Finalizers = append(n.Finalizers, "example.com/hold")
	g.Expect(k8sClient.Patch(ctx, n, client.MergeFrom(base))).To(Succeed())
	t.Cleanup(func() {
		n := &corev1.Node{}
		if err := k8sClient.Get(ctx, client.ObjectKey{Name: nodeName}, n); err == nil {
			base := n.DeepCopy()
			n.Finalizers = nil
			_ = k8sClient.Patch(ctx, n, client.MergeFrom(base))
		}
	})
	f.healthCheck(g, func(mhc *caprv1.MachineHealthCheck) { mhc.Spec.Checks.NodeDeletingTimeoutSeconds = ptr.To[int32](2) })
	g.Eventually(func(g Gomega) {
		g.Expect(conditions.IsTrue(getMachine(g, f.ns, "m"), caprv1.MachineCAPRHealthCheckSucceededCondition)).To(BeTrue())
	}, eventually, poll).Should(Succeed())

	g.Expect(k8sClient.Delete(ctx, n)).To(Succeed())
	g.Eventually(func(g Gomega) {
		rec, _ := markOf(g, f.ns, "m")
		g.Expect(rec).NotTo(BeNil())
		g.Expect(rec.Reason).To(Equal(caprv1.MachineCAPRHealthCheckNodeDeletingReason))
		g.Expect(rec.Message).To(ContainSubstring("Node %s has been deleting for more than 2s", nodeName))
		g.Expect(remediationExists(f.ns, "m")).To(BeTrue())
	}, eventually, poll).Should(Succeed())
}
