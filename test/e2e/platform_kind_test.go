package e2e_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/clientcmd"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	utilyaml "sigs.k8s.io/cluster-api/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capr-io/capr/controllers"
)

// A real management cluster (kind with CAPD, or any other), with CAPI, a KubeadmControlPlane provider
// and CAPR installed. The workload cluster comes from a manifest the user provides, and a node is
// broken by a command the user provides (docs/developer/testing.md, End-to-end suite).
const (
	// clusterTemplateEnv names a manifest of one Cluster (without ClusterClass: CAPR leaves a
	// topology-owned control plane alone) with a 3-replica KubeadmControlPlane and a 2-replica
	// MachineDeployment whose Nodes become Ready (a CNI included), e.g. from
	// `clusterctl generate cluster`; its objects are created in the test's namespace.
	clusterTemplateEnv = "E2E_CLUSTER_TEMPLATE"
	// breakNodeEnv is a shell command that breaks a node, {node} replaced by the Node's name; the
	// default stops CAPD's container of that name.
	breakNodeEnv     = "E2E_BREAK_NODE"
	defaultBreakNode = "docker stop {node}"
)

type kindPlatform struct {
	c        client.Client
	template string
	breakCmd string
}

func newKindPlatform(kubeconfig string) (*kindPlatform, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", kubeconfig, err)
	}
	scheme, err := controllers.NewScheme()
	if err != nil {
		return nil, err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	template := os.Getenv(clusterTemplateEnv)
	if template == "" {
		return nil, errors.New(clusterTemplateEnv + " must name the workload cluster's manifest")
	}
	cmd := os.Getenv(breakNodeEnv)
	if cmd == "" {
		cmd = defaultBreakNode
	}
	return &kindPlatform{c: c, template: template, breakCmd: cmd}, nil
}

func (p *kindPlatform) name() string                      { return "management cluster " + os.Getenv(kubeconfigEnv) }
func (p *kindPlatform) client() client.Client             { return p.c }
func (p *kindPlatform) nodeUnhealthySeconds() int32       { return 60 }
func (p *kindPlatform) remediationTimeout() time.Duration { return 30 * time.Minute }

// createCluster creates the template's objects in ns and waits until every Machine has a Node.
func (p *kindPlatform) createCluster(t *testing.T, ns string) string {
	t.Helper()
	g := NewWithT(t)
	raw, err := os.ReadFile(p.template)
	g.Expect(err).NotTo(HaveOccurred())
	objs, err := utilyaml.ToUnstructured(raw)
	g.Expect(err).NotTo(HaveOccurred())
	name := ""
	for i := range objs {
		o := &objs[i]
		if o.GetKind() == "Cluster" && o.GroupVersionKind().Group == clusterv1.GroupVersion.Group {
			name = o.GetName()
		}
		if o.GetKind() != "Namespace" {
			o.SetNamespace(ns)
		}
		g.Expect(p.c.Create(ctx, o)).To(Succeed(), "%s %s", o.GetKind(), o.GetName())
	}
	g.Expect(name).NotTo(BeEmpty(), "%s has no Cluster", p.template)
	t.Cleanup(func() {
		cluster := &clusterv1.Cluster{}
		cluster.Namespace, cluster.Name = ns, name
		_ = p.c.Delete(ctx, cluster)
		NewWithT(t).Eventually(func() bool {
			return apierrors.IsNotFound(p.c.Get(ctx, client.ObjectKeyFromObject(cluster), cluster))
		}, 10*time.Minute, 5*time.Second).Should(BeTrue(), "Cluster %s not deleted", name)
	})
	g.Eventually(func(g Gomega) {
		cp, workers := machinesOf(g, ns, name)
		g.Expect(cp).To(HaveLen(3))
		g.Expect(workers).To(HaveLen(2))
		for _, m := range append(cp, workers...) {
			g.Expect(m.Status.NodeRef.IsDefined()).To(BeTrue(), "Machine %s has no Node", m.Name)
		}
	}, 20*time.Minute, 10*time.Second).Should(Succeed())
	return name
}

// breakNode runs the user's command (CAPD: stop the node's container).
func (p *kindPlatform) breakNode(t *testing.T, _, _, node string) {
	t.Helper()
	out, err := exec.CommandContext(ctx, "sh", "-c", strings.ReplaceAll(p.breakCmd, "{node}", node)).CombinedOutput()
	NewWithT(t).Expect(err).NotTo(HaveOccurred(), "breaking node %s: %s", node, out)
}
