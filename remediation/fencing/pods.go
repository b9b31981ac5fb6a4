package fencing

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// Once the fence is confirmed the old node provably cannot write, so its pods may go at once.
// Kubernetes gets there too, but late: after the out-of-service taint the taint-eviction controller
// only marks the pods terminating, and the pod GC controller force-deletes them on its next pass,
// every 20 s (k8s.io/kubernetes pkg/controller/podgc, gc_controller.go: gcCheckPeriod, gcTerminating).
// The attach/detach controller detaches a volume only once no pod uses it, so that pass was almost
// all of a failover's time. PodDeleter does what the pod GC would, right after the fence is
// confirmed: it force-deletes (grace period 0) the pods bound to the Node, as medik8s
// self-node-remediation's ResourceDeletion strategy does (controllers/selfnoderemediation_controller.go,
// deleteResourcesWrapper). It never touches a VolumeAttachment: detaching stays
// kube-controller-manager's.
//
// With an out-of-service taint to come, the pods go before it, and the taint follows
// taintAfterPods later (taintAllowedAt). The taint starts the taint-eviction controller on the Node's pods, and its
// worker reads and deletes a pod by name, with no UID precondition, retrying for a while a read that
// finds nothing (k8s.io/kubernetes pkg/controller/tainteviction, taint_eviction.go: deletePodHandler,
// addConditionAndDeletePod; kubernetes/kubernetes#141568 proposes the precondition). Deleted right
// after the taint, as CAPR first did, a pod's StatefulSet replacement, created at once under the same
// name on a healthy node, was deleted in its place (make demo
// SCENARIO=worker-stateful; test/storage TestTheReplacementOfAFencedNodesPodIsNeverEvicted). Gone
// before the taint, and long enough for kube-controller-manager to have seen them go, they are not
// the controller's to evict. Deleting them before the taint changes nothing for safety: they go
// once every backend that fences (all but the taint, which only tells Kubernetes) confirmed, and the
// attach/detach controller still moves a volume only once the taint is on. With the taint already on
// the Node (someone else's), only terminating pods go, as the pod GC's gcTerminating deletes them,
// each once unchanged for evictionSettle.

// Events on a MachineRemediation about the fenced Node's pods.
const (
	// EventPodsDeleted: every backend confirmed the fence and CAPR force-deleted the Node's pods.
	EventPodsDeleted = "FencedNodePodsDeleted"
	// EventPodDeletionFailed: some pod of the fenced Node could not be deleted; tried again while the
	// Fence step runs (Kubernetes' pod GC deletes them too once the Node is tainted out-of-service).
	EventPodDeletionFailed = "FencedNodePodDeletionFailed"
)

// DefaultPodDeletionTimeout bounds one pass over a fenced Node's pods.
const DefaultPodDeletionTimeout = 30 * time.Second

// taintAfterPods is how long after the Node's pods were deleted the out-of-service taint is added:
// kube-controller-manager's informers see a deletion within milliseconds; half a second is a wide
// margin that the failover hardly notices (the attach/detach controller moves the volume on the
// taint).
const taintAfterPods = 500 * time.Millisecond

// taintAllowedAt is when the out-of-service taint may follow pods deleted at deletedAt. The record
// of the deletion (status.fencing.pods.deletedTime) keeps whole seconds, so deletedAt read back may be
// up to a second early: the wait counts from the end of that second.
func taintAllowedAt(deletedAt time.Time) time.Time {
	return deletedAt.Truncate(time.Second).Add(time.Second + taintAfterPods)
}

// taintWaitsForPods says why the out-of-service taint is not added yet ("" when it may be), for a
// fencer that deletes the Node's pods (deletedAt: when it did, zero until then).
func taintWaitsForPods(deletedAt, now time.Time) string {
	switch {
	case deletedAt.IsZero():
		return "waits until the Node's pods are force-deleted"
	case now.Before(taintAllowedAt(deletedAt)):
		return fmt.Sprintf("waits at least %s after the Node's pods were force-deleted, for kube-controller-manager to see them gone", taintAfterPods)
	}
	return ""
}

// evictionPoll is how long one pass over a Node that already has the out-of-service taint waits for
// the taint-eviction controller to be done with its pods, looking every evictionPollInterval; pods it
// is not done with by then are looked at again on the next call. It is done with a pod once the pod is
// terminating and has not changed for evictionSettle (the update that marked it terminating may start
// one more read-and-delete by name, which must be over before the pod goes and a replacement may take
// its name). evictionWait is how long after the taint was added CAPR stops waiting for the controller
// to mark a pod: one that has not by then is not running.
const (
	evictionPoll         = 2 * time.Second
	evictionPollInterval = 100 * time.Millisecond
	evictionSettle       = 500 * time.Millisecond
	evictionWait         = 10 * time.Second
)

