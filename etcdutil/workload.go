package etcdutil

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/clustercache"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// EndpointsAnnotation on a Cluster switches CAPR to direct etcd endpoints (external etcd, or any
// setup where the etcd-<node> pods cannot be port-forwarded to). Its value is a JSON object mapping
// each member name (the Node name for stacked etcd) to host:port. Anyone who may annotate a Cluster
// could point CAPR's etcd client, with the cluster's client certificate, at any address, so the
// manager honours it only with AllowEndpointsFlag (Workload.AllowEndpointsAnnotation).
const EndpointsAnnotation = "remediation.cluster.x-k8s.io/etcd-endpoints"

// AllowEndpointsFlag is the manager flag that makes CAPR dial the addresses of EndpointsAnnotation.
const AllowEndpointsFlag = "--allow-etcd-endpoints-annotation"

// EventEndpointsIgnored is the Warning event reason on a Cluster whose EndpointsAnnotation the
// manager ignores because AllowEndpointsFlag is off.
const EventEndpointsIgnored = "EtcdEndpointsAnnotationIgnored"

// EndpointsFromAnnotation parses the value of EndpointsAnnotation: a JSON object of member name to
// host:port, with a non-empty host and a port in 1-65535 (net.SplitHostPort; IPv6 as [addr]:port).
// An error names the annotation and the member.
func EndpointsFromAnnotation(value string) (map[string]string, error) {
	endpoints := map[string]string{}
	if err := json.Unmarshal([]byte(value), &endpoints); err != nil {
		return nil, fmt.Errorf("annotation %s is not a JSON object of member name to host:port: %w", EndpointsAnnotation, err)
	}
	if len(endpoints) == 0 {
		return nil, fmt.Errorf("annotation %s names no member", EndpointsAnnotation)
	}
	for name, addr := range endpoints {
		if name == "" {
			return nil, fmt.Errorf("annotation %s has an empty member name", EndpointsAnnotation)
		}
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, fmt.Errorf("annotation %s, member %q: %q is not host:port: %w", EndpointsAnnotation, name, addr, err)
		}
		if host == "" {
			return nil, fmt.Errorf("annotation %s, member %q: %q has no host", EndpointsAnnotation, name, addr)
		}
		if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
			return nil, fmt.Errorf("annotation %s, member %q: %q has no port in 1-65535", EndpointsAnnotation, name, addr)
		}
	}
	return endpoints, nil
}

// EndpointsDecision is what CAPR does with a Cluster's EndpointsAnnotation.
type EndpointsDecision struct {
	// Endpoints are the addresses to dial; nil to reach etcd through the API server (port-forward).
	Endpoints map[string]string
	// Ignored, when set, says that the annotation is present but not honoured, and why.
	Ignored string
}

// DecideEndpoints decides from a Cluster's annotations and the manager's AllowEndpointsFlag: without
// the annotation, or with the flag off, etcd is reached through the API server, and an annotation
// present but not honoured is said in Ignored; with both, the annotation must parse.
func DecideEndpoints(cluster *clusterv1.Cluster, allow bool) (EndpointsDecision, error) {
	v, ok := cluster.Annotations[EndpointsAnnotation]
	switch {
	case !ok:
		return EndpointsDecision{}, nil
	case !allow:
		return EndpointsDecision{Ignored: fmt.Sprintf("annotation %s on Cluster %s is ignored: the manager dials its addresses only when started with %s; etcd is reached through the API server",
			EndpointsAnnotation, cluster.Name, AllowEndpointsFlag)}, nil
	}
	endpoints, err := EndpointsFromAnnotation(v)
	if err != nil {
		return EndpointsDecision{}, fmt.Errorf("cluster %s: %w", cluster.Name, err)
	}
	return EndpointsDecision{Endpoints: endpoints}, nil
}

// clientCertValidity and clientCertRenewAfter bound the life of the client certificates CAPR signs.
// secretRecheck is how long a cluster's etcd CA secret is trusted before it is read again (a rotated
// CA is picked up within it); idleAfter is how long a cluster's clients and certificate are kept
// without use (the health checker uses them every few seconds while the cluster exists).
const (
	clientCertValidity   = 24 * time.Hour
	clientCertRenewAfter = 12 * time.Hour
	secretRecheck        = time.Minute
	idleAfter            = 10 * time.Minute
)

