package e2e_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/test/sandbox"
)

var (
	ctx = context.Background()
	// env is the platform the suite runs on.
	env platform
	// kindOnly is set by the kind faults (build tag kind), which run on a kind management cluster only.
	kindOnly bool
	// afterAll runs after every test, on a real management cluster (the kind faults' shared cluster).
	afterAll []func()
)

// platform is what differs between the sandbox and a real management cluster.
type platform interface {
	// name says which platform this is, for messages.
	name() string
	// client reaches the management cluster as an administrator.
	client() client.Client
	// createCluster creates a workload cluster in namespace ns with three control-plane Machines
	// (KubeadmControlPlane) and two workers (a MachineDeployment), returns its name once every
	// Machine has a Node, and deletes it when the test ends.
	createCluster(t *testing.T, ns string) string
	// breakNode makes a Node stop working (its kubelet stops reporting).
	breakNode(t *testing.T, ns, cluster, node string)
	// healthChecks returns CAPR's health checks of the cluster's control plane and workers, with
	// timeouts that suit the platform's nodes.
	healthChecks(ns, cluster string) (controlPlane, workers *caprv1.MachineHealthCheck)
	// remediationTimeout bounds the wait for both remediations and the replacements.
	remediationTimeout() time.Duration
}

// E2E_KUBECONFIG selects a real management cluster (see kindPlatform); unset, the sandbox is used.
const kubeconfigEnv = "E2E_KUBECONFIG"

func TestMain(m *testing.M) {
	if kubeconfig := os.Getenv(kubeconfigEnv); kubeconfig != "" {
		p, err := newKindPlatform(kubeconfig)
		if err != nil {
			fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
			os.Exit(1)
		}
		env = p
		code := m.Run()
		for _, f := range afterAll {
			f()
		}
		os.Exit(code)
	}
	if kindOnly {
		fmt.Fprintf(os.Stderr, "FAIL: built with the tag kind, the suite runs on a kind management cluster only: set %s (make e2e-kind)\n", kubeconfigEnv)
		os.Exit(1)
	}
	os.Exit(sandbox.RunTestsWithOptions(m, sandbox.Options{Provider: sandbox.ProviderKubeadm, WithoutManagerIdentity: true},
		func(s *sandbox.Sandbox) { env = &sandboxPlatform{sb: s} }))
}
