package docs

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// A comparison campaign on kind (make compare-kind, test/e2e compare_kind_test.go) writes a results
// file of its own: a first line that fixes the faults, systems and runs before any run, then one
// line per run, made or not. A document shows the campaign between these markers; the begin marker
// names the file. UPDATE_DOCS=1 go test ./docs -run TestKindComparison rewrites the section.
const (
	compareBegin = "<!-- kind comparison begin: "
	compareEnd   = "<!-- kind comparison end -->"
)

type compareCampaign struct {
	Campaign    string   `json:"campaign"`
	Commit      string   `json:"commit"`
	Started     string   `json:"started"`
	Machine     string   `json:"machine"`
	LoadAverage string   `json:"loadAverage"`
	Faults      []string `json:"faults"`
	Systems     []string `json:"systems"`
	RunsPerRow  int      `json:"runsPerRow"`
	Settings    string   `json:"settings"`
	Notes       []string `json:"notes"`
}

type compareRun struct {
	Campaign       string  `json:"campaign"`
	Fault          string  `json:"fault"`
	System         string  `json:"system"`
	Run            int     `json:"run"`
	Made           bool    `json:"made"`
	Passed         bool    `json:"passed"`
	SecondsToMark  float64 `json:"secondsToMark"`
	SecondsToWhole float64 `json:"secondsToWhole"`
	Error          string  `json:"error"`
	Observer       struct {
		MinMargin             *int     `json:"minMargin"`
		MinMarginSettled      *int     `json:"minMarginSettled"`
		SecondsAtMarginBelow1 float64  `json:"secondsAtMarginBelow1"`
		SecondsJoiningBelow1  float64  `json:"secondsJoiningBelow1"`
		MachinesCreated       []string `json:"machinesCreated"`
	} `json:"observer"`
}

var systemNames = map[string]string{"kcp": "CAPI MHC + KCP", "capr": "CAPR"}

// compareTable renders a campaign: what was fixed before it, a row per fault and system with the
// medians and ranges of its runs, and per fault where CAPR is ahead, even or behind.
func compareTable(results string) (string, error) {
	raw, err := os.ReadFile(results)
	if err != nil {
		return "", err
	}
	var head compareCampaign
	runs := map[string][]compareRun{} // by fault and system
	made, notMade := 0, 0
	for i, line := range strings.Split(string(raw), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		if head.Campaign == "" {
			if err := json.Unmarshal([]byte(line), &head); err != nil {
				return "", fmt.Errorf("%s line %d: %w", results, i+1, err)
			}
			if head.Campaign == "" || head.RunsPerRow == 0 {
				return "", fmt.Errorf("%s line %d: not a campaign's first line (no campaign or runsPerRow)", results, i+1)
			}
			continue
		}
		var r compareRun
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			return "", fmt.Errorf("%s line %d: %w", results, i+1, err)
		}
		if r.Campaign != head.Campaign || !slices.Contains(head.Faults, r.Fault) || !slices.Contains(head.Systems, r.System) {
			return "", fmt.Errorf("%s line %d: a run of %s/%s/%s, not of campaign %s's faults and systems", results, i+1, r.Campaign, r.Fault, r.System, head.Campaign)
		}
		if r.Made {
			made++
		} else {
			notMade++
		}
		runs[r.Fault+"/"+r.System] = append(runs[r.Fault+"/"+r.System], r)
	}
	if head.Campaign == "" {
		return "", fmt.Errorf("%s: empty", results)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Campaign %s on %s (%s; load average %s at its start): %d runs per fault and system, fixed before it started; "+
		"%d made, %d not made, of %d. Settings: %s.\n\n",
		head.Campaign, head.Commit, head.Machine, head.LoadAverage, head.RunsPerRow, made, notMade, head.RunsPerRow*len(head.Faults)*len(head.Systems), head.Settings)
	for _, n := range head.Notes {
		fmt.Fprintf(&b, "Note: %s\n\n", n)
	}
	b.WriteString("| fault | system | runs whole again | lowest failure margin (leaving out a joining replacement) | seconds at margin ≤ 0, median (range) | marked after, median (range) | whole again after, median (range) | Machines created per run |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|\n")
	var verdicts []string
	for _, fault := range head.Faults {
		stats := map[string]systemStats{}
		for _, system := range head.Systems {
			s := summarizeRuns(runs[fault+"/"+system])
			stats[system] = s
			fmt.Fprintf(&b, "| %s | %s | %d of %d | %s | %s | %s | %s | %s |\n", fault, systemNames[system], s.passed, s.made,
				s.margin(), spread(s.belowOne), spread(s.mark), spread(s.whole), spreadCount(s.created))
		}
		if c, k := stats["capr"], stats["kcp"]; c.made > 0 && k.made > 0 {
			verdicts = append(verdicts, fmt.Sprintf("- **%s**: failure margin: %s; at margin ≤ 0: %s; marked: %s; whole again: %s.", fault,
				compareMargins(c, k), ahead(c.belowOne, k.belowOne), ahead(c.mark, k.mark), ahead(c.whole, k.whole)))
		}
	}
	if len(verdicts) > 0 {
		b.WriteString("\nCAPR against CAPI MHC + KCP (lower is better; where the ranges overlap, neither side was ahead in every run):\n\n")
		b.WriteString(strings.Join(verdicts, "\n") + "\n")
	}
	return b.String(), nil
}

