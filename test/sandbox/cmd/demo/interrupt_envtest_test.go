//go:build envtest

package main

import (
	"bufio"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/capr-io/capr/test/sandbox"
)

// runAsDemo makes the test binary run the demo's main when the test starts it again with this
// variable set (the demo is a command; this runs it exactly as `make demo` does, in its own process).
const runAsDemo = "CAPR_DEMO_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if args := os.Getenv(runAsDemo); args != "" {
		os.Args = append([]string{os.Args[0]}, strings.Fields(args)...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// An interrupted demo (Ctrl-C) stops what it started: before, the signal ended the process at once
// and its kube-apiserver and etcd kept running, orphaned, beside whatever ran next on the machine.
func TestInterruptedDemoStopsWhatItStarted(t *testing.T) {
	g := NewWithT(t)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), runAsDemo+"=--scenario=node-notready")
	stdout, err := cmd.StdoutPipe()
	g.Expect(err).NotTo(HaveOccurred())
	cmd.Stderr = os.Stderr
	g.Expect(cmd.Start()).To(Succeed())
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	// The management cluster runs once the demo says it creates the workload cluster.
	lines := bufio.NewScanner(stdout)
	started := false
	for !started && lines.Scan() {
		t.Log(lines.Text())
		started = strings.Contains(lines.Text(), "Creating cluster")
	}
	g.Expect(started).To(BeTrue(), "the demo ended before starting its management cluster")
	go func() {
		for lines.Scan() {
			t.Log(lines.Text())
		}
	}()
	children, err := sandbox.ChildProcesses(cmd.Process.Pid)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(children).NotTo(BeEmpty(), "the demo runs kube-apiserver and etcd as its children")
	t.Cleanup(func() { // whatever the outcome, nothing is left running after the test
		for _, pid := range children {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})

	g.Expect(cmd.Process.Signal(os.Interrupt)).To(Succeed())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	g.Eventually(exited, 2*time.Minute).Should(Receive())
	for _, pid := range children {
		g.Eventually(func() bool { return sandbox.ProcessRunning(pid) }, 30*time.Second, 100*time.Millisecond).Should(BeFalse(),
			"process %d (%s), started by the demo, still runs after the demo exited", pid, sandbox.ProcessCommand(pid))
	}
}
