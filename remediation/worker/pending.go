package worker

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util"
	"sigs.k8s.io/cluster-api/util/annotations"
	"sigs.k8s.io/cluster-api/util/conditions"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/metrics"
	"github.com/capr-io/capr/remediation"
)

// reconcilePending records the role, checks that something replaces the Machine, then starts the
// remediation when its MachineDeployment has a free slot and no other request goes first.
func (r *Reconciler) reconcilePending(ctx context.Context, s *scope) (ctrl.Result, error) {
	mr, m := s.mr, s.machine
	mr.Status.Phase = caprv1.MachineRemediationPhasePending
	msName, refusal := replacingOwner(m)
	mr.Status.Worker = &caprv1.WorkerRemediationStatus{ClusterName: s.cluster.Name, MachineSet: msName, NodeName: m.Status.NodeRef.Name}
	if refusal != "" {
		// Looked at again later: a MachineSet may still adopt the Machine.
		r.setWaitingWithEvent(mr, EventNoRemediator, caprv1.MachineRemediationNoRemediatorReason, refusal)
		return ctrl.Result{RequeueAfter: waitLong}, nil
	}
	if !m.DeletionTimestamp.IsZero() {
		remediation.SetWaiting(mr, caprv1.MachineRemediationWaitingForPreconditionsReason, fmt.Sprintf("Machine %s is already being deleted", m.Name))
		return ctrl.Result{RequeueAfter: waitShort}, nil
	}
	g, err := resolveGroup(ctx, r.Client, mr.Namespace, msName)
	if err != nil {
		return ctrl.Result{}, err
	}
	mr.Status.Worker.MachineDeployment = g.machineDeployment
	if g.wait != "" {
		r.setWaitingWithEvent(mr, remediation.EventRemediationWaiting, caprv1.MachineRemediationWaitingForPreconditionsReason, g.wait)
		return ctrl.Result{RequeueAfter: waitLong}, nil
	}

	// Decide and record Running under one lock, from a live list: the next decision sees this one.
	r.admitMu.Lock()
	defer r.admitMu.Unlock()
	adm, err := r.admit(ctx, s, g)
	if err != nil {
		return ctrl.Result{}, err
	}
	if !adm.Start {
		kind, name := g.key()
		remediation.SetWaiting(mr, caprv1.MachineRemediationDeferredReason, fmt.Sprintf("%s %s: %s", kind, name, adm.Message))
		return ctrl.Result{RequeueAfter: waitLong}, nil
	}
	return r.start(ctx, s, adm.Message)
}

// admit counts the group's remediations in flight and its waiting candidates, read live.
func (r *Reconciler) admit(ctx context.Context, s *scope, g group) (Admission, error) {
	list := &caprv1.MachineRemediationList{}
	if err := r.APIReader.List(ctx, list, client.InNamespace(s.mr.Namespace)); err != nil {
		return Admission{}, fmt.Errorf("listing MachineRemediations: %w", err)
	}
	inFlight := 0
	var cands []Candidate
	for i := range list.Items {
		other := &list.Items[i]
		if other.Name == s.mr.Name {
			other = s.mr // this reconcile's copy, with the group just resolved
		}
		if !sameGroup(r.workerStatusOf(ctx, other), s.mr.Status.Worker) {
			continue
		}
		switch other.Status.Phase {
		case caprv1.MachineRemediationPhaseRunning:
			inFlight++ // until its Machine is gone, also while aborting
		case caprv1.MachineRemediationPhasePending, "":
			m := &clusterv1.Machine{}
			if err := r.Client.Get(ctx, client.ObjectKeyFromObject(other), m); err != nil {
				m = nil // gone, or not in the cache yet: it is not explicit, and not paused by its Machine
			}
			if other.Name != s.mr.Name && !waitsForTurn(s.cluster, other, m) {
				continue
			}
			cands = append(cands, candidate(other, m))
		}
	}
	return Admit(g.maxInFlight, inFlight, cands, s.mr.Name), nil
}

