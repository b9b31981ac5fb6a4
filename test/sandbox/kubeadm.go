package sandbox

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util"
	"sigs.k8s.io/cluster-api/util/kubeconfig"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/capr-io/capr/etcdutil"
	capienv "github.com/capr-io/capr/test/envtest"
	infrav1 "github.com/capr-io/capr/test/sandbox/api/infrastructure/v1alpha1"
)

// KubernetesVersion is the version of the sandbox's workload clusters (the API server's).
const KubernetesVersion = "v1.36.3"

// controlPlaneComponents are the static pods kubeadm runs on a control-plane node; KCP reads their
// mirror Pods (kube-system/<component>-<node>, labels tier=control-plane and component=<component>)
// for its Machine conditions.
var controlPlaneComponents = []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd"}

// ExternalEtcdMembers are the members of a full-stack cluster's external etcd (ClusterSpec.ExternalEtcd).
var ExternalEtcdMembers = []string{"external-etcd-0", "external-etcd-1", "external-etcd-2"}

// Where kubeadm finds the external etcd's CA and client certificate on a control-plane node: the
// paths CABPK writes the <cluster>-etcd and <cluster>-apiserver-etcd-client Secrets to.
const (
	externalEtcdCAFile   = "/etc/kubernetes/pki/etcd/ca.crt"
	externalEtcdCertFile = "/etc/kubernetes/pki/apiserver-etcd-client.crt"
	externalEtcdKeyFile  = "/etc/kubernetes/pki/apiserver-etcd-client.key"
)

// createKubeadmCluster creates a Cluster whose control plane is a real KubeadmControlPlane, with
// stacked etcd (KCP's default) played by the workload cluster's real etcd processes, or with
// external etcd (spec.ExternalEtcd): real etcd processes that are not the Machines'.
//
// Every workload cluster of the sandbox is the sandbox's own API server, so they share kube-system:
// kubeadm-config there says "initialized" to KCP, which would make CABPK write join data for a new
// cluster's first Machine. One full-stack cluster lives at a time (DestroyCluster the previous one);
// the leftover kubeadm-config of a destroyed cluster is deleted, as a fresh API server would not have it.
func (s *Sandbox) createKubeadmCluster(ctx context.Context, spec ClusterSpec, wc *WorkloadCluster) error {
	s.mu.Lock()
	var others []string
	for key := range s.clusters {
		if key != (types.NamespacedName{Namespace: spec.Namespace, Name: spec.Name}) {
			others = append(others, key.String())
		}
	}
	s.mu.Unlock()
	if len(others) > 0 {
		return fmt.Errorf("the full-stack sandbox runs one workload cluster at a time (they share kube-system); destroy %v first", others)
	}
	leftover := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: "kubeadm-config"}}
	if err := s.Client.Delete(ctx, leftover); err != nil && !isNotFound(err) {
		return fmt.Errorf("deleting the kubeadm-config of a destroyed cluster: %w", err)
	}
	host, port, err := apiServerHostPort(s.Env.Config.Host)
	if err != nil {
		return err
	}
	c := s.Client
	ns, name := spec.Namespace, spec.Name
	labels := map[string]string{clusterv1.ClusterNameLabel: name}
	if spec.Topology != nil {
		etcdSecrets, _, err := s.kubeadmEtcd(ctx, spec, wc, labels)
		if err != nil {
			return err
		}
		for _, o := range etcdSecrets {
			if err := c.Create(ctx, o); err != nil {
				return fmt.Errorf("creating %T %s: %w", o, o.GetName(), err)
			}
		}
		cluster, err := s.createTopologyCluster(ctx, spec, host, port)
		if err != nil {
			return err
		}
		return s.createKubeconfig(ctx, cluster)
	}
	infraCluster := &infrav1.SandboxCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec:       infrav1.SandboxClusterSpec{ControlPlaneEndpoint: clusterv1.APIEndpoint{Host: host, Port: port}},
	}
	if err := c.Create(ctx, infraCluster); err != nil {
		return fmt.Errorf("creating SandboxCluster: %w", err)
	}
	base := infraCluster.DeepCopy()
	infraCluster.Status.Initialization.Provisioned = ptr.To(true)
	if err := c.Status().Patch(ctx, infraCluster, client.MergeFrom(base)); err != nil {
		return fmt.Errorf("marking SandboxCluster provisioned: %w", err)
	}
	etcdSecrets, clusterConfiguration, err := s.kubeadmEtcd(ctx, spec, wc, labels)
	if err != nil {
		return err
	}
	objs := append([]client.Object{}, etcdSecrets...)
	objs = append(objs,
		&infrav1.SandboxMachineTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-cp", Labels: labels}},
		&controlplanev1.KubeadmControlPlane{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-cp", Labels: labels},
			Spec: controlplanev1.KubeadmControlPlaneSpec{
				Replicas: ptr.To(spec.ControlPlane),
				Version:  KubernetesVersion,
				MachineTemplate: controlplanev1.KubeadmControlPlaneMachineTemplate{Spec: controlplanev1.KubeadmControlPlaneMachineTemplateSpec{
					InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: infrav1.GroupVersion.Group, Kind: "SandboxMachineTemplate", Name: name + "-cp"},
				}},
				KubeadmConfigSpec: bootstrapv1.KubeadmConfigSpec{ClusterConfiguration: clusterConfiguration},
			},
		},
	)
	for _, o := range objs {
		if err := c.Create(ctx, o); err != nil {
			return fmt.Errorf("creating %T %s: %w", o, o.GetName(), err)
		}
	}
	cluster := capienv.NewCluster(ns, name, clusterv1.ContractVersionedObjectReference{
		APIGroup: controlplanev1.GroupVersion.Group, Kind: "KubeadmControlPlane", Name: name + "-cp",
	})
	cluster.Spec.ControlPlaneEndpoint = clusterv1.APIEndpoint{}
	cluster.Spec.InfrastructureRef = clusterv1.ContractVersionedObjectReference{APIGroup: infrav1.GroupVersion.Group, Kind: "SandboxCluster", Name: name}
	if err := c.Create(ctx, cluster); err != nil {
		return fmt.Errorf("creating Cluster: %w", err)
	}
	if spec.Workers > 0 {
		if err := s.createWorkers(ctx, ns, name, int32(spec.Workers)); err != nil {
			return err
		}
	}
	return s.createKubeconfig(ctx, cluster)
}

