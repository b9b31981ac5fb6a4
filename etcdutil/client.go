package etcdutil

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/logutil"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
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
// exactly one endpoint, so that a call is known to have been answered by that member. The caller
// closes the client, unless the Connector is a SharedConnector.
type Connector interface {
	Connect(ctx context.Context, node string) (*clientv3.Client, error)
}

// MetricsConnector is a Connector that also reads a member's Prometheus metrics: GET /metrics on its
// client port, which etcd serves there next to gRPC over the same TLS listener (embed.Etcd.serveClients,
// etcdhttp.HandleMetrics; --listen-metrics-urls only adds listeners). It goes the same way as Connect
// (the node's port-forward tunnel or the direct endpoint, the same TLS configuration), so it reaches
// exactly the members Connect reaches. What the leader receives from each follower
// (etcd_network_peer_received_bytes_total) is only there: no gRPC call reports it.
type MetricsConnector interface {
	Connector
	// Metrics returns the body of the member's /metrics (Prometheus text format), at most
	// maxMetricsBytes.
	Metrics(ctx context.Context, node string) ([]byte, error)
}

// SharedConnector is a Connector whose clients are shared between calls (Workload's client cache):
// callers never close them, and hand back a client whose call failed with Discard, which closes it and
// makes the next Connect dial again.
type SharedConnector interface {
	Connector
	Discard(node string, cli *clientv3.Client)
}

// PortForward reaches the member on a node the way KCP does: through the workload cluster's API
// server, port-forwarding to pod kube-system/etcd-<node> port 2379. It therefore depends on that
// node's kubelet; a node whose kubelet is down has an unreachable member even if etcd runs (Inspect
// then asks the leader what it receives from it: markAlive).
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
	dial, err := p.dialer(node)
	if err != nil {
		return nil, err
	}
	return newClient(ctx, PodName(node), p.TLS, orDuration(p.DialTimeout, DefaultDialTimeout), dial)
}

// Metrics implements MetricsConnector, through a tunnel of its own to the node's etcd pod.
func (p *PortForward) Metrics(ctx context.Context, node string) ([]byte, error) {
	dial, err := p.dialer(node)
	if err != nil {
		return nil, err
	}
	return getMetrics(ctx, PodName(node)+":"+strconv.Itoa(EtcdPort), p.TLS, orDuration(p.DialTimeout, DefaultDialTimeout), dial)
}

