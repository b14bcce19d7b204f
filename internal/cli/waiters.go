package cli

import (
	"cmp"
	"context"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	livev1alpha1 "github.com/vancetope/lease-operator/api/live/v1alpha1"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/opsview"
)

// waiterJSON is a waiter in -o json.
type waiterJSON struct {
	ID        string `json:"id"`
	Resource  string `json:"resource"`
	Lease     string `json:"lease"`
	Tenant    string `json:"tenant"`
	Project   string `json:"project"`
	User      string `json:"user,omitempty"`
	Pod       string `json:"pod,omitempty"`
	HolderRef string `json:"holderRef,omitempty"`
	// Parts are the resources of an acquisition of several, in their order (resource and
	// lease join them by "+"); absent for one.
	Parts []opsview.PartView `json:"parts,omitempty"`
	// WaitsOn is, for an acquisition of several resources, the part it waits on: the parts
	// before it are booked. Level, scope and position are those of its line.
	WaitsOn *opsview.PartView `json:"waitsOn,omitempty"`
	Level   string            `json:"level"`
	Scope   string            `json:"scope"`
	Cap     int               `json:"cap,omitempty"`
	// Priority is its priority (docs/waiting.md, "Priority"); absent is 0.
	Priority int `json:"priority,omitempty"`
	// Position is the number of live waiters ahead in the line, of every tenant.
	Position int `json:"position"`
	// EstimatedWaitMs is absent without an estimate.
	EstimatedWaitMs int64     `json:"estimatedWaitMs,omitempty"`
	Since           time.Time `json:"since,omitzero"`
	Lapsed          bool      `json:"lapsed,omitempty"`
}