// The Secrets of a workload cluster (<cluster>-kubeconfig, read by CAPI's ClusterCache, and
// <cluster>-etcd or <cluster>-apiserver-etcd-client, read here) are only ever read by name, never
// listed or watched (controllers.SetupWithManager gives the ClusterCache an uncached reader). Their
// one rule is therefore a role of its own, config/rbac/secret_reader, which an installation binds
// cluster-wide (the default) or only in the namespaces of its Clusters.
// +kubebuilder:rbac:groups=core,resources=secrets,verbs=get

// Workload builds etcd access for a workload cluster: port-forward through its API server (REST
// config from CAPI's ClusterCache), or the direct endpoints of EndpointsAnnotation; client
// certificates are signed with the CA in secret <cluster>-etcd (or, without a CA key, taken from
// secret <cluster>-apiserver-etcd-client), as KCP does.
type Workload struct {
	// SecretReader reads the cluster's secrets (uncached: CAPI's cache holds only kubeconfigs).
	SecretReader client.Reader
	ClusterCache clustercache.ClusterCache
	DialTimeout  time.Duration
	CallTimeout  time.Duration
	// AllowEndpointsAnnotation honours EndpointsAnnotation (AllowEndpointsFlag; off by default).
	AllowEndpointsAnnotation bool
	// Recorder, when set, receives a Warning event EventEndpointsIgnored on a Cluster whose
	// annotation is ignored.
	Recorder events.EventRecorder

	mu    sync.Mutex
	certs map[types.UID]*cachedTLS
	// ignored is the EndpointsAnnotation value last reported as ignored, by Cluster.
	ignored   map[types.UID]string
	clients   ClientCache
	lastSweep time.Time
	// now is time.Now, replaceable in tests.
	now func() time.Time
}

type cachedTLS struct {
	// resourceVersion and caHash identify the CA secret the certificate was signed from; checked is
	// when the secret was last read; used is when the entry was last used.
	resourceVersion string
	caHash          [32]byte
	created         time.Time
	checked         time.Time
	used            time.Time
	config          *tls.Config
}

func (w *Workload) clock() time.Time {
	if w.now != nil {
		return w.now()
	}
	return time.Now()
}

// Forget drops everything kept for a cluster (its certificate and its connected clients): call it
// when the Cluster is deleted. Entries of clusters nobody asks for are dropped after idleAfter anyway.
func (w *Workload) Forget(cluster types.UID) {
	w.mu.Lock()
	delete(w.certs, cluster)
	delete(w.ignored, cluster)
	w.mu.Unlock()
	w.clients.Forget(string(cluster))
}

// Retain closes the cached clients of a cluster for nodes not in nodes (their Machines are gone).
func (w *Workload) Retain(cluster types.UID, nodes []string) {
	w.clients.Retain(string(cluster), nodes)
}

// sweep drops the certificates and clients not used for idleAfter, at most once a minute.
func (w *Workload) sweep() {
	now := w.clock()
	w.mu.Lock()
	if now.Sub(w.lastSweep) < time.Minute {
		w.mu.Unlock()
		return
	}
	w.lastSweep = now
	for uid, c := range w.certs {
		if now.Sub(c.used) > idleAfter {
			delete(w.certs, uid)
		}
	}
	w.mu.Unlock()
	w.clients.sweepBefore(now.Add(-idleAfter))
}

// connectorGeneration tells cached clients built for another TLS configuration or address apart.
type connectorGeneration struct {
	tls  *tls.Config
	addr string
}

// ForCluster returns an etcdutil.Cluster for a CAPI Cluster. Its clients are shared with every other
// Cluster returned for the same CAPI Cluster (one connection per member, reused until it fails, its
// certificate or address changes, or it is idle for idleAfter).
func (w *Workload) ForCluster(ctx context.Context, cluster *clusterv1.Cluster) (*Cluster, error) {
	w.sweep()
	tlsConfig, err := w.tlsFor(ctx, cluster)
	if err != nil {
		return nil, err
	}
	scope := string(cluster.UID)
	decision, err := DecideEndpoints(cluster, w.AllowEndpointsAnnotation)
	if err != nil {
		return nil, err
	}
	if decision.Ignored != "" {
		w.reportIgnored(ctx, cluster, decision.Ignored)
	}
	if decision.Endpoints != nil {
		direct := &Direct{Endpoints: decision.Endpoints, TLS: tlsConfig, DialTimeout: w.DialTimeout}
		return &Cluster{Connector: w.clients.For(scope, connectorGeneration{tls: tlsConfig, addr: cluster.Annotations[EndpointsAnnotation]}, direct), CallTimeout: w.CallTimeout}, nil
	}
	restConfig, err := w.ClusterCache.GetRESTConfig(ctx, client.ObjectKeyFromObject(cluster))
	if err != nil {
		return nil, fmt.Errorf("workload cluster %s cannot be reached: %w", cluster.Name, err)
	}
	pf := &PortForward{RESTConfig: restConfig, TLS: tlsConfig, DialTimeout: w.DialTimeout}
	return &Cluster{Connector: w.clients.For(scope, connectorGeneration{tls: tlsConfig, addr: restConfig.Host}, pf), CallTimeout: w.CallTimeout}, nil
}

