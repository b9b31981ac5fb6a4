package controlplane

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/structured-merge-diff/v6/fieldpath"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// A Cluster built from a ClusterClass (Cluster.spec.topology) has its control-plane object written by
// CAPI's Cluster topology controller, which server-side applies spec.replicas from
// Cluster.spec.topology.controlPlane.replicas whenever that is set (exp/topology/desiredstate
// desired_state.go computeControlPlane) and takes back any other value written to it. CAPR therefore
// never writes the control-plane object's replicas of such a cluster: a surge goes through the
// Cluster's field, applied with CAPR's own field manager, and a victim whose etcd member is down is
// deleted first, which loses no failure margin and changes no replicas at all (docs/user/topology.md).

// TopologyFieldManager is the field manager of CAPR's server-side applies of Cluster
// spec.topology.controlPlane.replicas: what a GitOps tool sees in the Cluster's managedFields while a
// surge lasts, and what tells the undo that the value there is still the one CAPR set.
const TopologyFieldManager = "capr-controlplane-remediation"

// topologyReplicasPath is Cluster spec.topology.controlPlane.replicas in managedFields.
var topologyReplicasPath = fieldpath.MakePathOrDie("spec", "topology", "controlPlane", "replicas")

// topologyReplicas returns Cluster spec.topology.controlPlane.replicas (nil when the Cluster has no
// topology or the topology leaves the replicas to someone else).
func topologyReplicas(cluster *clusterv1.Cluster) *int32 {
	if cluster == nil || !cluster.Spec.Topology.IsDefined() {
		return nil
	}
	return cluster.Spec.Topology.ControlPlane.Replicas
}

// topologyOwnsReplicas reports whether the Cluster topology sets the control-plane object's replicas:
// the object carries the topology's owned label and the Cluster's topology names the replicas.
func topologyOwnsReplicas(cluster *clusterv1.Cluster, cp *unstructured.Unstructured) bool {
	if cp == nil {
		return false
	}
	_, owned := cp.GetLabels()[clusterv1.ClusterTopologyOwnedLabel]
	return owned && topologyReplicas(cluster) != nil
}

// ownsTopologyReplicas reports whether CAPR's field manager owns Cluster
// spec.topology.controlPlane.replicas: true from CAPR's apply until someone else writes a
// different value (an update or a forced apply moves the field to its writer).
func ownsTopologyReplicas(cluster *clusterv1.Cluster) bool {
	for _, mf := range cluster.ManagedFields {
		if mf.Manager != TopologyFieldManager || mf.Operation != metav1.ManagedFieldsOperationApply || mf.FieldsV1 == nil {
			continue
		}
		set := &fieldpath.Set{}
		if err := set.FromJSON(bytes.NewReader(mf.FieldsV1.GetRawBytes())); err != nil {
			continue
		}
		if set.Has(topologyReplicasPath) {
			return true
		}
	}
	return false
}

// giveBackTopologyReplicas drops CAPR's field manager's ownership of Cluster
// spec.topology.controlPlane.replicas, which the surge's forced apply took (setTopologyReplicas), as
// the remediation lets the control plane go (releaseLock). An applier that sets another value later
// would otherwise fail with a conflict naming CAPR, after the remediation ended. Only the
// managedFields entry changes, never the value: the field is left to the managers that share it, or
// to none until someone writes it again (which then takes it without a conflict). Idempotent: with
// nothing of CAPR's there it writes nothing. The write is conditional on the resourceVersion read, so
// an apply meanwhile is never lost; a conflict is returned, and the release is tried again.
func (r *Reconciler) giveBackTopologyReplicas(ctx context.Context, s *scope) error {
	if s.cluster == nil || !s.cluster.Spec.Topology.IsDefined() {
		return nil
	}
	cluster := &clusterv1.Cluster{}
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(s.cluster), cluster); err != nil {
		return client.IgnoreNotFound(err)
	}
	if !ownsTopologyReplicas(cluster) {
		return nil
	}
	base := cluster.DeepCopy()
	kept := make([]metav1.ManagedFieldsEntry, 0, len(cluster.ManagedFields))
	for _, mf := range cluster.ManagedFields {
		if mf.Manager == TopologyFieldManager && mf.Operation == metav1.ManagedFieldsOperationApply && mf.FieldsV1 != nil {
			set := &fieldpath.Set{}
			if err := set.FromJSON(bytes.NewReader(mf.FieldsV1.GetRawBytes())); err != nil {
				return fmt.Errorf("reading the managedFields of %s on Cluster %s: %w", TopologyFieldManager, cluster.Name, err)
			}
			set = set.Difference(fieldpath.NewSet(topologyReplicasPath))
			if set.Empty() {
				continue
			}
			raw, err := set.ToJSON()
			if err != nil {
				return err
			}
			mf.FieldsV1 = &metav1.FieldsV1{Raw: raw}
		}
		kept = append(kept, mf)
	}
	cluster.ManagedFields = kept
	if err := r.Client.Patch(ctx, cluster, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("giving back Cluster %s spec.topology.controlPlane.replicas (managedFields of %s): %w", cluster.Name, TopologyFieldManager, err)
	}
	ctrl.LoggerFrom(ctx).Info("Gave back Cluster spec.topology.controlPlane.replicas", "Cluster", klog.KObj(cluster), "fieldManager", TopologyFieldManager)
	return nil
}

