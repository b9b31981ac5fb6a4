package v1alpha1_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// TestNoNameClashWithCAPI checks that no exported constant of this API package has the Go name of a
// CAPI API constant with a different value: code that imports both would read the same name with
// two meanings (e.g. MachineHealthCheckSucceededCondition). The oracle is CAPI's source itself, read
// from the module the build uses.
func TestNoNameClashWithCAPI(t *testing.T) {
	g := NewWithT(t)
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/cluster-api/api").Output()
	g.Expect(err).NotTo(HaveOccurred(), "go list -m sigs.k8s.io/cluster-api/api")
	capiDir := strings.TrimSpace(string(out))

	capi := map[string]string{}
	g.Expect(filepath.WalkDir(capiDir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		for name, value := range stringConstants(t, path) {
			capi[name] = value
		}
		return nil
	})).To(Succeed())
	g.Expect(capi).To(HaveKey("MachineHealthCheckSucceededCondition"), "the walk must have read CAPI's core API")

	own := map[string]string{}
	files, err := filepath.Glob("*.go")
	g.Expect(err).NotTo(HaveOccurred())
	for _, f := range files {
		if !strings.HasSuffix(f, "_test.go") {
			for name, value := range stringConstants(t, f) {
				own[name] = value
			}
		}
	}
	g.Expect(own).To(HaveKey("UnhealthyAnnotation"), "the walk must have read this package")

	for name, value := range own {
		if other, ok := capi[name]; ok && other != value {
			t.Errorf("%s is %q here and %q in CAPI's API: rename it", name, value, other)
		}
	}
}

// stringConstants returns the exported constants of a file whose value is a string literal.
func stringConstants(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatalf("parsing %s: %v", path, err)
	}
	out := map[string]string{}
	for _, decl := range f.Decls {
		gd, ok := decl.(*ast.GenDecl)
		if !ok || gd.Tok != token.CONST {
			continue
		}
		for _, spec := range gd.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, name := range vs.Names {
				if !name.IsExported() || i >= len(vs.Values) {
					continue
				}
				if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
					if v, err := strconv.Unquote(lit.Value); err == nil {
						out[name.Name] = v
					}
				}
			}
		}
	}
	return out
}

// TestFenceHookIsACAPIPreDrainHook: CAPI's Machine controller honours only annotations with its
// pre-drain hook prefix, followed by "/" and a name.
func TestFenceHookIsACAPIPreDrainHook(t *testing.T) {
	g := NewWithT(t)
	prefix, name, ok := strings.Cut(caprv1.FenceBeforeDeleteHookAnnotation, "/")
	g.Expect(ok).To(BeTrue())
	g.Expect(prefix).To(Equal(clusterv1.PreDrainDeleteHookAnnotationPrefix))
	g.Expect(name).NotTo(BeEmpty())
}

// TestQuorumSafeHookIsACAPIPreTerminateHook: the hooks CAPR holds a victim's termination with carry
// CAPI's pre-terminate hook prefix, followed by "/" and a name.
func TestQuorumSafeHookIsACAPIPreTerminateHook(t *testing.T) {
	g := NewWithT(t)
	for _, hook := range []string{caprv1.QuorumSafeHookAnnotation, caprv1.ReplicasBackHookAnnotation} {
		prefix, name, ok := strings.Cut(hook, "/")
		g.Expect(ok).To(BeTrue())
		g.Expect(prefix).To(Equal(clusterv1.PreTerminateDeleteHookAnnotationPrefix))
		g.Expect(name).NotTo(BeEmpty())
	}
}