// reportIgnored says once per Cluster and annotation value that the annotation is ignored: etcd is
// read every few seconds, and the same Warning each time would only repeat itself.
func (w *Workload) reportIgnored(ctx context.Context, cluster *clusterv1.Cluster, msg string) {
	value := cluster.Annotations[EndpointsAnnotation]
	w.mu.Lock()
	if w.ignored == nil {
		w.ignored = map[types.UID]string{}
	}
	seen, ok := w.ignored[cluster.UID]
	w.ignored[cluster.UID] = value
	w.mu.Unlock()
	if ok && seen == value {
		return
	}
	ctrl.LoggerFrom(ctx).Info("Ignoring the etcd endpoints annotation", "cluster", klog.KObj(cluster), "reason", msg)
	if w.Recorder != nil {
		w.Recorder.Eventf(cluster, nil, corev1.EventTypeWarning, EventEndpointsIgnored, "ConnectEtcd", "%s", msg)
	}
}

// tlsFor returns the cluster's client TLS configuration. The CA secret is read at most once per
// secretRecheck; the certificate is signed again only when the secret's resourceVersion (and CA)
// changed or the certificate is due for renewal.
func (w *Workload) tlsFor(ctx context.Context, cluster *clusterv1.Cluster) (*tls.Config, error) {
	now := w.clock()
	w.mu.Lock()
	cached := w.certs[cluster.UID]
	if cached != nil && now.Sub(cached.checked) < secretRecheck && now.Sub(cached.created) < clientCertRenewAfter {
		cached.used = now
		w.mu.Unlock()
		return cached.config, nil
	}
	w.mu.Unlock()

	ca := &corev1.Secret{}
	name := cluster.Name + "-etcd"
	if err := w.SecretReader.Get(ctx, client.ObjectKey{Namespace: cluster.Namespace, Name: name}, ca); err != nil {
		return nil, fmt.Errorf("reading etcd CA secret %s/%s: %w", cluster.Namespace, name, err)
	}
	caCert, caKey := ca.Data[corev1.TLSCertKey], ca.Data[corev1.TLSPrivateKeyKey]
	if len(caCert) == 0 {
		return nil, fmt.Errorf("etcd CA secret %s/%s has no %s", cluster.Namespace, name, corev1.TLSCertKey)
	}
	hash := sha256.Sum256(append(append([]byte{}, caCert...), caKey...))

	w.mu.Lock()
	if w.certs == nil {
		w.certs = map[types.UID]*cachedTLS{}
	}
	if c, ok := w.certs[cluster.UID]; ok && c.resourceVersion == ca.ResourceVersion && c.caHash == hash && now.Sub(c.created) < clientCertRenewAfter {
		c.checked, c.used = now, now
		w.mu.Unlock()
		return c.config, nil
	}
	w.mu.Unlock()

	var cert tls.Certificate
	var err error
	if len(caKey) > 0 {
		cert, err = NewClientCertificate(caCert, caKey, clientCertValidity)
	} else {
		// External etcd: CAPR cannot sign, it uses the API server's etcd client certificate.
		clientSecret := &corev1.Secret{}
		cname := cluster.Name + "-apiserver-etcd-client"
		if gerr := w.SecretReader.Get(ctx, client.ObjectKey{Namespace: cluster.Namespace, Name: cname}, clientSecret); gerr != nil {
			return nil, fmt.Errorf("etcd CA secret %s has no key and client secret %s cannot be read: %w", name, cname, gerr)
		}
		cert, err = tls.X509KeyPair(clientSecret.Data[corev1.TLSCertKey], clientSecret.Data[corev1.TLSPrivateKeyKey])
	}
	if err != nil {
		return nil, fmt.Errorf("etcd client certificate for cluster %s: %w", cluster.Name, err)
	}
	config, err := TLSConfig(caCert, cert)
	if err != nil {
		return nil, fmt.Errorf("etcd TLS configuration for cluster %s: %w", cluster.Name, err)
	}
	w.mu.Lock()
	w.certs[cluster.UID] = &cachedTLS{resourceVersion: ca.ResourceVersion, caHash: hash, created: now, checked: now, used: now, config: config}
	w.mu.Unlock()
	return config, nil
}