// topologyReplicasOwners names the field managers of Cluster spec.topology.controlPlane.replicas,
// for the messages ("" when managedFields say nothing).
func topologyReplicasOwners(cluster *clusterv1.Cluster) string {
	out := ""
	for _, mf := range cluster.ManagedFields {
		set := &fieldpath.Set{}
		if mf.FieldsV1 == nil || set.FromJSON(bytes.NewReader(mf.FieldsV1.GetRawBytes())) != nil || !set.Has(topologyReplicasPath) {
			continue
		}
		if out != "" {
			out += ", "
		}
		out += fmt.Sprintf("%s (%s)", mf.Manager, mf.Operation)
	}
	return out
}

// Topology is the adapter of a control plane whose replicas the Cluster topology owns: the
// provider's own adapter, with what the topology adds to when a remediation may start and to the
// choice of order (through ScaleDownRefusal, the input that makes ChooseOrder delete first).
type Topology struct {
	Adapter
	cluster *clusterv1.Cluster
	policy  caprv1.TopologyReplicasPolicy
}

// Name implements Adapter.
func (t Topology) Name() string {
	return t.Adapter.Name() + " (Cluster topology)"
}

// Busy implements Adapter: the provider must be quiet, and the topology must have applied its
// replicas to the control-plane object (a change of Cluster spec.topology.controlPlane.replicas
// not propagated yet is a scaling about to happen).
func (t Topology) Busy(view ProviderView) string {
	if busy := t.Adapter.Busy(view); busy != "" {
		return busy
	}
	want := topologyReplicas(t.cluster)
	have, err := Replicas(view.ControlPlane)
	if err != nil {
		return err.Error()
	}
	if want != nil && *want != have {
		return fmt.Sprintf("Cluster %s spec.topology.controlPlane.replicas is %d and the Cluster topology has not applied it to %s %s yet (spec.replicas %d)",
			t.cluster.Name, *want, view.ControlPlane.GetKind(), view.ControlPlane.GetName(), have)
	}
	return ""
}

// Surge implements Adapter: the provider's surge, through Cluster spec.topology.controlPlane.replicas.
// A surge of two still creates one Machine: the replicas return to N through the Cluster's field as
// soon as the first replacement exists (firstreplacement.go), and the topology controller applies
// that to the control-plane object within a reconcile, long before KCP would create a second Machine
// (only once the first passes its preflight). A GitOps tool sees the field differ from Git from the
// surge to the first replacement's creation (docs/user/topology.md).
func (t Topology) Surge(cp *unstructured.Unstructured) SurgePlan {
	plan := t.Adapter.Surge(cp)
	plan.Reason = fmt.Sprintf("through Cluster %s spec.topology.controlPlane.replicas: %s", t.cluster.Name, plan.Reason)
	return plan
}

