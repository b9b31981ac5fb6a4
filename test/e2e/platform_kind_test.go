package e2e_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	utilyaml "sigs.k8s.io/cluster-api/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/controllers"
	"github.com/capr-io/capr/test/sandbox"
)

// kindPlatform is the kind management cluster of make kind-up (docs/developer/kind.md): CAPI, CAPD
// and CAPR installed by clusterctl, CAPR running from its image with its shipped RBAC. A workload
// cluster is rendered by clusterctl from test/kind/templates and made of real CAPD nodes; a fault is
// injected in a node's container.
type kindPlatform struct {
	c client.WithWatch
	// env holds hack/kind/versions.sh's values: the tools' paths, the state directory.
	env      map[string]string
	template string
}

// E2E_CLUSTER_TEMPLATE overrides the workload cluster template (a clusterctl template with
// ${CLUSTER_NAME}, ${NAMESPACE}, ${KUBERNETES_VERSION} and the two machine counts).
const clusterTemplateEnv = "E2E_CLUSTER_TEMPLATE"

// repoRoot is the checkout, two levels above this package.
func repoRoot() string {
	wd, _ := os.Getwd()
	return filepath.Clean(filepath.Join(wd, "..", ".."))
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
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	env := map[string]string{}
	for _, name := range []string{"CLUSTERCTL", "KUBECTL", "KUBERNETES_VERSION", "KIND_STATE", "CAPR_IMAGE"} {
		out, err := exec.Command(filepath.Join(repoRoot(), "hack", "kind", "env.sh"), name).Output()
		if err != nil {
			return nil, fmt.Errorf("hack/kind/env.sh %s: %w", name, err)
		}
		env[name] = strings.TrimSpace(string(out))
	}
	template := os.Getenv(clusterTemplateEnv)
	if template == "" {
		template = filepath.Join(repoRoot(), "test", "kind", "templates", "cluster-template.yaml")
	}
	return &kindPlatform{c: c, env: env, template: template}, nil
}

func (p *kindPlatform) name() string          { return "kind" }
func (p *kindPlatform) client() client.Client { return p.c }

// healthChecks tell a silent node from a joining one, as CAPI's own templates do with their
// five-minute Ready timeouts. A node whose kubelet stopped, or whose container did, turns Ready=Unknown
// (the node lifecycle controller's grace period, then Unknown): a minute of it marks. A joining
// control-plane node reports Ready=False until its pod network runs, which was measured at 73 s here
// (registered, then the network's pod started 49 s later on a busy two-core host); with the same minute
// the replacement itself was marked, and a second remediation began. Ready=False marks after five
// minutes, longer than any join seen here.
func (p *kindPlatform) healthChecks(ns, cluster string) (controlPlane, workers *caprv1.MachineHealthCheck) {
	const silent, joining = 60, 300
	controlPlane = sandbox.ControlPlaneHealthCheck(ns, "control-plane", cluster, silent)
	workers = sandbox.WorkerHealthCheck(ns, "workers", cluster, silent)
	for _, mhc := range []*caprv1.MachineHealthCheck{controlPlane, workers} {
		for i, c := range mhc.Spec.Checks.UnhealthyNodeConditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionFalse {
				mhc.Spec.Checks.UnhealthyNodeConditions[i].TimeoutSeconds = ptr.To[int32](joining)
			}
		}
	}
	return controlPlane, workers
}
func (p *kindPlatform) remediationTimeout() time.Duration { return 20 * time.Minute }

// render returns the template rendered by clusterctl, as a user renders it.
func (p *kindPlatform) render(template, ns, name string, controlPlane, workers int) ([]byte, error) {
	cmd := exec.CommandContext(ctx, p.env["CLUSTERCTL"], "generate", "cluster", name, "--from", template,
		"--target-namespace", ns, "--kubernetes-version", p.env["KUBERNETES_VERSION"],
		"--control-plane-machine-count", fmt.Sprint(controlPlane), "--worker-machine-count", fmt.Sprint(workers),
		"--kubeconfig", os.Getenv(kubeconfigEnv))
	cmd.Env = append(os.Environ(), "CLUSTERCTL_DISABLE_VERSIONCHECK=true")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("clusterctl generate cluster: %w: %s", err, stderr.String())
	}
	return out, nil
}

// createCluster creates a cluster of three control-plane Machines and two workers.
func (p *kindPlatform) createCluster(t *testing.T, ns string) string {
	t.Helper()
	return p.createClusterOf(t, ns, "e2e", 3, 2, t.Cleanup)
}