type systemStats struct {
	made, passed                   int
	minMargin, minSettled          *int
	belowOne, mark, whole, created []float64
}

func summarizeRuns(runs []compareRun) systemStats {
	var s systemStats
	for _, r := range runs {
		if !r.Made {
			continue
		}
		s.made++
		if r.Passed {
			s.passed++
			s.whole = append(s.whole, r.SecondsToWhole)
			s.created = append(s.created, float64(len(r.Observer.MachinesCreated)))
		}
		if r.SecondsToMark > 0 {
			s.mark = append(s.mark, r.SecondsToMark)
		}
		if m := r.Observer.MinMargin; m != nil {
			s.minMargin = lower(s.minMargin, *m)
			s.belowOne = append(s.belowOne, r.Observer.SecondsAtMarginBelow1)
		}
		if m := r.Observer.MinMarginSettled; m != nil {
			s.minSettled = lower(s.minSettled, *m)
		}
	}
	return s
}

func lower(p *int, v int) *int {
	if p == nil || v < *p {
		return &v
	}
	return p
}

func (s systemStats) margin() string {
	if s.minMargin == nil {
		return "not read"
	}
	if s.minSettled != nil && *s.minSettled != *s.minMargin {
		return fmt.Sprintf("%d (%d)", *s.minMargin, *s.minSettled)
	}
	return fmt.Sprint(*s.minMargin)
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// spread is "median (min–max)" in seconds, "-" with no values.
func spread(v []float64) string {
	if len(v) == 0 {
		return "-"
	}
	if len(v) == 1 {
		return fmt.Sprintf("%.1f", v[0])
	}
	return fmt.Sprintf("%.1f (%.1f–%.1f)", median(v), slices.Min(v), slices.Max(v))
}

func spreadCount(v []float64) string {
	if len(v) == 0 {
		return "-"
	}
	if slices.Min(v) == slices.Max(v) {
		return fmt.Sprintf("%.0f in every run", v[0])
	}
	return fmt.Sprintf("%.0f–%.0f", slices.Min(v), slices.Max(v))
}

// ahead says which side is lower (better) on a figure, by the difference of the medians, and
// whether the ranges overlap (then neither side is ahead in every run).
func ahead(capr, kcp []float64) string {
	if len(capr) == 0 || len(kcp) == 0 {
		return "not comparable (a side has no value)"
	}
	d := median(capr) - median(kcp)
	overlap := ""
	if slices.Max(capr) >= slices.Min(kcp) && slices.Max(kcp) >= slices.Min(capr) {
		overlap = ", ranges overlapping"
	}
	switch {
	case d < 0:
		return fmt.Sprintf("CAPR ahead by %.1f s in medians%s", -d, overlap)
	case d > 0:
		return fmt.Sprintf("CAPR behind by %.1f s in medians%s", d, overlap)
	default:
		return fmt.Sprintf("even (medians %.1f s)", median(capr))
	}
}

func compareMargins(capr, kcp systemStats) string {
	if capr.minMargin == nil || kcp.minMargin == nil {
		return "not comparable (a side was not read)"
	}
	out := lowest(*capr.minMargin, *kcp.minMargin, "")
	if capr.minSettled != nil && kcp.minSettled != nil && (*capr.minSettled != *capr.minMargin || *kcp.minSettled != *kcp.minMargin) {
		out += "; " + lowest(*capr.minSettled, *kcp.minSettled, "leaving out a joining replacement")
	}
	return out
}

func lowest(c, k int, what string) string {
	if what != "" {
		what += ", "
	}
	switch {
	case c > k:
		return fmt.Sprintf("%sCAPR ahead (lowest %d, KCP %d)", what, c, k)
	case c < k:
		return fmt.Sprintf("%sCAPR behind (lowest %d, KCP %d)", what, c, k)
	default:
		return fmt.Sprintf("%seven (lowest %d on both)", what, c)
	}
}

// TestKindComparisonMatchesItsFile fails when a document's comparison differs from the campaign's
// results file it names.
func TestKindComparisonMatchesItsFile(t *testing.T) {
	checkSections(t, compareBegin, compareEnd, compareTable, "TestKindComparison")
}

func TestKindComparisonTable(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "c.jsonl")
	lines := `{"campaign":"c1","commit":"abc","machine":"m","loadAverage":"0.1 0.2 0.3","faults":["f1"],"systems":["kcp","capr"],"runsPerRow":2,"settings":"s"}
{"campaign":"c1","fault":"f1","system":"kcp","run":1,"made":true,"passed":true,"secondsToMark":110,"secondsToWhole":300,"observer":{"minMargin":0,"minMarginSettled":0,"secondsAtMarginBelow1":40,"machinesCreated":["a"]}}
{"campaign":"c1","fault":"f1","system":"capr","run":1,"made":true,"passed":true,"secondsToMark":100,"secondsToWhole":250,"observer":{"minMargin":0,"minMarginSettled":1,"secondsAtMarginBelow1":5,"secondsJoiningBelow1":5,"machinesCreated":["b"]}}
{"campaign":"c1","fault":"f1","system":"capr","run":2,"made":true,"passed":false,"secondsToMark":104,"observer":{"minMargin":1,"minMarginSettled":1,"machinesCreated":["c","d"]}}
{"campaign":"c1","fault":"f1","system":"kcp","run":2,"made":false,"error":"not made: stopped"}
`
	if err := os.WriteFile(path, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := compareTable(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"2 runs per fault and system, fixed before it started; 3 made, 1 not made, of 4.",
		"| f1 | CAPI MHC + KCP | 1 of 1 | 0 | 40.0 | 110.0 | 300.0 | 1 in every run |",
		"| f1 | CAPR | 1 of 2 | 0 (1) | 2.5 (0.0–5.0) | 102.0 (100.0–104.0) | 250.0 | 1 in every run |",
		"- **f1**: failure margin: even (lowest 0 on both); leaving out a joining replacement, CAPR ahead (lowest 1, KCP 0); at margin ≤ 0: CAPR ahead by 37.5 s in medians; marked: CAPR ahead by 8.0 s in medians; whole again: CAPR ahead by 50.0 s in medians.",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the comparison lacks %q:\n%s", want, got)
		}
	}
	for _, c := range []struct {
		capr, kcp []float64
		want      string
	}{
		{[]float64{290, 330}, []float64{280, 300}, "CAPR behind by 20.0 s in medians, ranges overlapping"},
		{[]float64{100, 120}, []float64{90, 130}, "even (medians 110.0 s)"},
		{[]float64{80, 90}, nil, "not comparable (a side has no value)"},
	} {
		if got := ahead(c.capr, c.kcp); got != c.want {
			t.Errorf("ahead(%v, %v) = %q, want %q", c.capr, c.kcp, got, c.want)
		}
	}
	bad := strings.Replace(lines, `"system":"capr","run":2`, `"system":"other","run":2`, 1)
	if err := os.WriteFile(path, []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := compareTable(path); err == nil || !strings.Contains(err.Error(), "line 4") {
		t.Errorf("a run of an unknown system: %v, want an error naming line 4", err)
	}
}