// createKubeconfig creates the kubeconfig Secret of a full-stack cluster. The workload cluster is
// this API server. A user-provided (Opaque) kubeconfig Secret: KCP neither adopts nor rotates it
// (kubeadmcontrolplane helpers.go reconcileKubeconfig), so it keeps the credentials the API server
// trusts instead of ones from the cluster CA KCP generates.
func (s *Sandbox) createKubeconfig(ctx context.Context, cluster *clusterv1.Cluster) error {
	secret := kubeconfig.GenerateSecret(cluster, kubeconfig.FromEnvTestConfig(s.Env.Config, cluster))
	secret.Type = corev1.SecretTypeOpaque
	if err := s.Client.Create(ctx, secret); err != nil {
		return fmt.Errorf("creating the kubeconfig Secret of %s: %w", cluster.Name, err)
	}
	return nil
}

// kubeadmEtcd returns the etcd Secrets of a full-stack cluster and the ClusterConfiguration that
// points kubeadm at its etcd. Stacked: <cluster>-etcd holds the CA and its key (KCP generates the
// other certificates, and its etcd client must trust the sandbox's real members). External: the
// external members are started now; <cluster>-etcd holds the CA certificate only and
// <cluster>-apiserver-etcd-client a client certificate, the two Secrets a user provides for external
// etcd (KCP never generates them: util/secret certificates.go, External certificates).
func (s *Sandbox) kubeadmEtcd(ctx context.Context, spec ClusterSpec, wc *WorkloadCluster, labels map[string]string) ([]client.Object, bootstrapv1.ClusterConfiguration, error) {
	ns, name := spec.Namespace, spec.Name
	if !spec.ExternalEtcd {
		return []client.Object{&corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-etcd", Labels: labels},
			Type:       clusterv1.ClusterSecretType,
			Data:       map[string][]byte{corev1.TLSCertKey: wc.Etcd.caCertPEM, corev1.TLSPrivateKeyKey: wc.Etcd.caKeyPEM},
		}}, bootstrapv1.ClusterConfiguration{}, nil
	}
	for i, member := range ExternalEtcdMembers {
		start := wc.Etcd.Join
		if i == 0 {
			start = wc.Etcd.StartFirst
		}
		if err := start(ctx, member); err != nil {
			return nil, bootstrapv1.ClusterConfiguration{}, fmt.Errorf("starting external etcd member %s: %w", member, err)
		}
	}
	s.Log.Add(wc.LogKey(), "external etcd up: %d members (%v)", len(ExternalEtcdMembers), ExternalEtcdMembers)
	certPEM, keyPEM, err := clientCertificatePEM(wc.Etcd)
	if err != nil {
		return nil, bootstrapv1.ClusterConfiguration{}, err
	}
	var endpoints []string
	for _, member := range ExternalEtcdMembers {
		endpoints = append(endpoints, "https://"+wc.Etcd.Endpoint(member))
	}
	secrets := []client.Object{
		&corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-etcd", Labels: labels},
			Type:       clusterv1.ClusterSecretType,
			Data:       map[string][]byte{corev1.TLSCertKey: wc.Etcd.caCertPEM},
		},
		&corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-apiserver-etcd-client", Labels: labels},
			Type:       clusterv1.ClusterSecretType,
			Data:       map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM},
		},
	}
	return secrets, bootstrapv1.ClusterConfiguration{Etcd: bootstrapv1.Etcd{External: bootstrapv1.ExternalEtcd{
		Endpoints: endpoints, CAFile: externalEtcdCAFile, CertFile: externalEtcdCertFile, KeyFile: externalEtcdKeyFile,
	}}}, nil
}

