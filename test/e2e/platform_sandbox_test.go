package e2e_test

import (
	"os"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/test/sandbox"
)

// sandboxPlatform is the full-stack sandbox with the built capr binary as the rendered ServiceAccount.
type sandboxPlatform struct {
	sb *sandbox.Sandbox
}

func (p *sandboxPlatform) name() string                      { return "sandbox" }
func (p *sandboxPlatform) client() client.Client             { return p.sb.Client }
func (p *sandboxPlatform) remediationTimeout() time.Duration { return 6 * time.Minute }

// healthChecks: the sandbox's nodes change state at once, so two seconds of not Ready marks.
func (p *sandboxPlatform) healthChecks(ns, cluster string) (controlPlane, workers *caprv1.MachineHealthCheck) {
	return sandbox.ControlPlaneHealthCheck(ns, "control-plane", cluster, 2), sandbox.WorkerHealthCheck(ns, "workers", cluster, 2)
}

// createCluster creates the cluster on the sandbox's KCP and starts the built manager (in a real
// management cluster CAPR is already installed).
func (p *sandboxPlatform) createCluster(t *testing.T, ns string) string {
	t.Helper()
	g := NewWithT(t)
	wc, err := p.sb.CreateCluster(ctx, sandbox.ClusterSpec{Namespace: ns, Name: "e2e", ControlPlane: 3, Workers: 2})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { p.sb.DestroyCluster(ctx, wc) })
	proc, logFile, err := p.sb.StartBuiltManager(ctx, t.TempDir())
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { // before the cluster is destroyed
		proc.Stop()
		if t.Failed() {
			if out, err := os.ReadFile(logFile); err == nil {
				t.Logf("manager log:\n%s", out)
			}
		}
	})
	return wc.Name
}

// breakNode stops the Node's kubelet: its Lease is no longer renewed and kube-controller-manager's
// node lifecycle controller sets Ready=Unknown.
func (p *sandboxPlatform) breakNode(t *testing.T, ns, cluster, node string) {
	t.Helper()
	wc := p.sb.Cluster(ns, cluster)
	NewWithT(t).Expect(wc).NotTo(BeNil())
	NewWithT(t).Expect(p.sb.StopKubelet(ctx, wc, node)).To(Succeed())
}
