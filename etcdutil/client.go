package etcdutil

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/cluster-api/controlplane/kubeadm/pkg/proxy"
)

// Defaults for etcd access, the same as KCP's.
const (
	DefaultDialTimeout = 10 * time.Second
	DefaultCallTimeout = 15 * time.Second
	// EtcdPort is the etcd client port in the etcd-<node> static pod.
	EtcdPort = 2379
)

// Connector opens a client to the etcd member running on one node. Every client it returns has
// exactly one endpoint, so that a call is known to have been answered by that member.
type Connector interface {
	Connect(ctx context.Context, node string) (*clientv3.Client, error)
}

// PortForward reaches the member on a node the way KCP does: through the workload cluster's API
// server, port-forwarding to pod kube-system/etcd-<node> port 2379. It therefore depends on that
// node's kubelet; a node whose kubelet is down has an unreachable member even if etcd runs.
type PortForward struct {
	// RESTConfig is the workload cluster's API server.
	RESTConfig *rest.Config
	// TLS holds the client certificate and the CA check (see TLSConfig).
	TLS *tls.Config
	// DialTimeout bounds establishing the tunnel and the gRPC connection.
	DialTimeout time.Duration
}

// PodName is the name of the etcd static pod on a node (kubeadm's convention).
func PodName(node string) string { return "etcd-" + node }

// Connect implements Connector.
func (p *PortForward) Connect(ctx context.Context, node string) (*clientv3.Client, error) {
	timeout := orDuration(p.DialTimeout, DefaultDialTimeout)
	dialer, err := proxy.NewDialer(proxy.Proxy{
		Kind:       "pods",
		Namespace:  "kube-system",
		KubeConfig: rest.CopyConfig(p.RESTConfig),
		Port:       EtcdPort,
	})
	if err != nil {
		return nil, fmt.Errorf("creating port-forward dialer for node %s: %w", node, err)
	}
	pod := PodName(node)
	return newClient(ctx, pod, p.TLS, timeout, func(ctx context.Context, _ string) (net.Conn, error) {
		return dialer.DialContextWithAddr(ctx, pod)
	})
}

// Direct reaches members at known client URLs (external etcd, tests). Endpoints maps node (member)
// name to a host:port.
type Direct struct {
	Endpoints   map[string]string
	TLS         *tls.Config
	DialTimeout time.Duration
}

// Connect implements Connector.
func (d *Direct) Connect(ctx context.Context, node string) (*clientv3.Client, error) {
	ep, ok := d.Endpoints[node]
	if !ok {
		return nil, fmt.Errorf("no etcd endpoint known for node %s", node)
	}
	return newClient(ctx, ep, d.TLS, orDuration(d.DialTimeout, DefaultDialTimeout), nil)
}

func newClient(ctx context.Context, endpoint string, tlsConfig *tls.Config, dialTimeout time.Duration,
	dial func(context.Context, string) (net.Conn, error)) (*clientv3.Client, error) {
	cfg := clientv3.Config{
		Context:     ctx,
		Endpoints:   []string{endpoint},
		DialTimeout: dialTimeout,
		TLS:         tlsConfig,
		Logger:      zap.NewNop(),
		// Fail fast instead of waiting for a connection that will not come.
		DialOptions:          []grpc.DialOption{grpc.WithBlock()}, //nolint:staticcheck // a blocking dial bounded by DialTimeout is what we want here.
		DialKeepAliveTime:    10 * time.Second,
		DialKeepAliveTimeout: 5 * time.Second,
	}
	if dial != nil {
		cfg.DialOptions = append(cfg.DialOptions, grpc.WithContextDialer(dial))
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("connecting to etcd at %s: %w", endpoint, err)
	}
	return cli, nil
}

func orDuration(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}
