package binary_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	capienv "github.com/capr-io/capr/test/envtest"
	"github.com/capr-io/capr/test/sandbox"
)

// TestBuiltBinaryRemediatesAControlPlaneMachineWithTheShippedRBAC: the built binary, as the rendered
// ServiceAccount with only the rendered RBAC, marks a control-plane Machine whose Node stopped
// reporting and replaces it end to end on the sandbox (real etcd membership through the API server's
// port-forward). No request of the manager is refused for lack of permission along the way. It runs
// with the stricter of the two installations docs/user/install.md describes (Least privilege): Secrets readable
// only in the Cluster's namespace (test/e2e runs the built binary with the default one).
func TestBuiltBinaryRemediatesAControlPlaneMachineWithTheShippedRBAC(t *testing.T) {
	g := NewWithT(t)
	ns, err := capienv.CreateNamespace(ctx, sb.Client, "bin")
	g.Expect(err).NotTo(HaveOccurred())
	bindSecretsOnlyIn(t, ns)
	wc, err := sb.CreateCluster(ctx, sandbox.ClusterSpec{Namespace: ns, Name: "wc", ControlPlane: 3})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { sb.DestroyCluster(ctx, wc) })
	g.Expect(sb.Client.Create(ctx, sandbox.ControlPlaneHealthCheck(ns, "cp", wc.Name, 2))).To(Succeed())
	machines, err := sb.ControlPlaneMachines(ctx, wc)
	g.Expect(err).NotTo(HaveOccurred())
	victim := machines[1]

	p, logFile := startManager(t)
	g.Expect(sb.StopHeartbeat(ctx, wc, victim.Status.NodeRef.Name)).To(Succeed())
	g.Eventually(func(g Gomega) {
		if exited, err := p.Exited(); exited {
			StopTrying(fmt.Sprintf("the manager exited: %v", err)).Now()
		}
		mr := &caprv1.MachineRemediation{}
		g.Expect(sb.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: victim.Name}, mr)).To(Succeed())
		g.Expect(mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhaseSucceeded), "step %s: %v", mr.Status.CurrentStep, mr.Status.Conditions)
	}, 4*time.Minute, 250*time.Millisecond).Should(Succeed())
	g.Expect(sb.WaitForControlPlane(ctx, wc, 3, time.Minute)).To(Succeed())
	state, err := sb.EtcdState(ctx, wc)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(state.ByName(victim.Status.NodeRef.Name)).To(BeNil(), "the victim's etcd member is still there")
	g.Expect(state.Counts().Voting).To(Equal(3))

	exited, _ := p.Exited()
	g.Expect(exited).To(BeFalse(), "the manager stopped")
	out, err := os.ReadFile(logFile)
	g.Expect(err).NotTo(HaveOccurred())
	for _, line := range strings.Split(string(out), "\n") {
		g.Expect(line).NotTo(ContainSubstring("forbidden"), "a request of the manager was refused by RBAC")
	}

	// A Cluster in a namespace where Secrets are not bound: its health check says the workload cluster
	// cannot be reached, and the manager's log says why.
	unbound, err := capienv.CreateNamespace(ctx, sb.Client, "unbound")
	g.Expect(err).NotTo(HaveOccurred())
	copyCluster(g, wc.Key(), unbound)
	g.Expect(sb.Client.Create(ctx, sandbox.ControlPlaneHealthCheck(unbound, "cp", wc.Name, 2))).To(Succeed())
	g.Eventually(func(g Gomega) {
		mhc := &caprv1.MachineHealthCheck{}
		g.Expect(sb.Client.Get(ctx, client.ObjectKey{Namespace: unbound, Name: "cp"}, mhc)).To(Succeed())
		c := meta.FindStatusCondition(mhc.Status.Conditions, caprv1.MachineHealthCheckWorkloadClusterReachableCondition)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
	}, 2*time.Minute, 250*time.Millisecond).Should(Succeed())
	out, err = os.ReadFile(logFile)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(out)).To(MatchRegexp(`secrets \\?"wc-kubeconfig\\?" is forbidden`))
}

