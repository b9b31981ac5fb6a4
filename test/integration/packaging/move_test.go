package packaging_test

import (
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	clusterctlv1 "sigs.k8s.io/cluster-api/cmd/clusterctl/api/v1alpha3"
	clusterctlclient "sigs.k8s.io/cluster-api/cmd/clusterctl/client"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/controllers/machinehealthcheck"
	capienv "github.com/capr-io/capr/test/envtest"
)

// Line numbers below are of sigs.k8s.io/cluster-api v1.14.2, cmd/clusterctl/client/cluster/.
//
// `clusterctl move` (mover.go:75-104) discovers the objects of every CRD labelled
// clusterctl.cluster.x-k8s.io (objectgraph.go:420-430, the label clusterctl init puts on every
// component) and moves those an owner-reference chain links to a Cluster, or whose CRD has the
// clusterctl.cluster.x-k8s.io/move label (objectgraph.go:363-385, :674-684, :758-785). It recreates
// each one on the target with the owner references rebuilt from the owners' new UIDs
// (mover.go:1030-1034, :1209-1231), by a plain Create of the object read from the source
// (mover.go:1060): the API server drops the status of a kind with the status subresource, and
// clusterctl never writes it back (CAPI's book, docs/book/src/developer/providers/contracts/
// clusterctl.md:573-580: "Status subresource is never restored").
//
// The test moves a namespace holding a Cluster and everything CAPR creates or is given for it, from
// the suite's management cluster (CAPR installed by clusterctl init, install_test.go) to a second
// API server set up the same way, with clusterctl's own Move, offline.
func TestClusterctlMoveCarriesCAPRObjectsToAnotherManagementCluster(t *testing.T) {
	g := NewWithT(t)
	inst, err := installCAPR()
	g.Expect(err).NotTo(HaveOccurred())

	target, err := capienv.Start(capienv.Options{WithoutCAPR: true})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = target.Stop() })
	// Move first checks that every provider of the source is on the target, at least as new
	// (mover.go:86-90, :1316-1368): the same core provider record and clusterctl init of CAPR.
	_, _, targetKubeconfig, err := clusterctlInit(target, inst.configPath, inst.capiVersion)
	g.Expect(err).NotTo(HaveOccurred())
	// envtest installed CAPI's CRDs, not clusterctl init: give them the label clusterctl init would
	// have, without which move does not even look at Clusters and Machines (objectgraph.go:426).
	for _, c := range []client.Client{testEnv.Client, target.Client} {
		g.Expect(labelCAPICRDsAsInstalledByClusterctl(c)).To(Succeed())
	}

	// CAPR's CRDs come labelled by clusterctl init; the template's also carries the move label
	// (api/v1alpha1 MachineRemediationTemplate): nothing owns a template.
	for _, name := range []string{"machinehealthchecks", "machineremediations", "machineremediationtemplates"} {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		g.Expect(testEnv.Client.Get(ctx, client.ObjectKey{Name: name + "." + caprv1.GroupVersion.Group}, crd)).To(Succeed())
		g.Expect(crd.Labels).To(HaveKey(clusterctlv1.ClusterctlLabel), name)
		if name == "machineremediationtemplates" {
			g.Expect(crd.Labels).To(HaveKey(clusterctlv1.ClusterctlMoveLabel))
		} else {
			g.Expect(crd.Labels).NotTo(HaveKey(clusterctlv1.ClusterctlMoveLabel), "%s: moved with its Cluster, through its owner", name)
		}
	}

	src := createMoveFixture(g, testEnv.Client)

	c, err := clusterctlclient.New(ctx, inst.configPath)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(c.Move(ctx, clusterctlclient.MoveOptions{
		FromKubeconfig: clusterctlclient.Kubeconfig{Path: inst.kubeconfigPath},
		ToKubeconfig:   clusterctlclient.Kubeconfig{Path: targetKubeconfig},
		Namespace:      src.namespace,
	})).To(Succeed())

	ns := src.namespace
	get := func(c client.Client, name string, obj client.Object) error {
		return c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, obj)
	}

	// The Cluster: a new object (new UID), resumed on the target (mover.go:416-418).
	cluster := &clusterv1.Cluster{}
	g.Expect(get(target.Client, "c1", cluster)).To(Succeed())
	g.Expect(cluster.UID).NotTo(Equal(src.uids["Cluster/c1"]))
	g.Expect(ptr.Deref(cluster.Spec.Paused, false)).To(BeFalse())
	clusterOwner := metav1.OwnerReference{APIVersion: clusterv1.GroupVersion.String(), Kind: "Cluster", Name: "c1", UID: cluster.UID}
	machineUIDs := map[string]types.UID{}
	for _, name := range []string{"cp-0", "cp-1"} {
		m := &clusterv1.Machine{}
		g.Expect(get(target.Client, name, m)).To(Succeed())
		g.Expect(m.UID).NotTo(Equal(src.uids["Machine/"+name]))
		g.Expect(m.OwnerReferences).To(ConsistOf(clusterOwner))
		machineUIDs[name] = m.UID
	}

	// CAPR's MachineHealthCheck went with its Cluster through the owner reference CAPR's controller
	// sets (adoptByCluster, controllers/machinehealthcheck/controller.go), now
	// pointing at the new Cluster; spec and labels as they were; status empty.
	mhc := &caprv1.MachineHealthCheck{}
	g.Expect(get(target.Client, "hc", mhc)).To(Succeed())
	g.Expect(mhc.OwnerReferences).To(ConsistOf(clusterOwner))
	g.Expect(mhc.Labels).To(Equal(src.mhc.Labels))
	g.Expect(mhc.Spec).To(Equal(src.mhc.Spec))
	g.Expect(mhc.Status).To(Equal(caprv1.MachineHealthCheckStatus{}), "clusterctl does not restore status")

	// A health check CAPR never reconciled (no Cluster owner yet) is linked to nothing: it stays.
	g.Expect(apierrors.IsNotFound(get(target.Client, "not-adopted", &caprv1.MachineHealthCheck{}))).To(BeTrue())
	g.Expect(get(testEnv.Client, "not-adopted", &caprv1.MachineHealthCheck{})).To(Succeed())

	// The template went with the move label, so the moved health check's templateRef resolves.
	mrt := &caprv1.MachineRemediationTemplate{}
	g.Expect(get(target.Client, mhc.Spec.Remediation.TemplateRef.Name, mrt)).To(Succeed())
	g.Expect(mrt.Spec).To(Equal(src.mrt.Spec))
	g.Expect(mrt.OwnerReferences).To(BeEmpty())

	// The Pending request: owned by its Machine, the new one.
	pending := &caprv1.MachineRemediation{}
	g.Expect(get(target.Client, "cp-0", pending)).To(Succeed())
	g.Expect(pending.OwnerReferences).To(ConsistOf(metav1.OwnerReference{
		APIVersion: clusterv1.GroupVersion.String(), Kind: "Machine", Name: "cp-0", UID: machineUIDs["cp-0"],
	}))
	g.Expect(pending.Labels).To(Equal(src.pending.Labels))
	g.Expect(pending.Spec).To(Equal(src.pending.Spec))
	g.Expect(pending.Status).To(Equal(caprv1.MachineRemediationStatus{}), "clusterctl does not restore status")

	// The Running request: owned by the new Cluster, finalizer kept, and its status (CAPR's durable
	// record of the run: phase, start, control-plane record) gone.
	running := &caprv1.MachineRemediation{}
	g.Expect(get(target.Client, "cp-1", running)).To(Succeed())
	g.Expect(running.OwnerReferences).To(ConsistOf(clusterOwner))
	g.Expect(running.Labels).To(Equal(src.running.Labels))
	g.Expect(running.Finalizers).To(ConsistOf(caprv1.MachineRemediationFinalizer))
	g.Expect(running.Spec).To(Equal(src.running.Spec))
	g.Expect(running.Status).To(Equal(caprv1.MachineRemediationStatus{}), "clusterctl does not restore status")

	// Everything moved is gone from the source (finalizers removed by clusterctl, mover.go:1297-1312).
	for name, obj := range map[string]client.Object{
		"Cluster/c1": &clusterv1.Cluster{}, "Machine/cp-0": &clusterv1.Machine{}, "Machine/cp-1": &clusterv1.Machine{},
		"MachineHealthCheck/hc": &caprv1.MachineHealthCheck{}, "MachineRemediationTemplate/" + src.mrt.Name: &caprv1.MachineRemediationTemplate{},
		"MachineRemediation/cp-0": &caprv1.MachineRemediation{}, "MachineRemediation/cp-1": &caprv1.MachineRemediation{},
	} {
		_, objName, _ := strings.Cut(name, "/")
		g.Expect(apierrors.IsNotFound(get(testEnv.Client, objName, obj))).To(BeTrue(), "%s is still on the source", name)
	}
}

