package sandbox_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/capr-io/capr/test/sandbox"
)

// TestObserversDoNotConnectToAJoiningMember: the sandbox's observers (EtcdState, the quorum watcher)
// open no connection to a member whose Join has started it and not yet promoted it. A connection that
// reaches a member before it serves can hold its start back by etcd's request timeout (6 s here), which
// made compare-kcp's replacement times jump by 6 s in some runs (docs/developer/testing.md#oracles-and-their-self-tests).
// The oracle is the kernel's socket table: no socket of this process may be connected to the joining
// member's client port while the join is held before its promotion.
func TestObserversDoNotConnectToAJoiningMember(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ec := newEtcdCluster(g, t)
	_, err := ec.Provision(ctx, "m-b", nil)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(ec.Join(ctx, "m-c")).To(Succeed())
	wc := &sandbox.WorkloadCluster{Namespace: "observers", Name: "observers", Etcd: ec}
	w := sb.WatchQuorum(ctx, wc)
	t.Cleanup(func() { _, _ = w.Stop() })

	held, release := make(chan struct{}), make(chan struct{})
	ec.SetBeforePromote(func(string) { close(held); <-release })
	joined := make(chan error, 1)
	// "m-a" sorts first: the watcher asks the running members in name order.
	go func() { joined <- ec.Join(ctx, "m-a") }()
	g.Eventually(held, time.Minute).Should(BeClosed())
	g.Expect(ec.Joining("m-a")).To(BeTrue())
	_, port, err := net.SplitHostPort(ec.Endpoint("m-a"))
	g.Expect(err).NotTo(HaveOccurred())

	// Both observers at work while the member joins: EtcdState over and over, the watcher every 50 ms.
	state, err := sb.EtcdState(ctx, wc)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(state.Members).To(HaveLen(3), "the joining learner is in the member list")
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			select {
			case <-stop:
				return
			default:
				_, _ = sb.EtcdState(ctx, wc)
			}
		}
	}()
	g.Consistently(func(g Gomega) []string { return connectionsTo(g, port) }, 2*time.Second, 20*time.Millisecond).Should(BeEmpty())
	close(stop)
	<-stopped

	close(release)
	g.Eventually(joined, time.Minute).Should(Receive(Succeed()))
	g.Expect(ec.Joining("m-a")).To(BeFalse())
	// Once joined, the observers reach it: the oracle above can see a connection.
	_, err = sb.EtcdState(ctx, wc)
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(func(g Gomega) []string { return connectionsTo(g, port) }, 30*time.Second, 50*time.Millisecond).ShouldNot(BeEmpty())
}

// connectionsTo lists this process's TCP sockets whose remote port is port (from /proc/net/tcp and
// tcp6, matched to the process's socket inodes), in any state.
func connectionsTo(g Gomega, port string) []string {
	p, err := strconv.Atoi(port)
	g.Expect(err).NotTo(HaveOccurred())
	remote := fmt.Sprintf(":%04X", p)
	fds, err := os.ReadDir("/proc/self/fd")
	g.Expect(err).NotTo(HaveOccurred())
	mine := map[string]bool{}
	for _, fd := range fds {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name()))
		if err == nil && strings.HasPrefix(target, "socket:[") {
			mine[strings.TrimSuffix(strings.TrimPrefix(target, "socket:["), "]")] = true
		}
	}
	var out []string
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(table)
		g.Expect(err).NotTo(HaveOccurred())
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 10 || !strings.HasSuffix(fields[2], remote) || !mine[fields[9]] {
				continue
			}
			out = append(out, fmt.Sprintf("%s -> %s state %s", fields[1], fields[2], fields[3]))
		}
		_ = f.Close()
	}
	return out
}
