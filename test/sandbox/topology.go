package sandbox

import (
	"context"
	"fmt"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	infrav1 "github.com/capr-io/capr/test/sandbox/api/infrastructure/v1alpha1"
)

// TopologySpec builds a full-stack cluster from a ClusterClass (ClusterSpec.Topology; the sandbox
// needs CAPIOptions.Topology). The ClusterClass <cluster>-class has a KubeadmControlPlaneTemplate, the
// sandbox's infrastructure templates and one MachineDeployment class "default-worker"; the Cluster's
// topology asks for ClusterSpec.ControlPlane control-plane replicas and ClusterSpec.Workers workers
// (MachineDeployment topology "md"). The topology controller names what it creates as the hand-built
// cluster's objects are named: KubeadmControlPlane <cluster>-cp, MachineDeployment <cluster>-md,
// SandboxCluster <cluster>.
type TopologySpec struct {
	// ControlPlaneHealthCheck, if set, is the ClusterClass's spec.controlPlane.healthCheck: CAPI's
	// topology controller creates a MachineHealthCheck for the control plane from it.
	ControlPlaneHealthCheck *clusterv1.ControlPlaneClassHealthCheck
	// WorkerHealthCheck, if set, is the MachineDeployment class's healthCheck.
	WorkerHealthCheck *clusterv1.MachineDeploymentClassHealthCheck
}

// TopologyWorkerClass is the MachineDeployment class of the sandbox's ClusterClasses.
const TopologyWorkerClass = "default-worker"

// topologyObjects returns the ClusterClass of a full-stack cluster and its templates.
func (s *Sandbox) topologyObjects(spec ClusterSpec, host string, port int32) []client.Object {
	ns, name := spec.Namespace, spec.Name
	class := name + "-class"
	labels := map[string]string{}
	ref := func(apiVersion, kind, name string) clusterv1.ClusterClassTemplateReference {
		return clusterv1.ClusterClassTemplateReference{APIVersion: apiVersion, Kind: kind, Name: name}
	}
	infra := infrav1.GroupVersion.String()
	cc := &clusterv1.ClusterClass{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: class, Labels: labels},
		Spec: clusterv1.ClusterClassSpec{
			Infrastructure: clusterv1.InfrastructureClass{
				TemplateRef: ref(infra, "SandboxClusterTemplate", class),
				Naming:      clusterv1.InfrastructureClassNamingSpec{Template: "{{ .cluster.name }}"},
			},
			ControlPlane: clusterv1.ControlPlaneClass{
				TemplateRef:           ref(controlplanev1.GroupVersion.String(), "KubeadmControlPlaneTemplate", class),
				MachineInfrastructure: clusterv1.ControlPlaneClassMachineInfrastructureTemplate{TemplateRef: ref(infra, "SandboxMachineTemplate", class+"-cp")},
				Naming:                clusterv1.ControlPlaneClassNamingSpec{Template: "{{ .cluster.name }}-cp"},
			},
			Workers: clusterv1.WorkersClass{MachineDeployments: []clusterv1.MachineDeploymentClass{{
				Class:          TopologyWorkerClass,
				Bootstrap:      clusterv1.MachineDeploymentClassBootstrapTemplate{TemplateRef: ref(bootstrapv1.GroupVersion.String(), "KubeadmConfigTemplate", class+"-md")},
				Infrastructure: clusterv1.MachineDeploymentClassInfrastructureTemplate{TemplateRef: ref(infra, "SandboxMachineTemplate", class+"-md")},
				Naming:         clusterv1.MachineDeploymentClassNamingSpec{Template: "{{ .cluster.name }}-{{ .machineDeployment.topologyName }}"},
			}}},
		},
	}
	if t := spec.Topology; t.ControlPlaneHealthCheck != nil {
		cc.Spec.ControlPlane.HealthCheck = *t.ControlPlaneHealthCheck
	}
	if t := spec.Topology; t.WorkerHealthCheck != nil {
		cc.Spec.Workers.MachineDeployments[0].HealthCheck = *t.WorkerHealthCheck
	}
	return []client.Object{
		&infrav1.SandboxClusterTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: class},
			Spec: infrav1.SandboxClusterTemplateSpec{Template: infrav1.SandboxClusterTemplateResource{Spec: infrav1.SandboxClusterSpec{
				ControlPlaneEndpoint: clusterv1.APIEndpoint{Host: host, Port: port}}}}},
		&infrav1.SandboxMachineTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: class + "-cp"}},
		&infrav1.SandboxMachineTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: class + "-md"}},
		&bootstrapv1.KubeadmConfigTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: class + "-md"}},
		// Stacked etcd (KCP's default): the ClusterConfiguration says nothing about etcd.
		&controlplanev1.KubeadmControlPlaneTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: class}},
		cc,
	}
}

