package controllers

import (
	"context"
	"fmt"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capr-io/capr/controllers/machinehealthcheck"
	"github.com/capr-io/capr/etcdutil"
)

// etcdMemberSource feeds the health checker's checks.etcdMember from the workload cluster's etcd,
// reached the same way the remediator reaches it.
type etcdMemberSource struct {
	client   client.Client
	workload *etcdutil.Workload
}

// MemberHealth implements machinehealthcheck.EtcdMemberSource.
func (e *etcdMemberSource) MemberHealth(ctx context.Context, cluster *clusterv1.Cluster) (map[string]machinehealthcheck.EtcdMemberHealth, error) {
	machines := &clusterv1.MachineList{}
	if err := e.client.List(ctx, machines, client.InNamespace(cluster.Namespace),
		client.MatchingLabels{clusterv1.ClusterNameLabel: cluster.Name}, client.HasLabels{clusterv1.MachineControlPlaneLabel}); err != nil {
		return nil, fmt.Errorf("listing the control-plane Machines of cluster %s: %w", cluster.Name, err)
	}
	var nodes []string
	for _, m := range machines.Items {
		if m.Status.NodeRef.IsDefined() {
			nodes = append(nodes, m.Status.NodeRef.Name)
		}
	}
	ec, err := e.workload.ForCluster(ctx, cluster)
	if err != nil {
		return nil, err
	}
	state, err := ec.Inspect(ctx, nodes)
	if err != nil {
		return nil, fmt.Errorf("inspecting the etcd members of cluster %s: %w", cluster.Name, err)
	}
	out := map[string]machinehealthcheck.EtcdMemberHealth{}
	keep := nodes
	for _, m := range state.Members {
		if m.Name != "" {
			out[m.Name] = machinehealthcheck.EtcdMemberHealth{Healthy: m.Healthy, Votes: m.Up(), Problem: m.Problem}
			keep = append(keep, m.Name)
		}
	}
	// The cached clients of members whose Machines and members are gone are closed now, not when idle.
	e.workload.Retain(cluster.UID, keep)
	if !state.QuorumProven {
		ctrl.LoggerFrom(ctx).Info("No etcd member could serve a linearizable read: member health is one member's local view",
			"unreachable", state.UnreachableNames())
	}
	return out, nil
}