// copyCluster creates in namespace ns a copy of the Cluster at key (spec and status) and of its
// kubeconfig Secret: another Cluster whose workload cluster answers like the original.
func copyCluster(g Gomega, key client.ObjectKey, ns string) {
	orig := &clusterv1.Cluster{}
	g.Expect(sb.Client.Get(ctx, key, orig)).To(Succeed())
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: orig.Name, Labels: orig.Labels}, Spec: orig.Spec}
	g.Expect(sb.Client.Create(ctx, cluster)).To(Succeed())
	cluster.Status = orig.Status
	g.Expect(sb.Client.Status().Update(ctx, cluster)).To(Succeed())

	secret := &corev1.Secret{}
	g.Expect(sb.Client.Get(ctx, client.ObjectKey{Namespace: key.Namespace, Name: key.Name + "-kubeconfig"}, secret)).To(Succeed())
	g.Expect(sb.Client.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: secret.Name, Labels: secret.Labels},
		Type:       secret.Type, Data: secret.Data,
	})).To(Succeed())
}

// bindSecretsOnlyIn replaces the components' cluster-wide Secret binding with the sample RoleBinding
// in ns (docs/user/install.md, Least privilege), checks with SubjectAccessReviews that the manager may then read
// Secrets there and nowhere else, and puts the components' binding back when the test ends.
func bindSecretsOnlyIn(t *testing.T, ns string) {
	g := NewWithT(t)
	g.Expect(sb.InstallRenderedComponentsOnce(ctx)).To(Succeed())
	t.Cleanup(func() {
		_, err := sb.InstallRenderedComponents(ctx)
		NewWithT(t).Expect(err).NotTo(HaveOccurred())
	})
	g.Expect(sb.Client.Delete(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "capr-manager-secrets"}})).To(Succeed())

	root, err := capienv.ModuleRoot()
	g.Expect(err).NotTo(HaveOccurred())
	raw, err := os.ReadFile(filepath.Join(root, "config", "samples", "rbac_v1_rolebinding_secret_reader.yaml"))
	g.Expect(err).NotTo(HaveOccurred())
	binding := &rbacv1.RoleBinding{}
	g.Expect(yaml.UnmarshalStrict(raw, binding)).To(Succeed())
	binding.Namespace = ns
	g.Expect(sb.Client.Create(ctx, binding)).To(Succeed())

	g.Eventually(func(g Gomega) {
		g.Expect(allowed(g, access{"get", "", "secrets", "", ns})).To(BeTrue(), "reading Secrets in the Cluster's namespace")
		for _, elsewhere := range []string{"kube-system", sandbox.ManagerNamespace, "default"} {
			g.Expect(allowed(g, access{"get", "", "secrets", "", elsewhere})).To(BeFalse(), "reading Secrets in %s", elsewhere)
		}
	}, time.Minute, 250*time.Millisecond).Should(Succeed())
	g.Expect(allowed(g, access{"list", "", "secrets", "", ns})).To(BeFalse(), "listing Secrets")
}

// access is one question to the API server's authorizer about the manager's ServiceAccount.
type access struct {
	verb, group, resource, subresource, namespace string
}

func (a access) String() string {
	r := a.resource
	if a.subresource != "" {
		r += "/" + a.subresource
	}
	if a.group != "" {
		r += "." + a.group
	}
	where := "cluster-wide"
	if a.namespace != "" {
		where = "in " + a.namespace
	}
	return fmt.Sprintf("%s %s %s", a.verb, r, where)
}

// allowed asks the API server (SubjectAccessReview) whether the manager's ServiceAccount may do a.
func allowed(g Gomega, a access) bool {
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:   fmt.Sprintf("system:serviceaccount:%s:%s", sandbox.ManagerNamespace, sandbox.ManagerServiceAccount),
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + sandbox.ManagerNamespace, "system:authenticated"},
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Verb: a.verb, Group: a.group, Resource: a.resource, Subresource: a.subresource, Namespace: a.namespace,
		},
	}}
	g.Expect(sb.Client.Create(ctx, sar)).To(Succeed())
	return sar.Status.Allowed
}