// createTopologyCluster creates the ClusterClass and a Cluster built from it, then marks the
// SandboxCluster the topology controller creates provisioned (what an infrastructure provider does).
func (s *Sandbox) createTopologyCluster(ctx context.Context, spec ClusterSpec, host string, port int32) (*clusterv1.Cluster, error) {
	if spec.ExternalEtcd {
		return nil, fmt.Errorf("cluster %s: ClusterSpec.Topology builds stacked etcd only", spec.Name)
	}
	for _, o := range s.topologyObjects(spec, host, port) {
		if err := s.Client.Create(ctx, o); err != nil {
			return nil, fmt.Errorf("creating %T %s: %w", o, o.GetName(), err)
		}
	}
	cluster := &clusterv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: spec.Namespace, Name: spec.Name},
		Spec: clusterv1.ClusterSpec{Topology: clusterv1.Topology{
			ClassRef:     clusterv1.ClusterClassRef{Name: spec.Name + "-class"},
			Version:      KubernetesVersion,
			ControlPlane: clusterv1.ControlPlaneTopology{Replicas: ptr.To(spec.ControlPlane)},
		}},
	}
	if spec.Workers > 0 {
		cluster.Spec.Topology.Workers.MachineDeployments = []clusterv1.MachineDeploymentTopology{{
			Class: TopologyWorkerClass, Name: "md", Replicas: ptr.To(int32(spec.Workers)),
		}}
	}
	// CAPI's Cluster admission refuses a Cluster whose ClusterClass its reconciler has not seen yet.
	createErr := error(nil)
	if err := poll(ctx, time.Minute, func() (bool, string) {
		createErr = s.Client.Create(ctx, cluster.DeepCopy())
		if createErr != nil {
			return false, createErr.Error()
		}
		return true, ""
	}); err != nil {
		return nil, fmt.Errorf("creating Cluster %s from ClusterClass %s: %w", spec.Name, spec.Name+"-class", err)
	}
	if err := s.Client.Get(ctx, client.ObjectKeyFromObject(cluster), cluster); err != nil {
		return nil, err
	}
	infra := &infrav1.SandboxCluster{}
	if err := poll(ctx, time.Minute, func() (bool, string) {
		if err := s.Client.Get(ctx, client.ObjectKey{Namespace: spec.Namespace, Name: spec.Name}, infra); err != nil {
			why := ""
			live := &clusterv1.Cluster{}
			if s.Client.Get(ctx, client.ObjectKeyFromObject(cluster), live) == nil {
				why = fmt.Sprintf("; Cluster conditions %v", live.Status.Conditions)
			}
			cc := &clusterv1.ClusterClass{}
			if s.Client.Get(ctx, client.ObjectKey{Namespace: spec.Namespace, Name: spec.Name + "-class"}, cc) == nil {
				why += fmt.Sprintf("; ClusterClass conditions %v", cc.Status.Conditions)
			}
			return false, "waiting for the topology controller to create SandboxCluster " + spec.Name + ": " + err.Error() + why
		}
		return true, ""
	}); err != nil {
		return nil, err
	}
	base := infra.DeepCopy()
	infra.Status.Initialization.Provisioned = ptr.To(true)
	if err := s.Client.Status().Patch(ctx, infra, client.MergeFrom(base)); err != nil {
		return nil, fmt.Errorf("marking SandboxCluster %s provisioned: %w", infra.Name, err)
	}
	return cluster, nil
}

// ReplicasHistory watches, through the API server, a cluster's Cluster spec.topology.controlPlane.replicas
// and its KubeadmControlPlane's spec.replicas, and records every value each took, in order, with
// repeats of the same value folded: a replica flap (5, 3, 5) shows as such, however short.
type ReplicasHistory struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	values map[string][]int32
	err    error
}

// WatchTopologyReplicas starts watching the Cluster and its KubeadmControlPlane <cluster>-cp; it
// returns once both watches are established, with their values of now as the first entries.
func (s *Sandbox) WatchTopologyReplicas(ctx context.Context, wc *WorkloadCluster) (*ReplicasHistory, error) {
	wcli, err := client.NewWithWatch(s.Env.Config, client.Options{Scheme: s.Env.Scheme})
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithCancel(ctx)
	h := &ReplicasHistory{cancel: cancel, done: make(chan struct{}), values: map[string][]int32{}}
	type target struct {
		key      string
		list     client.ObjectList
		name     string
		replicas func(runtime.Object) *int32
	}
	targets := []target{
		{"Cluster", &clusterv1.ClusterList{}, wc.Name, func(o runtime.Object) *int32 {
			if c, ok := o.(*clusterv1.Cluster); ok {
				return c.Spec.Topology.ControlPlane.Replicas
			}
			return nil
		}},
		{"KubeadmControlPlane", &controlplanev1.KubeadmControlPlaneList{}, wc.Name + "-cp", func(o runtime.Object) *int32 {
			if k, ok := o.(*controlplanev1.KubeadmControlPlane); ok {
				return k.Spec.Replicas
			}
			return nil
		}},
	}
	var wg sync.WaitGroup
	for _, t := range targets {
		opts := []client.ListOption{client.InNamespace(wc.Namespace), client.MatchingFields{"metadata.name": t.name}}
		w, err := wcli.Watch(wctx, t.list, opts...)
		if err != nil {
			cancel()
			return nil, fmt.Errorf("watching %s %s: %w", t.key, t.name, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer w.Stop()
			for ev := range w.ResultChan() {
				switch ev.Type {
				case watch.Added, watch.Modified:
					if n := t.replicas(ev.Object); n != nil {
						h.mu.Lock()
						if v := h.values[t.key]; len(v) == 0 || v[len(v)-1] != *n {
							h.values[t.key] = append(v, *n)
						}
						h.mu.Unlock()
					}
				case watch.Error:
					if wctx.Err() == nil {
						h.mu.Lock()
						h.err = fmt.Errorf("watch of %s failed: %v", t.key, ev.Object)
						h.mu.Unlock()
					}
					return
				}
			}
		}()
	}
	go func() {
		wg.Wait()
		close(h.done)
	}()
	return h, nil
}

// Stop ends the watches and returns the values seen: "Cluster" and "KubeadmControlPlane".
func (h *ReplicasHistory) Stop() (map[string][]int32, error) {
	h.cancel()
	<-h.done
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.values, h.err
}
