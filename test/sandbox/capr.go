package sandbox

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/capr-io/capr/controllers"
)

// CAPR is a running CAPR manager (health checker and remediators) against the sandbox. Tests stop
// and restart it to simulate crashes.
type CAPR struct {
	cancel context.CancelFunc
	done   chan error
	// Crash is the fault switch of this manager's client: once tripped, every API call fails, as if
	// the process had been killed between two calls.
	Crash *CrashSwitch
}

// CAPROptions configures StartCAPR.
type CAPROptions struct {
	controllers.Options
	// CrashAfterWrites, when > 0, trips the crash switch after that many API writes.
	CrashAfterWrites int64
	// CrashAfterDeleting, when set, trips the crash switch right after the manager's delete of the
	// Machine of that name has succeeded: the process dies before its next call.
	CrashAfterDeleting string
	// Namespace, when set, is the only namespace the manager watches (main.go's --namespace), so
	// that several managers can each own the clusters of one namespace on one API server.
	Namespace string
	// MetricsBindAddress, when set, serves the manager's metrics (plain HTTP, /metrics) there.
	MetricsBindAddress string
}

// StartCAPR starts CAPR's manager with short etcd timeouts suited to the sandbox.
func (s *Sandbox) StartCAPR(ctx context.Context, opts CAPROptions) (*CAPR, error) {
	crash := &CrashSwitch{after: opts.CrashAfterWrites, afterDeleting: opts.CrashAfterDeleting}
	mgr, err := ctrl.NewManager(s.Env.ManagerConfig, ctrl.Options{
		Scheme:                  s.Env.Scheme,
		Metrics:                 metricsserver.Options{BindAddress: cmp.Or(opts.MetricsBindAddress, "0")},
		Cache:                   controllers.ManagerCacheOptionsNamed(s.Env.Scheme, fmt.Sprintf("capr-manager-%d", managerSeq.Add(1)), opts.Namespace, 10*time.Minute),
		Client:                  controllers.ManagerClientOptions(),
		GracefulShutdownTimeout: ptr.To(time.Second),
		Controller:              ctrlConfigSkipNameValidation(),
		NewClient: func(config *rest.Config, options client.Options) (client.Client, error) {
			c, err := client.New(config, options)
			if err != nil {
				return nil, err
			}
			return &crashingClient{Client: c, crash: crash}, nil
		},
	})
	if err != nil {
		return nil, fmt.Errorf("creating CAPR manager: %w", err)
	}
	o := opts.Options
	if o.ConnectionRetryInterval == 0 {
		o.ConnectionRetryInterval = time.Second
	}
	if o.EtcdDialTimeout == 0 {
		o.EtcdDialTimeout = 3 * time.Second
	}
	if o.EtcdCallTimeout == 0 {
		o.EtcdCallTimeout = 3 * time.Second
	}
	mctx, cancel := context.WithCancel(ctx)
	if _, err := controllers.SetupWithManager(mctx, mgr, o); err != nil {
		cancel()
		return nil, err
	}
	crash.onTrip = cancel
	c := &CAPR{cancel: cancel, done: make(chan error, 1), Crash: crash}
	go func() { c.done <- mgr.Start(mctx) }()
	return c, nil
}

// Stop stops the manager and waits for it.
func (c *CAPR) Stop() {
	c.cancel()
	<-c.done
}

// Stopped reports whether the manager has stopped (e.g. after a crash).
func (c *CAPR) Stopped() bool {
	select {
	case err := <-c.done:
		c.done <- err
		return true
	default:
		return false
	}
}

// CrashSwitch kills a manager's API access: after it trips, every call fails and the manager stops.
type CrashSwitch struct {
	after         int64
	afterDeleting string
	writes        atomic.Int64
	tripped       atomic.Bool
	onTrip        context.CancelFunc
	once          sync.Once
}

// Trip simulates the process dying now.
func (c *CrashSwitch) Trip() {
	c.tripped.Store(true)
	c.once.Do(func() {
		if c.onTrip != nil {
			c.onTrip()
		}
	})
}

// Writes returns the number of API writes so far.
func (c *CrashSwitch) Writes() int64 { return c.writes.Load() }

var managerSeq atomic.Int64

var errCrashed = errors.New("simulated crash: the controller process is gone")

func (c *CrashSwitch) check(write bool) error {
	if c.tripped.Load() {
		return errCrashed
	}
	if write {
		n := c.writes.Add(1)
		if c.after > 0 && n > c.after {
			c.Trip()
			return errCrashed
		}
	}
	return nil
}

