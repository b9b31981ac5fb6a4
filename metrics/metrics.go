package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Kinds of remediation (label kind), and the result of an aborted one (the others are the
// MachineRemediation phases Succeeded and Failed).
const (
	KindControlPlane = "control-plane"
	KindWorker       = "worker"
	ResultAborted    = "Aborted"
)

var (
	healthCheckTargets = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "capr_machinehealthcheck_targets", Help: "Machines a health check checks (skip-remediation and paused Machines excluded).",
	}, []string{"namespace", "name"})
	healthCheckUnhealthy = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "capr_machinehealthcheck_unhealthy", Help: "Targets of a health check currently marked unhealthy.",
	}, []string{"namespace", "name"})
	healthCheckEvaluated = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "capr_machinehealthcheck_targets_evaluated_total", Help: "Targets evaluated by health-check rounds, by pass: full (every target) or changed (those changed since the last round, and those unhealthy or with a timeout running).",
	}, []string{"namespace", "name", "pass"})
	marks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "capr_machinehealthcheck_marks_total", Help: "Machines marked unhealthy, by the mark's reason.",
	}, []string{"namespace", "name", "reason"})
	shortCircuits = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "capr_machinehealthcheck_short_circuits_total", Help: "Health-check rounds in which limits held back remediation requests, by the RemediationAllowed reason.",
	}, []string{"namespace", "name", "reason"})
	remediationsStarted = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "capr_remediations_started_total", Help: "Remediations started, by kind and (control plane) order.",
	}, []string{"kind", "order"})
	remediationsFinished = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "capr_remediations_finished_total", Help: "Remediations finished, by kind and result (Succeeded, Failed, Aborted).",
	}, []string{"kind", "result"})
	stepDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "capr_remediation_step_duration_seconds", Help: "Time from a remediation step's start to its end, by kind, step and outcome.",
		Buckets: []float64{0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800},
	}, []string{"kind", "step", "outcome"})
	etcdCallDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "capr_etcd_call_duration_seconds", Help: "Duration of CAPR's etcd operations (inspect, move_leader, remove_member), by operation.",
		Buckets: []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30},
	}, []string{"operation"})
	etcdCallErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "capr_etcd_call_errors_total", Help: "etcd operations that failed, by operation.",
	}, []string{"operation"})
	fencingDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "capr_fencing_duration_seconds", Help: "Time from a Fence step's start to its final outcome (Fenced, Skipped, GaveUp), by kind and outcome.",
		Buckets: []float64{0.1, 1, 5, 10, 30, 60, 120, 300, 600, 1800},
	}, []string{"kind", "outcome"})
	requestsDeleted = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "capr_remediation_requests_deleted_total", Help: "Finished MachineRemediations deleted by the retention controller, by reason (Expired: older than the TTL after finishing; OverLimit: beyond the per-Cluster maximum).",
	}, []string{"reason"})
	lockWaits = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "capr_controlplane_lock_waits_total", Help: "Times a control-plane remediation started waiting because another one of its cluster was in progress.",
	})
)

func init() {
	ctrlmetrics.Registry.MustRegister(healthCheckTargets, healthCheckUnhealthy, healthCheckEvaluated, marks, shortCircuits, remediationsStarted,
		remediationsFinished, stepDuration, etcdCallDuration, etcdCallErrors, fencingDuration, requestsDeleted, lockWaits)
}

// HealthCheckRound records a health check's targets and unhealthy targets after a round.
func HealthCheckRound(namespace, name string, targets, unhealthy int) {
	healthCheckTargets.WithLabelValues(namespace, name).Set(float64(targets))
	healthCheckUnhealthy.WithLabelValues(namespace, name).Set(float64(unhealthy))
}

// Passes of a health-check round (label pass of capr_machinehealthcheck_targets_evaluated_total).
const (
	PassFull    = "full"
	PassChanged = "changed"
)

// HealthCheckEvaluated records the targets a health-check round evaluated, in a pass of kind pass.
func HealthCheckEvaluated(namespace, name, pass string, targets int) {
	healthCheckEvaluated.WithLabelValues(namespace, name, pass).Add(float64(targets))
}

// HealthCheckDeleted drops a deleted health check's series.
func HealthCheckDeleted(namespace, name string) {
	labels := prometheus.Labels{"namespace": namespace, "name": name}
	healthCheckTargets.DeletePartialMatch(labels)
	healthCheckUnhealthy.DeletePartialMatch(labels)
	healthCheckEvaluated.DeletePartialMatch(labels)
	marks.DeletePartialMatch(labels)
	shortCircuits.DeletePartialMatch(labels)
}

// Marked records a Machine marked unhealthy.
func Marked(namespace, name, reason string) { marks.WithLabelValues(namespace, name, reason).Inc() }

// ShortCircuited records a round in which limits held back remediation requests.
func ShortCircuited(namespace, name, reason string) {
	shortCircuits.WithLabelValues(namespace, name, reason).Inc()
}

// RemediationStarted records a remediation leaving Pending.
func RemediationStarted(kind, order string) { remediationsStarted.WithLabelValues(kind, order).Inc() }

// RemediationFinished records a remediation's end.
func RemediationFinished(kind, result string) {
	remediationsFinished.WithLabelValues(kind, result).Inc()
}

// StepFinished records a step's duration.
func StepFinished(kind, step, outcome string, d time.Duration) {
	stepDuration.WithLabelValues(kind, step, outcome).Observe(d.Seconds())
}

// EtcdCall records one etcd operation.
func EtcdCall(operation string, d time.Duration, err error) {
	etcdCallDuration.WithLabelValues(operation).Observe(d.Seconds())
	if err != nil {
		etcdCallErrors.WithLabelValues(operation).Inc()
	}
}

// Fenced records a Fence step's final outcome.
func Fenced(kind, outcome string, d time.Duration) {
	fencingDuration.WithLabelValues(kind, outcome).Observe(d.Seconds())
}

// LockWait records a control-plane remediation starting to wait for another one.
func LockWait() { lockWaits.Inc() }

// RequestDeleted records a finished MachineRemediation deleted by the retention controller.
func RequestDeleted(reason string) { requestsDeleted.WithLabelValues(reason).Inc() }
