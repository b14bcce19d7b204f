package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/duration"
)

// Output formats of -o.
const (
	outputTable = "table"
	outputJSON  = "json"
)

// outputFlag is -o/--output of one command.
type outputFlag struct{ format string }

func (f *outputFlag) bind(c *cobra.Command) {
	c.Flags().StringVarP(&f.format, "output", "o", outputTable, "output format: table or json")
	_ = c.RegisterFlagCompletionFunc("output", // fails only for an unknown flag, bound just above
		cobra.FixedCompletions([]string{outputTable, outputJSON}, cobra.ShellCompDirectiveNoFileComp))
}

func (f *outputFlag) validate() error {
	switch f.format {
	case outputTable, outputJSON:
		return nil
	}
	return fmt.Errorf("--output %q: want table or json", f.format)
}

func (f *outputFlag) json() bool { return f.format == outputJSON }

// writeJSON writes v as indented JSON.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("writing JSON: %w", err)
	}
	return nil
}

// printer writes to w and keeps the first write error, so that a rendering checks it once,
// at its end (the errWriter pattern).
type printer struct {
	w   io.Writer
	err error
}

func newPrinter(w io.Writer) *printer { return &printer{w: w} }

func (p *printer) printf(format string, args ...any) {
	if p.err == nil {
		_, p.err = fmt.Fprintf(p.w, format, args...)
	}
}

func (p *printer) println(args ...any) {
	if p.err == nil {
		_, p.err = fmt.Fprintln(p.w, args...)
	}
}

func (p *printer) print(s string) {
	if p.err == nil {
		_, p.err = io.WriteString(p.w, s)
	}
}

// done returns the first write error, wrapped.
func (p *printer) done() error {
	if p.err != nil {
		return fmt.Errorf("writing output: %w", p.err)
	}
	return nil
}

// table writes aligned columns as kubectl does.
type table struct {
	tw  *tabwriter.Writer
	err error
}

func newTable(w io.Writer, header ...string) *table {
	t := &table{tw: tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)}
	t.row(header...)
	return t
}

// row writes one row; every cell is escaped (escapeField), so that no value can act on the
// terminal or forge a row or a column.
func (t *table) row(cells ...string) {
	for i, c := range cells {
		if c == "" {
			cells[i] = "<none>"
		} else {
			cells[i] = escapeField(c)
		}
	}
	if t.err == nil {
		_, t.err = fmt.Fprintln(t.tw, strings.Join(cells, "\t"))
	}
}

func (t *table) flush() error {
	err := t.err
	if ferr := t.tw.Flush(); err == nil {
		err = ferr
	}
	if err != nil {
		return fmt.Errorf("writing table: %w", err)
	}
	return nil
}

// age renders the time from then to now as kubectl does ("5m10s", "3d"); "<unknown>" for a
// zero time.
func age(now, then time.Time) string {
	if then.IsZero() {
		return "<unknown>"
	}
	return duration.HumanDuration(now.Sub(then))
}

// shortDuration renders a configured duration exactly, without zero units: 1h, 2m, 1h30m, 90s
// is 1m30s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// timestamp renders a time in UTC, RFC 3339.
func timestamp(t time.Time) string {
	if t.IsZero() {
		return "<unknown>"
	}
	return t.UTC().Format(time.RFC3339)
}

// plural returns "1 holder" or "2 holders".
func plural(n int, one, many string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, one)
	}
	return fmt.Sprintf("%d %s", n, many)
}
