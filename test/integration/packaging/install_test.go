package packaging_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	clusterctlv1 "sigs.k8s.io/cluster-api/cmd/clusterctl/api/v1alpha3"
	clusterctlclient "sigs.k8s.io/cluster-api/cmd/clusterctl/client"
	"sigs.k8s.io/cluster-api/cmd/clusterctl/client/cluster"
	"sigs.k8s.io/cluster-api/cmd/clusterctl/client/config"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/capr-io/capr/hack/manifests"
	capienv "github.com/capr-io/capr/test/envtest"
)

// releaseVersion is the Makefile's RELEASE_VERSION: clusterctl refuses a version outside the
// release series of metadata.yaml.
const releaseVersion = "v0.1.0"

// examplePath is the placeholder in config/clusterctl/clusterctl.yaml that `make local-repository`
// replaces with the checkout's out/ directory.
const examplePath = "/path/to/capr/out/repository"

// installation is what installCAPR did.
type installation struct {
	// rendered is the components file as `make release-manifests` writes it.
	rendered []byte
	// components are CAPR's components as clusterctl installed them (variables substituted).
	components clusterctlclient.Components
	// inventory reads clusterctl's provider inventory.
	inventory cluster.InventoryClient
	// configPath is the clusterctl configuration with the local repositories (CAPR's, the core
	// provider's): another management cluster is set up from it (move_test.go).
	configPath string
	// kubeconfigPath is clusterctl's kubeconfig of testEnv.
	kubeconfigPath string
	// capiVersion is the core provider's version recorded in the inventory.
	capiVersion string
}

var (
	installDir  string
	installOnce = sync.OnceValues(install)
)

// installCAPR installs CAPR once for all tests, as `clusterctl init --addon capr` does.
func installCAPR() (*installation, error) {
	return installOnce()
}

func cleanupInstallation() {
	if installDir != "" {
		_ = os.RemoveAll(installDir)
	}
}

// install runs clusterctl's Init, offline, on the envtest API server:
//
//   - CAPR's release (manifests.WriteRelease, what `make release-manifests` runs) is laid out as a
//     local repository with the provider entry of config/clusterctl/clusterctl.yaml.
//   - CAPI's core provider is recorded as installed (its CRDs are; its controllers are not needed):
//     clusterctl then installs only CAPR, and checks CAPR's contract against the core provider's,
//     read from CAPI's metadata.yaml in a local repository (the module's own file).
//   - cert-manager's API is stubbed by two schemaless CRDs: Init first checks that cert-manager
//     accepts an Issuer and a Certificate (it installs cert-manager from GitHub otherwise). CAPR has
//     no webhooks and does not use cert-manager.
func install() (*installation, error) {
	var err error
	if installDir, err = os.MkdirTemp("", "capr-packaging-"); err != nil {
		return nil, err
	}
	capiDir, err := capienv.CAPIModuleDir()
	if err != nil {
		return nil, err
	}
	// The module cache directory is sigs.k8s.io/cluster-api@<version>: go.mod's version.
	_, capiVersion, ok := strings.Cut(filepath.Base(capiDir), "@")
	if !ok {
		return nil, fmt.Errorf("cannot read the CAPI version from %s", capiDir)
	}

	caprDir := filepath.Join(installDir, "repository", manifests.ProviderLabel, releaseVersion)
	if err := manifests.WriteRelease(root, caprDir, ""); err != nil {
		return nil, err
	}
	rendered, err := os.ReadFile(filepath.Join(caprDir, manifests.ComponentsFile))
	if err != nil {
		return nil, err
	}
	coreDir := filepath.Join(installDir, "repository", config.ClusterAPIProviderName, capiVersion)
	if err := os.MkdirAll(coreDir, 0o755); err != nil {
		return nil, err
	}
	capiMetadata, err := os.ReadFile(filepath.Join(capiDir, "metadata.yaml"))
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(coreDir, "metadata.yaml"), capiMetadata, 0o600); err != nil {
		return nil, err
	}

	configPath, err := writeClusterctlConfig(filepath.Join(coreDir, "core-components.yaml"))
	if err != nil {
		return nil, err
	}
	components, inventory, kubeconfigPath, err := clusterctlInit(testEnv, configPath, capiVersion)
	if err != nil {
		return nil, err
	}
	return &installation{
		rendered: rendered, components: components, inventory: inventory,
		configPath: configPath, kubeconfigPath: kubeconfigPath, capiVersion: capiVersion,
	}, nil
}

