package docs

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// A copy of a results file's summary in a document: test/sandbox/cmd/compare-kcp writes the summary
// between these markers into its results file, and (make compare-kcp UPDATE_DOCS=1) into a document,
// whose begin marker names the results file relative to the document, followed by a line linking it.
var (
	embeddedBegin = regexp.MustCompile(`(?m)^<!-- compare-kcp summary begin: (\S+) -->\n`)
	resultsBegin  = "<!-- compare-kcp summary begin -->\n"
)

const summaryEnd = "<!-- compare-kcp summary end -->"

// TestEmbeddedResultsMatchTheirFiles fails when a document's generated compare-kcp tables differ from
// the results file they name, so a table in the docs cannot drift from the measurement it cites.
func TestEmbeddedResultsMatchTheirFiles(t *testing.T) {
	problems, err := staleEmbeddings(repoRoot, markdownFiles(t, repoRoot))
	if err != nil {
		t.Fatal(err)
	}
	if len(problems) > 0 {
		t.Errorf("%d generated section(s) differ from their results file (rerun make compare-kcp UPDATE_DOCS=1, do not edit them):\n  %s",
			len(problems), strings.Join(problems, "\n  "))
	}
}

func TestStaleEmbeddingsAreFound(t *testing.T) {
	root := t.TempDir()
	write := func(rel, body string) { writeFile(t, root, rel, body) }
	results := "# r\n\n" + resultsBegin + "3 runs.\n\n| a | b |\n" + summaryEnd + "\n"
	write("results/r.md", results)
	section := func(file, body string) string {
		return "<!-- compare-kcp summary begin: " + file + " -->\nGenerated from [`r.md`](" + file + ").\n\n" + body + "\n" + summaryEnd + "\n"
	}
	write("docs/same.md", "# Same\n\n"+section("../results/r.md", "3 runs.\n\n| a | b |"))
	write("docs/edited.md", section("../results/r.md", "3 runs.\n\n| a | c |"))
	write("docs/unlinked.md", "<!-- compare-kcp summary begin: ../results/r.md -->\n\n3 runs.\n\n| a | b |\n"+summaryEnd+"\n")
	write("docs/missing.md", section("../results/gone.md", "x"))
	write("docs/unended.md", "<!-- compare-kcp summary begin: ../results/r.md -->\nx\n")
	problems, err := staleEmbeddings(root, []string{"docs/same.md", "docs/edited.md", "docs/unlinked.md", "docs/missing.md", "docs/unended.md"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"docs/edited.md: the tables differ from results/r.md's summary",
		"docs/unlinked.md: the line after the begin marker does not link ../results/r.md",
		"docs/missing.md: open " + filepath.Join(root, "results/gone.md") + ": no such file or directory",
		"docs/unended.md: no " + summaryEnd + " after the begin marker",
	}
	if !slices.Equal(problems, want) {
		t.Errorf("problems:\n  %s\nwant:\n  %s", strings.Join(problems, "\n  "), strings.Join(want, "\n  "))
	}
}

// staleEmbeddings checks every generated section of the given Markdown files (relative to root).
func staleEmbeddings(root string, files []string) ([]string, error) {
	var problems []string
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			return nil, err
		}
		text := string(data)
		for _, loc := range embeddedBegin.FindAllStringSubmatchIndex(text, -1) {
			target := text[loc[2]:loc[3]]
			if p := checkEmbedding(root, f, target, text[loc[1]:]); p != "" {
				problems = append(problems, f+": "+p)
			}
		}
	}
	return problems, nil
}

// checkEmbedding compares one section (rest starts after its begin marker) with the summary of the
// results file it names; "" when they match.
func checkEmbedding(root, doc, target, rest string) string {
	end := strings.Index(rest, summaryEnd)
	if end < 0 {
		return "no " + summaryEnd + " after the begin marker"
	}
	link, body, _ := strings.Cut(rest[:end], "\n")
	if !strings.Contains(link, "]("+target+")") {
		return "the line after the begin marker does not link " + target
	}
	resultsPath := filepath.Join(root, filepath.Dir(doc), target)
	data, err := os.ReadFile(resultsPath)
	if err != nil {
		return err.Error()
	}
	summary, err := resultsSummary(string(data))
	if err != nil {
		return err.Error()
	}
	if strings.TrimSpace(body) != summary {
		rel, _ := filepath.Rel(root, resultsPath)
		return fmt.Sprintf("the tables differ from %s's summary", filepath.ToSlash(rel))
	}
	return ""
}

// resultsSummary is the text between a results file's summary markers.
func resultsSummary(results string) (string, error) {
	_, after, ok := strings.Cut(results, resultsBegin)
	if !ok {
		return "", fmt.Errorf("no %q in the results file", strings.TrimSpace(resultsBegin))
	}
	summary, _, ok := strings.Cut(after, summaryEnd)
	if !ok {
		return "", fmt.Errorf("no %s in the results file", summaryEnd)
	}
	return strings.TrimSpace(summary), nil
}
