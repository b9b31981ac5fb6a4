// Package fencing is the storage-fencing step of a remediation: before a Machine is
// deleted, its node must no longer be able to write to shared storage. This package holds the
// interface the remediators call, the policy logic, the record of a fence in the request's status
// (record.go), and the backends: NetworkFence (csi-addons, networkfence.go), External (external.go)
// and OutOfServiceTaint (outofservice.go). A backend that cannot run is reported as not available,
// never silently skipped.
package fencing

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// DefaultTimeout is spec.fencing.timeoutSeconds when unset.
const DefaultTimeout = 300 * time.Second

// Request is one fencing step.
type Request struct {
	Cluster *clusterv1.Cluster
	Machine *clusterv1.Machine
	// Node is the victim's Node name: the Machine's nodeRef, or the one the remediation recorded ("" when
	// neither names one; under Required, Fence then confirms that the Machine never had a Node).
	Node string
	// Remediation is the UID of the MachineRemediation this fence is for (FenceRecorded and
	// UnfenceRecorded set it). Backends mark what they create with it and confirm only their own
	// objects: an object of the same name left by another remediation, or made by someone else, is
	// no proof of this fence.
	Remediation types.UID
	Spec        *caprv1.FencingSpec
	// Started is when the fencing step started (for the timeout).
	Started time.Time
	// AfterDelete asks Unfence for the unfencing owed once the Machine is gone: it waits for the Node
	// to be gone too (a fenced address must not be released while the old node may still use it).
	// Unset, Unfence undoes the fence of a Machine that is kept (an aborted remediation).
	AfterDelete bool
	// Objects are the fence objects CAPR created for this fence, as recorded in the request's status
	// (status.fencing.backends[].objects; FenceRecorded sets them). A backend believes a fence object
	// only when its UID is among them (owned.go).
	Objects []caprv1.FencingObject
	// Created, when set, is told of each fence object a backend created. PolicyFencer sets it and
	// returns the objects in BackendResult.Objects, which Observe records.
	Created func(caprv1.FencingObject)
	// PodsDeletedAt is when CAPR force-deleted the Node's pods (status.fencing.pods.deletedTime, set
	// by FenceRecorded); zero until then. The out-of-service taint waits taintAfterPods after it
	// (pods.go).
	PodsDeletedAt time.Time
}

// Outcome of a fencing attempt.
type Outcome int

const (
	// Fenced means every configured backend confirmed.
	Fenced Outcome = iota
	// Skipped means the policy is Disabled, or there is no Node to fence (under Required: the Machine
	// provably never had one).
	Skipped
	// Waiting means some backend has not confirmed yet; ask again later.
	Waiting
	// GaveUp means BestEffort timed out: delete anyway, with a Warning event.
	GaveUp
)

// Result is what the remediator records.
type Result struct {
	Outcome Outcome
	Message string
	// Backends are the configured backends' answers, in spec order (empty when fencing is skipped).
	Backends []BackendResult
	// AskAgainAt, when set, is when a waiting fence will have something new to do (the out-of-service
	// taint after the pods' deletion, FenceRecorded): Judge asks again then at the latest.
	AskAgainAt time.Time
}

// BackendResult is one backend's answer.
type BackendResult struct {
	Type    caprv1.FencingBackendType
	State   caprv1.FencingBackendState
	Message string
	// Objects are the fence objects the backend created in this call (Request.Created).
	Objects []caprv1.FencingObject
}

// Fencer fences a Machine's node. Implementations must be idempotent: they are called again on every
// reconcile until the outcome is final.
type Fencer interface {
	Fence(ctx context.Context, req Request) (Result, error)
}

// Backend is one fencing backend.
type Backend interface {
	// Fence returns done=true once the backend confirmed the node cannot write.
	Fence(ctx context.Context, req Request, spec caprv1.FencingBackend) (done bool, message string, err error)
}

// BackendUnfencer is a Backend that can undo its fence. Unfence is idempotent and done once nothing of
// the fence is left (a node never fenced is done at once).
type BackendUnfencer interface {
	Unfence(ctx context.Context, req Request, spec caprv1.FencingBackend) (done bool, message string, err error)
}

// ErrUnfencePending is wrapped by PolicyFencer.Unfence's error while a backend has not finished
// unfencing: call again later.
var ErrUnfencePending = errors.New("unfencing not finished")