// SurgeRefusal implements Adapter: why a surge through the Cluster's replicas is not to be used, which
// makes ChooseOrder delete the victim first without changing any replicas:
//   - the victim's etcd member is down, unreachable, missing or a learner: removing it loses no
//     failure margin, so nothing the topology owns needs to change (member-aware delete-first);
//   - spec.controlPlane.topologyReplicas is Leave: CAPR may not write the Cluster;
//   - the Cluster topology is not reconciled: a replicas change might not reach the control plane.
//
// With the victim's member healthy the last two leave only orders that lose the margin, so
// ChooseOrder waits (WouldLoseFailureMargin) until a person sets order RemoveMemberFirst.
func (t Topology) SurgeRefusal(view ProviderView) string {
	if refusal := t.Adapter.SurgeRefusal(view); refusal != "" {
		return refusal
	}
	if view.Etcd != nil && view.Victim != nil && view.Victim.Status.NodeRef.IsDefined() {
		// The victim's member as the order decision classifies it (victimMember): a member that
		// cannot be reached but is known to be alive counts as healthy, and is surged for.
		if member := victimMember(view.Etcd, view.Victim.Status.NodeRef.Name); member != VictimHealthy {
			return fmt.Sprintf("Cluster %s's topology owns the replicas and the victim's etcd member is %s: deleting it first loses no failure margin and changes no replicas",
				t.cluster.Name, member)
		}
	}
	if t.policy == caprv1.TopologyReplicasLeave {
		return fmt.Sprintf("spec.controlPlane.topologyReplicas is %s: CAPR does not change Cluster %s spec.topology.controlPlane.replicas, so it does not surge",
			caprv1.TopologyReplicasLeave, t.cluster.Name)
	}
	if c := conditions.Get(t.cluster, clusterv1.ClusterTopologyReconciledCondition); c == nil || c.Status != metav1.ConditionTrue {
		why := "no condition yet"
		if c != nil {
			why = fmt.Sprintf("%s: %s", c.Reason, c.Message)
		}
		return fmt.Sprintf("Cluster %s's topology is not reconciled (%s %s), so a surge through spec.topology.controlPlane.replicas might not reach the control plane",
			t.cluster.Name, clusterv1.ClusterTopologyReconciledCondition, why)
	}
	return ""
}

// topologyAdapter wraps the provider's adapter when the Cluster topology owns the replicas.
func topologyAdapter(inner Adapter, cluster *clusterv1.Cluster, cp *unstructured.Unstructured, mr *caprv1.MachineRemediation) Adapter {
	if !topologyOwnsReplicas(cluster, cp) {
		return inner
	}
	policy := caprv1.TopologyReplicasSurge
	if mr.Spec.ControlPlane != nil && mr.Spec.ControlPlane.TopologyReplicas != "" {
		policy = mr.Spec.ControlPlane.TopologyReplicas
	}
	return Topology{Adapter: inner, cluster: cluster, policy: policy}
}

// replicasField returns where this remediation changes the replicas: as recorded at its start (unset
// in records older than the field: the control-plane object), or, before it starts, as the Cluster
// and the control-plane object say now.
func (s *scope) replicasField() caprv1.ReplicasField {
	if cps := s.mr.Status.ControlPlane; cps != nil {
		if cps.ReplicasField == "" {
			return caprv1.ReplicasFieldControlPlane
		}
		return cps.ReplicasField
	}
	if topologyOwnsReplicas(s.cluster, s.cp) {
		return caprv1.ReplicasFieldClusterTopology
	}
	return caprv1.ReplicasFieldControlPlane
}

// replicasSource is the replicas a decision is made on: the field's value, and, for the Cluster
// topology's field, whether CAPR's field manager owns it (theirs is true when it does not, so a
// value there is not one CAPR may take back).
type replicasSource struct {
	current int32
	theirs  bool
}

// readReplicas returns the replicas of the field this remediation changes. The Cluster is read live
// (once per reconcile, and again after a conflicting write): the value and its owner must be those
// of now.
func (r *Reconciler) readReplicas(ctx context.Context, s *scope) (replicasSource, error) {
	if s.replicasField() != caprv1.ReplicasFieldClusterTopology {
		n, err := Replicas(s.cp)
		return replicasSource{current: n}, err
	}
	if s.liveCluster == nil {
		cluster := &clusterv1.Cluster{}
		if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(s.cluster), cluster); err != nil {
			return replicasSource{}, fmt.Errorf("reading Cluster %s: %w", s.cluster.Name, err)
		}
		s.liveCluster = cluster
	}
	n := topologyReplicas(s.liveCluster)
	if n == nil {
		return replicasSource{}, fmt.Errorf("cluster %s: %w (the remediation recorded that the topology owns the replicas)", s.cluster.Name, errTopologyReplicasRemoved)
	}
	return replicasSource{current: *n, theirs: !ownsTopologyReplicas(s.liveCluster)}, nil
}