// clientCertificatePEM issues a client certificate of the etcd cluster's CA, PEM-encoded.
func clientCertificatePEM(ec *EtcdCluster) (certPEM, keyPEM []byte, err error) {
	cert, err := etcdutil.NewClientCertificate(ec.caCertPEM, ec.caKeyPEM, 24*time.Hour)
	if err != nil {
		return nil, nil, fmt.Errorf("issuing the apiserver-etcd-client certificate: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		return nil, nil, fmt.Errorf("encoding the apiserver-etcd-client key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), nil
}

// createWorkers creates a MachineDeployment of kubeadm-bootstrapped sandbox workers: CAPI's
// MachineDeployment and MachineSet reconcilers create the Machines, CABPK their join data.
func (s *Sandbox) createWorkers(ctx context.Context, ns, cluster string, n int32) error {
	labels := map[string]string{clusterv1.ClusterNameLabel: cluster}
	objs := []client.Object{
		&infrav1.SandboxMachineTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: cluster + "-md", Labels: labels}},
		&bootstrapv1.KubeadmConfigTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: cluster + "-md", Labels: labels}},
		&clusterv1.MachineDeployment{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: cluster + "-md", Labels: labels},
			Spec: clusterv1.MachineDeploymentSpec{
				ClusterName: cluster, Replicas: ptr.To(n),
				Selector: metav1.LabelSelector{MatchLabels: map[string]string{"sandbox.capr.io/pool": cluster + "-md"}},
				Template: clusterv1.MachineTemplateSpec{
					ObjectMeta: clusterv1.ObjectMeta{Labels: map[string]string{"sandbox.capr.io/pool": cluster + "-md"}},
					Spec: clusterv1.MachineSpec{
						ClusterName: cluster, Version: KubernetesVersion,
						Bootstrap: clusterv1.Bootstrap{ConfigRef: clusterv1.ContractVersionedObjectReference{
							APIGroup: bootstrapv1.GroupVersion.Group, Kind: "KubeadmConfigTemplate", Name: cluster + "-md"}},
						InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: infrav1.GroupVersion.Group, Kind: "SandboxMachineTemplate", Name: cluster + "-md"},
					},
				},
			},
		},
	}
	for _, o := range objs {
		if err := s.Client.Create(ctx, o); err != nil {
			return fmt.Errorf("creating %T %s: %w", o, o.GetName(), err)
		}
	}
	return nil
}

