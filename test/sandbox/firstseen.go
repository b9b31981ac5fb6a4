package sandbox

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/remediation/fencing"
)

// FirstSeen watches objects through the API server (not through any record of CAPR's, whose
// timestamps are metav1.Time, whole seconds) and records, on the test's clock with its full
// resolution, when each object was first seen in a state. A fence-before-delete check compares
// such a time with a backend's own confirmation time: a delete issued a few
// hundred milliseconds before the fence was confirmed then fails it.
type FirstSeen struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	at     map[string]time.Time
	err    error
}

// watchFirstSeen lists and then watches from the list's resourceVersion, so nothing between the two
// is missed; the objects already in a state when it starts count as seen at the start. states
// returns the names of the states obj is in (e.g. "deleting"), recorded under "<name>/<state>".
func (s *Sandbox) watchFirstSeen(ctx context.Context, list client.ObjectList, opts []client.ListOption, states func(client.Object) []string) (*FirstSeen, error) {
	wcli, err := client.NewWithWatch(s.Env.Config, client.Options{Scheme: s.Env.Scheme})
	if err != nil {
		return nil, fmt.Errorf("creating a watching client: %w", err)
	}
	if err := wcli.List(ctx, list, opts...); err != nil {
		return nil, fmt.Errorf("listing: %w", err)
	}
	f := &FirstSeen{done: make(chan struct{}), at: map[string]time.Time{}}
	items, err := meta.ExtractList(list)
	if err != nil {
		return nil, fmt.Errorf("reading the list: %w", err)
	}
	for _, item := range items {
		if o, ok := item.(client.Object); ok {
			f.record(o, states(o))
		}
	}
	wctx, cancel := context.WithCancel(ctx)
	w, err := wcli.Watch(wctx, list, append(opts, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.GetResourceVersion()}})...)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("watching: %w", err)
	}
	f.cancel = cancel
	go func() {
		defer close(f.done)
		defer w.Stop()
		for ev := range w.ResultChan() {
			switch ev.Type {
			case watch.Added, watch.Modified, watch.Deleted:
				if o, ok := ev.Object.(client.Object); ok {
					st := states(o)
					if ev.Type == watch.Deleted {
						st = append(st, StateGone)
					}
					f.record(o, st)
				}
			case watch.Error:
				if wctx.Err() != nil {
					return // Stop cancelled the watch: the client reports that as an error event
				}
				f.fail(fmt.Errorf("watch failed: %v", ev.Object))
				return
			}
		}
		if wctx.Err() == nil {
			f.fail(fmt.Errorf("watch ended before Stop: states may be missed"))
		}
	}()
	return f, nil
}

// StateGone is recorded when the object is deleted from the API server.
const StateGone = "gone"

func (f *FirstSeen) record(o client.Object, states []string) {
	now := time.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, st := range states {
		key := o.GetName() + "/" + st
		if _, ok := f.at[key]; !ok {
			f.at[key] = now
		}
	}
}

func (f *FirstSeen) fail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.err = err
}

// At returns when the object name was first seen in state, or an error when it never was or the
// watch broke (then a state may have been missed and no time can be trusted).
func (f *FirstSeen) At(name, state string) (time.Time, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return time.Time{}, f.err
	}
	at, ok := f.at[name+"/"+state]
	if !ok {
		return time.Time{}, fmt.Errorf("%s was never seen %s", name, state)
	}
	return at, nil
}

// Names returns the names of the objects seen in state, sorted, or an error when the watch broke.
func (f *FirstSeen) Names(state string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	var out []string
	for key := range f.at {
		if name, ok := strings.CutSuffix(key, "/"+state); ok {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out, nil
}

// Stop ends the watch; the times recorded stay readable.
func (f *FirstSeen) Stop() {
	f.cancel()
	<-f.done
}

// Machine states recorded by WatchMachineDeletions.
const (
	// MachineSeen: the Machine exists (in the first list, or created since).
	MachineSeen = "seen"
	// MachineDeleting: the API server has the Machine's deletionTimestamp (a delete was issued).
	MachineDeleting = "deleting"
	// MachineReleased: deleting and not held by CAPR's fence-before-delete hook, so CAPI's Machine
	// controller may drain it (a pre-drain hook holds it: CAPI's Machine deletion contract,
	// docs/proposals/20200602-machine-deletion-phase-hooks.md). This is when a deletion takes effect,
	// whoever issued it, as far as fence before delete is concerned: a pre-terminate hook (CAPR's
	// replicas-back) holds only the Machine's termination, after its drain.
	MachineReleased = "released"
)

// WatchMachineDeletions records when each Machine of the cluster was first seen (MachineSeen), first
// seen deleting and first seen released (MachineDeleting, MachineReleased), and StateGone.
func (s *Sandbox) WatchMachineDeletions(ctx context.Context, wc *WorkloadCluster) (*FirstSeen, error) {
	return s.watchFirstSeen(ctx, &clusterv1.MachineList{},
		[]client.ListOption{client.InNamespace(wc.Namespace), client.MatchingLabels{clusterv1.ClusterNameLabel: wc.Name}},
		func(o client.Object) []string {
			if o.GetDeletionTimestamp().IsZero() {
				return []string{MachineSeen}
			}
			if _, held := o.GetAnnotations()[caprv1.FenceBeforeDeleteHookAnnotation]; held {
				return []string{MachineSeen, MachineDeleting}
			}
			return []string{MachineSeen, MachineDeleting, MachineReleased}
		})
}

// NodeOutOfService is the state recorded by WatchNodeTaints: the Node carries the out-of-service
// taint (the OutOfServiceTaint backend's fence is its landing on the Node).
const NodeOutOfService = "out-of-service"

// WatchNodeTaints records when each Node was first seen with the out-of-service taint.
func (s *Sandbox) WatchNodeTaints(ctx context.Context) (*FirstSeen, error) {
	return s.watchFirstSeen(ctx, &corev1.NodeList{}, nil, func(o client.Object) []string {
		n, ok := o.(*corev1.Node)
		if !ok {
			return nil
		}
		for _, t := range n.Spec.Taints {
			if t.MatchTaint(&fencing.OutOfServiceTaint) {
				return []string{NodeOutOfService}
			}
		}
		return nil
	})
}

// SeenAfter returns nil when name was first seen in state strictly after t, e.g. a Machine released
// after a backend confirmed its fence at t; otherwise an error saying when, with milliseconds. A
// zero t (a fence never confirmed) is an error.
func (f *FirstSeen) SeenAfter(name, state string, t time.Time) error {
	if t.IsZero() {
		return fmt.Errorf("no time to compare %s %s with (a fence never confirmed?)", name, state)
	}
	at, err := f.At(name, state)
	if err != nil {
		return err
	}
	if !at.After(t) {
		return fmt.Errorf("%s was first seen %s at %s, not after %s", name, state, at.Format(time.StampMilli), t.Format(time.StampMilli))
	}
	return nil
}