// createClusterOf creates the rendered template's objects in ns and waits until every Machine has
// a Node. Its deletion is registered with cleanup (t.Cleanup, or later for a shared cluster);
// kind-down removes what a failed deletion left.
func (p *kindPlatform) createClusterOf(t *testing.T, ns, base string, controlPlane, workers int, cleanup func(func())) string {
	t.Helper()
	return p.createClusterFrom(t, p.template, ns, base, controlPlane, workers, cleanup)
}

// createClusterFrom is createClusterOf with another template of test/kind/templates.
func (p *kindPlatform) createClusterFrom(t *testing.T, template, ns, base string, controlPlane, workers int, cleanup func(func())) string {
	t.Helper()
	g := NewWithT(t)
	// CAPD names containers after the cluster, and the docker network is shared: a cluster's name is
	// unique on the host, and recorded for kind-down before anything is created.
	name := fmt.Sprintf("%s-%s", base, ns[len(ns)-5:])
	f, err := os.OpenFile(filepath.Join(p.env["KIND_STATE"], "workload-clusters"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	g.Expect(err).NotTo(HaveOccurred())
	_, err = fmt.Fprintln(f, name)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(f.Close()).To(Succeed())

	raw, err := p.render(template, ns, name, controlPlane, workers)
	g.Expect(err).NotTo(HaveOccurred())
	objs, err := utilyaml.ToUnstructured(raw)
	g.Expect(err).NotTo(HaveOccurred())
	for i := range objs {
		g.Expect(p.c.Create(ctx, &objs[i])).To(Succeed(), "%s %s", objs[i].GetKind(), objs[i].GetName())
	}
	cleanup(func() {
		cluster := &clusterv1.Cluster{}
		cluster.Namespace, cluster.Name = ns, name
		_ = p.c.Delete(ctx, cluster)
		deadline := time.Now().Add(10 * time.Minute)
		for !apierrors.IsNotFound(p.c.Get(ctx, client.ObjectKeyFromObject(cluster), cluster)) {
			if time.Now().After(deadline) {
				fmt.Fprintf(os.Stderr, "Cluster %s/%s not deleted within 10 minutes (make kind-down removes its containers)\n", ns, name)
				return
			}
			time.Sleep(5 * time.Second) // a cleanup's wait for a deletion, not a test's synchronisation
		}
	})
	g.Eventually(func(g Gomega) {
		cp, w := machinesOf(g, ns, name)
		g.Expect(cp).To(HaveLen(controlPlane))
		g.Expect(w).To(HaveLen(workers))
		for _, m := range append(cp, w...) {
			g.Expect(m.Status.NodeRef.IsDefined()).To(BeTrue(), "Machine %s has no Node", m.Name)
		}
	}, 20*time.Minute, 5*time.Second).Should(Succeed())
	return name
}

// breakNode injects the platform's fault for the node's role: a control-plane node's kubelet is
// stopped (its static pods, etcd among them, go on running), a worker's container is stopped.
func (p *kindPlatform) breakNode(t *testing.T, ns, _, node string) {
	t.Helper()
	m := &clusterv1.MachineList{}
	NewWithT(t).Expect(p.c.List(ctx, m, client.InNamespace(ns))).To(Succeed())
	for _, machine := range m.Items {
		if machine.Status.NodeRef.Name != node {
			continue
		}
		if _, ok := machine.Labels[clusterv1.MachineControlPlaneLabel]; ok {
			NewWithT(t).Expect(dockerRun("exec", node, "systemctl", "stop", "kubelet")).To(Succeed())
		} else {
			NewWithT(t).Expect(dockerRun("stop", node)).To(Succeed())
		}
		return
	}
	t.Fatalf("no Machine of node %s in %s", node, ns)
}

// dockerRun runs docker with args and returns its combined output in the error.
func dockerRun(args ...string) error {
	_, err := dockerOutput(args...)
	return err
}

func dockerOutput(args ...string) (string, error) {
	return dockerOutputCtx(ctx, args...)
}

// dockerOutputWithin is dockerOutput ended after d: a docker exec into a container paused while it
// runs waits for the container, not for its command (the command and any timeout inside are frozen
// with it), until the container is unpaused or removed.
func dockerOutputWithin(d time.Duration, args ...string) (string, error) {
	cctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	return dockerOutputCtx(cctx, args...)
}

func dockerOutputCtx(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "docker", args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return "", fmt.Errorf("docker %s: %w: %s", strings.Join(args, " "), err, stderr.String())
		}
		return "", fmt.Errorf("docker %s: %w", strings.Join(args, " "), err)
	}
	return string(out), nil
}

