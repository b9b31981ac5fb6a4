//go:build envtest

// The envtest suite of the health checker (go test -tags envtest; make test): CAPR's manager, with
// the shipped RBAC, on a real kube-apiserver and etcd with CAPI's CRDs (test/envtest); the etcd
// member check reads a stand-in (fakeEtcd).

package machinehealthcheck_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/controllers"
	capienv "github.com/capr-io/capr/test/envtest"
)

var (
	testEnv *capienv.Environment
	// k8sClient is an uncached client: tests observe the API server, not the manager's cache.
	k8sClient client.Client
	ctx       = context.Background()
	// requests counts the manager's requests by method and path.
	requests = capienv.NewRequestCounter()
	// hidden are the MachineRemediations the manager's Lists do not show (a cache lagging behind).
	hidden = &hiddenRequests{names: map[types.NamespacedName]bool{}}
)

// hiddenRequests makes the manager's cache lag for chosen MachineRemediations: its Lists leave them
// out (its informers, Gets and watch events still have them).
type hiddenRequests struct {
	mu    sync.Mutex
	names map[types.NamespacedName]bool
}

func (h *hiddenRequests) set(ns, name string, hide bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if hide {
		h.names[types.NamespacedName{Namespace: ns, Name: name}] = true
	} else {
		delete(h.names, types.NamespacedName{Namespace: ns, Name: name})
	}
}

// laggingClient is the manager's client with hidden's MachineRemediations left out of its Lists.
type laggingClient struct {
	client.Client
}

func (c laggingClient) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if err := c.Client.List(ctx, list, opts...); err != nil {
		return err
	}
	if l, ok := list.(*caprv1.MachineRemediationList); ok {
		hidden.mu.Lock()
		defer hidden.mu.Unlock()
		l.Items = slices.DeleteFunc(l.Items, func(mr caprv1.MachineRemediation) bool {
			return hidden.names[client.ObjectKeyFromObject(&mr)]
		})
	}
	return nil
}

func TestMain(m *testing.M) {
	capienv.SetLogger()
	os.Exit(capienv.Run(m, capienv.Options{}, func(s *capienv.Suite) error {
		testEnv = s.Environment
		k8sClient = testEnv.Client
		mgr, err := testEnv.NewManager(capienv.ManagerOptions{
			Requests:   requests,
			WrapClient: func(c client.Client) client.Client { return laggingClient{Client: c} },
		})
		if err != nil {
			return err
		}
		if _, err := controllers.SetupWithManager(s.Ctx, mgr, controllers.Options{
			ConnectionRetryInterval: 2 * time.Second,
			EtcdMembers:             fakeEtcd,
		}); err != nil {
			return fmt.Errorf("setting up controllers: %w", err)
		}
		s.Go(mgr.Start)
		return nil
	}))
}