// errTopologyReplicasRemoved says that Cluster spec.topology.controlPlane.replicas, which the
// remediation recorded as the field it changes, is gone: someone removed it during the remediation,
// and the topology no longer sets the control-plane object's replicas. CAPR never adds it back (that
// would take the replicas back from whoever removed them). Steps before the point of no return wait
// with it until their timeout undoes them; the Delete step and the undo leave the replicas to the
// provider (topologyReplicasLeft).
var errTopologyReplicasRemoved = errors.New("spec.topology.controlPlane.replicas was removed during the remediation")

// topologyReplicasLeft is what replicasBack and the undo do when err is errTopologyReplicasRemoved:
// nothing is written, and the note says so with the control-plane object's replicas of now (what its
// provider scales to from here on). ok is false for any other error.
func topologyReplicasLeft(s *scope, err error) (note string, ok bool) {
	if !errors.Is(err, errTopologyReplicasRemoved) {
		return "", false
	}
	n, rerr := Replicas(s.cp)
	now := fmt.Sprintf("%d", n)
	if rerr != nil {
		now = "unset"
	}
	return fmt.Sprintf("Cluster %s spec.topology.controlPlane.replicas was removed (%s), so CAPR leaves the replicas to the %s (%s %s spec.replicas %s now)",
		s.cluster.Name, replicasChangedElsewhere, s.adapter.Name(), s.cp.GetKind(), s.cp.GetName(), now), true
}

// topologyReplicasRemoved reports whether the remediation changes the Cluster topology's replicas
// and the Cluster, as last read, no longer has them.
func topologyReplicasRemoved(s *scope) bool {
	if s.replicasField() != caprv1.ReplicasFieldClusterTopology {
		return false
	}
	cluster := s.cluster
	if s.liveCluster != nil {
		cluster = s.liveCluster
	}
	return topologyReplicas(cluster) == nil
}

// setTopologyReplicas writes Cluster spec.topology.controlPlane.replicas, from the value from, to n with a
// server-side apply of that one field by TopologyFieldManager, forced (the field's previous owner,
// a person or a GitOps tool, loses it to CAPR until it writes it again) and conditional on the
// Cluster's resourceVersion as read (any write meanwhile makes it fail with errReplicasChanged, and
// the decision is made again on a live read). What before changes in the control-plane object's
// annotations (KCP's remediation-in-progress) is patched first, key by key, so that the provider
// sees it before the topology brings it the new replicas.
func (r *Reconciler) setTopologyReplicas(ctx context.Context, s *scope, from, n int32, before func(*unstructured.Unstructured) error) error {
	if before != nil {
		if err := r.annotateControlPlane(ctx, s, before); err != nil {
			return err
		}
	}
	apply := &unstructured.Unstructured{}
	apply.SetAPIVersion(clusterv1.GroupVersion.String())
	apply.SetKind("Cluster")
	apply.SetNamespace(s.liveCluster.Namespace)
	apply.SetName(s.liveCluster.Name)
	apply.SetResourceVersion(s.liveCluster.ResourceVersion)
	if err := unstructured.SetNestedField(apply.Object, int64(n), "spec", "topology", "controlPlane", "replicas"); err != nil {
		return err
	}
	err := r.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(apply), client.FieldOwner(TopologyFieldManager), client.ForceOwnership)
	switch {
	case apierrors.IsConflict(err):
		return fmt.Errorf("setting Cluster %s spec.topology.controlPlane.replicas from %d to %d: %w (%w)", s.liveCluster.Name, from, n, errReplicasChanged, err)
	case err != nil:
		return fmt.Errorf("setting Cluster %s spec.topology.controlPlane.replicas to %d: %w", s.liveCluster.Name, n, err)
	}
	return nil
}

// annotateControlPlane patches what before changes in the control-plane object's annotations, key by
// key (annotations others wrote meanwhile are kept), and nothing else.
func (r *Reconciler) annotateControlPlane(ctx context.Context, s *scope, before func(*unstructured.Unstructured) error) error {
	base := s.cp.DeepCopy()
	if err := before(s.cp); err != nil {
		return err
	}
	ops := annotationPatch(base.GetAnnotations(), s.cp.GetAnnotations())
	if len(ops) == 0 {
		return nil
	}
	patch, err := json.Marshal(ops)
	if err != nil {
		return err
	}
	if err := r.Client.Patch(ctx, s.cp, client.RawPatch(types.JSONPatchType, patch)); err != nil {
		return fmt.Errorf("annotating %s %s: %w", s.cp.GetKind(), s.cp.GetName(), err)
	}
	return nil
}
