package etcdutil

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/clustercache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// EndpointsAnnotation on a Cluster switches CAPR to direct etcd endpoints (external etcd, or any
// setup where the etcd-<node> pods cannot be port-forwarded to). Its value is a JSON object mapping
// each member name (the Node name for stacked etcd) to host:port.
const EndpointsAnnotation = "remediation.cluster.x-k8s.io/etcd-endpoints"

// clientCertValidity and clientCertRenewAfter bound the life of the client certificates CAPR signs.
const (
	clientCertValidity   = 24 * time.Hour
	clientCertRenewAfter = 12 * time.Hour
)

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

	mu    sync.Mutex
	certs map[types.UID]cachedTLS
}

type cachedTLS struct {
	caHash  [32]byte
	created time.Time
	config  *tls.Config
}

// ForCluster returns an etcdutil.Cluster for a CAPI Cluster.
func (w *Workload) ForCluster(ctx context.Context, cluster *clusterv1.Cluster) (*Cluster, error) {
	tlsConfig, err := w.tlsFor(ctx, cluster)
	if err != nil {
		return nil, err
	}
	if v, ok := cluster.Annotations[EndpointsAnnotation]; ok {
		endpoints := map[string]string{}
		if err := json.Unmarshal([]byte(v), &endpoints); err != nil {
			return nil, fmt.Errorf("annotation %s on Cluster %s is not a JSON object of member name to host:port: %w", EndpointsAnnotation, cluster.Name, err)
		}
		return &Cluster{Connector: &Direct{Endpoints: endpoints, TLS: tlsConfig, DialTimeout: w.DialTimeout}, CallTimeout: w.CallTimeout}, nil
	}
	restConfig, err := w.ClusterCache.GetRESTConfig(ctx, client.ObjectKeyFromObject(cluster))
	if err != nil {
		return nil, fmt.Errorf("workload cluster %s cannot be reached: %w", cluster.Name, err)
	}
	return &Cluster{Connector: &PortForward{RESTConfig: restConfig, TLS: tlsConfig, DialTimeout: w.DialTimeout}, CallTimeout: w.CallTimeout}, nil
}

func (w *Workload) tlsFor(ctx context.Context, cluster *clusterv1.Cluster) (*tls.Config, error) {
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
	defer w.mu.Unlock()
	if w.certs == nil {
		w.certs = map[types.UID]cachedTLS{}
	}
	if c, ok := w.certs[cluster.UID]; ok && c.caHash == hash && time.Since(c.created) < clientCertRenewAfter {
		return c.config, nil
	}
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
		return nil, err
	}
	w.certs[cluster.UID] = cachedTLS{caHash: hash, created: time.Now(), config: config}
	return config, nil
}
