// Package manifests renders CAPR's clusterctl provider components from config/default with the
// kustomize library (what the kustomize binary and `kubectl apply -k` run), so `make
// release-manifests` and the packaging test (test/integration/packaging) render them the same way
// and no kustomize binary has to be installed.
package manifests

import (
	"fmt"
	"os"
	"path/filepath"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/resource"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	kyaml "sigs.k8s.io/kustomize/kyaml/yaml"
)

const (
	// ProviderName is CAPR's name in clusterctl (clusterctl init --addon capr).
	ProviderName = "capr"
	// ProviderLabel is clusterctl's label for the provider (its type prefix and its name): the value
	// of cluster.x-k8s.io/provider and the directory name in a clusterctl local repository.
	ProviderLabel = "addon-capr"
	// ComponentsFile is the file clusterctl reads an AddonProvider's components from.
	ComponentsFile = "addon-components.yaml"
	// MetadataFile is clusterctl's provider metadata (release series and their contract).
	MetadataFile = "metadata.yaml"
	// ManagerContainer is the container whose image Components replaces.
	ManagerContainer = "manager"
)

// Components renders config/default of the CAPR checkout at root. A non-empty image replaces the
// manager container's image (the one in config/manager is the development tag).
func Components(root, image string) ([]byte, error) {
	opts := krusty.MakeDefaultOptions()
	// The kustomize binary's default order: the Namespace and CRDs first, so the file also works
	// with a plain `kubectl apply -f` (clusterctl sorts by itself).
	opts.Reorder = krusty.ReorderOptionLegacy
	k := krusty.MakeKustomizer(opts)
	m, err := k.Run(filesys.MakeFsOnDisk(), filepath.Join(root, "config", "default"))
	if err != nil {
		return nil, fmt.Errorf("kustomize build config/default: %w", err)
	}
	if image != "" {
		found := false
		for _, res := range m.Resources() {
			ok, err := setManagerImage(res, image)
			if err != nil {
				return nil, err
			}
			found = found || ok
		}
		if !found {
			return nil, fmt.Errorf("no Deployment in config/default has a container named %q to set the image of", ManagerContainer)
		}
	}
	return m.AsYaml()
}

// setManagerImage sets the image of the manager container when res is a Deployment that has one.
func setManagerImage(res *resource.Resource, image string) (bool, error) {
	if res.GetKind() != "Deployment" {
		return false, nil
	}
	containers, err := res.Pipe(kyaml.Lookup("spec", "template", "spec", "containers"))
	if err != nil || containers == nil {
		return false, err
	}
	found := false
	err = containers.VisitElements(func(c *kyaml.RNode) error {
		name, err := c.GetString("name")
		if err != nil || name != ManagerContainer {
			return err
		}
		found = true
		return c.PipeE(kyaml.SetField("image", kyaml.NewScalarRNode(image)))
	})
	return found, err
}

// WriteRelease writes what a CAPR release publishes for clusterctl into dir: the components
// (ComponentsFile, rendered by Components) and the provider metadata (MetadataFile, copied from the
// checkout's metadata.yaml).
func WriteRelease(root, dir, image string) error {
	components, err := Components(root, image)
	if err != nil {
		return err
	}
	metadata, err := os.ReadFile(filepath.Join(root, MetadataFile))
	if err != nil {
		return fmt.Errorf("reading the provider metadata: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, ComponentsFile), components, 0o644); err != nil { //nolint:gosec // release assets are public
		return err
	}
	return os.WriteFile(filepath.Join(dir, MetadataFile), metadata, 0o644) //nolint:gosec // release assets are public
}