func newWaitersCommand(o *options) *cobra.Command {
	var (
		f     leasestore.HolderFilter
		force bool
		out   outputFlag
	)
	c := &cobra.Command{
		Use:   "waiters",
		Short: "List the acquisitions waiting for a slot, with their place in line",
		Long: `List the acquisitions waiting in the line of a full level, highest priority first and oldest
first within a priority, from the live API
(leasewaiters): those of -n NAMESPACE, or of every namespace RBAC lets you list (a waiter
appears in its tenant's namespaces). --force reads MongoDB directly instead.

LEVEL and SCOPE are the full level it waits at. PRIORITY is its priority (docs/waiting.md,
"Priority"). POSITION is the number of live waiters ahead of it in that line, of every tenant
(others are counted, never named): those of a higher priority, then the older ones of its own. EST-WAIT estimates the
wait from the resource's recent hold times (docs/waiting.md, "Who waits"); <unknown> before
the resource has handed a slot over. It is an estimate, not a promise. WAITING is the time
since it lined up; LAPSED marks a place its process stopped renewing. An acquisition of
several resources holds the parts before the one it waits on: RESOURCE names that part and
the set, "licence (of gpu+licence)".`,
		Example: `  kubectl lease waiters
  kubectl lease waiters -n acme --resource tex2pdf
  kubectl lease waiters -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.validate(); err != nil {
				return err
			}
			ctx, r, done, err := o.openReader(cmd.Context(), force)
			if err != nil {
				return err
			}
			defer done()
			ws, err := r.waiters(ctx, f)
			if err != nil {
				return err
			}
			if out.json() {
				views := make([]waiterJSON, 0, len(ws))
				for _, w := range ws {
					views = append(views, toWaiterJSON(w))
				}
				return writeJSON(o.streams.Out, views)
			}
			if len(ws) == 0 {
				p := newPrinter(o.streams.ErrOut)
				p.printf("No acquisitions wait in %s%s.\n", r.where(), describeHolderFilter(f))
				return p.done()
			}
			now, err := r.now(ctx)
			if err != nil {
				return err
			}
			return renderWaiters(o.streams.Out, now, ws)
		},
	}
	c.Flags().StringVar(&f.Resource, "resource", "", "only waiters for this resource")
	c.Flags().StringVar(&f.Tenant, "tenant", "", "only waiters of this tenant")
	c.Flags().StringVar(&f.Project, "project", "", "only waiters of this project")
	c.Flags().StringVar(&f.User, "user", "", "only waiters of this user")
	c.Flags().BoolVar(&force, "force", false, "read MongoDB directly (--mongodb-uri), without the live API")
	out.bind(c)
	return c
}

func toWaiterJSON(w lease.Waiter) waiterJSON {
	out := waiterJSON{
		ID: w.Holder.ID, Resource: w.Holder.Resources(), Lease: w.Holder.LeaseNames(), Tenant: w.Holder.Tenant,
		Project: w.Holder.Project, User: w.Holder.User, Pod: w.Holder.Pod.String(), HolderRef: w.Holder.HolderRef,
		Parts: opsview.HolderViewOf(w.Holder).Parts,
		Level: string(w.Level), Scope: w.Scope, Cap: w.Cap, Priority: w.Priority, Position: w.Position,
		EstimatedWaitMs: w.EstimatedWait.Milliseconds(), Since: w.Since.UTC(), Lapsed: w.Lapsed,
	}
	if len(w.Holder.Parts) > 0 {
		out.WaitsOn = &opsview.PartView{Lease: w.Lease, Resource: w.Resource}
	}
	return out
}

// waitsOn is the RESOURCE of a waiter: its resource, or for an acquisition of several the
// part it waits on and all of them, "licence (of gpu+licence)".
func waitsOn(w lease.Waiter) string {
	if len(w.Holder.Parts) == 0 || w.Resource == "" {
		return w.Holder.Resources()
	}
	return w.Resource + " (of " + w.Holder.Resources() + ")"
}

// renderWaiters writes the waiter table; now is the server's time.
func renderWaiters(w io.Writer, now time.Time, ws []lease.Waiter) error {
	t := newTable(w, "ID", "RESOURCE", "TENANT", "PROJECT", "USER", "POD", "LEVEL", "SCOPE", "PRIORITY", "POSITION", "EST-WAIT", "WAITING")
	for _, x := range ws {
		est := "<unknown>"
		if x.EstimatedWait > 0 {
			est = x.EstimatedWait.Round(time.Millisecond).String()
		}
		waiting := age(now, x.Since)
		if x.Lapsed {
			waiting += " (lapsed)"
		}
		t.row(x.Holder.ID, waitsOn(x), x.Holder.Tenant, x.Holder.Project, orDash(x.Holder.User), orDash(x.Holder.Pod.String()),
			string(x.Level), x.Scope, strconv.Itoa(x.Priority), strconv.Itoa(x.Position), est, waiting)
	}
	return t.flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// listWaiters reads the waiters matching f in the client's namespace.
func (c *liveClient) listWaiters(ctx context.Context, f leasestore.HolderFilter) ([]lease.Waiter, error) {
	labelSel, fieldSel := holderSelectors(f)
	opts := metav1.ListOptions{LabelSelector: labelSel, FieldSelector: fieldSel}
	var list livev1alpha1.LeaseWaiterList
	get := func() error {
		return c.rc.Get().Namespace(c.namespace).Resource(livev1alpha1.ResourceWaiters).
			VersionedParams(&opts, liveParams).Do(ctx).Into(&list)
	}
	err := get()
	if err != nil && c.narrowOnForbidden(err) {
		err = get()
	}
	if err != nil {
		return nil, c.wrap("listing waiters", err)
	}
	seen := map[string]bool{}
	var out []lease.Waiter
	for _, o := range list.Items {
		if seen[o.Name] { // a waiter appears once per namespace of its tenant
			continue
		}
		seen[o.Name] = true
		ns, name, _ := strings.Cut(o.Spec.Pod, "/")
		h := lease.Holder{ID: o.Name, State: lease.StateWaiting, LeaseName: o.Spec.Lease, Resource: o.Spec.Resource,
			Type: o.Spec.Type, Tenant: o.Spec.Tenant, Project: o.Spec.Project, User: o.Spec.User, HolderRef: o.Spec.HolderRef,
			Pod: lease.PodRef{Namespace: ns, Name: name, UID: o.Spec.PodUID}}
		setParts(&h, o.Spec.Parts, nil)
		out = append(out, lease.Waiter{
			Holder: h, Resource: cmp.Or(o.Status.Resource, h.Resource), Lease: cmp.Or(o.Status.Lease, h.LeaseName),
			Key: o.Status.Key, Level: lease.Level(o.Status.Level), Scope: o.Status.Scope, Cap: int(o.Status.Cap),
			Since: o.Status.Since.Time, Priority: int(o.Status.Priority), Position: int(o.Status.Position), Lapsed: o.Status.Lapsed,
			EstimatedWait: time.Duration(o.Status.EstimatedWaitMs) * time.Millisecond,
		})
	}
	return out, nil
}
