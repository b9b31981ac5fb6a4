//go:build envtest

// The envtest suite of the storage-fencing backends (go test -tags envtest; make test): a real
// kube-apiserver and etcd (test/envtest) play the workload cluster, with csi-addons' own
// NetworkFence and NetworkFenceClass CRDs installed (test/crds/csiaddons). csi-addons' controller does
// not run here: the tests write the status it would write (its result and message strings), which is
// the whole contract the backend reads. The External backend runs against a stand-in power-fencing
// kind (test/crds/externalfencing) whose Fenced condition the tests set, as a provider would.

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
	return capienv.Run(m, capienv.Options{
		ExtraCRDDirs:           []string{filepath.Join(root, "test", "crds", "csiaddons"), filepath.Join(root, "test", "crds", "externalfencing")},
		WithoutManagerIdentity: true,
	}, func(s *capienv.Suite) error {
		testEnv = s.Environment
		k8sClient = testEnv.Client
		return nil
	})
}
