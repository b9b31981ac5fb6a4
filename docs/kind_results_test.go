package docs

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The kind faults (make e2e-kind) append one line per run to a results file. A document shows every
// run of it, passed or not, between these markers; the begin marker names the file relative to the
// repository root. UPDATE_DOCS=1 go test ./docs -run TestKindResults rewrites the section.
const (
	kindBegin = "<!-- kind results begin: "
	kindEnd   = "<!-- kind results end -->"
)

// kindRun is the part of a results line (test/e2e kindResult) the table shows.
type kindRun struct {
	Date            string  `json:"date"`
	Commit          string  `json:"commit"`
	Test            string  `json:"test"`
	VictimWasLeader bool    `json:"victimWasLeader"`
	Passed          bool    `json:"passed"`
	SecondsToMark   float64 `json:"secondsToMark"`
	SecondsToWhole  float64 `json:"secondsToWhole"`
	FencedBeforeDel *bool   `json:"fencedBeforeDelete"`
	Observer        struct {
		MinMargin             *int     `json:"minMargin"`
		SecondsAtMarginBelow1 float64  `json:"secondsAtMarginBelow1"`
		SecondsJoiningBelow1  float64  `json:"secondsJoiningBelow1"`
		MachinesCreated       []string `json:"machinesCreated"`
	} `json:"observer"`
	Notes []string `json:"notes"`
}

// kindTable renders every run of a results file, in the file's order.
func kindTable(results string) (string, error) {
	raw, err := os.ReadFile(results)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString("| date (UTC) | commit | test | passed | lowest failure margin | seconds at margin < 1 (of them joining) | marked after | whole after | Machines created | fenced before delete |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|\n")
	n := 0
	for i, line := range strings.Split(string(raw), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		n++
		var r kindRun
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			return "", fmt.Errorf("%s line %d: %w", results, i+1, err)
		}
		test := "`" + r.Test + "`"
		if r.VictimWasLeader {
			test += " (leader)"
		}
		passed := "no"
		if r.Passed {
			passed = "yes"
		}
		margin := "not read"
		if r.Observer.MinMargin != nil {
			margin = fmt.Sprint(*r.Observer.MinMargin)
		}
		fenced := "-"
		if r.FencedBeforeDel != nil {
			fenced = map[bool]string{true: "yes", false: "no"}[*r.FencedBeforeDel]
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s | %d | %s |\n", strings.Replace(strings.TrimSuffix(r.Date, "Z"), "T", " ", 1),
			r.Commit, test, passed, margin, belowOne(r.Observer.SecondsAtMarginBelow1, r.Observer.SecondsJoiningBelow1), seconds(r.SecondsToMark), seconds(r.SecondsToWhole),
			len(r.Observer.MachinesCreated), fenced)
	}
	return fmt.Sprintf("%d runs, every one the file holds; a failed run's notes say why.\n\n%s", n, b.String()), nil
}

// belowOne shows the seconds at margin below 1, and how many of them only a joining replacement
// failed its health read, where any did.
func belowOne(total, joining float64) string {
	if joining == 0 {
		return seconds(total)
	}
	return fmt.Sprintf("%s (%s)", seconds(total), seconds(joining))
}

// seconds shows a duration the run measured, or "-" where it did not get there.
func seconds(v float64) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f s", v)
}

// TestKindResultsMatchTheirFile fails when a document's table of kind runs differs from the results
// file it names, so that no run is left out and no figure is edited by hand.
func TestKindResultsMatchTheirFile(t *testing.T) {
	checkSections(t, kindBegin, kindEnd, kindTable, "TestKindResults")
}

// checkSections finds every section of the markdown files between begin (followed by a results
// file's path and " -->") and end, and fails where its body differs from render of that file;
// with UPDATE_DOCS=1 it rewrites the body instead. test names the test that does so.
func checkSections(t *testing.T, begin, end string, render func(path string) (string, error), test string) {
	t.Helper()
	for _, doc := range markdownFiles(t, repoRoot) {
		path := filepath.Join(repoRoot, doc)
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		text, updated := string(raw), ""
		for {
			at := strings.Index(text, begin)
			if at < 0 {
				updated += text
				break
			}
			rest := text[at+len(begin):]
			name, after, ok := strings.Cut(rest, " -->\n")
			if !ok {
				t.Errorf("%s: the marker %q is not closed", doc, begin)
				return
			}
			body, tail, ok := strings.Cut(after, end)
			if !ok {
				t.Errorf("%s: no %s after %s", doc, end, begin)
				return
			}
			want, err := render(filepath.Join(repoRoot, name))
			if err != nil {
				t.Errorf("%s: %v", doc, err)
				want = body
			} else if body != want && os.Getenv("UPDATE_DOCS") != "1" {
				t.Errorf("%s: the section differs from %s (UPDATE_DOCS=1 go test ./docs -run %s rewrites it; do not edit it):\n%s", doc, name, test, want)
			}
			updated += text[:at] + begin + name + " -->\n" + want + end
			text = tail
		}
		if os.Getenv("UPDATE_DOCS") == "1" && updated != string(raw) {
			if err := os.WriteFile(path, []byte(updated), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func TestKindTableShowsEveryRun(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "kind.jsonl")
	lines := `{"date":"2026-12-06T16:26:38Z","commit":"a1","test":"TestA","passed":true,"secondsToMark":113.2,"secondsToWhole":325.4,"observer":{"minMargin":1,"machinesCreated":["m1"]}}
{"date":"2026-12-06T17:00:00Z","commit":"b2","test":"TestB","victimWasLeader":true,"passed":false,"fencedBeforeDelete":false,"observer":{"secondsAtMarginBelow1":48.4}}
`
	if err := os.WriteFile(path, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := kindTable(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"2 runs,",
		"| 2026-12-06 16:26:38 | a1 | `TestA` | yes | 1 | - | 113 s | 325 s | 1 | - |",
		"| 2026-12-06 17:00:00 | b2 | `TestB` (leader) | no | not read | 48 s | - | - | 0 | no |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the table lacks %q:\n%s", want, got)
		}
	}
	if err := os.WriteFile(path, []byte(lines+"not json\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := kindTable(path); err == nil || !strings.Contains(err.Error(), "line 3") {
		t.Errorf("a broken line: %v, want an error naming line 3", err)
	}
}