// Unfencer is a Fencer that can undo its fences (PolicyFencer, through its backends that can).
// Unfence returns nil once nothing is left and an error wrapping ErrUnfencePending until then.
type Unfencer interface {
	Unfence(ctx context.Context, req Request) error
}

// PolicyFencer applies the policy (Disabled, BestEffort, Required) over the configured backends.
type PolicyFencer struct {
	// Backends by type; a configured type that is missing here is reported as not available.
	Backends map[caprv1.FencingBackendType]Backend
	// Workload reads the workload cluster (whether the Node is gone before an unfence after the
	// delete).
	Workload WorkloadClientFunc
	// Now is the clock (tests); nil means time.Now.
	Now func() time.Time
	// Pods, when set, force-deletes the fenced Node's pods once every backend confirmed (pods.go);
	// nil leaves them to Kubernetes' pod GC.
	Pods *PodDeleter
}

// Fence implements Fencer.
func (p *PolicyFencer) Fence(ctx context.Context, req Request) (Result, error) {
	spec := req.Spec
	if spec == nil || spec.Policy == "" || spec.Policy == caprv1.FencingDisabled {
		return Result{Outcome: Skipped, Message: "fencing policy is Disabled"}, nil
	}
	if req.Node == "" {
		return p.fenceWithoutNode(ctx, req)
	}
	var waiting []string
	results := make([]BackendResult, 0, len(spec.Backends))
	for i, b := range spec.Backends {
		r := p.fenceOne(ctx, req, b, len(waiting) > 0)
		results = append(results, r)
		if r.State != caprv1.FencingBackendFenced {
			waiting = append(waiting, fmt.Sprintf("backend %d (%s): %s", i, b.Type, r.Message))
		}
	}
	if len(waiting) == 0 {
		return Result{Outcome: Fenced, Message: fmt.Sprintf("node %s fenced by every configured backend", req.Node), Backends: results}, nil
	}
	timeout := Timeout(spec)
	msg := strings.Join(waiting, "; ")
	if spec.Policy == caprv1.FencingBestEffort && p.now().After(req.Started.Add(timeout)) {
		return Result{Outcome: GaveUp, Message: fmt.Sprintf("fencing not confirmed within %s, deleting anyway (BestEffort): %s", timeout, msg), Backends: results}, nil
	}
	if spec.Policy == caprv1.FencingRequired {
		msg = "fencing is Required and not confirmed, the Machine is not deleted: " + msg
	}
	return Result{Outcome: Waiting, Message: msg, Backends: results}, nil
}

// now is the clock of the timeouts (PolicyFencer.Now, tests set it).
func (p *PolicyFencer) now() time.Time {
	if p.Now != nil {
		return p.Now()
	}
	return time.Now()
}

// fenceWithoutNode answers for a Machine that names no Node. BestEffort skips: nothing is known to
// write through it. Required skips only when the Machine provably never had a Node; a Node may have
// registered without the Machine saying so yet (CAPI sets status.nodeRef once it finds the Node whose
// spec.providerID is the Machine's: sigs.k8s.io/cluster-api core/reconcilers/machine,
// machine_controller_noderef.go reconcileNode), so until then the fence cannot be confirmed.
func (p *PolicyFencer) fenceWithoutNode(ctx context.Context, req Request) (Result, error) {
	if req.Spec.Policy != caprv1.FencingRequired {
		return Result{Outcome: Skipped, Message: "the Machine has no Node: nothing can write through it"}, nil
	}
	why := p.nodeOfMachine(ctx, req)
	if why == "" {
		return Result{Outcome: Skipped, Message: fmt.Sprintf(
			"the Machine never had a Node (no nodeRef, and no Node has its providerID %q): nothing can write through it", req.Machine.Spec.ProviderID)}, nil
	}
	return Result{Outcome: Waiting, Message: "fencing is Required and cannot be confirmed, the Machine is not deleted: " + why}, nil
}

