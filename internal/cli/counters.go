package cli

import (
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
)

// counterJSON is a counter in -o json.
type counterJSON struct {
	Key      string `json:"key"`
	Resource string `json:"resource"`
	Level    string `json:"level"`
	Scope    string `json:"scope"`
	Count    int    `json:"count"`
	// Booked is the number of the counter's entries whose holder exists.
	Booked int `json:"booked"`
	// Drift is count - booked: the entries of holders that are gone, which block slots
	// nobody holds until the repair removes them. 0 is no drift.
	Drift int `json:"drift"`
	// Holders are the public IDs of the holders the entries name; Gone those of them whose
	// holder no longer exists.
	Holders []string `json:"holders,omitempty"`
	Gone    []string `json:"gone,omitempty"`
	// Borrowed is the number of booking holders whose slot was granted above the cap
	// (docs/borrowing.md).
	Borrowed int `json:"borrowed"`
	// Waiting is the number of acquisitions waiting in the counter's line.
	Waiting   int       `json:"waiting"`
	UpdatedAt time.Time `json:"updatedAt,omitzero"`
}

func newCountersCommand(o *options) *cobra.Command {
	var (
		f     leasestore.CounterFilter
		level string
		force bool
		out   outputFlag
	)
	c := &cobra.Command{
		Use:   "counters",
		Short: "List the counters with the holders that book them, and drift",
		Long: `List the counters of the funnel from the live API: the tenant, project and user levels
appear in their tenant's namespaces, the global level in the system namespace only (-n
NAMESPACE, default every namespace you may list). --force reads MongoDB directly.

COUNT is the counter as the funnel sees it; BOOKED is the number of holders whose levels
contain the counter, the value reconcile corrects COUNT to. A difference (DRIFT, COUNT - BOOKED)
is not a display error: it is left by a crash between an increment and its holder update, or
between a holder's deletion and its decrement. Positive drift blocks slots nobody holds; negative drift lets the
cap be exceeded. The sweep's reconcile repairs counters unchanged for the safety margin
(default 60s); kubectl lease reconcile does it now. BORROWED is the number of booking holders
whose slot of a tenant counter was granted above its cap, from capacity other tenants left idle
(they are reclaimed first). WAITING is the number of acquisitions in the counter's line.
UPDATED is the time since the counter last changed.

--tenant shows the tenant's tenant, project and user counters; the global level belongs to no
tenant and is left out.`,
		Example: `  kubectl lease counters
  kubectl lease counters --resource tex2pdf --level global
  kubectl lease counters --tenant acme -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.validate(); err != nil {
				return err
			}
			if level != "" {
				l, err := parseLevel(level)
				if err != nil {
					return err
				}
				f.Level = l
			}
			ctx, r, done, err := o.openReader(cmd.Context(), force)
			if err != nil {
				return err
			}
			defer done()
			counters, err := r.counters(ctx, f)
			if err != nil {
				return err
			}
			if out.json() {
				views := make([]counterJSON, 0, len(counters))
				for _, c := range counters {
					views = append(views, counterJSON{
						Key: c.Key, Resource: c.Resource, Level: string(c.Level), Scope: c.Scope,
						Count: c.Count, Booked: c.Booked, Drift: c.Count - c.Booked, Holders: c.Holders, Gone: c.Gone,
						Borrowed: c.Borrowed, Waiting: c.Waiting, UpdatedAt: c.UpdatedAt.UTC(),
					})
				}
				return writeJSON(o.streams.Out, views)
			}
			if len(counters) == 0 {
				p := newPrinter(o.streams.ErrOut)
				p.printf("No counters found in %s.\n", r.where())
				return p.done()
			}
			now, err := r.now(ctx)
			if err != nil {
				return err
			}
			if err := renderCounters(o.streams.Out, now, counters); err != nil {
				return err
			}
			p := newPrinter(o.streams.ErrOut)
			if n := driftCount(counters); n > 0 {
				p.printf("\n%s entries of holders that are gone (COUNT != BOOKED): bookings that arrived after their holder's release. "+
					"The next refusal at the level or the sweep's reconcile removes them; `kubectl lease reconcile` does it now.\n",
					plural(n, "counter has", "counters have"))
			}
			return p.done()
		},
	}
	c.Flags().StringVar(&f.Resource, "resource", "", "only counters of this resource")
	c.Flags().StringVar(&f.Tenant, "tenant", "", "only the tenant, project and user counters of this tenant")
	c.Flags().StringVar(&level, "level", "", "only this level: user, project, tenant or global")
	c.Flags().BoolVar(&force, "force", false, "read MongoDB directly (--mongodb-uri), without the live API")
	_ = c.RegisterFlagCompletionFunc("level", // fails only for an unknown flag, bound just above
		cobra.FixedCompletions([]string{"user", "project", "tenant", "global"}, cobra.ShellCompDirectiveNoFileComp))
	out.bind(c)
	return c
}

func parseLevel(s string) (lease.Level, error) {
	for _, l := range lease.Levels {
		if string(l) == s {
			return l, nil
		}
	}
	return "", fmt.Errorf("--level %q: want user, project, tenant or global", s)
}

// renderCounters writes the counter table; now is the server's time.
func renderCounters(w io.Writer, now time.Time, counters []lease.Counter) error {
	t := newTable(w, "RESOURCE", "LEVEL", "SCOPE", "COUNT", "BOOKED", "DRIFT", "BORROWED", "WAITING", "UPDATED")
	for _, c := range counters {
		t.row(c.Resource, string(c.Level), c.Scope, strconv.Itoa(c.Count), strconv.Itoa(c.Booked), driftMarker(c),
			strconv.Itoa(c.Borrowed), strconv.Itoa(c.Waiting), age(now, c.UpdatedAt))
	}
	return t.flush()
}

// driftMarker is "-" without drift, otherwise COUNT - BOOKED with its sign: "+n" (n slots
// counted that no holder books) or "-n" (n booked slots not counted).
func driftMarker(c lease.Counter) string {
	if !c.Drift() {
		return "-"
	}
	return fmt.Sprintf("%+d", c.Count-c.Booked)
}

func driftCount(counters []lease.Counter) int {
	n := 0
	for _, c := range counters {
		if c.Drift() {
			n++
		}
	}
	return n
}
