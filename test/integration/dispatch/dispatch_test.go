// Package dispatch_test checks, against a real kube-apiserver and etcd (envtest), which of CAPR's two
// remediators takes up a MachineRemediation: each reconciler's own Reconcile is called, not the
// discriminator function, so that an early exit before it counts too.
package dispatch_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/remediation/controlplane"
	"github.com/capr-io/capr/remediation/worker"
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

// recordingClient records every call a reconciler makes and passes it on to the API server.
type recordingClient struct {
	client.Client
	mu    sync.Mutex
	calls []string
}

func (c *recordingClient) record(verb string, obj any, key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls = append(c.calls, fmt.Sprintf("%s %T %s", verb, obj, key))
}

func (c *recordingClient) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	c.record("get", obj, key.String())
	return c.Client.Get(ctx, key, obj, opts...)
}

func (c *recordingClient) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	c.record("list", list, "")
	return c.Client.List(ctx, list, opts...)
}

func (c *recordingClient) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	c.record("create", obj, client.ObjectKeyFromObject(obj).String())
	return c.Client.Create(ctx, obj, opts...)
}

func (c *recordingClient) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	c.record("update", obj, client.ObjectKeyFromObject(obj).String())
	return c.Client.Update(ctx, obj, opts...)
}

func (c *recordingClient) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	c.record("patch", obj, client.ObjectKeyFromObject(obj).String())
	return c.Client.Patch(ctx, obj, patch, opts...)
}

func (c *recordingClient) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	c.record("delete", obj, client.ObjectKeyFromObject(obj).String())
	return c.Client.Delete(ctx, obj, opts...)
}

func (c *recordingClient) Status() client.SubResourceWriter {
	return &recordingStatus{SubResourceWriter: c.Client.Status(), c: c}
}

type recordingStatus struct {
	client.SubResourceWriter
	c *recordingClient
}

func (s *recordingStatus) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	s.c.record("status update", obj, client.ObjectKeyFromObject(obj).String())
	return s.SubResourceWriter.Update(ctx, obj, opts...)
}

func (s *recordingStatus) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	s.c.record("status patch", obj, client.ObjectKeyFromObject(obj).String())
	return s.SubResourceWriter.Patch(ctx, obj, patch, opts...)
}

// tookUp reports whether a reconciler went past reading the request and its Machine: a remediator
// that leaves a request to the other one makes no other call (the Cluster is paused, so the one that
// takes it up reads the Cluster and records the Paused condition, and goes no further).
func (c *recordingClient) tookUp(key client.ObjectKey) (bool, []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	readsOnly := []string{
		fmt.Sprintf("get %T %s", &caprv1.MachineRemediation{}, key),
		fmt.Sprintf("get %T %s", &clusterv1.Machine{}, key),
	}
	for _, call := range c.calls {
		if !slices.Contains(readsOnly, call) {
			return true, c.calls
		}
	}
	return false, c.calls
}

// TestExactlyOneRemediatorTakesUpARequest runs both remediators' Reconcile on every combination of
// recorded role (none, status.worker, status.controlPlane, both) and Machine (worker, control plane,
// gone), and checks that exactly one of them takes the request up: the expected one, stated here
// independently of the discriminator. A recorded control-plane role decides over everything: the
// control-plane remediator may hold its cluster's lock and have changed etcd's membership, which only
// it can finish or undo (a request with both roles recorded was written by neither remediator alone).
func TestExactlyOneRemediatorTakesUpARequest(t *testing.T) {
	g := NewWithT(t)
	ns, err := capienv.CreateNamespace(ctx, testEnv.Client, "dispatch")
	g.Expect(err).NotTo(HaveOccurred())
	cluster := capienv.NewCluster(ns, "c", clusterv1.ContractVersionedObjectReference{})
	cluster.Spec.Paused = ptr.To(true)
	g.Expect(testEnv.Client.Create(ctx, cluster)).To(Succeed())

	const (
		workerMachine = "worker Machine"
		cpMachine     = "control-plane Machine"
		machineGone   = "Machine gone"
		byWorker      = "worker"
		byCP          = "control plane"
	)
	type roles struct{ worker, cp bool }
	owner := func(r roles, machine string) string {
		switch {
		case r.cp:
			return byCP
		case r.worker:
			return byWorker
		case machine == workerMachine:
			return byWorker
		default:
			return byCP // a control-plane Machine, or a request whose Machine is gone before it started
		}
	}
	i := 0
	for _, r := range []roles{{}, {worker: true}, {cp: true}, {worker: true, cp: true}} {
		for _, machine := range []string{workerMachine, cpMachine, machineGone} {
			i++
			name := fmt.Sprintf("m%d", i)
			t.Run(fmt.Sprintf("worker recorded %t, control plane recorded %t, %s", r.worker, r.cp, machine), func(t *testing.T) {
				g := NewWithT(t)
				if machine != machineGone {
					m := capienv.NewMachine(ns, cluster.Name, name)
					if machine == cpMachine {
						capienv.AsControlPlane(m)
					}
					g.Expect(testEnv.Client.Create(ctx, m)).To(Succeed())
				}
				mr := &caprv1.MachineRemediation{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
					Labels: map[string]string{clusterv1.ClusterNameLabel: cluster.Name}}}
				g.Expect(testEnv.Client.Create(ctx, mr)).To(Succeed())
				if r.worker {
					mr.Status.Worker = &caprv1.WorkerRemediationStatus{ClusterName: cluster.Name, MachineSet: "ms"}
				}
				if r.cp {
					mr.Status.ControlPlane = &caprv1.ControlPlaneRemediationStatus{ClusterName: cluster.Name}
				}
				if r.worker || r.cp {
					g.Expect(testEnv.Client.Status().Update(ctx, mr)).To(Succeed())
				}
				key := client.ObjectKeyFromObject(mr)

				wc := &recordingClient{Client: testEnv.Client}
				wr := &worker.Reconciler{Client: wc, APIReader: wc}
				_, _ = wr.Reconcile(ctx, ctrl.Request{NamespacedName: key})
				cc := &recordingClient{Client: testEnv.Client}
				cr := &controlplane.Reconciler{Client: cc, APIReader: cc}
				_, _ = cr.Reconcile(ctx, ctrl.Request{NamespacedName: key})

				workerTook, workerCalls := wc.tookUp(key)
				cpTook, cpCalls := cc.tookUp(key)
				want := owner(r, machine)
				g.Expect(workerTook).To(Equal(want == byWorker), "worker remediator's calls:\n%s", strings.Join(workerCalls, "\n"))
				g.Expect(cpTook).To(Equal(want == byCP), "control-plane remediator's calls:\n%s", strings.Join(cpCalls, "\n"))
			})
		}
	}
}
