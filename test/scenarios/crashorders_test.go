package scenarios_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/remediation/controlplane"
	"github.com/capr-io/capr/test/builder"
	"github.com/capr-io/capr/test/sandbox"
)

// crashVariant is an order TestCrashSafety crashes, and how the remediation is made
// to take it. A remediation of a Machine whose Node stops reporting (its member healthy) takes
// ScaleUpFirst under the Auto policy; RemoveMemberFirst under that policy (which accepts no failure
// margin until the replacement votes); DeleteFirst under that policy where a surge would create two
// Machines (twoMachineSurge: KCP with stacked etcd where the replicas do not return at the first
// replacement); OneReplacement is ScaleUpFirst with a surge of two whose replicas return at the first
// replacement (oneReplacement, with the sandbox's provider scaling up as KCP does:
// remediation/controlplane firstreplacement.go).
type crashVariant struct {
	// name is the variant's name in CRASH_ORDERS and in the crash points' names.
	name  string
	order caprv1.ControlPlaneOrder
	// adapter is the controllers' ControlPlaneAdapter (nil: the default).
	adapter func(*unstructured.Unstructured) controlplane.Adapter
	// kcpPreflight makes the sandbox's provider scale up as KCP does (sandbox.KCPPreflightAnnotation).
	kcpPreflight bool
	// surge and replacements are what the remediation must record (0: not checked).
	surge, replacements int32
}

var crashVariants = []crashVariant{
	{name: "ScaleUpFirst", order: caprv1.ControlPlaneOrderScaleUpFirst},
	{name: "RemoveMemberFirst", order: caprv1.ControlPlaneOrderRemoveMemberFirst},
	{name: "DeleteFirst", order: caprv1.ControlPlaneOrderDeleteFirst,
		adapter: func(*unstructured.Unstructured) controlplane.Adapter { return twoMachineSurge{} }},
	{name: "OneReplacement", order: caprv1.ControlPlaneOrderScaleUpFirst, kcpPreflight: true, surge: 2, replacements: 1,
		adapter: func(*unstructured.Unstructured) controlplane.Adapter { return oneReplacement{} }},
}

// crashVariantsFromEnv reads CRASH_ORDERS: unset, the seed picks one variant per crash point (the CI
// budget: as many runs as one order); "all" runs every crash point in every variant; a
// comma-separated list of variant names lets the seed pick among those only.
func crashVariantsFromEnv(t *testing.T) (variants []crashVariant, all bool) {
	v := strings.TrimSpace(os.Getenv("CRASH_ORDERS"))
	switch v {
	case "":
		return crashVariants, false
	case "all":
		return crashVariants, true
	}
	for _, name := range strings.Split(v, ",") {
		i := slices.IndexFunc(crashVariants, func(c crashVariant) bool { return c.name == strings.TrimSpace(name) })
		if i < 0 {
			names := make([]string, 0, len(crashVariants))
			for _, c := range crashVariants {
				names = append(names, c.name)
			}
			t.Fatalf("CRASH_ORDERS=%q: %q is not one of %v or all", v, name, names)
		}
		variants = append(variants, crashVariants[i])
	}
	return variants, false
}

// crashPointsFor returns the crash points: each step boundary (a step issued, or its effect seen)
// of the longest order, and three random points between API writes, each in a variant the seed picks
// among those with that many boundaries (or, CRASH_ORDERS=all, in each of them).
func crashPointsFor(t *testing.T, rng *rand.Rand) []crashPoint {
	variants, all := crashVariantsFromEnv(t)
	boundaries := func(v crashVariant) int64 { return int64(2 * len(builder.Steps[v.order])) }
	most := int64(0)
	for _, v := range variants {
		most = max(most, boundaries(v))
	}
	pick := func(fits []crashVariant) []crashVariant {
		if all {
			return fits
		}
		return []crashVariant{fits[rng.IntN(len(fits))]}
	}
	var points []crashPoint
	for n := int64(1); n <= most; n++ {
		var fits []crashVariant
		for _, v := range variants {
			if boundaries(v) >= n {
				fits = append(fits, v)
			}
		}
		for _, v := range pick(fits) {
			points = append(points, crashPoint{name: fmt.Sprintf("%s step boundary %02d", v.name, n), variant: v, afterStepEvent: n})
		}
	}
	for range 3 {
		for _, v := range pick(variants) {
			points = append(points, crashPoint{name: fmt.Sprintf("%s random write", v.name), variant: v, afterWrites: 1 + rng.Int64N(30)})
		}
	}
	// Right after the victim's delete, in an order that then returns the replicas (the surge orders).
	var surged []crashVariant
	for _, v := range variants {
		if v.order != caprv1.ControlPlaneOrderDeleteFirst && v.replacements == 0 {
			surged = append(surged, v)
		}
	}
	if len(surged) > 0 {
		for _, v := range pick(surged) {
			points = append(points, crashPoint{name: fmt.Sprintf("%s victim deleted", v.name), variant: v, afterVictimDelete: true})
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

// oneReplacement is the sandbox's provider (the Generic adapter) asked for one replacement with a
// surge of two, as KCP with stacked etcd is: CAPR sets KCP's remediation-in-progress before the
// scale-up (KCP's adapter), which the provider, scaling up as KCP does (sandbox.KCPPreflightAnnotation),
// needs while the victim's Node is not Ready and removes when it creates the Machine.
type oneReplacement struct{ controlplane.Generic }

func (oneReplacement) Surge(*unstructured.Unstructured) controlplane.SurgePlan {
	return controlplane.SurgePlan{Replicas: 2, Machines: 1, Reason: "the test's provider: replicas raised by two, one replacement"}
}

func (oneReplacement) BeforeScaleUp(cp *unstructured.Unstructured, victim string, at time.Time, retryCount int32) error {
	return controlplane.KCP{}.BeforeScaleUp(cp, victim, at, retryCount)
}

func (oneReplacement) ClearScaleUp(cp *unstructured.Unstructured, victim string) bool {
	return controlplane.KCP{}.ClearScaleUp(cp, victim)
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

// setKCPPreflight makes the sandbox's provider scale up as KCP does, or not (sandbox.KCPPreflightAnnotation).
func setKCPPreflight(g Gomega, wc *sandbox.WorkloadCluster, on bool) {
	cp := controlPlaneObject(g, wc)
	base := cp.DeepCopy()
	if on {
		if cp.Annotations == nil {
			cp.Annotations = map[string]string{}
		}
		cp.Annotations[sandbox.KCPPreflightAnnotation] = "true"
	} else {
		delete(cp.Annotations, sandbox.KCPPreflightAnnotation)
	}
	g.Expect(sb.Client.Patch(ctx, cp, client.MergeFrom(base))).To(Succeed())
}