func apiServerHostPort(hostURL string) (string, int32, error) {
	u, err := url.Parse(hostURL)
	if err != nil {
		return "", 0, fmt.Errorf("parsing the API server URL %q: %w", hostURL, err)
	}
	host, p, err := net.SplitHostPort(u.Host)
	if err != nil {
		return "", 0, fmt.Errorf("parsing the API server address %q: %w", u.Host, err)
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		return "", 0, err
	}
	return host, int32(port), nil
}

// infraMachineFinalizer keeps a SandboxMachine until its machine (kubelet, etcd process) is gone.
const infraMachineFinalizer = "sandbox.capr.io/infra-machine"

// infraMachineReconciler is the sandbox infrastructure provider of the full stack. It follows CAPI's
// infrastructure machine contract and plays the machine the way a kubeadm node would: once the
// Machine's bootstrap data exists it runs `kubeadm init` (first etcd member, kube-system/kubeadm-config)
// or `kubeadm join --control-plane` (etcd member added as a learner, then promoted, as kubeadm ≥ 1.29
// does), registers the Node (named after the etcd member, with providerID, control-plane label and
// taint, kubelet endpoint), renews the Node's Lease, and creates the static-pod mirror Pods. CAPI's
// Machine controller then sets nodeRef and deletes the Node; KCP removes the etcd member.
type infraMachineReconciler struct {
	s *Sandbox
	c client.Client
}

func (r *infraMachineReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	im := &infrav1.SandboxMachine{}
	if err := r.c.Get(ctx, req.NamespacedName, im); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	clusterName := im.Labels[clusterv1.ClusterNameLabel]
	wc := r.s.cluster(im.Namespace, clusterName)
	if wc == nil {
		return ctrl.Result{}, nil
	}
	if !im.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, r.teardown(ctx, wc, im)
	}
	if controllerutil.AddFinalizer(im, infraMachineFinalizer) {
		return ctrl.Result{}, r.c.Update(ctx, im)
	}
	if ptr.Deref(im.Status.Initialization.Provisioned, false) {
		return ctrl.Result{}, nil
	}
	m, err := util.GetOwnerMachine(ctx, r.c, im.ObjectMeta)
	if err != nil {
		return ctrl.Result{}, err
	}
	if m == nil || m.Spec.Bootstrap.DataSecretName == nil {
		return ctrl.Result{RequeueAfter: 500 * time.Millisecond}, nil // waiting for CAPI to link the Machine and the bootstrap data
	}
	if wc.holdProvisioning.Load() {
		return ctrl.Result{RequeueAfter: time.Second}, nil
	}
	data := &corev1.Secret{}
	if err := r.c.Get(ctx, client.ObjectKey{Namespace: m.Namespace, Name: *m.Spec.Bootstrap.DataSecretName}, data); err != nil {
		return ctrl.Result{}, fmt.Errorf("reading the bootstrap data of %s: %w", m.Name, err)
	}
	return ctrl.Result{}, r.provision(ctx, wc, m, im, data.Data["value"])
}

// bootstrapRole is what the bootstrap data asks the machine to do.
type bootstrapRole int

const (
	roleWorker bootstrapRole = iota
	roleInit
	roleJoinControlPlane
)

// roleOf reads the kubeadm command from CABPK's cloud-init (bootstrap/kubeadm/pkg/cloudinit).
func roleOf(m *clusterv1.Machine, value []byte) bootstrapRole {
	switch {
	case bytes.Contains(value, []byte("kubeadm init")):
		return roleInit
	case util.IsControlPlaneMachine(m):
		return roleJoinControlPlane
	default:
		return roleWorker
	}
}

