package sandbox_test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/capr-io/capr/test/sandbox"
)

// interruptChildEnv makes this package's test binary a child of TestInterruptStopsTheSandbox: it
// starts the sandbox, writes the file the variable names and waits to be signalled.
const interruptChildEnv = "CAPR_SANDBOX_INTERRUPT_CHILD"

// waitForInterrupt is the child's whole life once its sandbox runs: say so, then wait for the signal,
// which sandbox.RunTests handles. It gives up after two minutes, should its parent be gone.
func waitForInterrupt(ready string) {
	if err := os.WriteFile(ready, []byte("ready"), 0o600); err != nil {
		os.Exit(3)
	}
	<-time.After(2 * time.Minute)
	os.Exit(4)
}

// TestInterruptStopsTheSandbox sends SIGTERM to a test binary whose sandbox runs (a Ctrl-C, a kill of
// a long `make chaos`, a CI timeout) and requires every process the sandbox started (the
// kube-apiserver, etcd) to be gone once the binary has exited, instead of left running.
func TestInterruptStopsTheSandbox(t *testing.T) {
	g := NewWithT(t)
	ready := filepath.Join(t.TempDir(), "ready")
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), interruptChildEnv+"="+ready)
	var stderr bytes.Buffer
	child.Stdout, child.Stderr = &stderr, &stderr
	g.Expect(child.Start()).To(Succeed())
	t.Cleanup(func() { _ = child.Process.Kill() })
	g.Eventually(func() error { _, err := os.Stat(ready); return err }, 3*time.Minute, 100*time.Millisecond).Should(Succeed(),
		"the child's sandbox did not start: %s", &stderr)
	started, err := sandbox.ChildProcesses(child.Process.Pid)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(started).NotTo(BeEmpty(), "the sandbox started no process")

	g.Expect(child.Process.Signal(syscall.SIGTERM)).To(Succeed())
	exited := make(chan error, 1)
	go func() { exited <- child.Wait() }()
	g.Eventually(exited, 2*time.Minute).Should(Receive(&err), "the child did not exit after SIGTERM: %s", &stderr)
	var exit *exec.ExitError
	for _, pid := range started {
		if sandbox.ProcessRunning(pid) {
			t.Errorf("process %d (%s), started by the sandbox, still runs after the test binary exited", pid, sandbox.ProcessCommand(pid))
			_ = syscall.Kill(pid, syscall.SIGKILL) // not left to the next test
		}
	}
	g.Expect(errors.As(err, &exit)).To(BeTrue(), "the child ended with %v: %s", err, &stderr)
	g.Expect(exit.ExitCode()).To(Equal(130), "%s", &stderr)
}
