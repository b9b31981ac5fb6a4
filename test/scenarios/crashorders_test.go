package scenarios_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/remediation/controlplane"
	"github.com/capr-io/capr/test/sandbox"
)

// The orders TestCrashSafety crashes (issue 34, gap 8). A remediation of a Machine whose Node stops
// reporting (its member healthy) takes ScaleUpFirst under the Auto policy; RemoveMemberFirst under
// that policy (which accepts no failure margin until the replacement votes); DeleteFirst under that
// policy where a surge would create two Machines (twoMachineSurge: KCP with stacked etcd where the
// replicas do not return at the first replacement).
var crashOrders = []caprv1.ControlPlaneOrder{
	caprv1.ControlPlaneOrderScaleUpFirst, caprv1.ControlPlaneOrderRemoveMemberFirst, caprv1.ControlPlaneOrderDeleteFirst,
}

// crashOrdersFromEnv reads CRASH_ORDERS: unset, the seed picks one order per crash point (the CI
// budget: as many runs as one order); "all" runs every crash point in every order; a comma-separated
// list of orders lets the seed pick among those only.
func crashOrdersFromEnv(t *testing.T) (orders []caprv1.ControlPlaneOrder, all bool) {
	v := strings.TrimSpace(os.Getenv("CRASH_ORDERS"))
	switch v {
	case "":
		return crashOrders, false
	case "all":
		return crashOrders, true
	}
	for _, name := range strings.Split(v, ",") {
		o := caprv1.ControlPlaneOrder(strings.TrimSpace(name))
		if !slices.Contains(crashOrders, o) {
			t.Fatalf("CRASH_ORDERS=%q: %q is not one of %v or all", v, o, crashOrders)
		}
		orders = append(orders, o)
	}
	return orders, false
}

// crashPointsFor returns the crash points: each step boundary (a step issued, or its effect seen)
// of the longest order, and three random points between API writes, each in an order the seed picks
// among those with that many boundaries (or, CRASH_ORDERS=all, in each of them).
func crashPointsFor(t *testing.T, rng *rand.Rand) []crashPoint {
	orders, all := crashOrdersFromEnv(t)
	boundaries := func(o caprv1.ControlPlaneOrder) int64 { return int64(2 * len(controlplane.StepsFor(o))) }
	most := int64(0)
	for _, o := range orders {
		most = max(most, boundaries(o))
	}
	pick := func(fits []caprv1.ControlPlaneOrder) []caprv1.ControlPlaneOrder {
		if all {
			return fits
		}
		return []caprv1.ControlPlaneOrder{fits[rng.IntN(len(fits))]}
	}
	var points []crashPoint
	for n := int64(1); n <= most; n++ {
		var fits []caprv1.ControlPlaneOrder
		for _, o := range orders {
			if boundaries(o) >= n {
				fits = append(fits, o)
			}
		}
		for _, o := range pick(fits) {
			points = append(points, crashPoint{name: fmt.Sprintf("%s step boundary %02d", o, n), order: o, afterStepEvent: n})
		}
	}
	for range 3 {
		for _, o := range pick(orders) {
			points = append(points, crashPoint{name: fmt.Sprintf("%s random write", o), order: o, afterWrites: 1 + rng.Int64N(30)})
		}
	}
	return points
}

// twoMachineSurge is the sandbox's provider (the Generic adapter) where a surge creates two Machines
// (replicas raised by two, as KCP's admission needs with stacked etcd): removing the victim's member
// first, the order is then DeleteFirst, which has the provider create one (remediation/controlplane
// ChooseOrder). Its scale-down preflight refuses too, as KCP's does while another control-plane
// Machine is unhealthy, which rules the surge orders out altogether.
type twoMachineSurge struct{ controlplane.Generic }

func (twoMachineSurge) Surge(*unstructured.Unstructured) controlplane.SurgePlan {
	return controlplane.SurgePlan{Replicas: 2, Machines: 2, Reason: "the test's provider: two replacements"}
}

func (twoMachineSurge) ScaleDownRefusal(controlplane.ProviderView) string {
	return "the test's provider refuses to scale down"
}

// crashAdapter is the controllers' ControlPlaneAdapter for a crash point's order (nil: the default).
func crashAdapter(o caprv1.ControlPlaneOrder) func(*unstructured.Unstructured) controlplane.Adapter {
	if o != caprv1.ControlPlaneOrderDeleteFirst {
		return nil
	}
	return func(*unstructured.Unstructured) controlplane.Adapter { return twoMachineSurge{} }
}

// setOrderPolicy sets the cluster's health check's ordering policy for the next remediation: Auto
// for ScaleUpFirst, RemoveMemberFirst for the other two.
func setOrderPolicy(g Gomega, wc *sandbox.WorkloadCluster, o caprv1.ControlPlaneOrder) {
	policy := caprv1.ControlPlaneOrderAuto
	if o != caprv1.ControlPlaneOrderScaleUpFirst {
		policy = caprv1.ControlPlaneOrderRemoveMemberFirst
	}
	mhc := &caprv1.MachineHealthCheck{}
	g.Expect(sb.Client.Get(ctx, client.ObjectKey{Namespace: wc.Namespace, Name: "cp"}, mhc)).To(Succeed())
	base := mhc.DeepCopy()
	if mhc.Spec.Remediation.ControlPlane == nil {
		mhc.Spec.Remediation.ControlPlane = &caprv1.ControlPlaneRemediationSpec{}
	}
	mhc.Spec.Remediation.ControlPlane.Order = policy
	g.Expect(sb.Client.Patch(ctx, mhc, client.MergeFrom(base))).To(Succeed())
}