func (r *infraMachineReconciler) provision(ctx context.Context, wc *WorkloadCluster, m *clusterv1.Machine, im *infrav1.SandboxMachine, bootstrapData []byte) error {
	node := m.Name
	role := roleOf(m, bootstrapData)
	if role != roleWorker && !wc.ExternalEtcd && wc.Etcd.Endpoint(node) == "" {
		if role == roleInit {
			if err := wc.Etcd.StartFirst(ctx, node); err != nil {
				return err
			}
			r.s.Log.Add(wc.LogKey(), "kubeadm init on %s: etcd member started (first member)", node)
		} else {
			r.s.Log.Add(wc.LogKey(), "kubeadm join on %s: etcd member joining as a learner", node)
			if err := wc.Etcd.Join(ctx, node); err != nil {
				return err
			}
			r.s.Log.Add(wc.LogKey(), "etcd member %s promoted to voter", node)
		}
	}
	if role == roleInit {
		if err := r.ensureKubeadmConfigMap(ctx); err != nil {
			return err
		}
	}
	host, port := r.s.startKubelet(node, role != roleWorker, wc)
	providerID := "sandbox://" + node
	if err := r.registerNode(ctx, wc, node, providerID, host, port, role != roleWorker); err != nil {
		return err
	}
	if role != roleWorker {
		for _, component := range wc.controlPlaneComponents() {
			if err := setMirrorPod(ctx, r.s.Client, node, component, true); err != nil {
				return err
			}
		}
	}
	base := im.DeepCopy()
	im.Spec.ProviderID = providerID
	if err := r.c.Patch(ctx, im, client.MergeFrom(base)); err != nil {
		return fmt.Errorf("setting providerID of SandboxMachine %s: %w", im.Name, err)
	}
	im.Status.Initialization.Provisioned = ptr.To(true)
	im.Status.Addresses = []clusterv1.MachineAddress{{Type: clusterv1.MachineInternalIP, Address: host}}
	if err := r.c.Status().Patch(ctx, im, client.MergeFrom(base)); err != nil {
		return fmt.Errorf("marking SandboxMachine %s provisioned: %w", im.Name, err)
	}
	r.s.Log.Add(wc.LogKey(), "machine %s up: Node %s registered", m.Name, node)
	return nil
}

// controlPlaneComponents are the static pods of the cluster's control-plane nodes: no etcd with
// external etcd (kubeadm runs none).
func (wc *WorkloadCluster) controlPlaneComponents() []string {
	if !wc.ExternalEtcd {
		return controlPlaneComponents
	}
	var out []string
	for _, c := range controlPlaneComponents {
		if c != "etcd" {
			out = append(out, c)
		}
	}
	return out
}

// ensureKubeadmConfigMap creates kube-system/kubeadm-config as `kubeadm init` does; KCP reads its
// existence as "the control plane is initialized" (kubeadmcontrolplane status.go).
func (r *infraMachineReconciler) ensureKubeadmConfigMap(ctx context.Context) error {
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: "kubeadm-config"},
		Data: map[string]string{"ClusterConfiguration": "apiVersion: kubeadm.k8s.io/v1beta4\nkind: ClusterConfiguration\n" +
			"kubernetesVersion: " + KubernetesVersion + "\n"},
	}
	if err := r.c.Create(ctx, cm); err != nil && !isAlreadyExists(err) {
		return fmt.Errorf("creating kube-system/kubeadm-config: %w", err)
	}
	return nil
}

// startKubelet starts the node's kubelet stand-in (once) and its Lease heartbeat.
func (s *Sandbox) startKubelet(node string, controlPlane bool, wc *WorkloadCluster) (string, int32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k, ok := s.kubelets[node]
	if !ok {
		if controlPlane {
			k = StartControlPlaneKubelet(wc.Etcd.Endpoint(node), s.apiServerCert.Address())
		} else {
			k = StartKubelet("")
		}
		k.startHeartbeat(s.Client, node)
		s.kubelets[node] = k
	}
	return k.Address()
}

