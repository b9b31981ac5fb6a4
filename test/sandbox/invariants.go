package sandbox

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// Invariant watchers and data checks shared by the scenario tests and the chaos suite.

// RunningWatcher samples a cluster's MachineRemediations and records every instant at which more
// than one of them was Running (one control-plane remediation per cluster). It reads through the
// API server, not CAPR's records, and counts its samples: a watcher whose Lists failed or that
// sampled too rarely to see anything reports that as a violation, instead of passing silently.
type RunningWatcher struct {
	cancel     context.CancelFunc
	done       chan struct{}
	started    time.Time
	mu         sync.Mutex
	violations []string
	samples    int
	failed     int
}

// runningSampleInterval is how often RunningWatcher lists the requests.
const runningSampleInterval = 50 * time.Millisecond

// WatchRunning starts sampling every 50 ms until Stop.
func (s *Sandbox) WatchRunning(ctx context.Context, wc *WorkloadCluster) *RunningWatcher {
	wctx, cancel := context.WithCancel(ctx)
	w := &RunningWatcher{cancel: cancel, done: make(chan struct{}), started: time.Now()}
	go func() {
		defer close(w.done)
		for {
			select {
			case <-wctx.Done():
				return
			case <-time.After(runningSampleInterval):
			}
			list := &caprv1.MachineRemediationList{}
			if err := s.Client.List(wctx, list, client.InNamespace(wc.Namespace)); err != nil {
				if wctx.Err() == nil {
					w.mu.Lock()
					w.failed++
					w.mu.Unlock()
				}
				continue
			}
			var running []string
			for _, mr := range list.Items {
				if mr.Status.Phase == caprv1.MachineRemediationPhaseRunning {
					running = append(running, mr.Name)
				}
			}
			w.mu.Lock()
			w.samples++
			if len(running) > 1 {
				w.violations = append(w.violations, fmt.Sprintf("%s: %v Running", time.Now().Format(time.StampMilli), running))
			}
			w.mu.Unlock()
		}
	}()
	return w
}

// Stop ends sampling and returns the violations, including too few samples: fewer than one a
// second on average (a loaded machine slows a 50 ms cadence, but a watcher that could not sample
// for seconds at a time could miss an overlap), or more failed Lists than good ones.
func (w *RunningWatcher) Stop() []string {
	w.cancel()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.violations
	if minimum := max(3, int(time.Since(w.started)/time.Second)); w.samples < minimum || w.failed > w.samples {
		out = append(out, fmt.Sprintf("the watcher sampled %d times in %s (%d Lists failed): too few to tell", w.samples,
			time.Since(w.started).Round(time.Millisecond), w.failed))
	}
	return out
}

// Samples returns how many times the watcher has listed the requests, and how many Lists failed.
func (w *RunningWatcher) Samples() (ok, failed int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.samples, w.failed
}

// MachineCreations watches a cluster's control-plane Machines through the API server (not through
// any record of CAPR's) and collects the names of those created after it started: how many Machines
// a remediation cost, including any created and deleted again before the test looked.
type MachineCreations struct {
	cancel  context.CancelFunc
	done    chan struct{}
	mu      sync.Mutex
	created map[string]bool
	err     error
}

// WatchMachineCreations starts watching; the Machines that exist now are not counted. It returns
// once the watch is established, so nothing created after it returns is missed.
func (s *Sandbox) WatchMachineCreations(ctx context.Context, wc *WorkloadCluster) (*MachineCreations, error) {
	wcli, err := client.NewWithWatch(s.Env.Config, client.Options{Scheme: s.Env.Scheme})
	if err != nil {
		return nil, err
	}
	list := &clusterv1.MachineList{}
	selector := []client.ListOption{client.InNamespace(wc.Namespace), client.MatchingLabels{clusterv1.ClusterNameLabel: wc.Name}, client.HasLabels{clusterv1.MachineControlPlaneLabel}}
	if err := wcli.List(ctx, list, selector...); err != nil {
		return nil, err
	}
	wctx, cancel := context.WithCancel(ctx)
	w, err := wcli.Watch(wctx, &clusterv1.MachineList{}, append(selector, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.ResourceVersion}})...)
	if err != nil {
		cancel()
		return nil, err
	}
	existing := map[string]bool{}
	for _, m := range list.Items {
		existing[m.Name] = true
	}
	mc := &MachineCreations{cancel: cancel, done: make(chan struct{}), created: map[string]bool{}}
	go func() {
		defer close(mc.done)
		defer w.Stop()
		for ev := range w.ResultChan() {
			switch ev.Type {
			case watch.Added:
				if m, ok := ev.Object.(*clusterv1.Machine); ok && !existing[m.Name] {
					mc.mu.Lock()
					mc.created[m.Name] = true
					mc.mu.Unlock()
				}
			case watch.Error:
				if wctx.Err() != nil {
					return // Stop cancelled the watch: the client reports that as an error event
				}
				mc.mu.Lock()
				mc.err = fmt.Errorf("watch of Machines failed: %v", ev.Object)
				mc.mu.Unlock()
				return
			}
		}
		if wctx.Err() == nil {
			mc.mu.Lock()
			mc.err = fmt.Errorf("watch of Machines ended before Stop: creations may be missed")
			mc.mu.Unlock()
		}
	}()
	return mc, nil
}

// Stop ends the watch and returns the names of the control-plane Machines created while it ran,
// sorted, or an error when the watch broke (and the count cannot be trusted).
func (mc *MachineCreations) Stop() ([]string, error) {
	mc.cancel()
	<-mc.done
	mc.mu.Lock()
	defer mc.mu.Unlock()
	out := make([]string, 0, len(mc.created))
	for n := range mc.created {
		out = append(out, n)
	}
	sort.Strings(out)
	return out, mc.err
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
