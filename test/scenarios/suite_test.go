package scenarios_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	capienv "github.com/capr-io/capr/test/envtest"
	"github.com/capr-io/capr/test/sandbox"
)

// These tests run CAPR against the sandbox: a real kube-apiserver and etcd for the management
// cluster, and for every workload cluster a real etcd cluster with one member process per
// control-plane Machine, reached through the API server's port-forward and kubelet stand-ins.

var (
	sb  *sandbox.Sandbox
	ctx = context.Background()
)

const remediationTimeout = 3 * time.Minute

func TestMain(m *testing.M) {
	os.Exit(sandbox.RunTests(m, func(s *sandbox.Sandbox) { sb = s }))
}

// startCAPR starts CAPR's manager (with the RBAC it ships) for the rest of the test.
func startCAPR(t testing.TB) *sandbox.CAPR {
	t.Helper()
	capr, err := sb.StartCAPR(ctx, sandbox.CAPROptions{})
	NewWithT(t).Expect(err).NotTo(HaveOccurred())
	t.Cleanup(capr.Stop)
	return capr
}

// clusterOptions configure newCluster.
type clusterOptions struct {
	controlPlane int32
	healthCheck  []func(*caprv1.MachineHealthCheck)
}

// clusterOption configures newCluster.
type clusterOption func(*clusterOptions)

// withControlPlane sets the number of control-plane Machines (and etcd members); the default is 3.
func withControlPlane(n int32) clusterOption {
	return func(o *clusterOptions) { o.controlPlane = n }
}

// withHealthCheck changes the cluster's CAPR health check before it is created.
func withHealthCheck(mutate func(*caprv1.MachineHealthCheck)) clusterOption {
	return func(o *clusterOptions) { o.healthCheck = append(o.healthCheck, mutate) }
}

// withReplacementTimeout sets the health check's replacementTimeoutSeconds.
func withReplacementTimeout(seconds int32) clusterOption {
	return withHealthCheck(func(mhc *caprv1.MachineHealthCheck) {
		mhc.Spec.Remediation.ControlPlane = &caprv1.ControlPlaneRemediationSpec{ReplacementTimeoutSeconds: ptr.To(seconds)}
	})
}

// newCluster creates a sandbox cluster in a fresh namespace with a CAPR health check on its control
// plane: a Node not Ready for 2s, or an etcd member unhealthy for 10s, marks the Machine.
func newCluster(t testing.TB, opts ...clusterOption) *sandbox.WorkloadCluster {
	t.Helper()
	o := clusterOptions{controlPlane: 3}
	for _, opt := range opts {
		opt(&o)
	}
	g := NewWithT(t)
	ns, err := capienv.CreateNamespace(ctx, sb.Client, "cp")
	g.Expect(err).NotTo(HaveOccurred())
	wc, err := sb.CreateCluster(ctx, sandbox.ClusterSpec{Namespace: ns, Name: "wc", ControlPlane: o.controlPlane})
	g.Expect(err).NotTo(HaveOccurred())
	// Its etcd members and kubelets stop with the test, passed or failed: clusters left running
	// loaded the machine until later tests' etcd dials timed out.
	t.Cleanup(func() { sb.DestroyCluster(ctx, wc) })
	mhc := sandbox.ControlPlaneHealthCheck(ns, "cp", wc.Name, 2)
	for _, mutate := range o.healthCheck {
		mutate(mhc)
	}
	g.Expect(sb.Client.Create(ctx, mhc)).To(Succeed())
	return wc
}

func controlPlane(g Gomega, wc *sandbox.WorkloadCluster) []clusterv1.Machine {
	machines, err := sb.ControlPlaneMachines(ctx, wc)
	g.Expect(err).NotTo(HaveOccurred())
	return machines
}

func getRemediation(g Gomega, wc *sandbox.WorkloadCluster, name string) *caprv1.MachineRemediation {
	mr := &caprv1.MachineRemediation{}
	g.Expect(sb.Client.Get(ctx, client.ObjectKey{Namespace: wc.Namespace, Name: name}, mr)).To(Succeed())
	return mr
}

// waitRemediated waits for the remediation of victim to succeed and the control plane to be whole.
func waitRemediated(t *testing.T, wc *sandbox.WorkloadCluster, victim string, n int) *caprv1.MachineRemediation {
	t.Helper()
	g := NewWithT(t)
	var mr *caprv1.MachineRemediation
	g.Eventually(func(g Gomega) {
		mr = getRemediation(g, wc, victim)
		if mr.Status.Phase == caprv1.MachineRemediationPhaseFailed {
			StopTrying(fmt.Sprintf("remediation failed: %v", mr.Status.Conditions)).Now()
		}
		g.Expect(mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhaseSucceeded), "step %s: %v", mr.Status.CurrentStep, mr.Status.Conditions)
	}, remediationTimeout, 200*time.Millisecond).Should(Succeed())
	g.Expect(sb.WaitForControlPlane(ctx, wc, n, time.Minute)).To(Succeed())
	return mr
}

// writeData writes keys to the workload etcd before a fault, and returns a check that they are all
// still readable (linearizably) afterwards.
func writeData(t *testing.T, wc *sandbox.WorkloadCluster) func() {
	t.Helper()
	g := NewWithT(t)
	cli, err := wc.Etcd.Client(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	for i := range 50 {
		_, err := cli.Put(ctx, fmt.Sprintf("/data/%03d", i), fmt.Sprintf("value-%d", i))
		g.Expect(err).NotTo(HaveOccurred())
	}
	_ = cli.Close()
	return func() {
		g := NewWithT(t)
		g.Eventually(func(g Gomega) {
			cli, err := wc.Etcd.Client(ctx)
			g.Expect(err).NotTo(HaveOccurred())
			defer func() { _ = cli.Close() }()
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			for i := range 50 {
				resp, err := cli.Get(rctx, fmt.Sprintf("/data/%03d", i))
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(resp.Kvs).To(HaveLen(1))
				g.Expect(string(resp.Kvs[0].Value)).To(Equal(fmt.Sprintf("value-%d", i)))
			}
		}, 30*time.Second, 500*time.Millisecond).Should(Succeed())
	}
}

func stepOutcome(mr *caprv1.MachineRemediation, name caprv1.StepName) caprv1.StepOutcome {
	for _, s := range mr.Status.Steps {
		if s.Name == name {
			return s.Outcome
		}
	}
	return ""
}

func stepNames(mr *caprv1.MachineRemediation) []caprv1.StepName {
	out := make([]caprv1.StepName, 0, len(mr.Status.Steps))
	for _, s := range mr.Status.Steps {
		out = append(out, s.Name)
	}
	return out
}

func memberNames(g Gomega, wc *sandbox.WorkloadCluster) []string {
	state, err := sb.EtcdState(ctx, wc)
	g.Expect(err).NotTo(HaveOccurred())
	out := make([]string, 0, len(state.Members))
	for _, m := range state.Members {
		out = append(out, m.Name)
	}
	return out
}

func getMachine(g Gomega, wc *sandbox.WorkloadCluster, name string) *clusterv1.Machine {
	m := &clusterv1.Machine{}
	g.Expect(sb.Client.Get(ctx, client.ObjectKey{Namespace: wc.Namespace, Name: name}, m)).To(Succeed())
	return m
}
