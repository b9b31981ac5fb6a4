package fencing

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"k8s.io/utils/ptr"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

type fakeBackend struct{ done bool }

func (f fakeBackend) Fence(context.Context, Request, caprv1.FencingBackend) (bool, string, error) {
	return f.done, "waiting for confirmation", nil
}

func TestPolicyFencer(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	nf := caprv1.FencingBackend{Type: caprv1.FencingBackendNetworkFence, NetworkFenceClassNames: []string{"c"}}
	spec := func(p caprv1.FencingPolicy) *caprv1.FencingSpec {
		return &caprv1.FencingSpec{Policy: p, Backends: []caprv1.FencingBackend{nf}, TimeoutSeconds: ptr.To[int32](60)}
	}
	tests := []struct {
		name     string
		spec     *caprv1.FencingSpec
		node     string
		backends map[caprv1.FencingBackendType]Backend
		elapsed  time.Duration
		want     Outcome
	}{
		{"no spec: disabled", nil, "n", nil, 0, Skipped},
		{"disabled", spec(caprv1.FencingDisabled), "n", nil, 0, Skipped},
		{"no node", spec(caprv1.FencingRequired), "", nil, 0, Skipped},
		{"required, backend confirms", spec(caprv1.FencingRequired), "n", map[caprv1.FencingBackendType]Backend{caprv1.FencingBackendNetworkFence: fakeBackend{done: true}}, 0, Fenced},
		{"required, backend pending, timed out: still waits", spec(caprv1.FencingRequired), "n", map[caprv1.FencingBackendType]Backend{caprv1.FencingBackendNetworkFence: fakeBackend{}}, time.Hour, Waiting},
		{"required, backend not available: waits, never deletes unfenced", spec(caprv1.FencingRequired), "n", nil, time.Hour, Waiting},
		{"best effort, pending within timeout", spec(caprv1.FencingBestEffort), "n", map[caprv1.FencingBackendType]Backend{caprv1.FencingBackendNetworkFence: fakeBackend{}}, 30 * time.Second, Waiting},
		{"best effort, timed out: gives up", spec(caprv1.FencingBestEffort), "n", nil, 61 * time.Second, GaveUp},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			p := &PolicyFencer{Backends: tt.backends, Now: func() time.Time { return start.Add(tt.elapsed) }}
			r, err := p.Fence(context.Background(), Request{Node: tt.node, Spec: tt.spec, Started: start})
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(r.Outcome).To(Equal(tt.want), r.Message)
			g.Expect(r.Message).NotTo(BeEmpty())
			if tt.backends == nil && tt.spec != nil && tt.spec.Policy != caprv1.FencingDisabled && tt.node != "" {
				g.Expect(r.Message).To(ContainSubstring("not available"))
			}
		})
	}
}
