package more_test

import (
	"context"
	"os"
	"testing"

	"github.com/capr-io/capr/test/sandbox"
)

// More control-plane scenarios on the full stack (CAPI's core, kubeadm bootstrap and KCP controllers
// and webhooks, kube-controller-manager, real etcd): `make test-kcp`. `make test` runs the package
// above (the stack coming up, a surge by two, two unhealthy of five, CAPI's MachineHealthCheck
// driving CAPR through its template).

var (
	sb  *sandbox.Sandbox
	ctx = context.Background()
)

func TestMain(m *testing.M) {
	os.Exit(sandbox.RunTestsWithOptions(m, sandbox.Options{Provider: sandbox.ProviderKubeadm}, func(s *sandbox.Sandbox) { sb = s }))
}
