package docs

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// A reason is a condition or event reason constant the runbook is keyed on.
type reason struct {
	value string // what kubectl shows
	name  string // the Go constant
	pos   string // file:line, relative to the repository root
}

// reasonSources are the packages whose reason constants an operator meets in a condition or an
// event, and which of their constants count: in api/v1alpha1 every exported constant whose name
// ends in "Reason" (condition reasons) or starts with "Event" (event reasons); in the remediators
// and fencing (its PodDeleter), which emit their own events, the exported constants starting with
// "Event" (the reasons both remediators emit are in remediation).
var reasonSources = []struct {
	dir          string
	suffixReason bool
}{
	{dir: "api/v1alpha1", suffixReason: true},
	{dir: "remediation"},
	{dir: "remediation/controlplane"},
	{dir: "remediation/worker"},
	{dir: "remediation/escalation"},
	{dir: "remediation/fencing"},
}

// reasonConstants parses the reason sources under root (no type checking: constants are read from
// the syntax, so a constant defined as another constant, also of another listed package, is
// followed) and returns every reason constant, sorted by value then name.
func reasonConstants(root string) ([]reason, error) {
	type constant struct {
		pkg, name, pos string
		expr           ast.Expr
		wanted         bool
	}
	var all []constant
	byName := map[string]*constant{} // "pkg.Name"
	fset := token.NewFileSet()
	for _, src := range reasonSources {
		files, err := filepath.Glob(filepath.Join(root, src.dir, "*.go"))
		if err != nil {
			return nil, fmt.Errorf("listing Go files in %s: %w", src.dir, err)
		}
		if len(files) == 0 {
			return nil, fmt.Errorf("no Go files in %s: reasonSources must follow the code", src.dir)
		}
		for _, path := range files {
			if strings.HasSuffix(path, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				return nil, fmt.Errorf("parsing %s: %w", path, err)
			}
			for _, decl := range f.Decls {
				gen, ok := decl.(*ast.GenDecl)
				if !ok || gen.Tok != token.CONST {
					continue
				}
				for _, spec := range gen.Specs {
					vs := spec.(*ast.ValueSpec)
					for i, id := range vs.Names {
						if !id.IsExported() || i >= len(vs.Values) {
							continue
						}
						p := fset.Position(id.Pos())
						rel, _ := filepath.Rel(root, p.Filename)
						wanted := strings.HasPrefix(id.Name, "Event") ||
							(src.suffixReason && strings.HasSuffix(id.Name, "Reason"))
						all = append(all, constant{pkg: f.Name.Name, name: id.Name,
							pos: fmt.Sprintf("%s:%d", filepath.ToSlash(rel), p.Line), expr: vs.Values[i], wanted: wanted})
					}
				}
			}
		}
	}
	for i := range all {
		byName[all[i].pkg+"."+all[i].name] = &all[i]
	}
	var resolve func(pkg string, e ast.Expr, depth int) (string, error)
	resolve = func(pkg string, e ast.Expr, depth int) (string, error) {
		if depth > 10 {
			return "", fmt.Errorf("constant chain too deep")
		}
		switch e := e.(type) {
		case *ast.BasicLit:
			if e.Kind != token.STRING {
				return "", fmt.Errorf("not a string")
			}
			return strconv.Unquote(e.Value)
		case *ast.Ident:
			if c, ok := byName[pkg+"."+e.Name]; ok {
				return resolve(c.pkg, c.expr, depth+1)
			}
			return "", fmt.Errorf("constant %s is not in %s", e.Name, pkg)
		case *ast.SelectorExpr:
			x, ok := e.X.(*ast.Ident)
			if !ok {
				return "", fmt.Errorf("unsupported selector")
			}
			if c, ok := byName[x.Name+"."+e.Sel.Name]; ok {
				return resolve(c.pkg, c.expr, depth+1)
			}
			return "", fmt.Errorf("%s.%s is not in a package the runbook test reads (reasonSources)", x.Name, e.Sel.Name)
		}
		return "", fmt.Errorf("not a string literal or a constant")
	}
	var reasons []reason
	for _, c := range all {
		if !c.wanted {
			continue
		}
		v, err := resolve(c.pkg, c.expr, 0)
		if err != nil {
			return nil, fmt.Errorf("%s (%s): cannot read its value: %w", c.name, c.pos, err)
		}
		reasons = append(reasons, reason{value: v, name: c.name, pos: c.pos})
	}
	sort.Slice(reasons, func(i, j int) bool {
		if reasons[i].value != reasons[j].value {
			return reasons[i].value < reasons[j].value
		}
		return reasons[i].name < reasons[j].name
	})
	return reasons, nil
}

// runbookEntries returns the reasons a runbook has an entry for: every word in backticks in a
// heading (e.g. "### `StepTimedOut`"), and every <a id> or <a name>.
func runbookEntries(text string) map[string]bool {
	entries := map[string]bool{}
	for _, h := range headings(text) {
		for _, m := range regexpBacktickWord.FindAllStringSubmatch(h, -1) {
			entries[m[1]] = true
		}
	}
	for _, l := range proseLines(text) {
		for _, m := range htmlAnchor.FindAllStringSubmatch(l, -1) {
			entries[m[1]] = true
		}
	}
	return entries
}

// missingEntries returns the reasons without a runbook entry, one line each, naming the constant
// and where it is defined.
func missingEntries(reasons []reason, entries map[string]bool) []string {
	var missing []string
	for _, r := range reasons {
		if !entries[r.value] {
			missing = append(missing, fmt.Sprintf("%s  (%s, %s)", r.value, r.name, r.pos))
		}
	}
	return missing
}
