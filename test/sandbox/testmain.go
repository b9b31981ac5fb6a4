package sandbox

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"go.uber.org/zap/zapcore"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

// VerboseEnv is the environment variable that, when set, makes the controllers under test log everything (not just errors).
const VerboseEnv = "CAPR_TEST_VERBOSE"

// RunTests is the TestMain of a package whose tests run on the sandbox: it starts the sandbox, hands
// it to set, runs the tests, stops the sandbox and returns the exit code for os.Exit.
func RunTests(m *testing.M, set func(*Sandbox)) int {
	return RunTestsWithOptions(m, Options{}, set)
}

// RunTestsWithOptions is RunTests with a sandbox started with opts.
func RunTestsWithOptions(m *testing.M, opts Options, set func(*Sandbox)) int {
	level := zapcore.DPanicLevel // controller errors are expected in fault tests; failures speak for themselves
	if os.Getenv(VerboseEnv) != "" {
		level = zapcore.Level(-4)
	}
	ctrl.SetLogger(zap.New(zap.Level(level)))
	sb, err := StartWithOptions(context.Background(), opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: cannot start the sandbox: %v\n", err)
		return 1
	}
	stop := stopOnInterrupt(sb)
	defer stop()
	set(sb)
	return m.Run()
}

// exitInterrupted is a test binary's exit code after SIGINT or SIGTERM (128 + SIGINT, as a shell
// reports an interrupted command).
const exitInterrupted = 130

// stopOnInterrupt makes the first SIGINT or SIGTERM stop the sandbox before the test binary exits:
// without it the signal ends the binary at once and leaves the kube-apiserver, the etcd processes and
// the workload clusters' members it started running (a Ctrl-C, `kill` of a long `make chaos`, a CI
// timeout). It returns the sandbox's stop for the normal end; either path stops it once.
func stopOnInterrupt(sb *Sandbox) (stop func()) {
	var once sync.Once
	stop = func() { once.Do(sb.Stop) }
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, os.Interrupt, syscall.SIGTERM)
	go func() {
		sig := <-signals
		signal.Stop(signals) // a second signal ends the binary at once
		fmt.Fprintf(os.Stderr, "%v: stopping the sandbox's processes before exiting\n", sig)
		stop()
		os.Exit(exitInterrupted)
	}()
	return stop
}

// AnnotateMachine sets (or, with set false, removes) an annotation on a Machine of the cluster.
func (s *Sandbox) AnnotateMachine(ctx context.Context, wc *WorkloadCluster, name, key string, set bool) error {
	m := &clusterv1.Machine{}
	if err := s.Client.Get(ctx, client.ObjectKey{Namespace: wc.Namespace, Name: name}, m); err != nil {
		return err
	}
	base := m.DeepCopy()
	if set {
		metav1.SetMetaDataAnnotation(&m.ObjectMeta, key, "")
	} else {
		delete(m.Annotations, key)
	}
	return s.Client.Patch(ctx, m, client.MergeFrom(base))
}
