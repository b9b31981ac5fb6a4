package envtest

import (
	"testing"

	. "github.com/onsi/gomega"
)

// processNextWorkItem stands for controller-runtime's function of that name: StuckWorkers looks for it.
func processNextWorkItem(block <-chan struct{}) { waitForever(block) }

func waitForever(block <-chan struct{}) { <-block }

func TestStuckWorkersNamesTheBlockedCall(t *testing.T) {
	g := NewWithT(t)
	g.Expect(StuckWorkers()).To(Equal("no controller worker is left"))
	block := make(chan struct{})
	defer close(block)
	go processNextWorkItem(block)
	go processNextWorkItem(block)
	g.Eventually(StuckWorkers).Should(Equal("stuck workers, stack 1 (2 goroutines):\n"+
		"  github.com/capr-io/capr/test/envtest.waitForever\n"+
		"  github.com/capr-io/capr/test/envtest.processNextWorkItem\n"),
		"one entry per distinct stack: its functions, innermost first, without file lines")
}