// dialer returns a dial function that opens a port-forward tunnel to the etcd pod of node.
func (p *PortForward) dialer(node string) (func(context.Context, string) (net.Conn, error), error) {
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
	return func(ctx context.Context, _ string) (net.Conn, error) {
		return dialer.DialContextWithAddr(ctx, pod)
	}, nil
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

// Metrics implements MetricsConnector.
func (d *Direct) Metrics(ctx context.Context, node string) ([]byte, error) {
	ep, ok := d.Endpoints[node]
	if !ok {
		return nil, fmt.Errorf("no etcd endpoint known for node %s", node)
	}
	return getMetrics(ctx, ep, d.TLS, orDuration(d.DialTimeout, DefaultDialTimeout), nil)
}

// maxMetricsBytes bounds the metrics read from one member: etcd's are a few hundred kB.
const maxMetricsBytes = 16 << 20

// getMetrics GETs /metrics from the member at hostPort (the URL's host; dial, when set, makes the
// connection instead), over TLS when tlsConfig is set, as the etcd client does. One connection per
// call, closed after it: metrics are read only while a member cannot be reached, and an idle tunnel
// would hold a port-forward stream open through the API server.
func getMetrics(ctx context.Context, hostPort string, tlsConfig *tls.Config, dialTimeout time.Duration,
	dial func(context.Context, string) (net.Conn, error)) ([]byte, error) {
	scheme := "http"
	if tlsConfig != nil {
		scheme = "https"
	}
	transport := &http.Transport{TLSClientConfig: tlsConfig, DisableKeepAlives: true, TLSHandshakeTimeout: dialTimeout}
	transport.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		ctx, cancel := context.WithTimeoutCause(ctx, dialTimeout, errors.New("etcd dial timeout expired"))
		defer cancel()
		if dial != nil {
			return dial(ctx, addr)
		}
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
	defer transport.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, scheme+"://"+hostPort+"/metrics", nil)
	if err != nil {
		return nil, fmt.Errorf("etcd metrics request for %s: %w", hostPort, err)
	}
	// The text format: what the parser reads (promhttp negotiates it from Accept).
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := (&http.Client{Transport: transport}).Do(req)
	if err != nil {
		return nil, fmt.Errorf("reading etcd metrics at %s: %w", hostPort, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("reading etcd metrics at %s: %s", hostPort, resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxMetricsBytes+1))
	if err != nil {
		return nil, fmt.Errorf("reading etcd metrics at %s: %w", hostPort, err)
	}
	if len(body) > maxMetricsBytes {
		return nil, fmt.Errorf("etcd metrics at %s exceed %d bytes", hostPort, maxMetricsBytes)
	}
	return body, nil
}

// etcdLogger is the etcd client's logger: etcd's own default zap configuration
// (go.etcd.io/etcd/client/pkg/v3/logutil, the one KCP uses for its etcd clients) at error level, so
// that client errors are logged (JSON on stderr) without the client's info chatter.
var etcdLogger = sync.OnceValue(func() *zap.Logger {
	lg, err := logutil.CreateDefaultZapLogger(zapcore.ErrorLevel)
	if err != nil {
		// The default configuration is static; building it does not fail in practice.
		return zap.NewExample()
	}
	return lg.Named("etcd-client")
})

// newClient creates a client with one endpoint and waits, at most dialTimeout, until its connection is
// ready. clientv3 dials in the background (no grpc.WithBlock, which gRPC deprecates) and etcd's calls
// wait for a ready connection (WaitForReady), so without this wait an unreachable member would only
// show as a call timeout; here it is a dial error within the dial timeout.
func newClient(ctx context.Context, endpoint string, tlsConfig *tls.Config, dialTimeout time.Duration,
	dial func(context.Context, string) (net.Conn, error)) (*clientv3.Client, error) {
	cfg := clientv3.Config{
		Endpoints:            []string{endpoint},
		DialTimeout:          dialTimeout,
		TLS:                  tlsConfig,
		Logger:               etcdLogger(),
		DialKeepAliveTime:    10 * time.Second,
		DialKeepAliveTimeout: 5 * time.Second,
	}
	if dial != nil {
		cfg.DialOptions = append(cfg.DialOptions, grpc.WithContextDialer(dial))
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating etcd client for %s: %w", endpoint, err)
	}
	if err := waitReady(ctx, cli, dialTimeout); err != nil {
		_ = cli.Close()
		return nil, fmt.Errorf("connecting to etcd at %s: %w", endpoint, err)
	}
	return cli, nil
}

// refusedGrace is how long waitReady keeps retrying a member whose connection attempts fail before it
// gives up on it, well within any dial timeout.
const refusedGrace = time.Second

// retryTick is how often waitReady asks gRPC to retry a failed connection at once.
const retryTick = 100 * time.Millisecond

// errRefused is the cause of a dial given up because every connection attempt failed.
var errRefused = errors.New("every connection attempt failed")

// waitReady waits until the client's connection is ready, at most timeout. A member whose connection
// attempts fail (its etcd process is dead: the node, or the kubelet behind the port-forward, refuses
// the connection at once) is given up after refusedGrace instead of the whole dial timeout: the
// health check's and the order decision's inspections waited that long for a dead member
// (3 s on the sandbox, 10 s by default, before each order decision with a dead member). gRPC reports
// a failed attempt as TRANSIENT_FAILURE and keeps the connection in that state until an attempt
// succeeds, retrying after a backoff of 1 s and more; here a failing connection is retried at once
// every retryTick (ResetConnectBackoff), so a member that comes back within refusedGrace, or that
// failed one attempt by chance, is still reached. A member that does not answer at all (its node is
// down, a black hole) still takes the dial timeout: no attempt fails then.
func waitReady(ctx context.Context, cli *clientv3.Client, timeout time.Duration) error {
	ctx, cancel := context.WithTimeoutCause(ctx, timeout, errors.New("etcd dial timeout expired"))
	defer cancel()
	conn := cli.ActiveConnection()
	conn.Connect()
	var failingSince time.Time
	for {
		state := conn.GetState()
		switch state {
		case connectivity.Ready:
			return nil
		case connectivity.TransientFailure:
			if failingSince.IsZero() {
				failingSince = time.Now()
			}
			if time.Since(failingSince) >= refusedGrace {
				return fmt.Errorf("connection %s for %s: %w", state, refusedGrace, errRefused)
			}
			conn.ResetConnectBackoff()
		}
		tick, stop := context.WithTimeout(ctx, retryTick)
		conn.WaitForStateChange(tick, state)
		stop()
		if ctx.Err() != nil {
			return fmt.Errorf("connection %s: %w", conn.GetState(), context.Cause(ctx))
		}
	}
}

func orDuration(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}