// nodeNameField is the pod field selector the API server supports for a Node's pods.
const nodeNameField = "spec.nodeName"

// PodDeleter force-deletes the pods of a fenced Node in the workload cluster (through the Cluster's
// kubeconfig, as every workload-cluster backend).
type PodDeleter struct {
	Workload WorkloadClientFunc
	// Recorder, when set, gets an event on the MachineRemediation for each deletion pass.
	Recorder events.EventRecorder
	// Timeout bounds one pass; zero means DefaultPodDeletionTimeout.
	Timeout time.Duration
}

// NodePodDeleter is a Fencer that force-deletes a fenced Node's pods: PolicyFencer, and any Fencer
// that hands a request on to one (tests route requests between fencers).
type NodePodDeleter interface {
	// NodePods returns the PodDeleter for req (nil: the pods are left to Kubernetes).
	NodePods(req Request) *PodDeleter
}

// NodePods implements NodePodDeleter.
func (p *PolicyFencer) NodePods(Request) *PodDeleter { return p.Pods }

// deleteFencedPods is FenceRecorded's last part: once every configured backend confirmed the fence of
// mr's Node, the Node's pods are force-deleted and that is recorded in status.fencing.pods, so that it
// is done once: a pass that failed, or a crash before the record was written, is tried again on the
// next call. Nothing is done without a PodDeleter, under Disabled, or when the fence is not confirmed
// (a BestEffort that gave up included). A failure does not hold the fence: it is reported (record,
// event) and Kubernetes' pod GC remains.
func deleteFencedPods(ctx context.Context, f Fencer, mr *caprv1.MachineRemediation, req Request, res Result, now time.Time) {
	pd, ok := f.(NodePodDeleter)
	if !ok {
		return
	}
	d := pd.NodePods(req)
	rec := mr.Status.Fencing
	if d == nil || rec == nil || rec.UnfencedTime != nil || rec.NodeName != req.Node ||
		(rec.Pods != nil && rec.Pods.DeletedTime != nil) {
		return
	}
	log := ctrl.LoggerFrom(ctx).WithValues("Node", klog.KRef("", req.Node))
	c, err := workloadClient(ctx, d.Workload, req)
	if err != nil {
		d.report(ctx, mr, rec, podPass{}, fmt.Errorf("the fenced Node's pods are not deleted yet: %w", err), now)
		return
	}
	confirmed, taint, err := fenceConfirmed(ctx, c, req, res)
	if err != nil {
		d.report(ctx, mr, rec, podPass{}, fmt.Errorf("the fenced Node's pods are not deleted yet: %w", err), now)
		return
	}
	if !confirmed {
		return
	}
	pass, err := d.deleteNodePods(ctx, c, req.Node, taint, now)
	if err == nil {
		log.Info("Fence confirmed: force-deleted the Node's pods", "pods", pass.deleted, "waitingForEviction", pass.waiting)
	}
	d.report(ctx, mr, rec, pass, err, now)
}

// podPass is what one pass over a fenced Node's pods did: the pods it deleted, and those it waits
// for the taint-eviction controller to mark terminating first.
type podPass struct {
	deleted, waiting []string
}

// fenceConfirmed reports whether every configured backend that fences confirmed the fence of
// req.Node: all but an OutOfServiceTaint, which only tells Kubernetes the node is down and follows
// the pods' deletion (taintWaitsForPods). A Skipped, GaveUp or not-available answer is never a
// confirmation. With an OutOfServiceTaint backend it also returns the taint when it is on the Node
// already, which decides which pods may go now (evictable).
func fenceConfirmed(ctx context.Context, c client.Client, req Request, res Result) (bool, *corev1.Taint, error) {
	spec := req.Spec
	if spec == nil || spec.Policy == "" || spec.Policy == caprv1.FencingDisabled || req.Node == "" {
		return false, nil, nil
	}
	switch res.Outcome {
	case Fenced, Waiting:
	default:
		return false, nil, nil
	}
	if len(res.Backends) == 0 || len(res.Backends) != len(spec.Backends) {
		return false, nil, nil
	}
	withTaint := false
	for _, b := range res.Backends {
		switch {
		case b.Type == caprv1.FencingBackendOutOfServiceTaint:
			withTaint = true
		case b.State != caprv1.FencingBackendFenced:
			return false, nil, nil
		}
	}
	if !withTaint {
		return true, nil, nil
	}
	node := &corev1.Node{}
	if err := c.Get(ctx, client.ObjectKey{Name: req.Node}, node); err != nil {
		if apierrors.IsNotFound(err) {
			return true, nil, nil
		}
		return false, nil, fmt.Errorf("reading Node %s: %w", req.Node, err)
	}
	i := slices.IndexFunc(node.Spec.Taints, func(t corev1.Taint) bool { return t.MatchTaint(&OutOfServiceTaint) })
	if i < 0 {
		return true, nil, nil
	}
	return true, &node.Spec.Taints[i], nil
}

