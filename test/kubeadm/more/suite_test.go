package more_test

import (
	"context"
	"os"
	"testing"

	"github.com/capr-io/capr/test/sandbox"
)

// More control-plane scenarios on the full stack (CAPI's core, kubeadm bootstrap and KCP controllers
// and webhooks, kube-controller-manager, real etcd): `make test-kcp`, which also runs the tests of
// the package above that `make test` leaves out (hack/test-levels.sh, docs/developer/testing.md#ci).

var (
	sb  *sandbox.Sandbox
	ctx = context.Background()
)

func TestMain(m *testing.M) {
	os.Exit(sandbox.RunTestsWithOptions(m, sandbox.Options{Provider: sandbox.ProviderKubeadm}, func(s *sandbox.Sandbox) { sb = s }))
}