// clusterctlInit makes env a management cluster with CAPI's core provider recorded (see install) and
// runs `clusterctl init --addon capr` on it from the repositories of configPath. It returns what Init
// installed, the inventory and the path of the kubeconfig clusterctl used (in installDir).
func clusterctlInit(env *capienv.Environment, configPath, capiVersion string) (clusterctlclient.Components, cluster.InventoryClient, string, error) {
	kubeconfig, err := env.AdminKubeconfig("clusterctl")
	if err != nil {
		return nil, nil, "", err
	}
	f, err := os.CreateTemp(installDir, "kubeconfig-")
	if err != nil {
		return nil, nil, "", err
	}
	kubeconfigPath := f.Name()
	_, err = f.Write(kubeconfig)
	if err = errors.Join(err, f.Close()); err != nil {
		return nil, nil, "", err
	}

	c, err := clusterctlclient.New(ctx, configPath)
	if err != nil {
		return nil, nil, "", fmt.Errorf("creating the clusterctl client from %s: %w", configPath, err)
	}
	configClient, err := config.New(ctx, configPath)
	if err != nil {
		return nil, nil, "", err
	}
	inventory := cluster.New(cluster.Kubeconfig{Path: kubeconfigPath}, configClient).ProviderInventory()
	if err := recordCoreProvider(env.Client, inventory, capiVersion); err != nil {
		return nil, nil, "", err
	}
	if err := stubCertManagerAPI(env.Client); err != nil {
		return nil, nil, "", err
	}

	installed, err := c.Init(ctx, clusterctlclient.InitOptions{
		Kubeconfig:     clusterctlclient.Kubeconfig{Path: kubeconfigPath},
		AddonProviders: []string{manifests.ProviderName + ":" + releaseVersion},
	})
	if err != nil {
		return nil, nil, "", fmt.Errorf("clusterctl init --addon %s:%s: %w", manifests.ProviderName, releaseVersion, err)
	}
	if len(installed) != 1 {
		return nil, nil, "", fmt.Errorf("clusterctl init installed %d providers, want only CAPR", len(installed))
	}
	return installed[0], inventory, kubeconfigPath, nil
}

// writeClusterctlConfig writes a clusterctl configuration with the provider entries of
// config/clusterctl/clusterctl.yaml pointed at installDir, the core provider's local repository,
// and an empty overrides folder (none of the developer's overrides apply).
func writeClusterctlConfig(coreComponents string) (string, error) {
	raw, err := os.ReadFile(filepath.Join(root, "config", "clusterctl", "clusterctl.yaml"))
	if err != nil {
		return "", err
	}
	var example struct {
		Providers []map[string]string `json:"providers"`
	}
	if err := yaml.UnmarshalStrict(raw, &example); err != nil {
		return "", fmt.Errorf("parsing config/clusterctl/clusterctl.yaml: %w", err)
	}
	if len(example.Providers) == 0 {
		return "", errors.New("config/clusterctl/clusterctl.yaml lists no provider")
	}
	for _, p := range example.Providers {
		url := strings.Replace(p["url"], examplePath, filepath.Join(installDir, "repository"), 1)
		if url == p["url"] {
			return "", fmt.Errorf("config/clusterctl/clusterctl.yaml: url %q does not start with %s (what make local-repository replaces)", url, examplePath)
		}
		p["url"] = url
	}
	core := map[string]string{
		"name": config.ClusterAPIProviderName, "type": string(clusterctlv1.CoreProviderType), "url": "file://" + coreComponents,
	}
	out, err := yaml.Marshal(map[string]any{
		"providers":       append(example.Providers, core),
		"overridesFolder": filepath.Join(installDir, "overrides"),
	})
	if err != nil {
		return "", err
	}
	path := filepath.Join(installDir, "clusterctl.yaml")
	return path, os.WriteFile(path, out, 0o600)
}

// recordCoreProvider adds CAPI's core provider to clusterctl's inventory, as `clusterctl init`
// would have after installing it.
func recordCoreProvider(c client.Client, inventory cluster.InventoryClient, version string) error {
	if err := inventory.EnsureCustomResourceDefinitions(ctx); err != nil {
		return fmt.Errorf("installing clusterctl's inventory CRD: %w", err)
	}
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "capi-system"}}); err != nil {
		return err
	}
	return inventory.Create(ctx, clusterctlv1.Provider{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "capi-system", Name: config.ClusterAPIProviderName,
			Labels: map[string]string{
				clusterctlv1.ClusterctlLabel:     "",
				clusterctlv1.ClusterctlCoreLabel: clusterctlv1.ClusterctlCoreLabelInventoryValue,
				clusterv1.ProviderNameLabel:      config.ClusterAPIProviderName,
			},
		},
		ProviderName: config.ClusterAPIProviderName,
		Type:         string(clusterctlv1.CoreProviderType),
		Version:      version,
	})
}

// stubCertManagerAPI installs schemaless CRDs for cert-manager's Issuer and Certificate.
func stubCertManagerAPI(c client.Client) error {
	for _, kind := range []string{"Issuer", "Certificate"} {
		plural := strings.ToLower(kind) + "s"
		crd := &apiextensionsv1.CustomResourceDefinition{
			ObjectMeta: metav1.ObjectMeta{Name: plural + ".cert-manager.io"},
			Spec: apiextensionsv1.CustomResourceDefinitionSpec{
				Group: "cert-manager.io",
				Names: apiextensionsv1.CustomResourceDefinitionNames{Kind: kind, ListKind: kind + "List", Plural: plural, Singular: strings.ToLower(kind)},
				Scope: apiextensionsv1.NamespaceScoped,
				Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
					Name: "v1", Served: true, Storage: true,
					Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
						Type: "object", XPreserveUnknownFields: ptr.To(true),
					}},
				}},
			},
		}
		if err := c.Create(ctx, crd); err != nil {
			return err
		}
		if err := waitEstablished(c, crd.Name); err != nil {
			return err
		}
	}
	return nil
}

func waitEstablished(c client.Client, name string) error {
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := c.Get(ctx, client.ObjectKey{Name: name}, crd); err != nil {
			return false, err
		}
		for _, c := range crd.Status.Conditions {
			if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
}
