package controlplane

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/annotations"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/etcdutil"
	"github.com/capr-io/capr/remediation"
)

// replacements returns the control-plane Machines created since the remediation started, oldest
// first (a surge of two creates two).
func replacements(s *scope) []*clusterv1.Machine {
	before := map[string]bool{}
	for _, n := range s.mr.Status.ControlPlane.MachinesBefore {
		before[n] = true
	}
	var out []*clusterv1.Machine
	for _, m := range s.machines {
		if !before[m.Name] && m.Name != s.mr.Name && m.DeletionTimestamp.IsZero() {
			out = append(out, m)
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if !out[i].CreationTimestamp.Equal(&out[j].CreationTimestamp) {
			return out[i].CreationTimestamp.Before(&out[j].CreationTimestamp)
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// machineNames returns the names of machines, in order.
func machineNames(machines []*clusterv1.Machine) []string {
	out := make([]string, 0, len(machines))
	for _, m := range machines {
		out = append(out, m.Name)
	}
	return out
}

// replacement returns the first replacement Machine, or nil.
func replacement(s *scope) *clusterv1.Machine {
	if reps := replacements(s); len(reps) > 0 {
		return reps[0]
	}
	return nil
}

// surplusReplacement is, after a surge of two, the replacement that is not the recorded one: the
// Machine that has to go again when the control plane returns to N (nil otherwise).
func surplusReplacement(s *scope) *clusterv1.Machine {
	reps := replacements(s)
	if surge(s) < 2 || len(reps) < 2 {
		return nil
	}
	surplus := reps[len(reps)-1]
	if surplus.Name == s.mr.Status.ControlPlane.Replacement {
		surplus = reps[len(reps)-2]
	}
	return surplus
}

// surge is the number of Machines the remediation adds (recorded at start; 1 for records without it).
func surge(s *scope) int32 {
	return max(s.mr.Status.ControlPlane.Surge, 1)
}

func (r *Reconciler) stepScaleUp(ctx context.Context, s *scope) (stepResult, error) {
	cps := s.mr.Status.ControlPlane
	desired := ptr.Deref(cps.DesiredReplicas, 0)
	src, err := r.readReplicas(ctx, s)
	if err != nil {
		return stepResult{}, err
	}
	current := src.current
	target := desired + surge(s)
	if rep := replacement(s); rep != nil || current >= target {
		msg := fmt.Sprintf("%s replicas %d → %d", replicasFieldName(s), desired, target)
		if rep != nil {
			msg += ", replacement Machine " + rep.Name
		}
		return stepResult{StepResult: remediation.StepResult{Done: true, Message: msg}}, nil
	}
	var state *etcdutil.State // stays nil with external etcd: no member is added
	afterRemoval := false
	if !s.externalEtcd() {
		var wait *stepResult
		if state, wait = r.etcdOrWait(ctx, s); wait != nil {
			return *wait, nil
		}
		// Quorum safety is re-checked against the state of now, not the state when the order was chosen.
		if !etcdutil.CanAddMember(state.Counts(), s.adapter.AddsLearners()) {
			c := state.Counts()
			return stepResult{StepResult: remediation.StepResult{WaitReason: caprv1.MachineRemediationNotQuorumSafeReason, Requeue: waitShort, Message: fmt.Sprintf("adding a member is not quorum-safe now (%d/%d healthy, %d learners)", c.Healthy, c.Voting, c.Learners)}, notQuorumSafe: true}, nil
		}
		afterRemoval = victimMemberOf(s, state) == nil
	}
	if refusal := s.adapter.ScaleUpRefusal(ProviderView{ControlPlane: s.cp, Machines: s.machines, Victim: s.machine, Etcd: state}, afterRemoval); refusal != "" {
		return stepResult{StepResult: remediation.StepResult{WaitReason: caprv1.MachineRemediationNotQuorumSafeReason, Message: refusal, Requeue: waitShort}}, nil
	}
	if returnsAtFirstReplacement(s) && current == desired {
		// Before the replicas are raised (firstreplacement.go): the provider's scale-down, once the
		// replicas are back at N, must find the victim marked.
		if err := r.markVictim(ctx, s); err != nil {
			return stepResult{}, err
		}
	}
	stamp := scaleUpStamp(s)
	// Raised only from the replicas the remediation started at; a conflicting write (the provider's
	// status, a hand edit) is decided again at once from a live read.
	current, _, err = r.setReplicasDecided(ctx, s, func(src replicasSource) (int32, bool) {
		return target, src.current == desired
	}, func(cp *unstructured.Unstructured) error {
		return s.adapter.BeforeScaleUp(cp, s.mr.Name, stamp, cps.RetryCount)
	})
	switch {
	case err != nil:
		return stepResult{}, err
	case current != desired && current < target:
		return stepResult{StepResult: remediation.StepResult{WaitReason: caprv1.MachineRemediationWaitingForPreconditionsReason, Requeue: waitShort, Message: fmt.Sprintf(
			"%s replicas are %d, %s before the surge (it was to raise them from %d to %d); waiting until they are %d again",
			replicasFieldName(s), current, replicasChangedElsewhere, desired, target, desired)}}, nil
	}
	if s.replicasField() == caprv1.ReplicasFieldClusterTopology {
		// Done at once, recorded with the write: a GitOps tool that puts the Cluster's replicas back
		// before the next pass must not see them raised again (no flapping); WaitForReplacement says
		// so if the replacement never comes.
		return stepResult{StepResult: remediation.StepResult{Done: true, Message: fmt.Sprintf("%s replicas %d → %d, applied by field manager %s",
			replicasFieldName(s), desired, target, TopologyFieldManager)}}, nil
	}
	return stepResult{StepResult: remediation.StepResult{Message: fmt.Sprintf("raised replicas to %d", target), Requeue: 200 * time.Millisecond}}, nil
}

// replicasFieldName names the replicas the remediation changes, for the messages.
func replicasFieldName(s *scope) string {
	if s.replicasField() == caprv1.ReplicasFieldClusterTopology {
		return fmt.Sprintf("Cluster %s spec.topology.controlPlane", s.cluster.Name)
	}
	return fmt.Sprintf("%s %s", s.cp.GetKind(), s.cp.GetName())
}

func (r *Reconciler) stepWaitForReplacement(ctx context.Context, s *scope) (stepResult, error) {
	reps := replacements(s)
	if len(reps) == 0 {
		if !Surges(s.mr.Status.ControlPlane.Order) || StepFinished(findStep(s.mr, caprv1.StepDelete)) {
			// The victim is gone and replicas at N: the provider replaces it on its own, with what
			// BeforeScaleUp sets (e.g. KCP's relaxed preflight while another Machine is unhealthy).
			var state *etcdutil.State
			if !s.externalEtcd() {
				var wait *stepResult
				if state, wait = r.etcdOrWait(ctx, s); wait != nil {
					return *wait, nil
				}
			}
			return r.armNextReplacement(ctx, s, state, nil)
		}
		if blocked := r.joinBlocked(ctx, s); blocked != nil {
			return *blocked, nil
		}
		return stepResult{StepResult: remediation.StepResult{Message: "waiting for the control-plane provider to create the replacement Machine" + s.adapter.Explain(s.cp), Requeue: waitShort}}, nil
	}
	s.mr.Status.ControlPlane.Replacement = reps[0].Name
	returned := ""
	if returnsAtFirstReplacement(s) {
		var err error
		if returned, err = r.returnReplicasAtFirstReplacement(ctx, s, reps); err != nil {
			return stepResult{}, err
		}
	}
	wanted := replacementsWanted(s)
	for _, rep := range reps {
		if err := r.annotateReplacement(ctx, s, rep); err != nil {
			return stepResult{}, err
		}
	}
	if blocked := r.joinBlocked(ctx, s); blocked != nil {
		return *blocked, nil
	}
	for i, rep := range reps {
		if !rep.Status.NodeRef.IsDefined() { // etcd is not read before there is a member to look for
			return stepResult{StepResult: remediation.StepResult{Message: fmt.Sprintf("replacement %d of %d: waiting for Machine %s to get a Node%s", i+1, wanted, rep.Name, returned), Requeue: waitShort}}, nil
		}
	}
	if s.externalEtcd() {
		return r.waitForServingReplacements(ctx, s, reps)
	}
	state, wait := r.etcdOrWait(ctx, s)
	if wait != nil {
		return *wait, nil
	}
	for i, rep := range reps {
		if res := replacementUp(state, rep); res != "" {
			return stepResult{StepResult: remediation.StepResult{Message: fmt.Sprintf("replacement %d of %d: %s%s", i+1, wanted, res, returned), Requeue: pollUnwatched}}, nil
		}
	}
	if n := int32(len(reps)); n < wanted {
		return r.armNextReplacement(ctx, s, state, reps)
	}
	names := make([]string, 0, len(reps))
	for _, rep := range reps {
		names = append(names, fmt.Sprintf("%s (Node %s)", rep.Name, rep.Status.NodeRef.Name))
	}
	return stepResult{StepResult: remediation.StepResult{Done: true, Message: fmt.Sprintf("replacement %s up with a healthy voting etcd member", strings.Join(names, " and "))}}, nil
}

// joinBlocked returns the wait of a scale-up-first remediation whose replacement cannot join: no
// member has joined since the start (membersJoined) and adding one is not quorum-safe now (etcd's own
// add rule, which the replacement's join would meet). Nil when the replacement may still join, when
// a member already joined (undoing would then remove a member: the step waits as before), when etcd
// cannot be read (the later checks of the step say so), or with external etcd.
func (r *Reconciler) joinBlocked(ctx context.Context, s *scope) *stepResult {
	if s.externalEtcd() || s.mr.Status.ControlPlane.Order != caprv1.ControlPlaneOrderScaleUpFirst {
		return nil
	}
	state, err := r.inspectEtcd(ctx, s)
	if err != nil || etcdutil.CanAddMember(state.Counts(), s.adapter.AddsLearners()) || membersJoined(s, state) {
		return nil
	}
	c := state.Counts()
	return &stepResult{StepResult: remediation.StepResult{WaitReason: caprv1.MachineRemediationNotQuorumSafeReason, Requeue: waitShort, Message: fmt.Sprintf(
		"the replacement cannot join: adding a member is not quorum-safe now (%d/%d healthy, %d learners)", c.Healthy, c.Voting, c.Learners)}, notQuorumSafe: true}
}

// membersJoined reports whether etcd lists a member that is not one of the control-plane Machines
// of the start (a replacement's, or one added and not started yet, which has no name).
func membersJoined(s *scope, state *etcdutil.State) bool {
	before := map[string]bool{s.victimNode(): true}
	for _, name := range s.mr.Status.ControlPlane.MachinesBefore {
		if node := machineNode(s.machines, name); node != "" {
			before[node] = true
		}
	}
	for _, m := range state.Members {
		if !before[m.Name] {
			return true
		}
	}
	return false
}

// waitForServingReplacements is WaitForReplacement with external etcd: a replacement is up when it
// serves the API (Adapter.ServesAPI); there is no member to wait for.
func (r *Reconciler) waitForServingReplacements(ctx context.Context, s *scope, reps []*clusterv1.Machine) (stepResult, error) {
	for i, rep := range reps {
		if missing := s.adapter.ServesAPI(rep); missing != "" {
			return stepResult{StepResult: remediation.StepResult{Message: fmt.Sprintf("replacement %d of %d: %s", i+1, replacementsWanted(s), missing), Requeue: waitShort}}, nil
		}
	}
	if n := int32(len(reps)); n < replacementsWanted(s) {
		return r.armNextReplacement(ctx, s, nil, reps)
	}
	return stepResult{StepResult: remediation.StepResult{Done: true, Message: fmt.Sprintf("replacement %s up and serving the API (etcd is external)", strings.Join(machineNames(reps), " and "))}}, nil
}

// replacementUp says what a replacement still lacks ("" when it has a Node and a healthy voting member).
func replacementUp(state *etcdutil.State, rep *clusterv1.Machine) string {
	if !rep.Status.NodeRef.IsDefined() {
		return fmt.Sprintf("waiting for Machine %s to get a Node", rep.Name)
	}
	member := state.ByName(rep.Status.NodeRef.Name)
	switch {
	case member == nil:
		return fmt.Sprintf("waiting for the etcd member of %s to join", rep.Name)
	case member.IsLearner:
		return fmt.Sprintf("the etcd member of %s is a learner, waiting for its promotion", rep.Name)
	case !member.Healthy:
		return fmt.Sprintf("the etcd member of %s is %s", rep.Name, member.Problem)
	}
	return ""
}

// armNextReplacement prepares the provider to create the next Machine of a surge once the previous
// ones vote: it re-checks that adding a member is quorum-safe now (state; nil with external etcd,
// where no member is added) and calls BeforeScaleUp again, stamped after the newest replacement (KCP
// removed its annotation when it created the previous one).
func (r *Reconciler) armNextReplacement(ctx context.Context, s *scope, state *etcdutil.State, reps []*clusterv1.Machine) (stepResult, error) {
	next := len(reps) + 1
	if !s.externalEtcd() && !etcdutil.CanAddMember(state.Counts(), s.adapter.AddsLearners()) {
		c := state.Counts()
		return stepResult{StepResult: remediation.StepResult{WaitReason: caprv1.MachineRemediationNotQuorumSafeReason, Requeue: waitShort, Message: fmt.Sprintf("replacement %d of %d: adding a member is not quorum-safe now (%d/%d healthy, %d learners)", next, replacementsWanted(s), c.Healthy, c.Voting, c.Learners)}}, nil
	}
	at := now()
	for _, rep := range reps {
		if rep.CreationTimestamp.After(at) {
			at = rep.CreationTimestamp.Time
		}
	}
	current, err := Replicas(s.cp)
	if err != nil {
		return stepResult{}, err
	}
	live := 0
	for _, m := range s.machines {
		if m.DeletionTimestamp.IsZero() {
			live++
		}
	}
	if live >= int(current) {
		// The provider has created every Machine its replicas ask for; the newest is not visible
		// to this reconcile yet. Arming again would leave an annotation nobody consumes.
		return stepResult{StepResult: remediation.StepResult{Message: fmt.Sprintf("waiting for replacement %d of %d to appear", next, replacementsWanted(s)), Requeue: waitShort}}, nil
	}
	probe := s.cp.DeepCopy()
	if err := s.adapter.BeforeScaleUp(probe, s.mr.Name, at, s.mr.Status.ControlPlane.RetryCount); err != nil {
		return stepResult{}, err
	}
	if !equality.Semantic.DeepEqual(probe.GetAnnotations(), s.cp.GetAnnotations()) {
		before := func(cp *unstructured.Unstructured) error {
			return s.adapter.BeforeScaleUp(cp, s.mr.Name, at, s.mr.Status.ControlPlane.RetryCount)
		}
		if s.replicasField() == caprv1.ReplicasFieldClusterTopology {
			// Only the annotations: applying the Cluster's replicas unchanged would still take the
			// field from whoever owns it.
			if err := r.annotateControlPlane(ctx, s, before); err != nil {
				return stepResult{}, err
			}
		} else if _, _, err := r.setReplicasDecided(ctx, s, func(src replicasSource) (int32, bool) { return src.current, true }, before); err != nil {
			return stepResult{}, err
		}
	}
	return stepResult{StepResult: remediation.StepResult{Message: fmt.Sprintf("waiting for the %s to create replacement %d of %d%s", s.adapter.Name(), next, replacementsWanted(s), s.adapter.Explain(s.cp)), Requeue: waitShort}}, nil
}

// annotateReplacement records on the replacement which Machine it replaced, for retry limits.
func (r *Reconciler) annotateReplacement(ctx context.Context, s *scope, rep *clusterv1.Machine) error {
	if _, ok := rep.Annotations[caprv1.RemediationRecordAnnotation]; ok {
		return nil
	}
	value, err := (&caprv1.RemediationRecord{
		Machine:    s.mr.Name,
		Timestamp:  metav1.NewTime(s.mr.Status.StartTime.UTC().Truncate(time.Second)),
		RetryCount: s.mr.Status.ControlPlane.RetryCount,
	}).Marshal()
	if err != nil {
		return err
	}
	base := rep.DeepCopy()
	annotations.AddAnnotations(rep, map[string]string{caprv1.RemediationRecordAnnotation: value})
	if err := r.Client.Patch(ctx, rep, client.MergeFrom(base)); err != nil {
		return fmt.Errorf("annotating replacement Machine %s: %w", rep.Name, err)
	}
	return nil
}
