package kind_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "sigs.k8s.io/cluster-api/util/yaml"
)

// Every template applies the platform's pod network with a ClusterResourceSet, and carries
// manifests/cni.yaml itself, with the image the node image preloads and the template's pod subnet.
func TestTemplatesCarryTheCNI(t *testing.T) {
	g := NewWithT(t)
	cni, err := os.ReadFile(filepath.Join("manifests", "cni.yaml"))
	g.Expect(err).NotTo(HaveOccurred())
	templates, err := filepath.Glob(filepath.Join("templates", "cluster-template*.yaml"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(templates).NotTo(BeEmpty())
	for _, path := range templates {
		raw, err := os.ReadFile(path)
		g.Expect(err).NotTo(HaveOccurred())
		objs, err := utilyaml.ToUnstructured(raw)
		g.Expect(err).NotTo(HaveOccurred(), path)
		kinds := map[string]int{}
		subnet := ""
		var data string
		for _, o := range objs {
			kinds[o.GetKind()]++
			if o.GetKind() == "Cluster" {
				blocks, _, _ := unstructured.NestedStringSlice(o.Object, "spec", "clusterNetwork", "pods", "cidrBlocks")
				g.Expect(blocks).To(HaveLen(1), path)
				subnet = blocks[0]
			}
			if o.GetKind() == "ConfigMap" {
				data = o.Object["data"].(map[string]any)["cni.yaml"].(string)
			}
		}
		g.Expect(kinds).To(HaveKeyWithValue("ClusterResourceSet", 1), path)
		want := strings.NewReplacer("@CNI_IMAGE@", "localhost/capr-kind/cni:dev", "{{ .PodSubnet }}", subnet).Replace(string(cni))
		g.Expect(data).To(Equal(want), "%s: its ConfigMap is not manifests/cni.yaml", path)
	}
}
