// Package envtest starts a real kube-apiserver and a real etcd (built into bin/k8s by
// `make envtest-assets`) with CAPI's CRDs, CAPR's CRDs and any extra CRDs, for controller tests, the
// sandbox and the demo. The same API server serves as the workload cluster of the clusters created on
// it (their kubeconfig secret points back at it).
package envtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/capr-io/capr/controllers"
)

// AssetsEnv overrides the directory holding kube-apiserver and etcd.
const AssetsEnv = "CAPR_ENVTEST_ASSETS"

// Environment is a running API server with the CRDs installed.
type Environment struct {
	env *envtest.Environment
	// Config is cluster-admin: for tests setting up the world (the sandbox's providers, fixtures).
	Config *rest.Config
	// ManagerConfig authenticates as CAPR's manager ServiceAccount, bound to the ClusterRoles that
	// `make generate` writes from the RBAC markers (config/rbac/role.yaml and
	// config/rbac/secret_reader/role.yaml). CAPR's controllers run
	// with it in every test, so a permission missing from the markers fails a test instead of a
	// production cluster.
	ManagerConfig *rest.Config
	Client        client.Client
	Scheme        *kruntime.Scheme
}

// ManagerUser is the identity the manager runs as in tests: the ServiceAccount config/rbac binds.
const ManagerUser = "system:serviceaccount:capr-system:capr-manager"

// Options configures Start.
type Options struct {
	// ExtraCRDDirs are more directories of CRD manifests (e.g. the sandbox providers').
	ExtraCRDDirs []string
	// AddToScheme registers more types with the scheme.
	AddToScheme []func(*kruntime.Scheme) error
	// CAPIWebhooks installs CAPI's, CABPK's and KCP's admission webhook configurations: the API
	// server then refuses what CAPI's own handlers refuse (see WebhookServerOptions), and every
	// request for those objects fails until a manager serves the handlers.
	CAPIWebhooks bool
	// ManagerRoleFiles are ClusterRole manifests granted to ManagerUser besides the generated
	// manager role: what a user installs, labelled remediation.cluster.x-k8s.io/aggregate-to-manager,
	// for a control-plane provider CAPR has no built-in rules for (e.g. the sandbox's). envtest runs no
	// ClusterRole aggregation, so each is bound to ManagerUser directly.
	ManagerRoleFiles []string
	// WithoutCAPR starts the API server with CAPI's CRDs only: no CAPR CRDs and no manager identity
	// (ManagerConfig is nil), for tests that install CAPR themselves (e.g. from the rendered
	// clusterctl components).
	WithoutCAPR bool
	// WithoutManagerIdentity installs CAPR's CRDs but no manager identity or role (ManagerConfig is
	// nil), for tests that install CAPR's RBAC from the rendered components themselves.
	WithoutManagerIdentity bool
	// EtcdDataDir is where etcd keeps its data, left in place by Stop; when it already holds the data
	// of an earlier API server, the new one starts with those objects (CRDs and the manager's roles
	// are installed again over them). Empty: a temporary directory, removed by Stop.
	EtcdDataDir string
}

// ModuleRoot returns the root of the CAPR module (the directory holding go.mod).
func ModuleRoot() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("cannot locate the CAPR module: runtime.Caller failed")
	}
	dir := filepath.Dir(file)
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("cannot locate the CAPR module above %s", filepath.Dir(file))
		}
		dir = parent
	}
}

// AssetsDir returns the directory holding kube-apiserver and etcd, and fails with a message naming
// the missing binary and the command that builds it.
func AssetsDir() (string, error) {
	dir := os.Getenv(AssetsEnv)
	if dir == "" {
		root, err := ModuleRoot()
		if err != nil {
			return "", err
		}
		dir = filepath.Join(root, "bin", "k8s")
	}
	for _, bin := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(dir, bin)); err != nil {
			return "", fmt.Errorf("missing test binary %s in %s: run `make envtest-assets` (builds kube-apiserver v1.36.3 and etcd v3.6.14 from the Go module proxy) or set %s", bin, dir, AssetsEnv)
		}
	}
	return dir, nil
}

// CAPIModuleDir returns the directory of the sigs.k8s.io/cluster-api module in the module cache.
func CAPIModuleDir() (string, error) {
	root, err := ModuleRoot()
	if err != nil {
		return "", err
	}
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/cluster-api")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("locating the sigs.k8s.io/cluster-api module (go list -m): %w", err)
	}
	capi := strings.TrimSpace(string(out))
	if capi == "" {
		return "", errors.New("sigs.k8s.io/cluster-api is not in the module cache: run `go mod download`")
	}
	return capi, nil
}

// CAPICRDDirs returns CAPI's CRD directories from the sigs.k8s.io/cluster-api module in the module cache.
func CAPICRDDirs() ([]string, error) {
	capi, err := CAPIModuleDir()
	if err != nil {
		return nil, err
	}
	dirs := []string{
		filepath.Join(capi, "core", "config", "crd", "bases"),
		filepath.Join(capi, "controlplane", "kubeadm", "config", "crd", "bases"),
		filepath.Join(capi, "bootstrap", "kubeadm", "config", "crd", "bases"),
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); err != nil {
			return nil, fmt.Errorf("CAPI CRD directory %s is missing: run `go mod download sigs.k8s.io/cluster-api`", d)
		}
	}
	return dirs, nil
}

