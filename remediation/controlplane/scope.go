package controlplane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/external"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/etcdutil"
	"github.com/capr-io/capr/remediation"
)

// scope is what one reconcile of a control-plane remediation works with. Everything in it is read
// fresh from the world at the start of the reconcile; the MachineRemediation status only remembers
// what cannot be re-read (the replicas before the scale-up, the Machines that existed then).
type scope struct {
	mr *caprv1.MachineRemediation
	// base is the MachineRemediation as last read or written; persist sends the difference.
	base    *caprv1.MachineRemediation
	machine *clusterv1.Machine
	// machineGone is true when the Machine no longer exists (machine is then empty).
	machineGone bool
	cluster     *clusterv1.Cluster
	// liveCluster is the Cluster read live, when the remediation changes the replicas through its
	// topology (readReplicas); nil until then.
	liveCluster *clusterv1.Cluster

	cp       *unstructured.Unstructured
	adapter  Adapter
	machines []*clusterv1.Machine // control-plane Machines of the cluster, sorted by name

	etcd      EtcdCluster
	etcdState *etcdutil.State
	etcdErr   error
}

// EtcdCluster is the seam between the steps and a workload cluster's etcd: the operations the steps
// use, implemented by *etcdutil.Cluster in production and by a fake in the unit tests.
type EtcdCluster interface {
	// Inspect reads the member list and every member's health, reaching etcd through the first of
	// nodes that answers.
	Inspect(ctx context.Context, nodes []string) (*etcdutil.State, error)
	// MoveLeader transfers leadership from the member on leaderNode to the member with ID to.
	MoveLeader(ctx context.Context, leaderNode string, to uint64) error
	// RemoveMember removes the member with ID id through the first of via that answers.
	RemoveMember(ctx context.Context, id uint64, via []string) error
}

var (
	_ EtcdCluster  = &etcdutil.Cluster{}
	_ EtcdProvider = WorkloadEtcd{}
)

// WorkloadEtcd is the production EtcdProvider: etcdutil.Workload, whose ForCluster returns the
// concrete *etcdutil.Cluster.
type WorkloadEtcd struct {
	Workload *etcdutil.Workload
}

// ForCluster implements EtcdProvider.
func (w WorkloadEtcd) ForCluster(ctx context.Context, cluster *clusterv1.Cluster) (EtcdCluster, error) {
	c, err := w.Workload.ForCluster(ctx, cluster)
	if err != nil {
		// Not c: a nil *etcdutil.Cluster in the interface would not compare equal to nil.
		return nil, err
	}
	return c, nil
}

// victimNode is the victim's Node name, which is also its etcd member's name.
func (s *scope) victimNode() string {
	if s.mr.Status.ControlPlane != nil && s.mr.Status.ControlPlane.MemberName != "" {
		return s.mr.Status.ControlPlane.MemberName
	}
	return s.machine.Status.NodeRef.Name
}

// etcdPlacement is where the cluster's etcd runs: as recorded when the remediation chose its order,
// otherwise as the control-plane object says now (remediation.EtcdPlacementOf).
func (s *scope) etcdPlacement() caprv1.EtcdPlacement {
	if cps := s.mr.Status.ControlPlane; cps != nil && cps.Etcd != "" {
		return cps.Etcd
	}
	return remediation.EtcdPlacementOf(s.cp)
}

// externalEtcd is true when etcd runs outside the control-plane Machines: nothing reads etcd then.
func (s *scope) externalEtcd() bool {
	return s.etcdPlacement() == caprv1.EtcdPlacementExternal
}

// servingOthers returns the control-plane Machines other than the victim that serve the API
// (Adapter.ServesAPI) and are not being deleted.
func (s *scope) servingOthers() []string {
	var out []string
	for _, m := range s.machines {
		if m.Name != s.mr.Name && m.DeletionTimestamp.IsZero() && s.adapter.ServesAPI(m) == "" {
			out = append(out, m.Name)
		}
	}
	return out
}

// nodes returns the Nodes to reach etcd through, the victim's last (it is the most likely to fail).
func (s *scope) nodes() []string {
	var out []string
	victim := s.victimNode()
	for _, m := range s.machines {
		if m.Status.NodeRef.IsDefined() && m.Status.NodeRef.Name != victim {
			out = append(out, m.Status.NodeRef.Name)
		}
	}
	if victim != "" {
		out = append(out, victim)
	}
	return out
}

