package envtest

import (
	"fmt"
	"os"
	"testing"
)

// RunTests starts an Environment with opts, hands it to set, runs the package's tests and stops it:
// the TestMain of a suite that needs nothing else. It returns the exit code for os.Exit.
func RunTests(m *testing.M, opts Options, set func(*Environment)) int {
	env, err := Start(opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: cannot start envtest: %v\n", err)
		return 1
	}
	defer func() { _ = env.Stop() }()
	set(env)
	return m.Run()
}