// crashingClient fails every call once its switch has tripped.
type crashingClient struct {
	client.Client
	crash *CrashSwitch
}

func (c *crashingClient) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if err := c.crash.check(false); err != nil {
		return err
	}
	return c.Client.Get(ctx, key, obj, opts...)
}

func (c *crashingClient) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if err := c.crash.check(false); err != nil {
		return err
	}
	return c.Client.List(ctx, list, opts...)
}

func (c *crashingClient) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	if err := c.crash.check(true); err != nil {
		return err
	}
	return c.Client.Create(ctx, obj, opts...)
}

func (c *crashingClient) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	if err := c.crash.check(true); err != nil {
		return err
	}
	err := c.Client.Delete(ctx, obj, opts...)
	if _, machine := obj.(*clusterv1.Machine); err == nil && machine && c.crash.afterDeleting != "" && obj.GetName() == c.crash.afterDeleting {
		c.crash.Trip()
	}
	return err
}

func (c *crashingClient) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	if err := c.crash.check(true); err != nil {
		return err
	}
	return c.Client.Update(ctx, obj, opts...)
}

func (c *crashingClient) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	if err := c.crash.check(true); err != nil {
		return err
	}
	return c.Client.Patch(ctx, obj, patch, opts...)
}

func (c *crashingClient) Status() client.SubResourceWriter {
	return &crashingStatus{SubResourceWriter: c.Client.Status(), crash: c.crash}
}

type crashingStatus struct {
	client.SubResourceWriter
	crash *CrashSwitch
}

func (c *crashingStatus) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	if err := c.crash.check(true); err != nil {
		return err
	}
	return c.SubResourceWriter.Update(ctx, obj, opts...)
}

func (c *crashingStatus) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	if err := c.crash.check(true); err != nil {
		return err
	}
	return c.SubResourceWriter.Patch(ctx, obj, patch, opts...)
}

// QuorumWatcher samples a workload cluster's real etcd throughout a scenario and records every
// sample where fewer than a quorum of the voting members (read from etcd's member list) had their
// process running, and every stretch of more than 3 s in which no member answered at all (a leader
// election in progress is not quorum loss).
//
// It is an oracle, so it shares nothing with the code under test: it reads the member list with a
// plain etcd client (not etcdutil.Cluster.Inspect) and does the quorum arithmetic itself (not
// etcdutil.Quorum), so that a fault in either cannot hide itself.
type QuorumWatcher struct {
	cancel  context.CancelFunc
	done    chan struct{}
	mu      sync.Mutex
	samples int
	lost    []string
	// Failure margin (healthy voting members minus quorum): the minimum seen and how long it was at
	// most zero (one more failure would lose quorum).
	minMargin     int
	minMarginAt   string
	marginSampled bool
	lastSample    time.Time
	atMostZero    time.Duration
}

// Margin returns the minimum failure margin seen (running voting members minus quorum), when it was
// first seen and what the cluster looked like then, and how long the margin was zero or below. Call
// after Stop.
func (w *QuorumWatcher) Margin() (minimum int, when string, atMostZero time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.minMargin, w.minMarginAt, w.atMostZero
}

func (w *QuorumWatcher) recordMargin(margin int, at time.Time, what string) {
	if !w.marginSampled || margin < w.minMargin {
		w.minMargin = margin
		w.minMarginAt = at.Format(time.StampMilli) + ": " + what
	}
	if w.marginSampled && margin <= 0 {
		w.atMostZero += at.Sub(w.lastSample)
	}
	w.marginSampled, w.lastSample = true, at
}

// unansweredIsLost is how long no member may answer before the watcher counts quorum as lost.
const unansweredIsLost = 3 * time.Second

// watcherCallTimeout bounds each of the watcher's etcd calls.
const watcherCallTimeout = 500 * time.Millisecond