func (r *infraMachineReconciler) registerNode(ctx context.Context, wc *WorkloadCluster, node, providerID, host string, port int32, controlPlane bool) error {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: node, Labels: map[string]string{"sandbox.capr.io/cluster": wc.Name, corev1.LabelHostname: node}},
		Spec:       corev1.NodeSpec{ProviderID: providerID},
	}
	if controlPlane {
		n.Labels["node-role.kubernetes.io/control-plane"] = ""
		n.Spec.Taints = []corev1.Taint{{Key: "node-role.kubernetes.io/control-plane", Effect: corev1.TaintEffectNoSchedule}}
	}
	// The direct client: reads right after writes must not come from a lagging cache.
	c := r.s.Client
	if err := c.Create(ctx, n); err != nil && !isAlreadyExists(err) {
		return fmt.Errorf("registering Node %s: %w", node, err)
	}
	if err := c.Get(ctx, client.ObjectKey{Name: node}, n); err != nil {
		return err
	}
	base := n.DeepCopy()
	now := metav1.Now()
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: host}, {Type: corev1.NodeHostName, Address: host}} // the API server dials the kubelet at the first address type it prefers, Hostname first
	n.Status.DaemonEndpoints = corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: port}}
	n.Status.NodeInfo = corev1.NodeSystemInfo{KubeletVersion: KubernetesVersion, KubeProxyVersion: KubernetesVersion, OperatingSystem: "linux", Architecture: "amd64"}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastTransitionTime: now, LastHeartbeatTime: now}}
	if err := c.Status().Patch(ctx, n, client.MergeFrom(base)); err != nil {
		return fmt.Errorf("setting Node %s status: %w", node, err)
	}
	return nil
}

// setMirrorPod creates or updates the mirror Pod of a static pod, Running and Ready when up (c must
// read its own writes: not a cached client).
func setMirrorPod(ctx context.Context, c client.Client, node, component string, up bool) error {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: metav1.NamespaceSystem, Name: component + "-" + node,
			Labels:      map[string]string{"tier": "control-plane", "component": component},
			Annotations: map[string]string{corev1.MirrorPodAnnotationKey: "sandbox"},
		},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: component, Image: "registry.k8s.io/" + component + ":" + KubernetesVersion}}},
	}
	if err := c.Create(ctx, pod); err != nil && !isAlreadyExists(err) {
		return fmt.Errorf("creating mirror Pod %s: %w", pod.Name, err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
		return err
	}
	base := pod.DeepCopy()
	now := metav1.Now()
	ready := corev1.ConditionTrue
	state := corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}
	if !up {
		ready = corev1.ConditionFalse
		state = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: "the process exited"}}
	}
	pod.Status.Phase = corev1.PodRunning
	pod.Status.Conditions = []corev1.PodCondition{
		{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.PodReady, Status: ready, LastTransitionTime: now},
	}
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: component, Ready: up, State: state, Image: pod.Spec.Containers[0].Image}}
	if err := c.Status().Patch(ctx, pod, client.MergeFrom(base)); err != nil {
		return fmt.Errorf("setting mirror Pod %s status: %w", pod.Name, err)
	}
	return nil
}

// teardown is the machine going away after CAPI's Machine controller drained it and KCP removed its
// etcd member: `kubeadm reset` (remove the member if still there), processes stopped.
func (r *infraMachineReconciler) teardown(ctx context.Context, wc *WorkloadCluster, im *infrav1.SandboxMachine) error {
	if !controllerutil.ContainsFinalizer(im, infraMachineFinalizer) {
		return nil
	}
	node := im.Name
	r.s.powerOff(ctx, wc, node, true)
	for _, component := range controlPlaneComponents {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: component + "-" + node}}
		if err := r.c.Delete(ctx, pod); err != nil && !isNotFound(err) {
			return fmt.Errorf("deleting mirror Pod %s: %w", pod.Name, err)
		}
	}
	controllerutil.RemoveFinalizer(im, infraMachineFinalizer)
	if err := r.c.Update(ctx, im); err != nil {
		return err
	}
	r.s.Log.Add(wc.LogKey(), "machine %s gone (kubelet and etcd process stopped)", node)
	return nil
}

// nodeLease is the Node's heartbeat in kube-node-lease, as the kubelet renews it.
func nodeLease(node string) *coordinationv1.Lease {
	return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: corev1.NamespaceNodeLease, Name: node}}
}
