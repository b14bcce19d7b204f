// Package docs holds the repository's documentation. Its test checks that the documentation
// is self-contained: every relative link in README.md and docs/*.md resolves to a file of the
// repository, and every #anchor to a heading of the file it names.
package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// pending names documents that other work adds under docs/ and that the index already links.
// A link to one of them is not an error while it is missing; once it exists it is checked
// like any other. Remove a name when its document has landed.
var pending = map[string]bool{}

// link matches an inline Markdown link or image: [text](target) or ![alt](target "title");
// refDef a reference definition: [label]: target.
var (
	link   = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	refDef = regexp.MustCompile(`^ {0,3}\[[^\]]+\]:\s*(\S+)`)
)

func TestRelativeLinksResolve(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, filepath.Join(root, "README.md"))
	checked := 0
	for _, file := range files {
		for _, l := range links(t, file) {
			checked++
			if msg := resolve(root, file, l.target); msg != "" {
				rel, _ := filepath.Rel(root, file)
				t.Errorf("%s:%d: link %q: %s", rel, l.line, l.target, msg)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no links found: the test reads the wrong files")
	}
}

type mdLink struct {
	line   int
	target string
}

// links returns the links of a Markdown file outside code (fenced blocks, indented blocks and
// inline code spans), where example text is not a link.
func links(t *testing.T, file string) []mdLink {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out []mdLink
	fenced := false
	for i, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced || strings.HasPrefix(line, "    ") || strings.HasPrefix(line, "\t") {
			continue
		}
		for _, m := range link.FindAllStringSubmatch(stripCode(line), -1) {
			out = append(out, mdLink{line: i + 1, target: m[1]})
		}
		if m := refDef.FindStringSubmatch(line); m != nil {
			out = append(out, mdLink{line: i + 1, target: strings.Trim(m[1], "<>")})
		}
	}
	return out
}

// stripCode removes inline code spans from a line.
func stripCode(line string) string {
	var b strings.Builder
	in := false
	for _, r := range line {
		if r == '`' {
			in = !in
			continue
		}
		if !in {
			b.WriteRune(r)
		}
	}
	return b.String()
}

// resolve checks one link target of file; it returns why it does not resolve, or "".
func resolve(root, file, target string) string {
	if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
		return "" // external; the repository documents itself, but may cite the web
	}
	path, anchor, _ := strings.Cut(target, "#")
	dest := file
	if path != "" {
		dest = filepath.Join(filepath.Dir(file), filepath.FromSlash(path))
		if rel, err := filepath.Rel(root, dest); err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
			return "points outside the repository"
		}
		if _, err := os.Stat(dest); err != nil {
			if filepath.Dir(dest) == filepath.Join(root, "docs") && pending[filepath.Base(dest)] {
				return ""
			}
			return "no such file"
		}
	}
	if anchor == "" || !strings.HasSuffix(dest, ".md") {
		return ""
	}
	anchors, err := headingAnchors(dest)
	if err != nil {
		return err.Error()
	}
	if !anchors[anchor] {
		return "no heading with anchor #" + anchor
	}
	return ""
}

// headingAnchors returns the anchors GitHub derives from the headings of a Markdown file:
// lower case, punctuation dropped, spaces as hyphens, repeats numbered -1, -2, ...
func headingAnchors(file string) (map[string]bool, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	anchors := map[string]bool{}
	seen := map[string]int{}
	fenced := false
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced || !strings.HasPrefix(line, "#") {
			continue
		}
		text := strings.TrimSpace(strings.TrimLeft(line, "#"))
		slug := slugify(text)
		if n := seen[slug]; n > 0 {
			anchors[slug+"-"+strconv.Itoa(n)] = true
		} else {
			anchors[slug] = true
		}
		seen[slug]++
	}
	return anchors, nil
}

func slugify(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteRune('-')
		}
	}
	return b.String()
}

func TestSlugify(t *testing.T) {
	for heading, want := range map[string]string{
		"Views, drift and scaling":          "views-drift-and-scaling",
		"Wait for a revocation (long-poll)": "wait-for-a-revocation-long-poll",
		"`kubectl lease` plugin":            "kubectl-lease-plugin",
		"What it is, and what it is not":    "what-it-is-and-what-it-is-not",
	} {
		if got := slugify(heading); got != want {
			t.Errorf("slugify(%q) = %q, want %q", heading, got, want)
		}
	}
}
