package machinehealthcheck

import (
	"context"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// selectors keeps each health check's parsed Machine selector (machineSelector) for the version of
// the health check it was parsed from. The watch mappers match every Machine and Node event against
// every health check of its namespace (healthChecksFor); parsing there, where
// metav1.LabelSelectorAsSelector validates every key and value with regular expressions, was a
// quarter of the process's CPU with 100 health checks at N=10,000 (make bench, CPU profile of the
// mark phase). Its zero value is ready to use.
type selectors struct {
	mu sync.Mutex
	m  map[types.NamespacedName]parsedSelector
}

// parsedSelector is the selector parsed from one version of a health check: a UID and a
// resourceVersion name one content of an object, so a selector edited by hand is parsed again.
type parsedSelector struct {
	uid             types.UID
	resourceVersion string
	sel             labels.Selector
	err             error
}

// of returns mhc's Machine selector, parsed once per version of mhc. A health check that was never
// stored (no resourceVersion) is parsed every time.
func (s *selectors) of(mhc *caprv1.MachineHealthCheck) (labels.Selector, error) {
	if mhc.ResourceVersion == "" {
		return machineSelector(mhc)
	}
	key := types.NamespacedName{Namespace: mhc.Namespace, Name: mhc.Name}
	s.mu.Lock()
	p, ok := s.m[key]
	s.mu.Unlock()
	if ok && p.uid == mhc.UID && p.resourceVersion == mhc.ResourceVersion {
		return p.sel, p.err
	}
	sel, err := machineSelector(mhc)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[types.NamespacedName]parsedSelector{}
	}
	s.m[key] = parsedSelector{uid: mhc.UID, resourceVersion: mhc.ResourceVersion, sel: sel, err: err}
	return sel, err
}

// forget drops the selector of a health check that is gone.
func (s *selectors) forget(key types.NamespacedName) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, key)
}

// machineSelector is the health check's selector restricted to its cluster.
func machineSelector(mhc *caprv1.MachineHealthCheck) (labels.Selector, error) {
	return mhc.Spec.MachineSelector()
}

// setInvalidSelector reports that spec.selector does not parse: RemediationAllowed is False with
// reason InvalidSelector, and a Warning event when it just became so.
func (r *Reconciler) setInvalidSelector(ctx context.Context, mhc *caprv1.MachineHealthCheck, err error) {
	ctrl.LoggerFrom(ctx).Info("Health check not run: its selector does not parse", "machineHealthCheck", klog.KObj(mhc), "err", err.Error())
	mhc.Status.RemediationsAllowed = ptr.To(int32(0))
	msg := fmt.Sprintf("No Machine is checked until spec.selector is fixed: %v", err)
	c := metav1.Condition{Type: caprv1.MachineHealthCheckRemediationAllowedCondition, Status: metav1.ConditionFalse,
		Reason: caprv1.MachineHealthCheckInvalidSelectorReason, Message: msg}
	if r.setStatusCondition(mhc, c) {
		r.recorder.Eventf(mhc, nil, corev1.EventTypeWarning, caprv1.EventInvalidSelector, "HealthCheck", "%s", msg)
	}
}
