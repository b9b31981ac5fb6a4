package envtest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Ports handed to processes that bind them later (kube-controller-manager, etcd members) are
// reserved the way controller-runtime's envtest reserves the ports it suggests for API servers and
// webhook servers (pkg/internal/testing/addr: a file "port-<n>" in the kubebuilder-envtest cache
// directory, locked with flock for as long as the reservation holds). Test packages run in parallel
// (go test -p), so without it a port one package picked and released could be the one envtest in
// another package suggested for a webhook server that has not bound it yet: the webhook calls then
// reach the wrong server ("certificate signed by unknown authority").

// portReservation is how long a reservation is held: long enough for the process to bind the port
// (envtest itself treats reservations older than 2 minutes as stale).
const portReservation = 2 * time.Minute

var reservations struct {
	sync.Mutex
	held []reservation
}

type reservation struct {
	fd    int
	taken time.Time
}

// FreePort returns a free TCP port on 127.0.0.1, reserved against envtest's own port suggestions in
// every process on this machine.
func FreePort() (int, error) {
	ports, err := FreePorts(1)
	if err != nil {
		return 0, err
	}
	return ports[0], nil
}

// FreePorts returns n distinct free TCP ports on 127.0.0.1, each reserved as FreePort's.
func FreePorts(n int) ([]int, error) {
	dir, err := portCacheDir()
	if err != nil {
		return nil, err
	}
	releaseOld()
	var listeners []net.Listener
	defer func() {
		for _, l := range listeners {
			_ = l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for attempt := 0; len(ports) < n; attempt++ {
		if attempt >= 100*n {
			return nil, fmt.Errorf("no free port that is not reserved after %d attempts", attempt)
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("finding a free port: %w", err)
		}
		listeners = append(listeners, l) // held until every port is chosen: n distinct ports
		port := l.Addr().(*net.TCPAddr).Port
		ok, err := reserve(filepath.Join(dir, fmt.Sprintf("port-%d", port)))
		if err != nil {
			return nil, err
		}
		if ok {
			ports = append(ports, port)
		}
	}
	return ports, nil
}

// Listen listens on a free TCP port of 127.0.0.1 that it reserves as FreePort does. Every test
// server listens through it, never on "127.0.0.1:0" directly: the kernel hands out any port not bound,
// including one that envtest in another test process has just suggested for a webhook server that has
// not bound it yet, and that API server's webhook calls then reach this server ("certificate signed
// by unknown authority" from a TLS server, as CI once saw when a sandbox kubelet took a port that
// test/e2e's envtest had suggested for KCP's webhooks).
func Listen() (net.Listener, error) {
	dir, err := portCacheDir()
	if err != nil {
		return nil, err
	}
	releaseOld()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("finding a free port: %w", err)
		}
		ok, err := reserve(filepath.Join(dir, fmt.Sprintf("port-%d", l.Addr().(*net.TCPAddr).Port)))
		if ok && err == nil {
			return l, nil
		}
		_ = l.Close()
		if err != nil {
			return nil, err
		}
	}
	return nil, errors.New("no free port that is not reserved after 100 attempts")
}

// reserve takes the lock on path; false when another process holds it.
func reserve(path string) (bool, error) {
	fd, err := unix.Open(path, unix.O_CREAT|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return false, fmt.Errorf("reserving a port (%s): %w", path, err)
	}
	if err := unix.Flock(fd, unix.LOCK_NB|unix.LOCK_EX); err != nil {
		_ = unix.Close(fd)
		if errors.Is(err, unix.EWOULDBLOCK) {
			return false, nil
		}
		return false, fmt.Errorf("reserving a port (%s): %w", path, err)
	}
	// envtest ages reservations by the file's modification time.
	now := time.Now()
	_ = os.Chtimes(path, now, now)
	reservations.Lock()
	reservations.held = append(reservations.held, reservation{fd: fd, taken: now})
	reservations.Unlock()
	return true, nil
}

// releaseOld gives back the reservations held longer than portReservation: their processes have
// bound the ports long ago (and a long fault campaign would otherwise keep a descriptor per port).
func releaseOld() {
	reservations.Lock()
	defer reservations.Unlock()
	kept := reservations.held[:0]
	for _, r := range reservations.held {
		if time.Since(r.taken) > portReservation {
			_ = unix.Close(r.fd)
			continue
		}
		kept = append(kept, r)
	}
	reservations.held = kept
}

// portCacheDir is the directory envtest keeps its port reservations in.
func portCacheDir() (string, error) {
	base, err := os.UserCacheDir()
	if err == nil {
		dir := filepath.Join(base, "kubebuilder-envtest")
		if err = os.MkdirAll(dir, 0o750); err == nil {
			return dir, nil
		}
	}
	dir := filepath.Join(os.TempDir(), "kubebuilder-envtest")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return "", fmt.Errorf("creating the port reservation directory: %w", err)
	}
	return dir, nil
}
