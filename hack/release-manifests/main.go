// Command release-manifests writes CAPR's clusterctl release assets (addon-components.yaml and
// metadata.yaml) into a directory: `make release-manifests`.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/capr-io/capr/hack/manifests"
)

func main() {
	out := flag.String("out", "out", "Directory to write the release assets into.")
	image := flag.String("image", "", "Image of the manager container (default: the one in config/manager).")
	root := flag.String("root", ".", "The CAPR checkout.")
	flag.Parse()
	if err := manifests.WriteRelease(*root, *out, *image); err != nil {
		fmt.Fprintf(os.Stderr, "release-manifests: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("wrote %s and %s\n", filepath.Join(*out, manifests.ComponentsFile), filepath.Join(*out, manifests.MetadataFile))
}
