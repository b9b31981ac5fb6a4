package kubeadm_test

import (
	"context"
	"os"
	"testing"

	"github.com/capr-io/capr/test/sandbox"
)

var (
	sb  *sandbox.Sandbox
	ctx = context.Background()
)

func TestMain(m *testing.M) {
	os.Exit(sandbox.RunTestsWithOptions(m, sandbox.Options{Provider: sandbox.ProviderKubeadm, CAPI: sandbox.CAPIOptions{MachineHealthCheck: true, Topology: true}}, func(s *sandbox.Sandbox) { sb = s }))
}
