// Package kcm_test runs a real kube-controller-manager v1.36.3 against envtest's API server and
// checks the upstream behaviour CAPR's remediation builds on: the node lifecycle controller marking
// a silent Node Ready=Unknown and tainting it unreachable, the garbage collector deleting
// dependents, and the pod garbage collector deleting the Pods of a deleted Node.
package kcm_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	capienv "github.com/capr-io/capr/test/envtest"
)

// gracePeriod is --node-monitor-grace-period: short so that a silent Node goes Unknown in seconds.
const gracePeriod = 6 * time.Second

var (
	testEnv   *capienv.Environment
	k8sClient client.Client
	kcm       *capienv.KubeControllerManager
	ctx       = context.Background()
)

func TestMain(m *testing.M) {
	os.Exit(capienv.Run(m, capienv.Options{}, func(s *capienv.Suite) error {
		testEnv = s.Environment
		k8sClient = testEnv.Client
		start := time.Now()
		var err error
		kcm, err = testEnv.StartKubeControllerManager(ctx, capienv.KubeControllerManagerOptions{
			NodeMonitorGracePeriod: gracePeriod,
		})
		if err != nil {
			return fmt.Errorf("cannot start kube-controller-manager: %w", err)
		}
		s.Cleanup(func() {
			if s.Failed() {
				fmt.Fprintf(os.Stderr, "last lines of %s:\n%s\n", kcm.LogFile, kcm.LogTail(60))
			}
			kcm.Stop()
		})
		fmt.Fprintf(os.Stderr, "kube-controller-manager running in %s (log: %s)\n", time.Since(start).Round(time.Millisecond), kcm.LogFile)
		return nil
	}))
}
