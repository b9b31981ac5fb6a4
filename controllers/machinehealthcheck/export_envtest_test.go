//go:build envtest

package machinehealthcheck

import (
	"context"

	"k8s.io/apimachinery/pkg/labels"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// WriteMarkFrom writes health check checker's verdict on Machine m as its round does (writeMark),
// starting from m as given: a copy read before other writes stands for a cache lagging behind them.
// c both writes and reads again.
func WriteMarkFrom(ctx context.Context, c client.Client, m *clusterv1.Machine, checker string, unhealthy bool) error {
	r := &Reconciler{Client: c, APIReader: c}
	ev := evaluation{verdict: verdictHealthy}
	if unhealthy {
		ev = evaluation{verdict: verdictUnhealthy, reason: caprv1.MachineCAPRHealthCheckUnhealthyNodeReason, message: "Node is not Ready"}
	}
	_, _, err := r.writeMark(ctx, m, ev, checker)
	return err
}

// UnmarkFrom removes health check checker's mark from Machine m as its deletion does
// (reconcileDelete), starting from m as given.
func UnmarkFrom(ctx context.Context, c client.Client, m *clusterv1.Machine, checker string) error {
	return (&Reconciler{Client: c, APIReader: c}).removeMark(ctx, m, checker, labels.Everything())
}
