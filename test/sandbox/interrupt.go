package sandbox

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

// InterruptContext returns a context cancelled by the first SIGINT or SIGTERM, so that a command
// interrupted by its user (Ctrl-C, a CI timeout) returns through its deferred Sandbox.Stop and
// stops the kube-apiserver, the etcd processes and the controllers it started instead of leaving
// them running. A second signal ends the process at once (the default handling is restored once
// the context is done). stop releases the signals.
func InterruptContext() (ctx context.Context, stop context.CancelFunc) {
	ctx, stop = signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop()
	}()
	return ctx, stop
}