// nodeOfMachine says why the Machine of a request without a Node may still have one ("" when it
// provably has none): a nodeRef, or a Node in the workload cluster with its providerID, read live.
func (p *PolicyFencer) nodeOfMachine(ctx context.Context, req Request) string {
	m := req.Machine
	switch {
	case m == nil:
		return "no Machine was given to look for its Node"
	case m.Status.NodeRef.IsDefined():
		return fmt.Sprintf("Machine %s has Node %s, but no Node was given to fence", m.Name, m.Status.NodeRef.Name)
	case m.Spec.ProviderID == "":
		// CAPI links a Node to a Machine by providerID only: without one, no Node is the Machine's.
		return ""
	}
	c, err := workloadClient(ctx, p.Workload, req)
	if err != nil {
		return fmt.Sprintf("cannot tell whether a Node has the Machine's providerID %q: %v", m.Spec.ProviderID, err)
	}
	nodes := &corev1.NodeList{}
	opts := &client.ListOptions{Limit: 500}
	for {
		if err := c.List(ctx, nodes, opts); err != nil {
			return fmt.Sprintf("cannot tell whether a Node has the Machine's providerID %q: listing Nodes: %v", m.Spec.ProviderID, err)
		}
		for i := range nodes.Items {
			if nodes.Items[i].Spec.ProviderID == m.Spec.ProviderID {
				return fmt.Sprintf("Node %s has the Machine's providerID %q but the Machine has no nodeRef yet; fencing waits until CAPI sets it",
					nodes.Items[i].Name, m.Spec.ProviderID)
			}
		}
		if nodes.Continue == "" {
			return ""
		}
		opts.Continue = nodes.Continue
	}
}

// fenceOne asks one backend. earlierWaiting is true while a backend before it has not confirmed.
func (p *PolicyFencer) fenceOne(ctx context.Context, req Request, b caprv1.FencingBackend, earlierWaiting bool) BackendResult {
	r := BackendResult{Type: b.Type, State: caprv1.FencingBackendFencing}
	if b.Type == caprv1.FencingBackendOutOfServiceTaint && earlierWaiting {
		// Fence before taint: the taint lets Kubernetes detach the node's volumes and start its
		// pods elsewhere, which is only safe once the node provably cannot write.
		r.Message = "waits until the backends before it confirm the fence"
		return r
	}
	if b.Type == caprv1.FencingBackendOutOfServiceTaint && p.Pods != nil {
		if wait := taintWaitsForPods(req.PodsDeletedAt, p.now()); wait != "" {
			r.Message = wait
			return r
		}
	}
	impl, ok := p.Backends[b.Type]
	if !ok {
		r.State, r.Message = caprv1.FencingBackendNotAvailable, "is not available in this CAPR version"
		return r
	}
	req.Created = func(o caprv1.FencingObject) { r.Objects = append(r.Objects, o) }
	done, msg, err := impl.Fence(ctx, req, b)
	switch {
	case errors.Is(err, ErrNotAvailable):
		r.State, r.Message = caprv1.FencingBackendNotAvailable, err.Error()
	case err != nil:
		r.Message = err.Error()
	case done:
		r.State, r.Message = caprv1.FencingBackendFenced, msg
	default:
		r.Message = msg
	}
	return r
}

// Unfence undoes the fences of the configured backends that can (BackendUnfencer), last backend first
// (an out-of-service taint, which follows a fence, goes before the fence it relied on). It returns
// nil once every one is undone and an error wrapping ErrUnfencePending, saying what is left, until
// then. With the policy Disabled or without a Node nothing was fenced.
func (p *PolicyFencer) Unfence(ctx context.Context, req Request) error {
	spec := req.Spec
	if spec == nil || spec.Policy == "" || spec.Policy == caprv1.FencingDisabled || req.Node == "" {
		return nil
	}
	if p.unfences(spec) {
		if wait, err := p.unfenceWait(ctx, req); err != nil || wait != "" {
			if err != nil {
				return err
			}
			return fmt.Errorf("%w: %s", ErrUnfencePending, wait)
		}
	}
	var pending []string
	for i := len(spec.Backends) - 1; i >= 0; i-- {
		b := spec.Backends[i]
		impl, ok := p.Backends[b.Type].(BackendUnfencer)
		if !ok {
			continue
		}
		done, msg, err := impl.Unfence(ctx, req, b)
		if err != nil {
			return fmt.Errorf("backend %d (%s): unfencing node %s: %w", i, b.Type, req.Node, err)
		}
		if !done {
			pending = append(pending, fmt.Sprintf("backend %d (%s): %s", i, b.Type, msg))
		}
	}
	if len(pending) > 0 {
		return fmt.Errorf("%w: %s", ErrUnfencePending, strings.Join(pending, "; "))
	}
	return nil
}

