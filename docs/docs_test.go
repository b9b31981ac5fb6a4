package docs

import (
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// repoRoot is the repository root, seen from this package's folder (go test runs in it).
const repoRoot = ".."

// runbook is the runbook the reason constants must have entries in, relative to repoRoot.
const runbook = "docs/operations/runbook.md"

// TestEveryReasonHasARunbookEntry fails when a condition or event reason constant (see
// reasonSources) has no entry in the runbook, naming each missing reason and its constant.
func TestEveryReasonHasARunbookEntry(t *testing.T) {
	reasons, err := reasonConstants(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	text, err := os.ReadFile(filepath.Join(repoRoot, runbook))
	if err != nil {
		t.Fatal(err)
	}
	if missing := missingEntries(reasons, runbookEntries(string(text))); len(missing) > 0 {
		t.Errorf("%s has no entry for %d reason(s). Add for each a heading with the reason in backticks "+
			"(e.g. \"### `%s`\") saying what it means, how to confirm it (kubectl) and what to do:\n  %s",
			runbook, len(missing), strings.Fields(missing[0])[0], strings.Join(missing, "\n  "))
	}
}

// TestReasonConstantsAreFound guards the parser: the reasons an operator meets most, condition
// and event reasons from each source package, are found with their values.
func TestReasonConstantsAreFound(t *testing.T) {
	reasons, err := reasonConstants(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]string{}
	for _, r := range reasons {
		found[r.name] = r.value
	}
	for name, value := range map[string]string{
		"MachineRemediationWouldLoseFailureMarginReason": "WouldLoseFailureMargin", // condition, api/v1alpha1
		"MachineHealthCheckEtcdQuorumLostReason":         "EtcdQuorumLost",
		"EventStormCooldownStarted":                      "StormCooldownStarted", // event, api/v1alpha1
		"EventRemediationYielded":                        "RemediationYielded",   // event, remediation/controlplane
		"EventNoRemediator":                              "NoRemediator",         // event, remediation/worker
		"EventEscalationCreated":                         "EscalationCreated",    // remediation/worker, via remediation/escalation
	} {
		if found[name] != value {
			t.Errorf("constant %s: found value %q, want %q", name, found[name], value)
		}
	}
	if _, ok := found["MachineRemediationProgressingCondition"]; ok {
		t.Errorf("a condition type was taken for a reason")
	}
}

func TestMissingEntriesNamesTheConstant(t *testing.T) {
	root := t.TempDir()
	for _, src := range reasonSources {
		dir := filepath.Join(root, src.dir)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		pkg := filepath.Base(src.dir)
		body := "package " + pkg + "\n"
		switch {
		case src.suffixReason:
			body += "const (\n\tFooCondition = \"Foo\"\n\tFooWaitingReason = \"FooWaiting\"\n\tFooDoneReason = \"FooDone\"\n\tunexportedReason = \"Hidden\"\n)\n"
		case pkg == "escalation":
			body += "const EventCreated = \"EscalationCreated\"\n"
		default:
			body += "import \"x/escalation\"\nconst (\n\tEventFoo = \"FooHappened\"\n\tEventCopied = escalation.EventCreated\n\tNotAnEvent = \"Other\"\n)\n"
		}
		if err := os.WriteFile(filepath.Join(dir, "c.go"), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	reasons, err := reasonConstants(root)
	if err != nil {
		t.Fatal(err)
	}
	var values []string
	for _, r := range reasons {
		values = append(values, r.value)
	}
	slices.Sort(values)
	values = slices.Compact(values)
	if want := []string{"EscalationCreated", "FooDone", "FooHappened", "FooWaiting"}; !slices.Equal(values, want) {
		t.Fatalf("reasons %v, want %v", values, want)
	}
	runbookText := "# Runbook\n## `FooWaiting`\ntext\n<a id=\"FooHappened\"></a>\n### `EscalationCreated` and more\n```\n## `FooDone`\n```\n"
	missing := missingEntries(reasons, runbookEntries(runbookText))
	if len(missing) != 1 || !strings.HasPrefix(missing[0], "FooDone  (FooDoneReason, api/v1alpha1/c.go:") {
		t.Errorf("missing = %q, want only FooDone (a heading inside a code block is no entry), naming its constant", missing)
	}
}

// markdownFiles are the files whose links are checked: README.md, CONTRIBUTING.md, CHANGELOG.md
// and every Markdown file under docs/.
func markdownFiles(t *testing.T, root string) []string {
	t.Helper()
	files := []string{"README.md", "CONTRIBUTING.md", "CHANGELOG.md"}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			rel, err := filepath.Rel(root, path)
			if err != nil {
				return err
			}
			files = append(files, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// TestDocumentationLinksResolve fails on a relative link or #anchor in the documentation that
// names no file, folder or heading. No network: absolute URLs are not followed.
func TestDocumentationLinksResolve(t *testing.T) {
	problems, err := brokenLinks(repoRoot, markdownFiles(t, repoRoot))
	if err != nil {
		t.Fatal(err)
	}
	if len(problems) > 0 {
		t.Errorf("%d broken link(s) (anchors follow GitHub: the heading lowercased, punctuation dropped, spaces as '-'):\n  %s",
			len(problems), strings.Join(problems, "\n  "))
	}
}

func TestBrokenLinksAreFound(t *testing.T) {
	root := t.TempDir()
	write := func(rel, body string) { writeFile(t, root, rel, body) }
	write("README.md", "# Title\n"+
		"[ok](docs/a.md#end-to-end-suite-teste2e-and-on-kind) [ok folder](docs) [web](https://example.invalid/x)\n"+
		"[gone](docs/missing.md) [bad anchor](docs/a.md#nope) `[in code](nowhere.md)`\n"+
		"```\n[in a block](nowhere.md)\n```\n"+
		"[self](#title) [second](docs/a.md#same-1) [html](docs/a.md#custom) [out](../x.md)\n"+
		"[ref]: docs/a.md#also-missing\n")
	write("docs/a.md", "## End-to-end suite (`test/e2e`), and on kind\n## Same\n## Same\n<a id=\"custom\"></a>\n")
	problems, err := brokenLinks(root, []string{"README.md", "docs/a.md"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"README.md:3: docs/missing.md: no such file or folder docs/missing.md",
		"README.md:3: docs/a.md#nope: docs/a.md has no heading or <a id> with anchor #nope",
		"README.md:7: ../x.md: points outside the repository",
		"README.md:8: docs/a.md#also-missing: docs/a.md has no heading or <a id> with anchor #also-missing",
	}
	if !slices.Equal(problems, want) {
		t.Errorf("problems:\n  %s\nwant:\n  %s", strings.Join(problems, "\n  "), strings.Join(want, "\n  "))
	}
}

func TestGitHubSlug(t *testing.T) {
	for heading, want := range map[string]string{
		"End-to-end suite (`test/e2e`), and on kind":      "end-to-end-suite-teste2e-and-on-kind",
		"Least privilege: Secrets":                        "least-privilege-secrets",
		"How CAPR differs from CAPI's MachineHealthCheck": "how-capr-differs-from-capis-machinehealthcheck",
		"`WouldLoseFailureMargin`":                        "wouldlosefailuremargin",
		"N = 500 Machines, 1 health check(s)":             "n--500-machines-1-health-checks",
		"[Link](x.md) and **bold** snake_case":            "link-and-bold-snake_case",
	} {
		if got := githubSlug(heading); got != want {
			t.Errorf("githubSlug(%q) = %q, want %q", heading, got, want)
		}
	}
}

// writeFile writes body to rel below root, creating its folders.
func writeFile(t *testing.T, root, rel, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(filepath.Join(root, rel)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, rel), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}
