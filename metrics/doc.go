// Package metrics defines CAPR's Prometheus metrics, registered in controller-runtime's registry and
// served on the manager's metrics endpoint next to controller-runtime's own. Every metric is
// documented in docs/user/metrics.md; the recording functions are the only way to change them.
package metrics
