package worker

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// replacingOwner returns the name of the MachineSet that replaces m once it is deleted, or why no
// owner would: only a MachineSet controller owner (group cluster.x-k8s.io) is trusted to create a
// replacement for a deleted Machine.
func replacingOwner(m *clusterv1.Machine) (machineSet, refusal string) {
	ref := metav1.GetControllerOf(m)
	if ref == nil {
		return "", fmt.Sprintf("Machine %s has no controller owner: nothing would replace it, so it is never deleted", m.Name)
	}
	if !isCAPIGroup(ref.APIVersion) {
		return "", fmt.Sprintf("Machine %s is owned by %s %s (%s), not by a MachineSet: nothing is known to replace it, so it is never deleted",
			m.Name, ref.Kind, ref.Name, ref.APIVersion)
	}
	switch ref.Kind {
	case "MachineSet":
		return ref.Name, ""
	case "MachinePool":
		return "", fmt.Sprintf("Machine %s belongs to MachinePool %s: whether the MachinePool's infrastructure provider replaces a single deleted Machine is not verified, so it is never deleted",
			m.Name, ref.Name)
	default:
		return "", fmt.Sprintf("Machine %s is owned by %s %s, not by a MachineSet: nothing is known to replace it, so it is never deleted",
			m.Name, ref.Kind, ref.Name)
	}
}

// group is the set of Machines whose remediations share a maxInFlight: a MachineDeployment's, or a
// lone MachineSet's.
type group struct {
	machineSet        string
	machineDeployment string
	maxInFlight       int
	// wait, when set, says why no remediation of the group may start now.
	wait string
}

// resolveGroup reads the MachineSet and its MachineDeployment and computes maxInFlight as CAPI's
// MachineSet controller does (an integer, or a percentage of the MachineDeployment's replicas rounded up).
func resolveGroup(ctx context.Context, c client.Client, namespace, machineSet string) (group, error) {
	g := group{machineSet: machineSet, maxInFlight: Unlimited}
	ms := &clusterv1.MachineSet{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: machineSet}, ms); err != nil {
		if apierrors.IsNotFound(err) {
			g.wait = fmt.Sprintf("MachineSet %s not found: the Machine is not deleted while nothing would replace it", machineSet)
			return g, nil
		}
		return g, fmt.Errorf("reading MachineSet %s: %w", machineSet, err)
	}
	if !ms.DeletionTimestamp.IsZero() {
		g.wait = fmt.Sprintf("MachineSet %s is being deleted: it would not replace the Machine", machineSet)
		return g, nil
	}
	ref := metav1.GetControllerOf(ms)
	if ref == nil || ref.Kind != "MachineDeployment" || !isCAPIGroup(ref.APIVersion) {
		return g, nil
	}
	g.machineDeployment = ref.Name
	md := &clusterv1.MachineDeployment{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: ref.Name}, md); err != nil {
		if apierrors.IsNotFound(err) {
			g.wait = fmt.Sprintf("MachineDeployment %s of MachineSet %s not found: its maxInFlight cannot be read", ref.Name, machineSet)
			return g, nil
		}
		return g, fmt.Errorf("reading MachineDeployment %s: %w", ref.Name, err)
	}
	if md.Spec.Remediation.MaxInFlight == nil {
		return g, nil
	}
	n, err := maxInFlightOf(md.Spec.Remediation.MaxInFlight, int(ptr.Deref(md.Spec.Replicas, 1)))
	if err != nil {
		g.wait = fmt.Sprintf("MachineDeployment %s has an invalid spec.remediation.maxInFlight %s: %v", md.Name, md.Spec.Remediation.MaxInFlight, err)
		return g, nil
	}
	g.maxInFlight = n
	return g, nil
}

// maxInFlightOf scales spec.remediation.maxInFlight to replicas as CAPI's MachineSet controller does
// (intstr.GetScaledValueFromIntOrPercent, a percentage rounded up). CAPI's admission accepts a
// negative value (core/webhooks/admission machinedeployment.go validateRemediationMaxInFlight checks
// only the syntax), which would hold every remediation back as if too many were in flight: it is an
// error here, so that the wait says why.
func maxInFlightOf(v *intstr.IntOrString, replicas int) (int, error) {
	n, err := intstr.GetScaledValueFromIntOrPercent(v, replicas, true)
	if err != nil {
		return 0, err
	}
	if n < 0 {
		return 0, fmt.Errorf("%d remediations in flight: must not be negative", n)
	}
	return n, nil
}

// key identifies the group for admission.
func (g group) key() (field, name string) {
	if g.machineDeployment != "" {
		return "MachineDeployment", g.machineDeployment
	}
	return "MachineSet", g.machineSet
}

// isCAPIGroup reports whether apiVersion is of CAPI's core group (any version).
func isCAPIGroup(apiVersion string) bool {
	gv, err := schema.ParseGroupVersion(apiVersion)
	return err == nil && gv.Group == clusterv1.GroupVersion.Group
}
