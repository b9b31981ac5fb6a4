package binary_test

import (
	"context"
	"os"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/capr-io/capr/test/sandbox"
)

var (
	sb  *sandbox.Sandbox
	ctx = context.Background()
)

func TestMain(m *testing.M) {
	os.Exit(sandbox.RunTestsWithOptions(m, sandbox.Options{WithoutManagerIdentity: true}, func(s *sandbox.Sandbox) { sb = s }))
}

// startManager runs the built binary as the rendered ServiceAccount (sandbox.StartBuiltManager) for
// the rest of the test; its log is printed when the test fails. It returns the log's path.
func startManager(t *testing.T) (*sandbox.ManagerProcess, string) {
	t.Helper()
	p, logFile, err := sb.StartBuiltManager(ctx, t.TempDir())
	NewWithT(t).Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() {
		p.Stop()
		if t.Failed() {
			if out, err := os.ReadFile(logFile); err == nil {
				t.Logf("manager log:\n%s", out)
			}
		}
	})
	return p, logFile
}
