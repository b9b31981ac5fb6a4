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
	os.Exit(run(m))
}

func run(m *testing.M) int {
	var err error
	testEnv, err = capienv.Start(capienv.Options{})
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: cannot start envtest: %v\n", err)
		return 1
	}
	defer func() { _ = testEnv.Stop() }()
	k8sClient = testEnv.Client

	start := time.Now()
	kcm, err = testEnv.StartKubeControllerManager(ctx, capienv.KubeControllerManagerOptions{
		NodeMonitorGracePeriod: gracePeriod,
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: cannot start kube-controller-manager: %v\n", err)
		return 1
	}
	defer kcm.Stop()
	fmt.Fprintf(os.Stderr, "kube-controller-manager running in %s (log: %s)\n", time.Since(start).Round(time.Millisecond), kcm.LogFile)

	code := m.Run()
	if code != 0 {
		fmt.Fprintf(os.Stderr, "last lines of %s:\n%s\n", kcm.LogFile, kcm.LogTail(60))
	}
	return code
}
