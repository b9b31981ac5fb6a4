package packaging_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/adrg/xdg"

	capienv "github.com/capr-io/capr/test/envtest"
)

var (
	testEnv *capienv.Environment
	ctx     = context.Background()
	// root is the CAPR checkout.
	root string
)

// componentVariables are the clusterctl variables of CAPR's components: docs/user/install.md
// ("Configuration variables") lists the same.
var componentVariables = []string{
	"CAPR_ALLOW_ETCD_ENDPOINTS_ANNOTATION",
	"CAPR_CLUSTERCACHE_CLIENT_BURST",
	"CAPR_CLUSTERCACHE_CLIENT_QPS",
	"CAPR_CLUSTERCACHE_CONCURRENCY",
	"CAPR_DIAGNOSTICS_ADDRESS",
	"CAPR_ETCD_CALL_TIMEOUT",
	"CAPR_ETCD_DIAL_TIMEOUT",
	"CAPR_INSECURE_DIAGNOSTICS",
	"CAPR_KUBE_API_BURST",
	"CAPR_KUBE_API_QPS",
	"CAPR_LOG_LEVEL",
	"CAPR_MACHINEHEALTHCHECK_CONCURRENCY",
	"CAPR_MACHINEREMEDIATION_CONCURRENCY",
	"CAPR_MACHINEREMEDIATION_MAX_FINISHED_PER_CLUSTER",
	"CAPR_MACHINEREMEDIATION_TTL_AFTER_FINISHED",
	"CAPR_SYNC_PERIOD",
}

func TestMain(m *testing.M) {
	// clusterctl reads its configuration directory from XDG_CONFIG_HOME (and creates it) and every
	// variable from the environment: point it at a temporary directory, and leave the components'
	// variables unset so that their defaults are what gets installed.
	xdgHome, err := os.MkdirTemp("", "capr-packaging-xdg-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
		os.Exit(1)
	}
	code := run(m, xdgHome)
	_ = os.RemoveAll(xdgHome)
	os.Exit(code)
}

func run(m *testing.M, xdgHome string) int {
	if err := os.Setenv("XDG_CONFIG_HOME", xdgHome); err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
		return 1
	}
	xdg.Reload()
	for _, v := range componentVariables {
		_ = os.Unsetenv(v)
	}
	var err error
	if root, err = capienv.ModuleRoot(); err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
		return 1
	}
	// CAPI's CRDs only: CAPR's CRDs and RBAC come from the components clusterctl installs.
	return capienv.Run(m, capienv.Options{WithoutCAPR: true}, func(s *capienv.Suite) error {
		testEnv = s.Environment
		// The ClusterRole aggregation controller fills the aggregated roles CAPR ships and uses.
		kcm, err := testEnv.StartKubeControllerManager(ctx, capienv.KubeControllerManagerOptions{
			Controllers: []string{capienv.ClusterRoleAggregationController},
		})
		if err != nil {
			return fmt.Errorf("cannot start kube-controller-manager: %w", err)
		}
		s.Cleanup(kcm.Stop)
		s.Cleanup(cleanupInstallation)
		return nil
	})
}
