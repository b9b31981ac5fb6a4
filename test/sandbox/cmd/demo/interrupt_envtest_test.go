//go:build envtest

package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"
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
	children := childrenOf(t, cmd.Process.Pid)
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
		g.Eventually(func() bool { return running(pid) }, 30*time.Second, 100*time.Millisecond).Should(BeFalse(),
			"process %d (%s), started by the demo, still runs after the demo exited", pid, commandOf(pid))
	}
}

// childrenOf returns the processes whose parent is pid (from /proc).
func childrenOf(t *testing.T, pid int) []int {
	t.Helper()
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, f := range stats {
		if ppid, _, ok := parentAndState(f); ok && ppid == pid {
			child, _ := strconv.Atoi(filepath.Base(filepath.Dir(f)))
			out = append(out, child)
		}
	}
	return out
}

// running reports whether pid is a process that has not exited (a zombie has: only its parent, init
// here, has not collected its status yet).
func running(pid int) bool {
	_, state, ok := parentAndState("/proc/" + strconv.Itoa(pid) + "/stat")
	return ok && state != "Z" && state != "X"
}

// parentAndState reads a /proc/<pid>/stat file: "pid (comm) state ppid ...", comm may hold spaces.
func parentAndState(file string) (ppid int, state string, ok bool) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, "", false
	}
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 2 {
		return 0, "", false
	}
	ppid, err = strconv.Atoi(fields[1])
	return ppid, fields[0], err == nil
}

func commandOf(pid int) string {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	return strings.ReplaceAll(strings.TrimRight(string(b), "\x00"), "\x00", " ")
}
