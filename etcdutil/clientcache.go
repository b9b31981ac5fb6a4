package etcdutil

import (
	"context"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// ClientCache shares connected etcd clients between calls, keyed by scope (a workload cluster) and
// node, so that the health checker's periodic inspections reuse one connection (one port-forward
// tunnel) per member instead of dialling N+1 times every check. A client whose call failed is closed
// and dropped (SharedConnector.Discard); a client not used for a while is closed by Sweep; a scope's
// clients are closed by Forget and Retain. The zero value is ready to use.
type ClientCache struct {
	mu      sync.Mutex
	entries map[clientKey]*cachedClient
	// now is time.Now, replaceable in tests.
	now func() time.Time
}

type clientKey struct {
	scope string
	node  string
}

type cachedClient struct {
	cli *clientv3.Client
	// generation identifies how the client was built (TLS configuration, endpoint): a client built
	// with an older one is replaced.
	generation any
	lastUsed   time.Time
}

func (cc *ClientCache) clock() time.Time {
	if cc.now != nil {
		return cc.now()
	}
	return time.Now()
}

// For returns a SharedConnector over inner whose clients are cached under scope. generation must be
// comparable; clients cached under another generation of the same scope and node are replaced. It is
// also a MetricsConnector, which reads through inner when inner is one.
func (cc *ClientCache) For(scope string, generation any, inner Connector) SharedConnector {
	return &cachedConnector{cache: cc, scope: scope, generation: generation, inner: inner}
}

// Forget closes and drops every client of scope (its cluster is gone).
func (cc *ClientCache) Forget(scope string) {
	cc.drop(func(k clientKey, _ *cachedClient) bool { return k.scope == scope })
}

// Retain closes and drops the clients of scope whose node is not in nodes (their Machines are gone).
func (cc *ClientCache) Retain(scope string, nodes []string) {
	keep := map[string]bool{}
	for _, n := range nodes {
		keep[n] = true
	}
	cc.drop(func(k clientKey, _ *cachedClient) bool { return k.scope == scope && !keep[k.node] })
}

// Sweep closes and drops the clients not used for idle.
func (cc *ClientCache) Sweep(idle time.Duration) {
	cc.sweepBefore(cc.clock().Add(-idle))
}

func (cc *ClientCache) sweepBefore(cutoff time.Time) {
	cc.drop(func(_ clientKey, c *cachedClient) bool { return c.lastUsed.Before(cutoff) })
}

// Len is the number of cached clients.
func (cc *ClientCache) Len() int {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return len(cc.entries)
}

func (cc *ClientCache) drop(match func(clientKey, *cachedClient) bool) {
	cc.mu.Lock()
	var closing []*clientv3.Client
	for k, c := range cc.entries {
		if match(k, c) {
			closing = append(closing, c.cli)
			delete(cc.entries, k)
		}
	}
	cc.mu.Unlock()
	for _, cli := range closing {
		_ = cli.Close()
	}
}

type cachedConnector struct {
	cache      *ClientCache
	scope      string
	generation any
	inner      Connector
}

// Connect implements Connector: the cached client of the node, or a new one (then cached).
func (c *cachedConnector) Connect(ctx context.Context, node string) (*clientv3.Client, error) {
	key := clientKey{scope: c.scope, node: node}
	cc := c.cache
	cc.mu.Lock()
	if e, ok := cc.entries[key]; ok {
		if e.generation == c.generation {
			e.lastUsed = cc.clock()
			cc.mu.Unlock()
			return e.cli, nil
		}
		delete(cc.entries, key)
		defer func() { _ = e.cli.Close() }()
	}
	cc.mu.Unlock()

	cli, err := c.inner.Connect(ctx, node)
	if err != nil {
		return nil, err
	}
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if e, ok := cc.entries[key]; ok && e.generation == c.generation {
		// Dialled concurrently by another caller: keep one.
		_ = cli.Close()
		e.lastUsed = cc.clock()
		return e.cli, nil
	}
	if cc.entries == nil {
		cc.entries = map[clientKey]*cachedClient{}
	}
	cc.entries[key] = &cachedClient{cli: cli, generation: c.generation, lastUsed: cc.clock()}
	return cli, nil
}

// Metrics implements MetricsConnector through the inner Connector. Nothing is cached: metrics are
// read only while a member cannot be reached, each time fresh.
func (c *cachedConnector) Metrics(ctx context.Context, node string) ([]byte, error) {
	inner, ok := c.inner.(MetricsConnector)
	if !ok {
		return nil, errNoMetrics
	}
	return inner.Metrics(ctx, node)
}

// Discard implements SharedConnector: a client whose call failed is closed and not used again.
func (c *cachedConnector) Discard(node string, cli *clientv3.Client) {
	key := clientKey{scope: c.scope, node: node}
	c.cache.mu.Lock()
	if e, ok := c.cache.entries[key]; ok && e.cli == cli {
		delete(c.cache.entries, key)
	}
	c.cache.mu.Unlock()
	_ = cli.Close()
}