// Start starts kube-apiserver and etcd and installs the CRDs.
func Start(opts Options) (*Environment, error) {
	assets, err := AssetsDir()
	if err != nil {
		return nil, err
	}
	capiDir, err := CAPIModuleDir()
	if err != nil {
		return nil, err
	}
	capiDirs, err := CAPICRDDirs()
	if err != nil {
		return nil, err
	}
	root, err := ModuleRoot()
	if err != nil {
		return nil, err
	}
	scheme, err := controllers.NewScheme(opts.AddToScheme...)
	if err != nil {
		return nil, err
	}
	crdDirs := capiDirs
	if !opts.WithoutCAPR {
		crdDirs = append(crdDirs, filepath.Join(root, "config", "crd", "bases"))
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     append(crdDirs, opts.ExtraCRDDirs...),
		ErrorIfCRDPathMissing: true,
		// The data is thrown away: do not wait for the API server to drain long-running watches.
		ControlPlaneStopTimeout: 5 * time.Second,
		Scheme:                  scheme,
	}
	if opts.EtcdDataDir != "" {
		env.ControlPlane.Etcd = &envtest.Etcd{DataDir: opts.EtcdDataDir}
	}
	if opts.CAPIWebhooks {
		if env.WebhookInstallOptions, err = capiWebhookInstallOptions(capiDir); err != nil {
			return nil, err
		}
	}
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("starting kube-apiserver and etcd from %s: %w", assets, err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		_ = env.Stop()
		return nil, fmt.Errorf("creating client: %w", err)
	}
	if err := labelContractVersions(c, env.CRDs); err != nil {
		_ = env.Stop()
		return nil, err
	}
	var managerCfg *rest.Config
	if !opts.WithoutCAPR && !opts.WithoutManagerIdentity {
		if managerCfg, err = managerConfig(env, c, root, opts.ManagerRoleFiles); err != nil {
			_ = env.Stop()
			return nil, err
		}
	}
	return &Environment{env: env, Config: cfg, ManagerConfig: managerCfg, Client: c, Scheme: scheme}, nil
}

// AdminKubeconfig returns a kubeconfig of a new system:masters user called name, for tools that
// take a kubeconfig file (e.g. clusterctl's library).
func (e *Environment) AdminKubeconfig(name string) ([]byte, error) {
	user, err := e.env.AddUser(envtest.User{Name: name, Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return nil, fmt.Errorf("adding user %s to the API server: %w", name, err)
	}
	return user.KubeConfig()
}

// Stop stops the API server and etcd.
func (e *Environment) Stop() error {
	return e.env.Stop()
}

// labelContractVersions adds the cluster.x-k8s.io/v1beta2 contract label (value: the storage
// version) that CAPI's kustomize overlays put on CRDs (the bases in the module lack it). CAPI resolves the version of a referenced
// object (e.g. Cluster.spec.controlPlaneRef) from this label.
func labelContractVersions(c client.Client, crds []*apiextensionsv1.CustomResourceDefinition) error {
	ctx := context.Background()
	for _, installed := range crds {
		if !strings.HasSuffix(installed.Spec.Group, "cluster.x-k8s.io") {
			continue
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := c.Get(ctx, client.ObjectKey{Name: installed.Name}, crd); err != nil {
			return fmt.Errorf("reading CRD %s: %w", installed.Name, err)
		}
		if _, ok := crd.Labels[clusterv1.GroupVersion.String()]; ok {
			continue
		}
		var versions []string
		for _, v := range crd.Spec.Versions {
			if v.Storage {
				versions = append(versions, v.Name)
			}
		}
		base := crd.DeepCopy()
		if crd.Labels == nil {
			crd.Labels = map[string]string{}
		}
		crd.Labels[clusterv1.GroupVersion.String()] = strings.Join(versions, "_")
		if err := c.Patch(ctx, crd, client.MergeFrom(base)); err != nil {
			return fmt.Errorf("labelling CRD %s with its contract versions: %w", crd.Name, err)
		}
	}
	return nil
}

// managerConfig installs the generated manager and Secret-reader ClusterRoles and the extra roles, binds them to
// ManagerUser and returns a config that authenticates as that user (no other permission: not in
// system:masters).
func managerConfig(env *envtest.Environment, c client.Client, root string, extraRoles []string) (*rest.Config, error) {
	if err := bindManagerRole(c, filepath.Join(root, "config", "rbac", "role.yaml"), "capr-manager-role"); err != nil {
		return nil, err
	}
	if err := bindManagerRole(c, filepath.Join(root, "config", "rbac", "secret_reader", "role.yaml"), "capr-secret-reader"); err != nil {
		return nil, err
	}
	for _, file := range extraRoles {
		if err := bindManagerRole(c, file, ""); err != nil {
			return nil, err
		}
	}
	user, err := env.AddUser(envtest.User{Name: ManagerUser, Groups: []string{"system:authenticated", "system:serviceaccounts"}}, nil)
	if err != nil {
		return nil, fmt.Errorf("adding the manager user to the API server: %w", err)
	}
	return user.Config(), nil
}

// bindManagerRole creates the ClusterRole in file (named name, or as in the file when name is empty)
// and binds it to ManagerUser.
func bindManagerRole(c client.Client, file, name string) error {
	ctx := context.Background()
	raw, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("reading the manager role %s: %w", file, err)
	}
	role := &rbacv1.ClusterRole{}
	if err := yaml.Unmarshal(raw, role); err != nil {
		return fmt.Errorf("parsing %s: %w", file, err)
	}
	if name != "" {
		role.Name = name
	}
	// AlreadyExists: an API server started on an earlier one's etcd data (Options.EtcdDataDir), whose
	// role came from the same file.
	if err := c.Create(ctx, role); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating the ClusterRole %s from %s: %w", role.Name, file, err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name + "binding"}, // capr-manager-role -> capr-manager-rolebinding
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: ManagerUser}},
	}
	if err := c.Create(ctx, binding); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("binding the ClusterRole %s: %w", role.Name, err)
	}
	return nil
}