// moveFixture is what createMoveFixture created on the source, as read back before the move.
type moveFixture struct {
	namespace string
	uids      map[string]types.UID
	mhc       *caprv1.MachineHealthCheck
	mrt       *caprv1.MachineRemediationTemplate
	pending   *caprv1.MachineRemediation
	running   *caprv1.MachineRemediation
}

// createMoveFixture creates, in a new namespace, what a management cluster holds for a cluster CAPR
// remediates. No CAPI or CAPR controller runs, so the test writes what they would have:
//   - Cluster c1, provisioned: Move refuses a Cluster whose infrastructure is not provisioned or
//     whose control plane is not initialized (mover.go:226-259).
//   - control-plane Machines cp-0 and cp-1, owned by the Cluster as CAPI's Machine controller does
//     for stand-alone Machines (core/reconcilers/machine/machine_controller.go:444-454), with a
//     nodeRef: Move refuses Machines without one (mover.go:261-277).
//   - CAPR's MachineHealthCheck hc, labelled and owned by the Cluster as adoptByCluster does
//     (controllers/machinehealthcheck/controller.go), with status, and
//     "not-adopted", which CAPR never reconciled.
//   - the MachineRemediationTemplate hc references.
//   - MachineRemediation cp-0, Pending, owned by its Machine as the health check creates it
//     (ensureRequest, controllers/machinehealthcheck/requests.go); cp-1, Running,
//     re-owned by the Cluster with the finalizer as start does
//     (remediation/controlplane/pending.go, Reconciler.start). Both with status, as the
//     remediator writes it.
func createMoveFixture(g Gomega, c client.Client) *moveFixture {
	ns, err := capienv.CreateNamespace(ctx, c, "move")
	g.Expect(err).NotTo(HaveOccurred())
	f := &moveFixture{namespace: ns, uids: map[string]types.UID{}}

	cluster := capienv.NewCluster(ns, "c1", clusterv1.ContractVersionedObjectReference{})
	g.Expect(c.Create(ctx, cluster)).To(Succeed())
	g.Expect(capienv.SetClusterReady(ctx, c, cluster, capienv.ControlPlaneInitialized)).To(Succeed())
	f.uids["Cluster/c1"] = cluster.UID
	clusterOwner := metav1.OwnerReference{APIVersion: clusterv1.GroupVersion.String(), Kind: "Cluster", Name: "c1", UID: cluster.UID}

	machines := map[string]*clusterv1.Machine{}
	for _, name := range []string{"cp-0", "cp-1"} {
		m := capienv.NewMachine(ns, "c1", name, capienv.AsControlPlane)
		m.OwnerReferences = []metav1.OwnerReference{clusterOwner}
		g.Expect(c.Create(ctx, m)).To(Succeed())
		g.Expect(capienv.SetMachineNode(ctx, c, m, name)).To(Succeed())
		f.uids["Machine/"+name] = m.UID
		machines[name] = m
	}

	mrt := &caprv1.MachineRemediationTemplate{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "control-plane"},
		Spec: caprv1.MachineRemediationTemplateSpec{Template: caprv1.MachineRemediationTemplateResource{
			Spec: caprv1.MachineRemediationSpec{
				ControlPlane: &caprv1.ControlPlaneRemediationSpec{MaxRetry: ptr.To[int32](3)},
				Fencing:      &caprv1.FencingSpec{Policy: caprv1.FencingDisabled},
			},
		}},
	}
	g.Expect(c.Create(ctx, mrt)).To(Succeed())

	mhc := capienv.NewHealthCheck(ns, "c1", "cp", 300)
	mhc.Labels = map[string]string{clusterv1.ClusterNameLabel: "c1"}
	mhc.OwnerReferences = []metav1.OwnerReference{clusterOwner}
	mhc.Spec.Remediation.TemplateRef = &caprv1.TemplateReference{
		APIVersion: caprv1.GroupVersion.String(), Kind: "MachineRemediationTemplate", Name: mrt.Name,
	}
	g.Expect(c.Create(ctx, mhc)).To(Succeed())
	mhc.Status = caprv1.MachineHealthCheckStatus{
		ExpectedMachines: ptr.To[int32](2), CurrentHealthy: ptr.To[int32](0), RemediationsAllowed: ptr.To[int32](0),
		Targets: []string{"cp-0", "cp-1"}, UnhealthyMachines: []string{"cp-0", "cp-1"}, ObservedGeneration: mhc.Generation,
	}
	conditions.Set(mhc, metav1.Condition{Type: caprv1.MachineHealthCheckRemediationAllowedCondition, Status: metav1.ConditionTrue, Reason: "Allowed"})
	g.Expect(c.Status().Update(ctx, mhc)).To(Succeed())

	notAdopted := capienv.NewHealthCheck(ns, "c1", "workers", 300)
	notAdopted.Name = "not-adopted"
	g.Expect(c.Create(ctx, notAdopted)).To(Succeed())

	requestLabels := map[string]string{clusterv1.ClusterNameLabel: "c1", machinehealthcheck.HealthCheckLabel: mhc.Name}
	pending := &caprv1.MachineRemediation{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: "cp-0", Labels: requestLabels,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: clusterv1.GroupVersion.String(), Kind: "Machine", Name: "cp-0", UID: machines["cp-0"].UID,
			}},
		},
		Spec: caprv1.MachineRemediationSpec{Source: caprv1.MachineRemediationSourceHealthCheck, Reason: "NodeNotReady", Message: "Node cp-0 is not Ready"},
	}
	g.Expect(c.Create(ctx, pending)).To(Succeed())
	pending.Status.Phase = caprv1.MachineRemediationPhasePending
	conditions.Set(pending, metav1.Condition{Type: caprv1.MachineRemediationProgressingCondition, Status: metav1.ConditionFalse,
		Reason: caprv1.MachineRemediationWaitingForPreconditionsReason, Message: "waiting"})
	g.Expect(c.Status().Update(ctx, pending)).To(Succeed())

	running := &caprv1.MachineRemediation{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: "cp-1", Labels: requestLabels,
			OwnerReferences: []metav1.OwnerReference{clusterOwner},
			Finalizers:      []string{caprv1.MachineRemediationFinalizer},
		},
		Spec: caprv1.MachineRemediationSpec{Source: caprv1.MachineRemediationSourceHealthCheck, Reason: "NodeNotReady", Message: "Node cp-1 is not Ready"},
	}
	g.Expect(c.Create(ctx, running)).To(Succeed())
	running.Status.Phase = caprv1.MachineRemediationPhaseRunning
	running.Status.StartTime = ptr.To(metav1.NewTime(time.Now().Truncate(time.Second)))
	running.Status.ControlPlane = &caprv1.ControlPlaneRemediationStatus{
		ClusterName: "c1", Order: caprv1.ControlPlaneOrderRemoveMemberFirst, DesiredReplicas: ptr.To[int32](3), MemberName: "cp-1",
	}
	conditions.Set(running, metav1.Condition{Type: caprv1.MachineRemediationProgressingCondition, Status: metav1.ConditionTrue,
		Reason: caprv1.MachineRemediationStepInProgressReason, Message: "order RemoveMemberFirst"})
	g.Expect(c.Status().Update(ctx, running)).To(Succeed())

	// Read everything back: what the target is compared with, and proof that the status the move
	// drops was really there.
	f.mhc, f.mrt, f.pending, f.running = &caprv1.MachineHealthCheck{}, &caprv1.MachineRemediationTemplate{}, &caprv1.MachineRemediation{}, &caprv1.MachineRemediation{}
	g.Expect(c.Get(ctx, client.ObjectKeyFromObject(mhc), f.mhc)).To(Succeed())
	g.Expect(c.Get(ctx, client.ObjectKeyFromObject(mrt), f.mrt)).To(Succeed())
	g.Expect(c.Get(ctx, client.ObjectKeyFromObject(pending), f.pending)).To(Succeed())
	g.Expect(c.Get(ctx, client.ObjectKeyFromObject(running), f.running)).To(Succeed())
	g.Expect(f.mhc.Status.Targets).To(HaveLen(2))
	g.Expect(f.pending.Status.Phase).To(Equal(caprv1.MachineRemediationPhasePending))
	g.Expect(f.running.Status.Phase).To(Equal(caprv1.MachineRemediationPhaseRunning))
	g.Expect(f.running.Status.ControlPlane).NotTo(BeNil())
	return f
}

// labelCAPICRDsAsInstalledByClusterctl adds the clusterctl.cluster.x-k8s.io label clusterctl init puts
// on every component it installs (cmd/clusterctl/client/repository/components.go:543-563) to the CAPI
// CRDs envtest installed (every *.x-k8s.io CRD without it: CAPR's have it from clusterctl init).
func labelCAPICRDsAsInstalledByClusterctl(c client.Client) error {
	crds := &apiextensionsv1.CustomResourceDefinitionList{}
	if err := c.List(ctx, crds); err != nil {
		return err
	}
	for i := range crds.Items {
		crd := &crds.Items[i]
		if _, ok := crd.Labels[clusterctlv1.ClusterctlLabel]; ok || !strings.HasSuffix(crd.Spec.Group, ".x-k8s.io") {
			continue
		}
		base := crd.DeepCopy()
		if crd.Labels == nil {
			crd.Labels = map[string]string{}
		}
		crd.Labels[clusterctlv1.ClusterctlLabel] = ""
		if err := c.Patch(ctx, crd, client.MergeFrom(base)); err != nil {
			return err
		}
	}
	return nil
}
