package docs

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"unicode"
)

// A link found in a Markdown file: its target as written and the line it is on.
type link struct {
	target string
	line   int
}

var (
	// inlineLink matches [text](target) and ![alt](target), with an optional "title".
	inlineLink = regexp.MustCompile(`!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	// referenceDefinition matches "[label]: target" at the start of a line.
	referenceDefinition = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$`)
	// htmlAnchor matches <a id="x"> and <a name="x">, which GitHub keeps as anchors.
	htmlAnchor = regexp.MustCompile(`<a\s+(?:id|name)="([^"]+)"`)
	inlineCode = regexp.MustCompile("`+[^`]*`+")
	heading    = regexp.MustCompile(`^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$`)
	// scheme marks an absolute URL (https:, mailto:, ...), which is not checked: no network.
	scheme = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*:`)
)

// proseLines returns the lines of a Markdown text with fenced code blocks blanked out, so that
// line numbers stay right and nothing inside a code block counts as a link or a heading.
func proseLines(text string) []string {
	lines := strings.Split(text, "\n")
	fence := ""
	for i, l := range lines {
		trimmed := strings.TrimSpace(l)
		if fence == "" {
			if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
				fence = trimmed[:3]
				lines[i] = ""
			}
			continue
		}
		if strings.HasPrefix(trimmed, fence) {
			fence = ""
		}
		lines[i] = ""
	}
	return lines
}

// linksOf returns the inline links and reference definitions of a Markdown text, outside code.
func linksOf(text string) []link {
	var links []link
	for i, l := range proseLines(text) {
		l = inlineCode.ReplaceAllString(l, "")
		for _, m := range inlineLink.FindAllStringSubmatch(l, -1) {
			links = append(links, link{target: m[1], line: i + 1})
		}
		if m := referenceDefinition.FindStringSubmatch(l); m != nil {
			links = append(links, link{target: m[1], line: i + 1})
		}
	}
	return links
}

// headings returns the text of every heading of a Markdown text, outside code blocks.
func headings(text string) []string {
	var hs []string
	for _, l := range proseLines(text) {
		if m := heading.FindStringSubmatch(l); m != nil {
			hs = append(hs, m[2])
		}
	}
	return hs
}

// githubSlug is the anchor GitHub gives a heading: the rendered text lowercased, every character
// that is not a letter, a digit, a space, '-' or '_' dropped, and each space turned into '-'
// (github.com/gjtorikian/html-pipeline, TableOfContentsFilter, which GitHub's Markdown follows).
func githubSlug(headingText string) string {
	// What GitHub renders: link text without its target, code without backticks, no emphasis stars.
	text := regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`).ReplaceAllString(headingText, "$1")
	text = strings.NewReplacer("`", "", "*", "").Replace(text)
	text = htmlAnchor.ReplaceAllString(text, "")
	text = regexp.MustCompile(`<[^>]*>`).ReplaceAllString(text, "")
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.Is(unicode.Mn, r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchorsOf returns every anchor a Markdown text has on GitHub: one per heading (a repeated slug
// gets -1, -2, ... as GitHub numbers them) and every <a id> or <a name>.
func anchorsOf(text string) map[string]bool {
	anchors := map[string]bool{}
	seen := map[string]int{}
	for _, h := range headings(text) {
		slug := githubSlug(h)
		if n := seen[slug]; n > 0 {
			anchors[fmt.Sprintf("%s-%d", slug, n)] = true
		} else {
			anchors[slug] = true
		}
		seen[slug]++
	}
	for _, l := range proseLines(text) {
		for _, m := range htmlAnchor.FindAllStringSubmatch(l, -1) {
			anchors[m[1]] = true
		}
	}
	return anchors
}

// brokenLinks checks every relative link of the given Markdown files (paths relative to root):
// the file or folder it names exists inside root and, for a Markdown target, its #anchor exists.
// Absolute URLs are not followed. Each problem is returned as "file:line: target: why".
func brokenLinks(root string, files []string) ([]string, error) {
	anchorCache := map[string]map[string]bool{}
	anchorsFor := func(rel string) (map[string]bool, error) {
		if a, ok := anchorCache[rel]; ok {
			return a, nil
		}
		b, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			return nil, fmt.Errorf("reading %s for its anchors: %w", rel, err)
		}
		anchorCache[rel] = anchorsOf(string(b))
		return anchorCache[rel], nil
	}
	var problems []string
	for _, file := range files {
		b, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", file, err)
		}
		for _, l := range linksOf(string(b)) {
			if scheme.MatchString(l.target) {
				continue
			}
			path, anchor, _ := strings.Cut(l.target, "#")
			report := func(format string, args ...any) {
				problems = append(problems, fmt.Sprintf("%s:%d: %s: %s", file, l.line, l.target, fmt.Sprintf(format, args...)))
			}
			target := file
			if path != "" {
				if strings.HasPrefix(path, "/") {
					target = filepath.Clean(strings.TrimPrefix(path, "/"))
				} else {
					target = filepath.Join(filepath.Dir(file), path)
				}
				if target == ".." || strings.HasPrefix(target, "../") {
					report("points outside the repository")
					continue
				}
				info, err := os.Stat(filepath.Join(root, target))
				if err != nil {
					report("no such file or folder %s", target)
					continue
				}
				if info.IsDir() {
					if anchor != "" {
						report("an anchor on a folder")
					}
					continue
				}
			}
			if anchor == "" || !strings.HasSuffix(target, ".md") {
				continue
			}
			anchors, err := anchorsFor(target)
			if err != nil {
				return nil, err
			}
			if !anchors[anchor] {
				report("%s has no heading or <a id> with anchor #%s", target, anchor)
			}
		}
	}
	return problems, nil
}

// regexpBacktickWord matches a code span holding one identifier, such as `StepTimedOut`.
var regexpBacktickWord = regexp.MustCompile("`([A-Za-z][A-Za-z0-9./-]*)`")
