package cli

import (
	"fmt"
	"io"
	"strings"
	"unicode"
	"unicode/utf8"
)

// What the plugin prints comes largely from tenants: payload keys and values, user IDs,
// holder references, lease and resource names, server messages that quote them. Printed raw,
// an escape sequence in any of them acts on the operator's terminal (retitles it, rewrites
// what is on screen, in some terminals worse), and a newline or a bidirectional override
// forges what a table or a description seems to say. So:
//
//   - escapeField renders one value for a table cell or a described field: every control
//     character, newline and tab included, every bidirectional formatting character and
//     every byte that is not UTF-8 becomes a visible escape;
//   - every stream the plugin writes to goes through a terminalWriter, which does the same
//     for everything else it prints but keeps newlines and tabs, the layout of the
//     plugin's own text. Its escapes are JSON's (\u001b), so -o json stays valid JSON.
//
// See docs/operations.md ("Output is escaped").

// escapeField returns s with every character that could act on a terminal or forge the
// layout replaced by a visible escape (\n, \t, \x1b, \u202e, \xff for a byte that is not
// UTF-8). Printable text, including non-ASCII letters, is unchanged.
func escapeField(s string) string {
	if !needsEscape(s, false) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size <= 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\r':
			b.WriteString(`\r`)
		case r < 0x80 && unsafeRune(r):
			fmt.Fprintf(&b, `\x%02x`, r)
		case unsafeRune(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// unsafeRune reports the characters a terminal may act on: C0 and C1 controls, DEL, and the
// bidirectional formatting characters (which reorder what follows them on screen).
func unsafeRune(r rune) bool {
	return unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r)
}

// needsEscape reports whether s holds an unsafe character (with keepLayout, newline and tab
// are fine) or a byte that is not UTF-8.
func needsEscape(s string, keepLayout bool) bool {
	for i, r := range s {
		if r == utf8.RuneError {
			if _, size := utf8.DecodeRuneInString(s[i:]); size <= 1 {
				return true
			}
		}
		if keepLayout && (r == '\n' || r == '\t') {
			continue
		}
		if unsafeRune(r) {
			return true
		}
	}
	return false
}

// terminalWriter escapes, in everything written through it, the characters escapeField
// escapes except newline and tab. Each Write is escaped on its own: the plugin writes whole
// strings (a formatted line, a table, a JSON document), never a character split in two.
type terminalWriter struct{ w io.Writer }

// newTerminalWriter wraps w, once.
func newTerminalWriter(w io.Writer) io.Writer {
	if w == nil {
		return nil
	}
	if _, ok := w.(*terminalWriter); ok {
		return w
	}
	return &terminalWriter{w: w}
}

func (t *terminalWriter) Write(p []byte) (int, error) {
	s := string(p)
	if !needsEscape(s, true) {
		return t.w.Write(p)
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size <= 1:
			// Not UTF-8: shown as the replacement character, as a JSON encoder would.
			b.WriteString(`\ufffd`)
		case r != '\n' && r != '\t' && unsafeRune(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	if _, err := io.WriteString(t.w, b.String()); err != nil {
		return 0, err
	}
	return len(p), nil
}
