package adversarial_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capr-io/capr/controllers"
	capienv "github.com/capr-io/capr/test/envtest"
)

var (
	testEnv *capienv.Environment
	// k8sClient is cluster-admin and uncached: each tenant's own writes, and what the tests observe.
	// (Both tenants' workload clusters are this API server too, as in the other envtest suites.)
	k8sClient client.Client
	ctx       = context.Background()
	// etcdElsewhere is where the hostile Cluster's etcd-endpoints annotation points: a listener that
	// counts the connections made to it. The manager runs without the flag that honours the
	// annotation, so it must never be dialled.
	etcdElsewhere = &countingListener{}
)

// countingListener accepts TCP connections on a local port and counts them. It closes each at once,
// or, holding, keeps it open and never answers (a black hole), until stop.
type countingListener struct {
	l        net.Listener
	accepted atomic.Int32
	hold     bool
	mu       sync.Mutex
	held     []net.Conn
}

func (c *countingListener) start() error {
	l, err := capienv.Listen()
	if err != nil {
		return fmt.Errorf("listening: %w", err)
	}
	c.l = l
	go func() {
		for {
			conn, err := l.Accept()
			if errors.Is(err, net.ErrClosed) {
				return
			}
			if err != nil {
				continue
			}
			c.accepted.Add(1)
			if !c.hold {
				_ = conn.Close()
				continue
			}
			c.mu.Lock()
			c.held = append(c.held, conn)
			c.mu.Unlock()
		}
	}()
	return nil
}

// stop closes the listener and every connection it holds.
func (c *countingListener) stop() {
	_ = c.l.Close()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, conn := range c.held {
		_ = conn.Close()
	}
}

func (c *countingListener) addr() string { return c.l.Addr().String() }

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	capienv.SetLogger()
	root, err := capienv.ModuleRoot()
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
		return 1
	}
	return capienv.Run(m, capienv.Options{
		ExtraCRDDirs:     []string{filepath.Join(root, "test", "crds", "csiaddons"), filepath.Join(root, "test", "crds", "externalfencing")},
		ManagerRoleFiles: []string{filepath.Join("testdata", "externalfencing_role.yaml")},
	}, setup)
}

// setup starts CAPR's manager as main.go does, with the shipped RBAC, its own fencer (the real
// NetworkFence, External and OutOfServiceTaint backends) and the default of every flag that matters
// here (10 health-check workers, 10 remediation workers, the etcd-endpoints annotation not honoured,
// the 10 s etcd dial and 15 s call timeouts that a black-holed node costs in full); only the
// connection retry is shorter, so that the suite's waits are short.
func setup(s *capienv.Suite) error {
	testEnv = s.Environment
	k8sClient = testEnv.Client
	if err := etcdElsewhere.start(); err != nil {
		return err
	}
	s.Cleanup(etcdElsewhere.stop)
	mgr, err := testEnv.NewManager(capienv.ManagerOptions{})
	if err != nil {
		return err
	}
	if _, err := controllers.SetupWithManager(s.Ctx, mgr, controllers.Options{
		ConnectionRetryInterval: 2 * time.Second,
	}); err != nil {
		return fmt.Errorf("setting up controllers: %w", err)
	}
	s.Go(mgr.Start)
	return nil
}
