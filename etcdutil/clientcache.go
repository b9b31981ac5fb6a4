package etcdutil

import (
	"context"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// ClientCache shares connected etcd clients between calls, keyed by scope (a workload cluster) and
// node, so that the health checker's periodic inspections reuse one connection (one port-forward
// tunnel) per member instead of dialling N+1 times every check. A client whose call failed is closed
// and dropped (SharedConnector.Discard); a client not used for a while is closed by Sweep; a scope's
// clients are closed by Forget and Retain. The zero value is ready to use.
//
// It also remembers a node whose last dial failed. A black-holed node (powered off, or a
// port-forward that accepts and never answers) costs its whole dial timeout, 10 s by default, and
// every health check and remediation of the cluster would pay it on every inspection, holding a
// worker shared with every other tenant for that long. A node whose last dial failed is dialled
// again in the background, one dial at a time whoever asks, and a caller waits for that dial at most
// retryGrace: a node that answers again is reached at once, one that still does not costs a second,
// and the remembered failure is the answer.
type ClientCache struct {
	mu      sync.Mutex
	entries map[clientKey]*cachedClient
	// dialing is the dial in progress per node; failed is the error of its last dial, when it failed.
	dialing map[clientKey]*pendingDial
	failed  map[clientKey]error
	// now is time.Now, replaceable in tests.
	now func() time.Time
}

// retryGrace is how long a caller waits for the dial of a node whose last dial failed.
const retryGrace = time.Second

// maxDial bounds a dial run in the background, beyond the Connector's own dial timeout.
const maxDial = 5 * time.Minute

type pendingDial struct {
	done       chan struct{}
	generation any
	cli        *clientv3.Client
	err        error
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
	cc.forgetFailures(func(k clientKey) bool { return k.scope == scope })
}

// Retain closes and drops the clients of scope whose node is not in nodes (their Machines are gone).
func (cc *ClientCache) Retain(scope string, nodes []string) {
	keep := map[string]bool{}
	for _, n := range nodes {
		keep[n] = true
	}
	cc.drop(func(k clientKey, _ *cachedClient) bool { return k.scope == scope && !keep[k.node] })
	cc.forgetFailures(func(k clientKey) bool { return k.scope == scope && !keep[k.node] })
}

// forgetFailures drops the remembered dial failures of the nodes that match.
func (cc *ClientCache) forgetFailures(match func(clientKey) bool) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	for k := range cc.failed {
		if match(k) {
			delete(cc.failed, k)
		}
	}
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

// Connect implements Connector: the cached client of the node, or a new one (then cached). The dial
// runs in the background, shared by every caller of the node; a caller waits for it until ctx ends,
// or at most retryGrace when the node's last dial failed (then that failure is returned).
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
	p, ok := cc.dialing[key]
	if !ok || p.generation != c.generation {
		p = c.dial(ctx, key)
	}
	lastErr := cc.failed[key]
	cc.mu.Unlock()

	wait := ctx.Done()
	if lastErr != nil {
		grace, cancel := context.WithTimeout(ctx, retryGrace)
		defer cancel()
		wait = grace.Done()
	}
	select {
	case <-p.done:
		if p.err != nil {
			return nil, p.err
		}
		return p.cli, nil
	case <-wait:
		if lastErr != nil {
			return nil, fmt.Errorf("%w (its last dial failed; dialling again in the background)", lastErr)
		}
		return nil, context.Cause(ctx)
	}
}

// dial starts the background dial of key, with ctx's values but not its end (bounded by maxDial and
// the inner Connector's dial timeout). Called with cc.mu held.
func (c *cachedConnector) dial(ctx context.Context, key clientKey) *pendingDial {
	cc := c.cache
	p := &pendingDial{done: make(chan struct{}), generation: c.generation}
	if cc.dialing == nil {
		cc.dialing = map[clientKey]*pendingDial{}
	}
	cc.dialing[key] = p
	go func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), maxDial)
		defer cancel()
		cli, err := c.inner.Connect(dctx, key.node)
		cc.mu.Lock()
		if cc.dialing[key] == p {
			delete(cc.dialing, key)
		}
		switch e, cached := cc.entries[key]; {
		case err != nil:
			if cc.failed == nil {
				cc.failed = map[clientKey]error{}
			}
			cc.failed[key] = err
		case cached && e.generation == c.generation:
			// Connected otherwise meanwhile (a replaced generation's dial raced): keep one.
			_ = cli.Close()
			cli = e.cli
			delete(cc.failed, key)
		default:
			if cached {
				// A client of another generation, dialled by a caller of that generation meanwhile.
				_ = e.cli.Close()
			}
			if cc.entries == nil {
				cc.entries = map[clientKey]*cachedClient{}
			}
			cc.entries[key] = &cachedClient{cli: cli, generation: c.generation, lastUsed: cc.clock()}
			delete(cc.failed, key)
		}
		p.cli, p.err = cli, err
		cc.mu.Unlock()
		close(p.done)
	}()
	return p
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
