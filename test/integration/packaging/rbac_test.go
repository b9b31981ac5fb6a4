package packaging_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	capienv "github.com/capr-io/capr/test/envtest"
)

// eventually bounds waits for kube-controller-manager's aggregation (usually well under a second).
const eventually = 30 * time.Second

const (
	caprManager = "system:serviceaccount:capr-system:capr-manager"
	// capiManager is CAPI core's ServiceAccount as clusterctl installs it.
	capiManager = "system:serviceaccount:capi-system:capi-manager"
)

// can asks the API server's authorizer whether user may do verb on resource in the group.
func can(g Gomega, user, verb, group, resource string) bool {
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:   user,
		Groups: []string{"system:authenticated", "system:serviceaccounts"},
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: "default", Verb: verb, Group: group, Resource: resource,
		},
	}}
	g.Expect(testEnv.Client.Create(ctx, sar)).To(Succeed())
	return sar.Status.Allowed
}

// The manager's ServiceAccount is bound to an aggregated role: the generated rules reach it only
// through ClusterRole aggregation, which kube-controller-manager performs, and a user extends it for
// another control-plane provider with one labelled ClusterRole (no wildcard in what CAPR ships).
func TestManagerRoleIsAggregatedAndExtensibleWithoutWildcards(t *testing.T) {
	g := NewWithT(t)
	_, err := installCAPR()
	g.Expect(err).NotTo(HaveOccurred())

	generated := &rbacv1.ClusterRole{}
	g.Expect(testEnv.Client.Get(ctx, client.ObjectKey{Name: "capr-manager-role"}, generated)).To(Succeed())
	secretReader := &rbacv1.ClusterRole{}
	g.Expect(testEnv.Client.Get(ctx, client.ObjectKey{Name: "capr-secret-reader"}, secretReader)).To(Succeed())
	g.Expect(secretReader.Labels).NotTo(HaveKey("remediation.cluster.x-k8s.io/aggregate-to-manager"),
		"the Secret role is bound on its own, so that an installation can bind it per namespace")
	for _, r := range append(append([]rbacv1.PolicyRule{}, generated.Rules...), secretReader.Rules...) {
		g.Expect(r.Resources).NotTo(ContainElement("*"), "rule %v", r)
		g.Expect(r.APIGroups).NotTo(ContainElement("*"), "rule %v", r)
		g.Expect(r.Verbs).NotTo(ContainElement("*"), "rule %v", r)
	}
	g.Eventually(func(g Gomega) {
		aggregated := &rbacv1.ClusterRole{}
		g.Expect(testEnv.Client.Get(ctx, client.ObjectKey{Name: "capr-aggregated-manager-role"}, aggregated)).To(Succeed())
		g.Expect(aggregated.Rules).To(ConsistOf(generated.Rules))
	}).WithTimeout(eventually).Should(Succeed())

	g.Expect(can(g, caprManager, "patch", "controlplane.cluster.x-k8s.io", "kubeadmcontrolplanes")).To(BeTrue())
	g.Expect(can(g, caprManager, "create", "authentication.k8s.io", "tokenreviews")).To(BeTrue(), "the secure diagnostics endpoint authenticates its callers")
	g.Expect(can(g, caprManager, "patch", "controlplane.cluster.x-k8s.io", "rke2controlplanes")).To(BeFalse())
	g.Expect(can(g, caprManager, "delete", "controlplane.cluster.x-k8s.io", "kubeadmcontrolplanes")).To(BeFalse())

	// What docs/user/install.md ("Other control-plane providers") tells a user to apply.
	other := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{
			Name:   "capr-rke2-control-plane",
			Labels: map[string]string{"remediation.cluster.x-k8s.io/aggregate-to-manager": "true"},
		},
		Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{"controlplane.cluster.x-k8s.io"}, Resources: []string{"rke2controlplanes"},
			Verbs: []string{"get", "list", "watch", "patch"},
		}},
	}
	g.Expect(testEnv.Client.Create(ctx, other)).To(Succeed())
	g.Eventually(func(g Gomega) {
		g.Expect(can(g, caprManager, "patch", "controlplane.cluster.x-k8s.io", "rke2controlplanes")).To(BeTrue())
	}).WithTimeout(eventually).Should(Succeed())
}

// CAPI's manager gets what its MachineHealthCheck needs on CAPR's kinds through CAPI's own
// aggregated role (installed here from the CAPI module as CAPI's kustomization names it), and no
// more.
func TestCAPIManagerMayCreateRemediationsFromTemplates(t *testing.T) {
	g := NewWithT(t)
	_, err := installCAPR()
	g.Expect(err).NotTo(HaveOccurred())

	capiDir, err := capienv.CAPIModuleDir()
	g.Expect(err).NotTo(HaveOccurred())
	raw, err := os.ReadFile(filepath.Join(capiDir, "core", "config", "rbac", "aggregated_role.yaml"))
	g.Expect(err).NotTo(HaveOccurred())
	capiRole := &rbacv1.ClusterRole{}
	g.Expect(yaml.Unmarshal(raw, capiRole)).To(Succeed())
	capiRole.Name = "capi-" + capiRole.Name // CAPI's namePrefix
	g.Expect(testEnv.Client.Create(ctx, capiRole)).To(Succeed())
	g.Expect(testEnv.Client.Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "capi-manager-rolebinding"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: capiRole.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: capiManager}},
	})).To(Succeed())

	const group = "remediation.cluster.x-k8s.io"
	g.Eventually(func(g Gomega) {
		g.Expect(can(g, capiManager, "create", group, "machineremediations")).To(BeTrue())
	}).WithTimeout(eventually).Should(Succeed())
	for _, verb := range []string{"get", "list", "watch", "delete"} {
		g.Expect(can(g, capiManager, verb, group, "machineremediations")).To(BeTrue(), verb)
	}
	g.Expect(can(g, capiManager, "get", group, "machineremediationtemplates")).To(BeTrue())
	g.Expect(can(g, capiManager, "update", group, "machineremediations")).To(BeFalse())
	g.Expect(can(g, capiManager, "create", group, "machineremediationtemplates")).To(BeFalse())
	g.Expect(can(g, capiManager, "get", group, "machinehealthchecks")).To(BeFalse())
}
