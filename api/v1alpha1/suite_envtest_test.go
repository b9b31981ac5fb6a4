//go:build envtest

// The envtest suite of the API (go test -tags envtest; make test): bad specs are applied to a real
// kube-apiserver with CAPR's CRDs installed (test/envtest) and must be refused naming the field. They
// need the binaries built by `make envtest-assets`.

package v1alpha1_test

import (
	"context"
	"os"
	"testing"

	capienv "github.com/capr-io/capr/test/envtest"
)

var (
	testEnv *capienv.Environment
	ctx     = context.Background()
)

func TestMain(m *testing.M) {
	os.Exit(capienv.Run(m, capienv.Options{}, func(s *capienv.Suite) error {
		testEnv = s.Environment
		return nil
	}))
}