// TestShippedRBACAllowsWhatTheControllersNeedAndNoMore asks the API server's authorizer, with
// SubjectAccessReviews, about the rendered ServiceAccount holding only the rendered RBAC (aggregated
// by kube-controller-manager): everything the controllers do is allowed; writing, listing or watching
// Secrets, touching workloads, RBAC or other providers' objects, and leases outside its namespace
// are not. By default a Secret may be read by name in every namespace (a workload cluster's
// <cluster>-kubeconfig and <cluster>-etcd live in the Cluster's namespace, which is not known in
// advance, and RBAC cannot select by name pattern or label); bindSecretsOnlyIn checks the stricter
// installation.
func TestShippedRBACAllowsWhatTheControllersNeedAndNoMore(t *testing.T) {
	_, err := sb.InstallRenderedComponents(ctx)
	NewWithT(t).Expect(err).NotTo(HaveOccurred())
	const ns = "any-cluster-namespace"
	capi, cp, capr := "cluster.x-k8s.io", "controlplane.cluster.x-k8s.io", "remediation.cluster.x-k8s.io"
	need := []access{
		{"get", capi, "clusters", "", ns}, {"watch", capi, "clusters", "", ns},
		// The surge of a control plane whose replicas the Cluster topology owns is written to
		// Cluster spec.topology.controlPlane.replicas (docs/user/topology.md).
		{"patch", capi, "clusters", "", ns},
		{"list", capi, "machinesets", "", ns}, {"list", capi, "machinedeployments", "", ns},
		{"patch", capi, "machines", "", ns}, {"delete", capi, "machines", "", ns}, {"patch", capi, "machines", "status", ns},
		{"patch", cp, "kubeadmcontrolplanes", "", ns},
		{"patch", cp, "sandboxcontrolplanes", "", ns}, // the user's aggregated role for another provider
		{"create", capr, "machineremediations", "", ns}, {"delete", capr, "machineremediations", "", ns},
		{"patch", capr, "machineremediations", "status", ns}, {"update", capr, "machineremediations", "finalizers", ns},
		{"patch", capr, "machinehealthchecks", "status", ns}, {"get", capr, "machineremediationtemplates", "", ns},
		{"get", "", "secrets", "", ns},
		{"create", "events.k8s.io", "events", "", ns},
		{"create", "coordination.k8s.io", "leases", "", sandbox.ManagerNamespace},
		{"update", "coordination.k8s.io", "leases", "", sandbox.ManagerNamespace},
		{"create", "authentication.k8s.io", "tokenreviews", "", ""},
		{"create", "authorization.k8s.io", "subjectaccessreviews", "", ""},
		{"get", "apiextensions.k8s.io", "customresourcedefinitions", "", ""},
	}
	never := []access{
		{"create", "", "secrets", "", ns}, {"update", "", "secrets", "", ns}, {"patch", "", "secrets", "", ns}, {"delete", "", "secrets", "", ns},
		{"list", "", "secrets", "", ns}, {"watch", "", "secrets", "", ns}, {"list", "", "secrets", "", ""}, {"watch", "", "secrets", "", ""},
		{"get", "", "configmaps", "", ns}, {"create", "", "pods", "", ns}, {"create", "", "pods", "portforward", ns},
		{"get", "", "nodes", "", ""}, {"create", "apps", "deployments", "", ns},
		{"delete", capi, "clusters", "", ns}, {"update", capi, "clusters", "", ns}, {"patch", capi, "machinedeployments", "", ns},
		{"create", capi, "machines", "", ns}, {"delete", cp, "kubeadmcontrolplanes", "", ns}, {"update", cp, "kubeadmcontrolplanes", "", ns},
		{"get", "infrastructure.cluster.x-k8s.io", "sandboxmachines", "", ns},
		{"create", "coordination.k8s.io", "leases", "", "kube-system"},
		{"create", "rbac.authorization.k8s.io", "clusterrolebindings", "", ""},
		{"escalate", "rbac.authorization.k8s.io", "clusterroles", "", ""}, {"bind", "rbac.authorization.k8s.io", "clusterroles", "", ""},
		{"impersonate", "", "users", "", ""}, {"impersonate", "", "serviceaccounts", "", ns},
		{"create", "", "serviceaccounts", "token", sandbox.ManagerNamespace},
		{"update", "apiextensions.k8s.io", "customresourcedefinitions", "", ""},
		{"delete", capr, "machinehealthchecks", "", ns},
	}
	g := NewWithT(t)
	// The aggregation controller fills the manager role shortly after it is created.
	g.Eventually(func(g Gomega) {
		for _, a := range need {
			g.Expect(allowed(g, a)).To(BeTrue(), "the manager may not %s", a)
		}
	}, time.Minute, 250*time.Millisecond).Should(Succeed())
	for _, a := range never {
		g.Expect(allowed(g, a)).To(BeFalse(), "the manager may %s", a)
	}
}