// unfences reports whether any configured backend has something to undo.
func (p *PolicyFencer) unfences(spec *caprv1.FencingSpec) bool {
	for _, b := range spec.Backends {
		if _, ok := p.Backends[b.Type].(BackendUnfencer); ok {
			return true
		}
	}
	return false
}

// unfenceWait says why a fence may not be released yet ("" when it may). After the delete the Node
// must be gone: while it exists the old machine may still use the fenced address. A Machine that is
// kept (an abort, a failure, a recovery) must have its Node back and Ready: once its fence let
// Kubernetes move its volumes and pods (the out-of-service taint), a node that is only unreachable may
// still run the old containers, and unfencing it would let them write next to their replacements.
func (p *PolicyFencer) unfenceWait(ctx context.Context, req Request) (string, error) {
	c, err := workloadClient(ctx, p.Workload, req)
	if err != nil {
		return "", err
	}
	node := &corev1.Node{}
	err = c.Get(ctx, client.ObjectKey{Name: req.Node}, node)
	gone := apierrors.IsNotFound(err)
	if err != nil && !gone {
		return "", fmt.Errorf("reading Node %s: %w", req.Node, err)
	}
	switch {
	case req.AfterDelete && !gone:
		return fmt.Sprintf("Node %s still exists; its fence is undone once it is gone (its address may still be in use by the old machine)", req.Node), nil
	case req.AfterDelete:
		return "", nil
	case gone:
		return fmt.Sprintf("Node %s is gone but its Machine is kept: the fence stays until the Machine is deleted or its Node is back and Ready", req.Node), nil
	case !nodeReady(node):
		return fmt.Sprintf("Node %s is not Ready: the fence stays until it is (an unreachable node may still run the workloads started elsewhere since)", req.Node), nil
	}
	return "", nil
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Timeout is how long fencing may take before the policy decides (spec.fencing.timeoutSeconds).
func Timeout(spec *caprv1.FencingSpec) time.Duration {
	if spec != nil && spec.TimeoutSeconds != nil {
		return time.Duration(*spec.TimeoutSeconds) * time.Second
	}
	return DefaultTimeout
}

// Verdict is what a remediator's Fence step makes of one Fencer answer. Both remediators take it
// from Judge, so "fence before delete" is decided in one place.
type Verdict struct {
	// Done: the Machine may now be deleted (fenced, skipped, or BestEffort gave up).
	Done bool
	// Skipped: done without fencing (the policy is Disabled, or there is no Node: PolicyFencer.Fence).
	Skipped bool
	// GaveUp: done unconfirmed (BestEffort past its timeout); the remediator warns in an event.
	GaveUp bool
	// TimedOut: not done and past the timeout (Required never deletes unconfirmed: it keeps waiting,
	// visibly).
	TimedOut bool
	Message  string
	// Requeue is when to ask again while not done (askAgain): at the latest when the timeout
	// expires, so BestEffort gives up on time.
	Requeue time.Duration
}

// Outcome names a final verdict for metrics: Fenced, Skipped or GaveUp ("" while not done).
func (v Verdict) Outcome() string {
	switch {
	case !v.Done:
		return ""
	case v.GaveUp:
		return "GaveUp"
	case v.Skipped:
		return "Skipped"
	}
	return "Fenced"
}

// Judge turns a Fencer's answer for a Fence step that started at started into a Verdict.
func Judge(res Result, spec *caprv1.FencingSpec, started, now time.Time) Verdict {
	switch res.Outcome {
	case Fenced:
		return Verdict{Done: true, Message: res.Message}
	case Skipped:
		return Verdict{Done: true, Skipped: true, Message: res.Message}
	case GaveUp:
		return Verdict{Done: true, GaveUp: true, Message: res.Message}
	}
	timeout := Timeout(spec)
	elapsed := now.Sub(started)
	v := Verdict{Message: res.Message, Requeue: min(askAgain(elapsed), timeout-elapsed+100*time.Millisecond)}
	if elapsed > timeout {
		v = Verdict{TimedOut: true, Requeue: 15 * time.Second,
			Message: fmt.Sprintf("not confirmed within %s, still waiting: %s", timeout, res.Message)}
	}
	if at := res.AskAgainAt.Sub(now); !res.AskAgainAt.IsZero() && at < v.Requeue {
		v.Requeue = max(at, 10*time.Millisecond)
	}
	return v
}
