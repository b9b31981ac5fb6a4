package envtest

import (
	"testing"

	. "github.com/onsi/gomega"
)

// reconcileHandler stands for controller-runtime's function of that name: StuckReconciles looks for it.
func reconcileHandler(block <-chan struct{}) { waitForever(block) }

func waitForever(block <-chan struct{}) { <-block }

func TestStuckReconcilesNamesTheBlockedCall(t *testing.T) {
	g := NewWithT(t)
	g.Expect(StuckReconciles()).To(Equal("no goroutine is inside a Reconcile"))
	block := make(chan struct{})
	defer close(block)
	go reconcileHandler(block)
	g.Eventually(StuckReconciles).Should(And(
		HavePrefix("stuck reconcile 1: goroutine "),
		ContainSubstring("\n  github.com/capr-io/capr/test/envtest.waitForever\n  github.com/capr-io/capr/test/envtest.reconcileHandler\n"),
		Not(ContainSubstring(".go:")),
	), "the blocked call's functions, innermost first, without file lines")
}
