package controllers

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/types"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/capr-io/capr/controllers/machinehealthcheck"
)

// blockingSource counts its reads; each waits for release (when set) and answers health or err.
type blockingSource struct {
	reads   atomic.Int32
	release chan struct{}
	health  map[string]machinehealthcheck.EtcdMemberHealth
	err     error
}

func (b *blockingSource) MemberHealth(context.Context, *clusterv1.Cluster) (map[string]machinehealthcheck.EtcdMemberHealth, error) {
	b.reads.Add(1)
	if b.release != nil {
		<-b.release
	}
	return b.health, b.err
}

func clusterWithUID(uid string) *clusterv1.Cluster {
	c := &clusterv1.Cluster{}
	c.UID = types.UID(uid)
	return c
}

// Health checks over one cluster that ask while its read is in flight share that read.
func TestSharedEtcdMembersOneReadInFlight(t *testing.T) {
	g := NewWithT(t)
	source := &blockingSource{release: make(chan struct{}), health: map[string]machinehealthcheck.EtcdMemberHealth{"n1": {Healthy: true}}}
	s := newSharedEtcdMembers(source)
	const callers = 20
	var wg sync.WaitGroup
	results := make([]map[string]machinehealthcheck.EtcdMemberHealth, callers)
	errs := make([]error, callers)
	for i := range callers {
		wg.Go(func() { results[i], errs[i] = s.MemberHealth(context.Background(), clusterWithUID("c1")) })
	}
	g.Eventually(source.reads.Load).Should(BeEquivalentTo(1))
	close(source.release)
	wg.Wait()
	g.Expect(source.reads.Load()).To(BeEquivalentTo(1), "one read for every caller")
	g.Expect(errs).To(HaveEach(BeNil()))
	for _, h := range results {
		g.Expect(h).To(Equal(map[string]machinehealthcheck.EtcdMemberHealth{"n1": {Healthy: true}}))
	}
	// Each caller has its own copy.
	results[0]["n1"] = machinehealthcheck.EtcdMemberHealth{Problem: "changed by a caller"}
	g.Expect(results[1]["n1"].Healthy).To(BeTrue())
}

func TestSharedEtcdMembersAge(t *testing.T) {
	g := NewWithT(t)
	now := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	source := &blockingSource{health: map[string]machinehealthcheck.EtcdMemberHealth{"n1": {Healthy: true}}}
	s := newSharedEtcdMembers(source)
	s.now = func() time.Time { return now }
	read := func(uid string) {
		_, err := s.MemberHealth(context.Background(), clusterWithUID(uid))
		g.Expect(err).NotTo(HaveOccurred())
	}

	read("c1")
	now = now.Add(sharedEtcdMaxAge)
	read("c1")
	g.Expect(source.reads.Load()).To(BeEquivalentTo(1), "an observation as old as maxAge is given again")
	now = now.Add(time.Millisecond)
	read("c1")
	g.Expect(source.reads.Load()).To(BeEquivalentTo(2), "an older one is read again")
	read("c2")
	g.Expect(source.reads.Load()).To(BeEquivalentTo(3), "another cluster has its own observation")

	// A failed read is not kept.
	source.err = errors.New("no etcd member answered")
	now = now.Add(time.Hour)
	_, err := s.MemberHealth(context.Background(), clusterWithUID("c1"))
	g.Expect(err).To(MatchError("no etcd member answered"))
	_, err = s.MemberHealth(context.Background(), clusterWithUID("c1"))
	g.Expect(err).To(HaveOccurred())
	g.Expect(source.reads.Load()).To(BeEquivalentTo(5))
	s.mu.Lock()
	g.Expect(s.last).To(BeEmpty(), "observations older than maxAge are dropped")
	s.mu.Unlock()
}

// A caller that joins a read in flight leaves when its own context ends.
func TestSharedEtcdMembersJoinerLeavesWithItsContext(t *testing.T) {
	g := NewWithT(t)
	source := &blockingSource{release: make(chan struct{})}
	defer close(source.release)
	s := newSharedEtcdMembers(source)
	go func() { _, _ = s.MemberHealth(context.Background(), clusterWithUID("c1")) }()
	g.Eventually(source.reads.Load).Should(BeEquivalentTo(1))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := s.MemberHealth(ctx, clusterWithUID("c1"))
	g.Expect(err).To(MatchError(context.Canceled))
	g.Expect(source.reads.Load()).To(BeEquivalentTo(1))
}
