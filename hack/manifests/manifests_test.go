package manifests

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
)

// root is the CAPR checkout, seen from this package's directory.
const root = "../.."

func TestComponentsReplacesOnlyTheManagerImage(t *testing.T) {
	g := NewWithT(t)
	dev, err := Components(root, "")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(strings.Count(string(dev), "image: ghcr.io/capr-io/capr:dev")).To(Equal(1))

	released, err := Components(root, "registry.example/capr:v0.1.0")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(strings.Count(string(released), "image: registry.example/capr:v0.1.0")).To(Equal(1))
	g.Expect(string(released)).NotTo(ContainSubstring("capr:dev"))
	// Nothing but the image changes.
	g.Expect(strings.Replace(string(released), "registry.example/capr:v0.1.0", "ghcr.io/capr-io/capr:dev", 1)).To(Equal(string(dev)))
}

func TestWriteReleaseWritesComponentsAndMetadata(t *testing.T) {
	g := NewWithT(t)
	dir := filepath.Join(t.TempDir(), ProviderLabel, "v0.1.0")
	g.Expect(WriteRelease(root, dir, "")).To(Succeed())

	components, err := os.ReadFile(filepath.Join(dir, ComponentsFile))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(components)).To(HavePrefix("apiVersion: v1\nkind: Namespace\n"), "the Namespace comes first, for kubectl apply -f")
	want, err := os.ReadFile(filepath.Join(root, MetadataFile))
	g.Expect(err).NotTo(HaveOccurred())
	got, err := os.ReadFile(filepath.Join(dir, MetadataFile))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got).To(Equal(want))
}
