package sandbox

import (
	"context"
	"sync"
	"time"

	"k8s.io/utils/ptr"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/remediation/fencing"
)

// GateBackend is a fencing backend for tests that confirms only once opened, recording when it
// first did. Serve it as the External backend (ExternalFencing) through a PolicyFencer.
type GateBackend struct {
	mu     sync.Mutex
	open   bool
	fenced time.Time
	// machines is when each Machine's fence was first confirmed.
	machines map[string]time.Time
}

// Fence implements fencing.Backend.
func (b *GateBackend) Fence(_ context.Context, req fencing.Request, _ caprv1.FencingBackend) (bool, string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.open {
		return false, "the test has not opened the gate", nil
	}
	now := time.Now()
	if b.fenced.IsZero() {
		b.fenced = now
	}
	if b.machines == nil {
		b.machines = map[string]time.Time{}
	}
	if req.Machine != nil {
		if _, ok := b.machines[req.Machine.Name]; !ok {
			b.machines[req.Machine.Name] = now
		}
	}
	return true, "fenced", nil
}

// Open lets every later Fence call confirm.
func (b *GateBackend) Open() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.open = true
}

// FencedAt is when the backend first confirmed (zero: never).
func (b *GateBackend) FencedAt() time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.fenced
}

// FencedAtFor is when the backend first confirmed the fence of the Machine (zero: never).
func (b *GateBackend) FencedAtFor(machine string) time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.machines[machine]
}

// Fencer serves the backend as the External fencing backend.
func (b *GateBackend) Fencer() fencing.Fencer {
	return &fencing.PolicyFencer{Backends: map[caprv1.FencingBackendType]fencing.Backend{caprv1.FencingBackendExternal: b}}
}

// ExternalFencing is a Required fencing spec with one External backend (a test's own, see
// GateBackend) and a long timeout.
func ExternalFencing(name string) *caprv1.FencingSpec {
	return &caprv1.FencingSpec{Policy: caprv1.FencingRequired, TimeoutSeconds: ptr.To[int32](600),
		Backends: []caprv1.FencingBackend{{Type: caprv1.FencingBackendExternal, TemplateRef: &caprv1.TemplateReference{
			APIVersion: "fencing.example.com/v1", Kind: "PowerFenceTemplate", Name: name}}}}
}