// WatchQuorum starts sampling.
func (s *Sandbox) WatchQuorum(ctx context.Context, wc *WorkloadCluster) *QuorumWatcher {
	wctx, cancel := context.WithCancel(ctx)
	w := &QuorumWatcher{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		var failingSince time.Time
		reported := false
		// Connections are kept between samples: a fresh TLS handshake with every member every 50 ms
		// was most of the fault suite's CPU.
		clients := &rawMemberClients{tls: wc.Etcd.ClientTLS(), byName: map[string]*rawMemberClient{}}
		defer clients.close()
		for wctx.Err() == nil {
			endpoints := wc.Etcd.Endpoints()
			names := make([]string, 0, len(endpoints))
			for n := range endpoints {
				names = append(names, n)
			}
			sort.Strings(names)
			// Which processes run is read before the member list: a member removed and then
			// stopped between the two reads must not count as a voting member that is down.
			running := map[string]bool{}
			for _, n := range names {
				running[n] = wc.Etcd.Running(n)
			}
			members, err := clients.memberList(wctx, names, endpoints, running)
			if wctx.Err() != nil {
				return
			}
			w.mu.Lock()
			w.samples++
			switch {
			case err != nil && failingSince.IsZero():
				failingSince = time.Now()
			case err != nil && time.Since(failingSince) > unansweredIsLost && !reported:
				// A leader election makes linearizable calls time out for a moment; only a cluster
				// that answers nothing, not even a member's own view, for longer counts as without quorum.
				w.lost = append(w.lost, fmt.Sprintf("%s: no member answered for %s: %v", time.Now().Format(time.StampMilli), unansweredIsLost, err))
				reported = true
			case err != nil:
			default:
				failingSince, reported = time.Time{}, false
				// Every voter in etcd's own list counts, also one the sandbox never started (it has no
				// name until its process first joins): it votes, and is not running. The margin and
				// the loss count members whose process runs (the sandbox knows): a slow answer under
				// load is not a failure, and a member behind a dead kubelet still votes.
				voting, alive := 0, 0
				for _, m := range members {
					if m.IsLearner {
						continue
					}
					voting++
					if m.Name != "" && running[m.Name] {
						alive++
					}
				}
				w.recordMargin(alive-(voting/2+1), time.Now(), fmt.Sprintf("%d of %d voting members running", alive, voting))
				// Quorum is a strict majority of the voters (etcd's raft: a leader needs votes from
				// more than half of them). The sandbox's faults kill processes, and it knows which run.
				if 2*alive <= voting {
					w.lost = append(w.lost, fmt.Sprintf("%s: %d of %d voting members running", time.Now().Format(time.StampMilli), alive, voting))
				}
			}
			w.mu.Unlock()
			select {
			case <-wctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	return w
}

// rawMemberClients are plain etcd clients, one per member endpoint, kept between samples.
type rawMemberClients struct {
	tls    *tls.Config
	byName map[string]*rawMemberClient
}

type rawMemberClient struct {
	endpoint string
	cli      *clientv3.Client
}

// memberList reads etcd's member list through the running members: linearizable through any of
// them (served only with a quorum), else the first member's own (serializable) view, so that a
// cluster that lost quorum is still counted. It fails only when no running member answers.
func (c *rawMemberClients) memberList(ctx context.Context, names []string, endpoints map[string]string, running map[string]bool) ([]*etcdserverpb.Member, error) {
	var errs []error
	for _, serializable := range []bool{false, true} {
		for _, n := range names {
			if !running[n] {
				continue
			}
			cli, err := c.get(n, endpoints[n])
			if err != nil {
				errs = append(errs, err)
				continue
			}
			var opts []clientv3.OpOption
			if serializable {
				opts = append(opts, clientv3.WithSerializable())
			}
			cctx, cancel := context.WithTimeout(ctx, watcherCallTimeout)
			resp, err := cli.MemberList(cctx, opts...)
			cancel()
			if err == nil {
				return resp.Members, nil
			}
			errs = append(errs, fmt.Errorf("member list from %s (serializable %t): %w", n, serializable, err))
		}
	}
	if len(errs) == 0 {
		return nil, errors.New("no member process runs")
	}
	return nil, errors.Join(errs...)
}

func (c *rawMemberClients) get(name, endpoint string) (*clientv3.Client, error) {
	if rc, ok := c.byName[name]; ok {
		if rc.endpoint == endpoint {
			return rc.cli, nil
		}
		_ = rc.cli.Close() // the member was started again on other ports
		delete(c.byName, name)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, TLS: c.tls, DialTimeout: watcherCallTimeout, Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("etcd client for %s: %w", name, err)
	}
	c.byName[name] = &rawMemberClient{endpoint: endpoint, cli: cli}
	return cli, nil
}

func (c *rawMemberClients) close() {
	for _, rc := range c.byName {
		_ = rc.cli.Close()
	}
}

// Lost returns the samples without quorum so far.
func (w *QuorumWatcher) Lost() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.lost...)
}

// Stop ends sampling and returns the number of samples and every sample without quorum.
func (w *QuorumWatcher) Stop() (int, []string) {
	w.cancel()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.samples, w.lost
}
