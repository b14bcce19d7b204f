package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/opsview"
)

// holderJSON is a holder in -o json: the operator API's view plus the TTL.
type holderJSON struct {
	opsview.HolderView
	// TTLSeconds is the idle time after the last check after which the holder is reaped.
	TTLSeconds float64 `json:"ttlSeconds"`
}

func toHolderJSON(h lease.Holder) holderJSON {
	return holderJSON{HolderView: opsview.HolderViewOf(h), TTLSeconds: h.TTL.Seconds()}
}

func newListCommand(o *options) *cobra.Command {
	var (
		f        leasestore.HolderFilter
		force    bool
		watching bool
		out      outputFlag
	)
	c := &cobra.Command{
		Use:   "list",
		Short: "List lease holders of the namespaces you may see",
		Long: `List the lease holders, oldest first, from the live API: those of -n NAMESPACE, or of every
namespace RBAC lets you list (a holder appears in its tenant's namespaces). --force reads
MongoDB directly instead.

FENCE is the grant's fencing token (docs/fencing.md). AGE is the time since the acquisition,
IDLE the time since the last check (or payload update); a holder idle longer than its TTL is
reaped by the next sweep. A holder of several resources at once shows them joined by "+" in
RESOURCE (gpu+licence) and one fence per part in FENCE (12+7); --resource finds it by any
of them.`,
		Example: `  kubectl lease list
  kubectl lease list -w -n acme
  kubectl lease list --tenant acme --resource tex2pdf
  kubectl lease list --pod apps/brain-7d9f-x2 -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.validate(); err != nil {
				return err
			}
			if f.Pod != "" {
				if _, _, err := splitPod(f.Pod); err != nil {
					return fmt.Errorf("--pod: %w", err)
				}
			}
			if watching {
				if force {
					return &usageError{command: cmd.CommandPath(), err: errors.New("--watch follows the live API; it cannot read MongoDB directly (--force)")}
				}
				return watchHolders(cmd.Context(), o, f, out)
			}
			ctx, r, done, err := o.openReader(cmd.Context(), force)
			if err != nil {
				return err
			}
			defer done()
			holders, err := r.holders(ctx, f)
			if err != nil {
				return err
			}
			if out.json() {
				views := make([]holderJSON, 0, len(holders))
				for _, h := range holders {
					views = append(views, toHolderJSON(h))
				}
				return writeJSON(o.streams.Out, views)
			}
			if len(holders) == 0 {
				p := newPrinter(o.streams.ErrOut)
				p.printf("No lease holders found in %s%s.\n", r.where(), describeHolderFilter(f))
				return p.done()
			}
			now, err := r.now(ctx)
			if err != nil {
				return err
			}
			return renderHolders(o.streams.Out, now, holders)
		},
	}
	c.Flags().StringVar(&f.Tenant, "tenant", "", "only holders of this tenant")
	c.Flags().StringVar(&f.Resource, "resource", "", "only holders of this resource (counter key)")
	c.Flags().StringVar(&f.Type, "type", "", "only holders of this handler type (tex, mcp, notify, ...)")
	c.Flags().StringVar(&f.Pod, "pod", "", "only holders of this pod, NAMESPACE/NAME (any UID)")
	c.Flags().BoolVar(&force, "force", false, "read MongoDB directly (--mongodb-uri), without the live API")
	c.Flags().BoolVarP(&watching, "watch", "w", false, "after the list, print every change as it happens (ADDED, MODIFIED, DELETED) until interrupted; --timeout bounds the list only")
	out.bind(c)
	return c
}

func describeHolderFilter(f leasestore.HolderFilter) string {
	var parts []string
	for _, p := range []struct{ name, v string }{
		{"tenant", f.Tenant}, {"resource", f.Resource}, {"type", f.Type}, {"pod", f.Pod},
	} {
		if p.v != "" {
			parts = append(parts, p.name+" "+p.v)
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return " for " + strings.Join(parts, ", ")
}

// renderHolders writes the holder table; now is the server's time.
func renderHolders(w io.Writer, now time.Time, holders []lease.Holder) error {
	t := newTable(w, "ID", "TYPE", "RESOURCE", "TENANT", "PROJECT", "USER", "POD", "STATE", "FENCE", "AGE", "IDLE", "TTL")
	for _, h := range holders {
		t.row(holderCells(now, h)...)
	}
	return t.flush()
}

// holderCells are a holder's cells in the table's columns.
func holderCells(now time.Time, h lease.Holder) []string {
	state := stateOf(now, h)
	if h.Borrowed { // docs/borrowing.md
		state += ",BORROWED"
	}
	return []string{h.ID, h.Type, h.Resources(), h.Tenant, h.Project, h.User, h.Pod.String(), state, fenceOf(h),
		age(now, h.AcquiredAt), age(now, h.LastSeenAt), shortDuration(h.TTL)}
}

// fenceOf is the holder's fence, "-" before its grant; for a holder of several resources one
// per part, joined by "+" in the order of its resources (3+7). The parts take their fences
// together, at the grant.
func fenceOf(h lease.Holder) string {
	if len(h.Parts) == 0 || h.Fence == 0 {
		return fenceText(h.Fence)
	}
	fences := make([]string, len(h.Parts))
	for i, p := range h.Parts {
		fences[i] = fenceText(p.Fence)
	}
	return strings.Join(fences, "+")
}

func fenceText(fence int64) string {
	if fence == 0 {
		return "-"
	}
	return strconv.FormatInt(fence, 10)
}

// countersOf reads the counters of the holder's resources: its resource's, or each part's.
func countersOf(ctx context.Context, r reader, h lease.Holder) ([]lease.Counter, error) {
	resources := []string{h.Resource}
	if len(h.Parts) > 0 {
		resources = resources[:0]
		for _, p := range h.Parts {
			resources = append(resources, p.Resource)
		}
	}
	var out []lease.Counter
	for _, res := range resources {
		cs, err := r.counters(ctx, leasestore.CounterFilter{Resource: res})
		if err != nil {
			return nil, err
		}
		out = append(out, cs...)
	}
	return out, nil
}

// stateOf is the stored state, marked when the holder is idle past its TTL (the next sweep
// reaps it).
func stateOf(now time.Time, h lease.Holder) string {
	s := string(h.State)
	if !h.LastSeenAt.IsZero() && h.LastSeenAt.Add(h.TTL).Before(now) {
		s += ",IDLE-EXPIRED"
	}
	return s
}

func newShowCommand(o *options) *cobra.Command {
	var (
		force bool
		out   outputFlag
	)
	c := &cobra.Command{
		Use:   "show ID",
		Short: "Show every field of one lease holder, with the counters it books",
		Long: `Show every field of one lease holder, with the counters it books. ID is the holder's public
ID as kubectl lease list shows it; a token (which only its holder should have) is turned into
its ID on this machine and is never sent.`,
		Example: `  kubectl lease show lh-5d0c3e1f9a2b4c6d7e8f9a0b
  kubectl lease show lh-5d0c3e1f9a2b4c6d7e8f9a0b -o json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := out.validate(); err != nil {
				return err
			}
			id, err := holderIDArg(args[0])
			if err != nil {
				return err
			}
			ctx, r, done, err := o.openReader(cmd.Context(), force)
			if err != nil {
				return err
			}
			defer done()
			h, err := r.holder(ctx, id)
			if err != nil {
				return err
			}
			if out.json() {
				return writeJSON(o.streams.Out, toHolderJSON(h))
			}
			now, err := r.now(ctx)
			if err != nil {
				return err
			}
			counters, err := countersOf(ctx, r, h)
			if err != nil {
				return err
			}
			return renderHolder(o.streams.Out, now, h, counters)
		},
	}
	c.Flags().BoolVar(&force, "force", false, "read MongoDB directly (--mongodb-uri), without the live API")
	out.bind(c)
	return c
}

