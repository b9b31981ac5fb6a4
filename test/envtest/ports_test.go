package envtest

import (
	"fmt"
	"net"
	"path/filepath"
	"testing"

	. "github.com/onsi/gomega"
)

// TestListenReservesItsPort: the port a test server listens on is reserved the way envtest reserves
// the ports it suggests, so neither envtest nor FreePorts in any process hands it out while held.
func TestListenReservesItsPort(t *testing.T) {
	g := NewWithT(t)
	l, err := Listen()
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = l.Close() }()
	port := l.Addr().(*net.TCPAddr).Port
	dir, err := portCacheDir()
	g.Expect(err).NotTo(HaveOccurred())
	// envtest's addr.Suggest takes the same flock on this file, from a new open file description.
	ok, err := reserve(filepath.Join(dir, fmt.Sprintf("port-%d", port)))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(ok).To(BeFalse(), "port %d is listened on but not reserved", port)
}
