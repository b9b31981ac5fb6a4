package fencing_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	capienv "github.com/capr-io/capr/test/envtest"
)

var (
	testEnv *capienv.Environment
	// k8sClient is cluster-admin: the workload cluster's client (a workload kubeconfig is admin).
	k8sClient client.Client
	ctx       = context.Background()
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	root, err := capienv.ModuleRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	testEnv, err = capienv.Start(capienv.Options{
		ExtraCRDDirs:           []string{filepath.Join(root, "test", "crds", "csiaddons"), filepath.Join(root, "test", "crds", "externalfencing")},
		WithoutManagerIdentity: true,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() {
		if err := testEnv.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}()
	k8sClient = testEnv.Client
	return m.Run()
}