// victimMember classifies the victim's etcd member in the current state.
func victimMember(state *etcdutil.State, node string) VictimMember {
	m := state.ByName(node)
	switch {
	case m == nil:
		return VictimMissing
	case m.IsLearner:
		return VictimLearner
	case m.Up():
		return VictimHealthy
	default:
		return VictimUnhealthy
	}
}

func (r *Reconciler) gather(ctx context.Context, s *scope) error {
	if !s.cluster.Spec.ControlPlaneRef.IsDefined() {
		return fmt.Errorf("cluster %s has no spec.controlPlaneRef", s.cluster.Name)
	}
	// Read live: the lock and the replicas CAPR set must be seen as written.
	cp, err := external.GetObjectFromContractVersionedRef(ctx, r.APIReader, s.cluster.Spec.ControlPlaneRef, s.cluster.Namespace)
	if err != nil {
		return fmt.Errorf("reading the control plane of cluster %s: %w", s.cluster.Name, err)
	}
	s.cp = cp
	s.adapter = AdapterFor(cp)
	if r.Adapter != nil {
		s.adapter = r.Adapter(cp)
	}
	s.adapter = topologyAdapter(s.adapter, s.cluster, cp, s.mr)
	list := &clusterv1.MachineList{}
	if err := r.Client.List(ctx, list, client.InNamespace(s.cluster.Namespace),
		client.MatchingLabels{clusterv1.ClusterNameLabel: s.cluster.Name}, client.HasLabels{clusterv1.MachineControlPlaneLabel}); err != nil {
		return fmt.Errorf("listing control-plane Machines: %w", err)
	}
	s.machines = nil
	for i := range list.Items {
		s.machines = append(s.machines, &list.Items[i])
	}
	sort.Slice(s.machines, func(i, j int) bool { return s.machines[i].Name < s.machines[j].Name })
	return nil
}

// inspectEtcd reads the etcd state once per reconcile; errors are kept, never guessed around.
func (r *Reconciler) inspectEtcd(ctx context.Context, s *scope) (*etcdutil.State, error) {
	if s.etcdState != nil || s.etcdErr != nil {
		return s.etcdState, s.etcdErr
	}
	if s.externalEtcd() {
		// Every step has an external-etcd path that reads nothing; reaching here is a bug, said
		// in the condition instead of dialling etcd pods that do not exist.
		s.etcdErr = errors.New("etcd is external: CAPR does not read it")
		return nil, s.etcdErr
	}
	if s.etcd == nil {
		s.etcd, s.etcdErr = r.Etcd.ForCluster(ctx, s.cluster)
		if s.etcdErr != nil {
			return nil, s.etcdErr
		}
	}
	s.etcdState, s.etcdErr = s.etcd.Inspect(ctx, s.nodes())
	return s.etcdState, s.etcdErr
}

// setReplicas patches the control plane's spec.replicas (idempotent), with what before changes in
// the object's annotations. The write is conditional on the replicas the decision was made on (a
// JSON patch whose first operation tests spec.replicas): a change of the replicas by anyone else
// meanwhile (a person, GitOps, an autoscaler on the scale subresource) makes it fail
// (errReplicasChanged) instead of being overwritten, while writes of other fields (the provider's
// status, a label) do not get in the way, as a resourceVersion precondition would: the replicas
// must go back right after the victim's delete, or the provider replaces the victim and stays above
// N (TestCrashSafety).
func (r *Reconciler) setReplicas(ctx context.Context, s *scope, n int32, before func(*unstructured.Unstructured) error) error {
	base := s.cp.DeepCopy()
	from, err := Replicas(base)
	if err != nil {
		return err
	}
	if before != nil {
		if err := before(s.cp); err != nil {
			return err
		}
	}
	if err := SetReplicas(s.cp, n); err != nil {
		return err
	}
	ops := append([]jsonPatchOp{{Op: "test", Path: "/spec/replicas", Value: from}, {Op: "replace", Path: "/spec/replicas", Value: n}},
		annotationPatch(base.GetAnnotations(), s.cp.GetAnnotations())...)
	patch, err := json.Marshal(ops)
	if err != nil {
		return err
	}
	if err := r.Client.Patch(ctx, s.cp, client.RawPatch(types.JSONPatchType, patch)); err != nil {
		if strings.Contains(err.Error(), "test failed") {
			// The test operation failed: the replicas are no longer those of the decision. The API
			// server answers 422 with the JSON patch library's words (apiserver handlers/patch.go
			// applyJSPatch), which other refusals (admission) share the code of, but not the words.
			return fmt.Errorf("setting %s %s replicas from %d to %d: %w (%w)", s.cp.GetKind(), s.cp.GetName(), from, n, errReplicasChanged, err)
		}
		return fmt.Errorf("setting %s %s replicas to %d: %w", s.cp.GetKind(), s.cp.GetName(), n, err)
	}
	return nil
}