// renderHolder writes one holder, describe-style; counters are those of its resources.
func renderHolder(w io.Writer, now time.Time, h lease.Holder, counters []lease.Counter) error {
	p := newPrinter(w)
	field := func(name, value string) {
		if value == "" {
			value = "<none>"
		}
		p.printf("%-12s %s\n", name+":", escapeField(value))
	}
	field("ID", h.ID)
	field("State", stateOf(now, h))
	field("Fence", fenceOf(h))
	field("Lease", h.LeaseNames())
	field("Resource", h.Resources())
	if len(h.Parts) > 0 {
		parts := make([]string, len(h.Parts))
		for i, pt := range h.Parts {
			parts[i] = fmt.Sprintf("%s (lease %s, fence %s)", pt.Resource, pt.LeaseName, fenceText(pt.Fence))
		}
		field("Parts", strings.Join(parts, ", "))
	}
	field("Type", h.Type)
	field("Tenant", h.Tenant)
	field("Project", h.Project)
	field("User", h.User)
	field("Holder ref", h.HolderRef)
	pod := h.Pod.String()
	if pod != "" && h.Pod.UID != "" {
		pod += " (uid " + h.Pod.UID + ")"
	}
	field("Pod", pod)
	field("Pod bound", strconv.FormatBool(h.PodBound))
	field("TTL", shortDuration(h.TTL))
	field("Acquired", fmt.Sprintf("%s (%s ago)", timestamp(h.AcquiredAt), age(now, h.AcquiredAt)))
	lastSeen := fmt.Sprintf("%s (idle %s)", timestamp(h.LastSeenAt), age(now, h.LastSeenAt))
	if !h.LastSeenAt.IsZero() {
		if reapAt := h.LastSeenAt.Add(h.TTL); reapAt.Before(now) {
			lastSeen += "; idle past its TTL: the next sweep reaps it"
		} else {
			lastSeen += "; reapable after " + timestamp(reapAt)
		}
	}
	field("Last seen", lastSeen)

	p.println("Levels:")
	if len(h.Levels) == 0 {
		p.println("  <none>")
	} else {
		byKey := make(map[string]lease.Counter, len(counters))
		for _, c := range counters {
			byKey[c.Key] = c
		}
		var tb strings.Builder
		missing := false
		t := newTable(&tb, "LEVEL", "SCOPE", "COUNTER", "COUNT", "BOOKED", "DRIFT")
		for _, key := range h.Levels {
			c, ok := byKey[key]
			if !ok {
				missing = true
				t.row(levelOf(key), scopeOf(key), key, "?", "?", "missing")
				continue
			}
			t.row(string(c.Level), c.Scope, key, strconv.Itoa(c.Count), strconv.Itoa(c.Booked), driftMarker(c))
		}
		if err := t.flush(); err != nil {
			return err
		}
		p.print(indented(tb.String()))
		if missing {
			p.println("  (a booked counter is missing, which the funnel never leaves; reconcile recreates it)")
		}
	}
	if h.State == lease.StatePending {
		p.println("  (PENDING: the acquisition is booking its levels, or crashed while doing so)")
	}

	p.println("Payload:")
	if len(h.Payload) == 0 {
		p.println("  <none>")
	}
	for _, k := range slices.Sorted(maps.Keys(h.Payload)) {
		p.printf("  %s: %s\n", escapeField(k), escapeField(h.Payload[k]))
	}
	return p.done()
}

