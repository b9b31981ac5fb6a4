package main

import (
	"context"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// scenario is one fault.
type scenario struct {
	name         string
	controlPlane int32
	// externalEtcd runs the cluster with external etcd (sandbox.ClusterSpec.ExternalEtcd): "full
	// strength" is then every control-plane Machine serving (KCP's pod conditions), the victims gone.
	externalEtcd bool
	// topology builds the cluster from a ClusterClass (sandbox.ClusterSpec.Topology): CAPI's Cluster
	// topology controller owns KCP's replicas.
	topology bool
	inject   func(ctx context.Context, r *run) ([]string, error)
}

var scenarios = []scenario{
	{name: "node not Ready, member healthy", controlPlane: 3, inject: stopHeartbeat},
	{name: "member dead", controlPlane: 3, inject: killMember},
	{name: "leader's member dead", controlPlane: 3, inject: func(ctx context.Context, r *run) ([]string, error) {
		m, err := r.etcdMachine(ctx, true)
		if err != nil {
			return nil, err
		}
		r.sb.KillEtcdMember(r.wc, m.Status.NodeRef.Name)
		return []string{m.Name}, nil
	}},
	{name: "leader's kubelet dead, member alive", controlPlane: 3, inject: func(ctx context.Context, r *run) ([]string, error) {
		m, err := r.etcdMachine(ctx, true)
		if err != nil {
			return nil, err
		}
		return []string{m.Name}, r.sb.StopKubelet(ctx, r.wc, m.Status.NodeRef.Name)
	}},
	// A follower's member that runs and answers but carries etcd's NOSPACE alarm (its backend over
	// quota). Both systems see it only through etcd's alarm list: CAPI's MachineHealthCheck through
	// KCP's Machine condition EtcdMemberHealthy ("Etcd reports alarms: NOSPACE"), CAPR through
	// checks.etcdMember.
	{name: "etcd member degraded (alarm NOSPACE)", controlPlane: 3, inject: func(ctx context.Context, r *run) ([]string, error) {
		m, err := r.etcdMachine(ctx, false)
		if err != nil {
			return nil, err
		}
		return []string{m.Name}, r.sb.AlarmEtcdMember(ctx, r.wc, m.Status.NodeRef.Name)
	}},
	{name: "external etcd, node not Ready", controlPlane: 3, externalEtcd: true, inject: stopHeartbeat},
	{name: "topology, node not Ready, member healthy", controlPlane: 3, topology: true, inject: stopHeartbeat},
	{name: "topology, member dead", controlPlane: 3, topology: true, inject: killMember},
	// One control-plane Machine, its Node NotReady while its kubelet and member run (KCP's preflight
	// then sees its components healthy). KCP's remediation refuses a single Machine (CAPI #4554);
	// CAPR replaces it with learner joins, which the KCP declares for it.
	{name: "single Machine, node NotReady, member healthy", controlPlane: 1, inject: func(ctx context.Context, r *run) ([]string, error) {
		if err := r.sb.AnnotateControlPlane(ctx, r.wc, caprv1.EtcdLearnerJoinsAnnotation, "true"); err != nil {
			return nil, err
		}
		m := r.initial[0]
		return []string{m.Name}, r.sb.ReportNotReady(ctx, r.wc, m.Status.NodeRef.Name)
	}},
	{name: "two of five unhealthy", controlPlane: 5, inject: func(_ context.Context, r *run) ([]string, error) {
		a, b := r.initial[0], r.initial[3]
		r.sb.KillEtcdMember(r.wc, a.Status.NodeRef.Name)
		r.sb.KillEtcdMember(r.wc, b.Status.NodeRef.Name)
		return []string{a.Name, b.Name}, nil
	}},
}

// stopHeartbeat stops the heartbeat of the second Machine's Node (Ready turns Unknown); its etcd
// member keeps running.
func stopHeartbeat(ctx context.Context, r *run) ([]string, error) {
	m := r.initial[1]
	return []string{m.Name}, r.sb.StopHeartbeat(ctx, r.wc, m.Status.NodeRef.Name)
}

// killMember kills the etcd member of a follower's Node (the leader's is its own row).
func killMember(ctx context.Context, r *run) ([]string, error) {
	m, err := r.etcdMachine(ctx, false)
	if err != nil {
		return nil, err
	}
	r.sb.KillEtcdMember(r.wc, m.Status.NodeRef.Name)
	return []string{m.Name}, nil
}

// etcdMachine is the first initial Machine (by name) whose Node hosts etcd's current leader
// (leader) or a follower (!leader), read from etcd.
func (r *run) etcdMachine(ctx context.Context, leader bool) (*clusterv1.Machine, error) {
	return r.sb.EtcdMachine(ctx, r.wc, r.initial, leader)
}