// dumpOnFailure logs, when the test has failed, what an operator would look at first: each
// MachineRemediation's phase, conditions and steps, each Machine, the namespace's Warning events and
// the tail of CAPR's, CAPI's and KCP's logs. CI shows a test's output, not the cluster, which
// kind-down deletes.
func (p *kindPlatform) dumpOnFailure(t *testing.T, ns string) {
	t.Helper()
	if !t.Failed() {
		return
	}
	var b strings.Builder
	requests := &caprv1.MachineRemediationList{}
	if err := p.c.List(ctx, requests, client.InNamespace(ns)); err != nil {
		fmt.Fprintf(&b, "listing MachineRemediations: %v\n", err)
	}
	for _, mr := range requests.Items {
		fmt.Fprintf(&b, "MachineRemediation %s: phase %s, created %s\n", mr.Name, mr.Status.Phase, mr.CreationTimestamp.UTC().Format(time.RFC3339))
		if cps := mr.Status.ControlPlane; cps != nil {
			fmt.Fprintf(&b, "  order %s: %s\n", cps.Order, cps.OrderReason)
		}
		for _, c := range mr.Status.Conditions {
			fmt.Fprintf(&b, "  condition %s=%s %s: %s\n", c.Type, c.Status, c.Reason, c.Message)
		}
		for _, s := range mr.Status.Steps {
			fmt.Fprintf(&b, "  step %s %s (%s): %s\n", s.Name, s.Outcome, stamp(s.StartTime), s.Message)
		}
	}
	machines := &clusterv1.MachineList{}
	if err := p.c.List(ctx, machines, client.InNamespace(ns)); err != nil {
		fmt.Fprintf(&b, "listing Machines: %v\n", err)
	}
	for _, m := range machines.Items {
		fmt.Fprintf(&b, "Machine %s: phase %s, node %q, created %s, deleting %s\n", m.Name, m.Status.Phase, m.Status.NodeRef.Name,
			m.CreationTimestamp.UTC().Format(time.RFC3339), stamp(m.DeletionTimestamp))
		for _, c := range m.Status.Conditions {
			if c.Status != metav1.ConditionTrue {
				fmt.Fprintf(&b, "  condition %s=%s %s: %s\n", c.Type, c.Status, c.Reason, c.Message)
			}
		}
	}
	kubectl := func(args ...string) {
		out, err := exec.CommandContext(ctx, p.env["KUBECTL"], append([]string{"--kubeconfig", os.Getenv(kubeconfigEnv)}, args...)...).CombinedOutput()
		fmt.Fprintf(&b, "$ kubectl %s\n%s", strings.Join(args, " "), out)
		if err != nil {
			fmt.Fprintf(&b, "(%v)\n", err)
		}
	}
	kubectl("get", "events", "-n", ns, "--field-selector", "type=Warning", "--sort-by", ".lastTimestamp")
	kubectl("logs", "-n", "capr-system", "deployment/capr-controller-manager", "--tail", "60")
	kubectl("logs", "-n", "capi-system", "deployment/capi-controller-manager", "--tail", "30")
	kubectl("logs", "-n", "capi-kubeadm-control-plane-system", "deployment/capi-kubeadm-control-plane-controller-manager", "--tail", "30")
	t.Logf("the state at the failure:\n%s", b.String())
}

func stamp(t *metav1.Time) string {
	if t == nil || t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

// managers are the management cluster's controller managers whose logs a comparison run keeps.
var managers = []struct{ name, namespace, deployment string }{
	{"capr", "capr-system", "capr-controller-manager"},
	{"capi", "capi-system", "capi-controller-manager"},
	{"kcp", "capi-kubeadm-control-plane-system", "capi-kubeadm-control-plane-controller-manager"},
}

// keepLogs writes each manager's log since a run began into dir, one file per manager, so that a
// run's timings can be explained afterwards from what each controller did (docs/developer/kind.md).
// A log that cannot be read is reported in the test's output, not failed on: the run's result does
// not depend on it.
func (p *kindPlatform) keepLogs(t *testing.T, dir string, since time.Time) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Logf("keeping the managers' logs: %v", err)
		return
	}
	for _, m := range managers {
		out, err := exec.CommandContext(ctx, p.env["KUBECTL"], "--kubeconfig", os.Getenv(kubeconfigEnv), "logs", "-n", m.namespace,
			"deployment/"+m.deployment, "--timestamps", "--since-time", since.UTC().Format(time.RFC3339), "--request-timeout", "2m").Output()
		if err != nil {
			// No file: an empty one would read as a manager that logged nothing.
			var exit *exec.ExitError
			if errors.As(err, &exit) {
				err = fmt.Errorf("%w: %s", err, exit.Stderr)
			}
			t.Logf("reading %s's log: %v", m.name, err)
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, m.name+".log"), out, 0o644); err != nil {
			t.Logf("keeping %s's log: %v", m.name, err)
		}
	}
}