// errReplicasChanged says a replicas write found them changed since they were read.
var errReplicasChanged = errors.New("the replicas changed since they were read")

// jsonPatchOp is one operation of a JSON patch (RFC 6902).
type jsonPatchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value,omitempty"`
}

// annotationPatch returns the JSON patch operations that turn the annotations from into to, key by
// key, so that annotations written by others meanwhile are kept.
func annotationPatch(from, to map[string]string) []jsonPatchOp {
	if len(from) == 0 && len(to) > 0 {
		return []jsonPatchOp{{Op: "add", Path: "/metadata/annotations", Value: to}}
	}
	escape := strings.NewReplacer("~", "~0", "/", "~1")
	keys := make([]string, 0, len(to))
	for k := range to {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var ops []jsonPatchOp
	for _, k := range keys {
		if v, ok := from[k]; !ok || v != to[k] {
			ops = append(ops, jsonPatchOp{Op: "add", Path: "/metadata/annotations/" + escape.Replace(k), Value: to[k]})
		}
	}
	removed := make([]string, 0)
	for k := range from {
		if _, ok := to[k]; !ok {
			removed = append(removed, k)
		}
	}
	sort.Strings(removed)
	for _, k := range removed {
		ops = append(ops, jsonPatchOp{Op: "remove", Path: "/metadata/annotations/" + escape.Replace(k)})
	}
	return ops
}

// setReplicasDecided sets the replicas (the control-plane object's spec.replicas, or Cluster
// spec.topology.controlPlane.replicas when the topology owns them: scope.replicasField) to what
// decide returns for the replicas there (write false: nothing is written), and decides again at once
// from a live read when the replicas changed since they were read: for the writes that must follow
// the decision without a pass in between (replicas back right after the victim's delete, the undo).
// It returns the replicas decided on and the target.
func (r *Reconciler) setReplicasDecided(ctx context.Context, s *scope, decide func(src replicasSource) (target int32, write bool),
	before func(*unstructured.Unstructured) error) (current, target int32, err error) {
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		src, err := r.readReplicas(ctx, s)
		if err != nil {
			return err
		}
		current = src.current
		var write bool
		if target, write = decide(src); !write {
			return nil
		}
		if s.replicasField() == caprv1.ReplicasFieldClusterTopology {
			err = r.setTopologyReplicas(ctx, s, current, target, before)
			if errors.Is(err, errReplicasChanged) {
				s.liveCluster = nil // read again by the next attempt
				return apierrors.NewConflict(schema.GroupResource{}, s.cluster.Name, err)
			}
			return err
		}
		err = r.setReplicas(ctx, s, target, before)
		if errors.Is(err, errReplicasChanged) {
			cp := s.cp.DeepCopy()
			if rerr := r.APIReader.Get(ctx, client.ObjectKeyFromObject(cp), cp); rerr != nil {
				return fmt.Errorf("reading %s %s again: %w", cp.GetKind(), cp.GetName(), rerr)
			}
			s.cp = cp
			return apierrors.NewConflict(schema.GroupResource{}, cp.GetName(), err) // retried
		}
		return err
	})
	return current, target, err
}

// remediationRecord reads the victim's remediation-for annotation.
func remediationRecord(m *clusterv1.Machine) *caprv1.RemediationRecord {
	v, ok := m.Annotations[caprv1.RemediationRecordAnnotation]
	if !ok {
		return nil
	}
	rec, err := caprv1.RemediationRecordFromAnnotation(v)
	if err != nil {
		// Unreadable: treated as a remediation long ago (a new sequence), as KCP does.
		return &caprv1.RemediationRecord{Machine: "(unreadable)"}
	}
	return rec
}

func now() time.Time { return time.Now() }