// workerStatusOf returns a request's worker state: recorded, or, for a request this remediator has
// not reconciled yet (e.g. all created together, or while the Cluster was paused), resolved from its
// Machine, so that it takes its turn in order and is not overtaken by whichever is reconciled first.
func (r *Reconciler) workerStatusOf(ctx context.Context, mr *caprv1.MachineRemediation) *caprv1.WorkerRemediationStatus {
	if mr.Status.Worker != nil || mr.Status.ControlPlane != nil {
		return mr.Status.Worker
	}
	m := &clusterv1.Machine{}
	if err := r.Client.Get(ctx, client.ObjectKeyFromObject(mr), m); err != nil || util.IsControlPlaneMachine(m) {
		return nil
	}
	ms, refusal := replacingOwner(m)
	if refusal != "" {
		return nil
	}
	g, err := resolveGroup(ctx, r.Client, mr.Namespace, ms)
	if err != nil || g.wait != "" {
		return nil
	}
	return &caprv1.WorkerRemediationStatus{MachineSet: ms, MachineDeployment: g.machineDeployment}
}

// waitsForTurn is true for a Pending request that would start if it had a slot: not being deleted,
// not paused, not refused. Pause is read from the Cluster, the request and its Machine as they are
// now, not from the request's Paused condition or Paused reason: those say what its last reconcile
// saw, and when a Cluster is unpaused the requests are reconciled one by one, so a request not yet
// reconciled would still say Paused and be overtaken by a later one.
func waitsForTurn(cluster *clusterv1.Cluster, mr *caprv1.MachineRemediation, m *clusterv1.Machine) bool {
	if !mr.DeletionTimestamp.IsZero() || annotations.IsPaused(cluster, mr) || (m != nil && annotations.HasPaused(m)) {
		return false
	}
	return conditions.GetReason(mr, caprv1.MachineRemediationProgressingCondition) != caprv1.MachineRemediationNoRemediatorReason
}

// candidate describes a waiting request for Admit: explicit when its Machine (nil if not found)
// carries CAPI's remediate-machine annotation. Not spec.source: anyone who may create a request can
// write Manual there, while the annotation takes write access to the Machine.
func candidate(mr *caprv1.MachineRemediation, m *clusterv1.Machine) Candidate {
	return Candidate{Name: mr.Name, Requested: m != nil && annotations.HasRemediateMachine(m), Created: mr.CreationTimestamp.Time}
}

// start records Running with the finalizer and re-owns the request by the Cluster (its record must
// outlive the Machine it deletes), before anything is done to the Machine.
func (r *Reconciler) start(ctx context.Context, s *scope, why string) (ctrl.Result, error) {
	mr := s.mr
	raised, ok := r.decideFencing(ctx, s)
	if !ok {
		return ctrl.Result{RequeueAfter: waitLong}, nil
	}
	controllerutil.AddFinalizer(mr, caprv1.MachineRemediationFinalizer)
	if mr.Labels == nil {
		mr.Labels = map[string]string{}
	}
	mr.Labels[clusterv1.ClusterNameLabel] = s.cluster.Name
	mr.OwnerReferences = []metav1.OwnerReference{{
		APIVersion: clusterv1.GroupVersion.String(), Kind: "Cluster", Name: s.cluster.Name, UID: s.cluster.UID,
	}}
	mr.Status.Phase = caprv1.MachineRemediationPhaseRunning
	mr.Status.StartTime = ptr.To(metav1.Now())
	mr.Status.LastError = ""
	plan := "fence, then delete; the MachineSet replaces it"
	if n := len(mr.Spec.Escalation); n > 0 {
		plan = fmt.Sprintf("%d escalation step(s), then %s", n, plan)
	}
	msg := fmt.Sprintf("Remediating worker Machine %s of MachineSet %s (%s): %s", mr.Name, mr.Status.Worker.MachineSet, why, plan)
	if raised != "" {
		msg += "; " + raised
	}
	conditions.Set(mr, metav1.Condition{Type: caprv1.MachineRemediationProgressingCondition, Status: metav1.ConditionTrue,
		Reason: caprv1.MachineRemediationStepInProgressReason, Message: msg})
	if err := r.persist(ctx, s); err != nil {
		return ctrl.Result{}, err
	}
	metrics.RemediationStarted(metrics.KindWorker, "")
	r.event(mr, corev1.EventTypeNormal, remediation.EventRemediationStarted, msg)
	r.fencingRaisedEvent(s, raised)
	ctrl.LoggerFrom(ctx).Info("Worker remediation started", "MachineSet", mr.Status.Worker.MachineSet,
		"MachineDeployment", mr.Status.Worker.MachineDeployment)
	return ctrl.Result{RequeueAfter: time.Millisecond}, nil
}
