package sandbox

import (
	"context"
	"fmt"
	"sync"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// Invariant watchers and data checks shared by the scenario tests and the chaos suite.

// RunningWatcher samples a cluster's MachineRemediations and records every instant at which more
// than one of them was Running (one control-plane remediation per cluster).
type RunningWatcher struct {
	cancel     context.CancelFunc
	done       chan struct{}
	mu         sync.Mutex
	violations []string
}

// WatchRunning starts sampling every 50 ms until Stop.
func (s *Sandbox) WatchRunning(ctx context.Context, wc *WorkloadCluster) *RunningWatcher {
	wctx, cancel := context.WithCancel(ctx)
	w := &RunningWatcher{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for {
			select {
			case <-wctx.Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
			list := &caprv1.MachineRemediationList{}
			if s.Client.List(wctx, list, client.InNamespace(wc.Namespace)) != nil {
				continue
			}
			var running []string
			for _, mr := range list.Items {
				if mr.Status.Phase == caprv1.MachineRemediationPhaseRunning {
					running = append(running, mr.Name)
				}
			}
			if len(running) > 1 {
				w.mu.Lock()
				w.violations = append(w.violations, fmt.Sprintf("%s: %v Running", time.Now().Format(time.StampMilli), running))
				w.mu.Unlock()
			}
		}
	}()
	return w
}

// Stop ends sampling and returns the violations.
func (w *RunningWatcher) Stop() []string {
	w.cancel()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.violations
}

// WriteData writes n keys to the workload etcd (before a fault) and returns a function that reads
// every one back linearizably (after the remediation) and says what is missing.
func WriteData(ctx context.Context, wc *WorkloadCluster, n int) (func() error, error) {
	cli, err := wc.Etcd.Client(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = cli.Close() }()
	for i := range n {
		if _, err := cli.Put(ctx, fmt.Sprintf("/data/%03d", i), fmt.Sprintf("value-%d", i)); err != nil {
			return nil, fmt.Errorf("writing key %d: %w", i, err)
		}
	}
	return func() error {
		cli, err := wc.Etcd.Client(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = cli.Close() }()
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		for i := range n {
			resp, err := cli.Get(rctx, fmt.Sprintf("/data/%03d", i))
			if err != nil {
				return fmt.Errorf("reading key %d: %w", i, err)
			}
			if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != fmt.Sprintf("value-%d", i) {
				return fmt.Errorf("key %d lost or changed: %v", i, resp.Kvs)
			}
		}
		return nil
	}, nil
}
