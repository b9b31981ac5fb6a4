package remediation

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/capr-io/capr/"

// TestLayering keeps two imports from coming back: etcd access knows no CRDs
// (the placement of a control plane's etcd is decided in remediation.EtcdPlacementOf, which reads the
// provider's object), and neither remediator imports the other (which remediator owns a request is
// decided once, in remediation.IsWorkerRequest).
func TestLayering(t *testing.T) {
	forbidden := map[string][]string{
		"../etcdutil":                       {module + "api/", module + "remediation", module + "controllers"},
		"../etcdutil/quorum":                {module + "api/", module + "remediation", module + "controllers"},
		"worker":                            {module + "remediation/controlplane"},
		"controlplane":                      {module + "remediation/worker"},
		".":                                 {module + "remediation/controlplane", module + "remediation/worker", module + "controllers"},
		"../controllers/machinehealthcheck": {module + "remediation/controlplane", module + "remediation/worker"},
	}
	for dir, prefixes := range forbidden {
		imports := productImports(t, dir)
		if len(imports) == 0 {
			t.Fatalf("%s: no Go file read; has the package moved?", dir)
		}
		for file, paths := range imports {
			for _, p := range paths {
				for _, prefix := range prefixes {
					if strings.HasPrefix(p, prefix) {
						t.Errorf("%s imports %s", file, p)
					}
				}
			}
		}
	}
}

// productImports returns the import paths of each non-test Go file in dir.
func productImports(t *testing.T, dir string) map[string][]string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("reading %s: %v", dir, err)
	}
	out := map[string][]string{}
	fset := token.NewFileSet()
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		path := filepath.Join(dir, name)
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatalf("parsing %s: %v", path, err)
		}
		out[path] = []string{}
		for _, imp := range f.Imports {
			p, err := strconv.Unquote(imp.Path.Value)
			if err != nil {
				t.Fatalf("%s: import %s: %v", path, imp.Path.Value, err)
			}
			out[path] = append(out[path], p)
		}
	}
	return out
}