// deleteNodePods force-deletes the pods bound to node, within the timeout, and returns what it did.
// Mirror pods are left alone: deleting one does not stop its static pod, the kubelet that would
// recreate it cannot run, a static pod cannot use a PersistentVolumeClaim (the kubelet refuses static
// pods that reference API objects), and the pod GC deletes the mirror with the Node
// (podgc gcOrphaned). Each delete is conditional on the pod's UID: a pod created anew under the same
// name (a StatefulSet's replacement) is never deleted unseen. With taint (the out-of-service taint on
// the Node) only terminating pods go (evictable), once unchanged for evictionSettle; the pass waits up
// to evictionPoll for the taint-eviction controller, and returns the pods it is not done with as
// waiting.
func (d *PodDeleter) deleteNodePods(ctx context.Context, c client.Client, node string, taint *corev1.Taint, now time.Time) (podPass, error) {
	timeout := d.Timeout
	if timeout <= 0 {
		timeout = DefaultPodDeletionTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var pass podPass
	var errs []error
	poll := time.Now()
	// The version of each terminating pod first seen, and when: it goes once unchanged for
	// evictionSettle.
	type sighting struct {
		version string
		at      time.Time
	}
	seen := map[types.UID]sighting{}
	for {
		pass.waiting = nil
		pods, err := listNodePods(ctx, c, node)
		if err != nil {
			return pass, err
		}
		for i := range pods {
			pod := &pods[i]
			verdict := evictable(pod, taint, now)
			if verdict == podDelete && taint != nil && pod.DeletionTimestamp != nil {
				if s, ok := seen[pod.UID]; !ok || s.version != pod.ResourceVersion {
					seen[pod.UID] = sighting{version: pod.ResourceVersion, at: time.Now()}
					verdict = podNotMarkedYet
				} else if time.Since(s.at) < evictionSettle {
					verdict = podNotMarkedYet
				}
			}
			switch verdict {
			case podLeft:
				continue
			case podNotMarkedYet:
				pass.waiting = append(pass.waiting, pod.Namespace+"/"+pod.Name)
				continue
			}
			err := c.Delete(ctx, pod, client.GracePeriodSeconds(0), client.Preconditions{UID: ptr.To(pod.UID)})
			switch {
			case err == nil:
				pass.deleted = append(pass.deleted, pod.Namespace+"/"+pod.Name)
			case apierrors.IsNotFound(err), apierrors.IsConflict(err):
				// Gone already, or replaced by a pod of the same name: not this Node's old pod.
			default:
				errs = append(errs, fmt.Errorf("deleting pod %s/%s: %w", pod.Namespace, pod.Name, err))
			}
		}
		if len(pass.waiting) == 0 || len(errs) > 0 || time.Since(poll) >= evictionPoll {
			break
		}
		select {
		case <-ctx.Done():
			return pass, fmt.Errorf("waiting for the pods of Node %s to be marked terminating: %w", node, ctx.Err())
		case <-time.After(evictionPollInterval):
		}
	}
	if len(errs) > 0 {
		return pass, fmt.Errorf("force-deleting the pods of Node %s: %w", node, kerrors.NewAggregate(errs))
	}
	return pass, nil
}

// listNodePods lists the pods bound to node (a field selector the server ignored must not widen the
// deletion: each pod's node is checked again), mirror pods left out.
func listNodePods(ctx context.Context, c client.Client, node string) ([]corev1.Pod, error) {
	var out []corev1.Pod
	list := &corev1.PodList{}
	opts := []client.ListOption{client.MatchingFields{nodeNameField: node}, client.Limit(500)}
	for {
		if err := c.List(ctx, list, opts...); err != nil {
			return nil, fmt.Errorf("listing the pods of Node %s: %w", node, err)
		}
		for _, pod := range list.Items {
			if _, mirror := pod.Annotations[corev1.MirrorPodAnnotationKey]; pod.Spec.NodeName == node && !mirror {
				out = append(out, pod)
			}
		}
		if list.Continue == "" {
			return out, nil
		}
		opts = []client.ListOption{client.MatchingFields{nodeNameField: node}, client.Limit(500), client.Continue(list.Continue)}
	}
}

// podVerdict is what a pass does with one pod of the fenced Node.
type podVerdict int

const (
	podDelete podVerdict = iota
	// podNotMarkedYet: the taint-eviction controller is to mark it terminating first (or, marked, to be
	// done with it: deleteNodePods).
	podNotMarkedYet
	// podLeft: it tolerates the out-of-service taint; Kubernetes leaves it, and so does CAPR.
	podLeft
)

// evictable decides one pod (deleteNodePods). Without the out-of-service taint every pod goes (no
// taint-eviction controller acts on the Node). With it, a terminating pod goes (what the pod GC's
// gcTerminating deletes); a pod that tolerates the taint is left; any other waits for the
// taint-eviction controller, until evictionWait after the taint was added (taint.TimeAdded; a taint
// without it was not added by CAPR, which sets it, and is taken as old).
func evictable(pod *corev1.Pod, taint *corev1.Taint, now time.Time) podVerdict {
	switch {
	case taint == nil || pod.DeletionTimestamp != nil:
		return podDelete
	case slices.ContainsFunc(pod.Spec.Tolerations, func(t corev1.Toleration) bool { return t.ToleratesTaint(klog.Background(), taint, false) }):
		return podLeft
	case taint.TimeAdded != nil && now.Sub(taint.TimeAdded.Time) < evictionWait:
		return podNotMarkedYet
	default:
		return podDelete
	}
}

// report records one pass in rec.Pods and says so in an event once it is done (or failed): a pass
// that waits for the taint-eviction controller is recorded, not announced, and tried again on the
// next call.
func (d *PodDeleter) report(ctx context.Context, mr *caprv1.MachineRemediation, rec *caprv1.FencingStatus, pass podPass, err error, now time.Time) {
	if rec.Pods == nil {
		rec.Pods = &caprv1.FencedPodsStatus{}
	}
	deleted := pass.deleted
	rec.Pods.Deleted += int32(min(len(deleted), math.MaxInt32-int(rec.Pods.Deleted))) //nolint:gosec // bounded by the min
	var msg string
	switch {
	case err != nil && len(deleted) > 0:
		msg = fmt.Sprintf("force-deleted %d pod(s) of fenced Node %s (%s), but not all: %v", len(deleted), rec.NodeName, names(deleted), err)
	case err != nil:
		msg = err.Error()
	case len(pass.waiting) > 0:
		msg = fmt.Sprintf("fence confirmed; %d pod(s) of Node %s force-deleted so far, waiting for Kubernetes' taint eviction to mark %d pod(s) terminating first: %s",
			rec.Pods.Deleted, rec.NodeName, len(pass.waiting), names(pass.waiting))
	case rec.Pods.Deleted == 0:
		msg = fmt.Sprintf("fence confirmed; no pod left on Node %s to delete", rec.NodeName)
	default:
		msg = fmt.Sprintf("fence confirmed; force-deleted %d pod(s) of Node %s: %s", rec.Pods.Deleted, rec.NodeName, names(deleted))
	}
	rec.Pods.Message = truncate(msg)
	switch {
	case err != nil:
		ctrl.LoggerFrom(ctx).Error(err, "Force-deleting the fenced Node's pods", "Node", klog.KRef("", rec.NodeName))
	case len(pass.waiting) == 0:
		rec.Pods.DeletedTime = ptr.To(metav1.NewTime(now))
	default:
		return // waiting: nothing to announce yet
	}
	if d.Recorder == nil {
		return
	}
	eventType, reason := corev1.EventTypeNormal, EventPodsDeleted
	if err != nil {
		eventType, reason = corev1.EventTypeWarning, EventPodDeletionFailed
	}
	d.Recorder.Eventf(mr, nil, eventType, reason, "Fence", "%s", rec.Pods.Message)
}

// names lists pods for a message, at most ten.
func names(pods []string) string {
	if len(pods) <= 10 {
		return strings.Join(pods, ", ")
	}
	return strings.Join(pods[:10], ", ") + fmt.Sprintf(" and %d more", len(pods)-10)
}