// indented prefixes every line of s with two spaces.
func indented(s string) string {
	var b strings.Builder
	for _, l := range strings.SplitAfter(s, "\n") {
		if l != "" {
			b.WriteString("  " + l)
		}
	}
	return b.String()
}

// levelOf and scopeOf split a counter key <resource>|<level>|<scope>.
func levelOf(key string) string {
	parts := strings.Split(key, "|")
	if len(parts) < 3 {
		return "?"
	}
	return parts[len(parts)-2]
}

func scopeOf(key string) string {
	parts := strings.Split(key, "|")
	return parts[len(parts)-1]
}

// splitPod parses NAMESPACE/NAME.
func splitPod(s string) (namespace, name string, err error) {
	namespace, name, ok := strings.Cut(s, "/")
	if !ok || namespace == "" || name == "" || strings.Contains(name, "/") {
		return "", "", fmt.Errorf("%q is not NAMESPACE/NAME", s)
	}
	return namespace, name, nil
}

// tokenLen is the length of a holder token: 128 random bits in lowercase hex.
const tokenLen = 32

// holderIDArg reads the holder argument of show and revoke: a public holder ID as list
// shows it, or a token, which is turned into its ID here, so that it never leaves this
// machine (docs/live-api.md, "Holder IDs").
func holderIDArg(arg string) (string, error) {
	if lease.ValidHolderID(arg) {
		return arg, nil
	}
	if len(arg) == tokenLen && strings.IndexFunc(arg, func(r rune) bool {
		return (r < '0' || r > '9') && (r < 'a' || r > 'f')
	}) < 0 {
		return lease.HolderID(arg), nil
	}
	return "", fmt.Errorf("%q is not a holder ID (want %s and 24 lowercase hex digits, as kubectl lease list shows them)",
		lease.Clip(arg, 64), lease.HolderIDPrefix)
}
