package fencing

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
		d.report(ctx, mr, rec, nil, fmt.Errorf("the fenced Node's pods are not deleted yet: %w", err), now)
		return
	}
	confirmed, err := fenceConfirmed(ctx, c, req, res)
	if err != nil {
		d.report(ctx, mr, rec, nil, fmt.Errorf("the fenced Node's pods are not deleted yet: %w", err), now)
		return
	}
	if !confirmed {
		return
	}
	deleted, err := d.deleteNodePods(ctx, c, req.Node)
	if err == nil {
		log.Info("Fence confirmed: force-deleted the Node's pods", "pods", deleted)
	}
	d.report(ctx, mr, rec, deleted, err, now)
}

// fenceConfirmed reports whether every configured backend confirmed the fence of req.Node. An
// OutOfServiceTaint backend counts once its taint is on the Node (or the Node is gone): what it waits
// for next, the node's volumes detached, follows from its pods being gone, which is this step.
// PolicyFencer asks it only after every backend before it confirmed. A Skipped, GaveUp or
// not-available answer is never a confirmation.
func fenceConfirmed(ctx context.Context, c client.Client, req Request, res Result) (bool, error) {
	spec := req.Spec
	if spec == nil || spec.Policy == "" || spec.Policy == caprv1.FencingDisabled || req.Node == "" {
		return false, nil
	}
	switch res.Outcome {
	case Fenced:
		return true, nil
	case Waiting:
	default:
		return false, nil
	}
	if len(res.Backends) == 0 || len(res.Backends) != len(spec.Backends) {
		return false, nil
	}
	taint := false
	for _, b := range res.Backends {
		switch {
		case b.Type == caprv1.FencingBackendOutOfServiceTaint && b.State == caprv1.FencingBackendFencing:
			taint = true
		case b.State != caprv1.FencingBackendFenced:
			return false, nil
		}
	}
	if !taint {
		return true, nil
	}
	node := &corev1.Node{}
	if err := c.Get(ctx, client.ObjectKey{Name: req.Node}, node); err != nil {
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, fmt.Errorf("reading Node %s: %w", req.Node, err)
	}
	return hasOutOfServiceTaint(node), nil
}

// deleteNodePods force-deletes the pods bound to node, within the timeout, and returns their names.
// Mirror pods are left alone: deleting one does not stop its static pod, the kubelet that would
// recreate it cannot run, a static pod cannot use a PersistentVolumeClaim (the kubelet refuses static
// pods that reference API objects), and the pod GC deletes the mirror with the Node
// (podgc gcOrphaned). Each delete is conditional on the pod's UID: a pod created anew under the same
// name (a StatefulSet's replacement) is never deleted unseen.
func (d *PodDeleter) deleteNodePods(ctx context.Context, c client.Client, node string) ([]string, error) {
	timeout := d.Timeout
	if timeout <= 0 {
		timeout = DefaultPodDeletionTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var deleted []string
	var errs []error
	list := &corev1.PodList{}
	opts := []client.ListOption{client.MatchingFields{nodeNameField: node}, client.Limit(500)}
	for {
		if err := c.List(ctx, list, opts...); err != nil {
			return deleted, fmt.Errorf("listing the pods of Node %s: %w", node, err)
		}
		for i := range list.Items {
			pod := &list.Items[i]
			if pod.Spec.NodeName != node {
				continue // a field selector the server ignored must not widen the deletion
			}
			if _, mirror := pod.Annotations[corev1.MirrorPodAnnotationKey]; mirror {
				continue
			}
			err := c.Delete(ctx, pod, client.GracePeriodSeconds(0), client.Preconditions{UID: ptr.To(pod.UID)})
			switch {
			case err == nil:
				deleted = append(deleted, pod.Namespace+"/"+pod.Name)
			case apierrors.IsNotFound(err), apierrors.IsConflict(err):
				// Gone already, or replaced by a pod of the same name: not this Node's old pod.
			default:
				errs = append(errs, fmt.Errorf("deleting pod %s/%s: %w", pod.Namespace, pod.Name, err))
			}
		}
		if list.Continue == "" {
			break
		}
		opts = []client.ListOption{client.MatchingFields{nodeNameField: node}, client.Limit(500), client.Continue(list.Continue)}
	}
	if len(errs) > 0 {
		return deleted, fmt.Errorf("force-deleting the pods of Node %s: %w", node, kerrors.NewAggregate(errs))
	}
	return deleted, nil
}

// report records one pass in rec.Pods and says so in an event.
func (d *PodDeleter) report(ctx context.Context, mr *caprv1.MachineRemediation, rec *caprv1.FencingStatus, deleted []string, err error, now time.Time) {
	if rec.Pods == nil {
		rec.Pods = &caprv1.FencedPodsStatus{}
	}
	rec.Pods.Deleted += int32(min(len(deleted), math.MaxInt32-int(rec.Pods.Deleted))) //nolint:gosec // bounded by the min
	var msg string
	switch {
	case err != nil && len(deleted) > 0:
		msg = fmt.Sprintf("force-deleted %d pod(s) of fenced Node %s (%s), but not all: %v", len(deleted), rec.NodeName, names(deleted), err)
	case err != nil:
		msg = err.Error()
	case len(deleted) == 0:
		msg = fmt.Sprintf("fence confirmed; no pod left on Node %s to delete", rec.NodeName)
	default:
		msg = fmt.Sprintf("fence confirmed; force-deleted %d pod(s) of Node %s: %s", len(deleted), rec.NodeName, names(deleted))
	}
	rec.Pods.Message = truncate(msg)
	if err == nil {
		rec.Pods.DeletedTime = ptr.To(metav1.NewTime(now))
	} else {
		ctrl.LoggerFrom(ctx).Error(err, "Force-deleting the fenced Node's pods", "Node", klog.KRef("", rec.NodeName))
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
