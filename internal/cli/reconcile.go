package cli

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	livev1alpha1 "github.com/vancetope/lease-operator/api/live/v1alpha1"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/opsview"
)

func newSweepCommand(o *options) *cobra.Command {
	var out outputFlag
	c := &cobra.Command{
		Use:   "sweep",
		Short: "Run a reaper round now on the manager (idle reap, pod-dead reap, reconcile), with handlers",
		Long: `Run one reaper round now on the manager: reap idle holders, reap the holders of dead pods,
reconcile the counters. Reaped holders go to their handlers as in every scheduled sweep. This
needs the manager: only it knows which pods are alive and runs the handlers (RBAC: create sweeps
in the system namespace).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.validate(); err != nil {
				return err
			}
			lc, err := o.live()
			if err != nil {
				return err
			}
			ctx, cancel := o.withTimeout(cmd.Context())
			defer cancel()
			var sw livev1alpha1.Sweep
			req := &livev1alpha1.Sweep{
				TypeMeta:   metav1.TypeMeta{APIVersion: livev1alpha1.GroupVersion.String(), Kind: "Sweep"},
				ObjectMeta: metav1.ObjectMeta{GenerateName: "kubectl-lease-"},
			}
			if err := lc.create(ctx, livev1alpha1.ResourceSweeps, req, &sw); err != nil {
				return err
			}
			res := opsview.SweepView{Idle: int(sw.Result.Idle), Pod: int(sw.Result.Pod), Reconcile: reconcileViewOf(sw.Result.Reconcile)}
			if out.json() {
				return writeJSON(o.streams.Out, res)
			}
			p := newPrinter(o.streams.Out)
			p.printf("Sweep on the manager (through %s): reaped %s idle and %s of dead pods; their handlers are dispatched.\n",
				lc.host, plural(res.Idle, "holder", "holders"), plural(res.Pod, "holder", "holders"))
			printReconcile(p, "  reconcile:", res.Reconcile)
			return p.done()
		},
	}
	out.bind(c)
	return c
}

// reconcileJSON is the -o json answer of reconcile.
type reconcileJSON struct {
	opsview.ReconcileView
	Via string `json:"via"`
}

func newReconcileCommand(o *options) *cobra.Command {
	var (
		safety, confirm time.Duration
		force           bool
		out             outputFlag
	)
	c := &cobra.Command{
		Use:   "reconcile",
		Short: "Correct counter drift now (on the manager; --force directly in MongoDB)",
		Long: `Recompute every counter from the holders that book it and correct the drift left by crash
windows; counters that no holder books are deleted. Only counters unchanged for the safety margin
are touched, each by a compare-and-set, so concurrent acquisitions and releases win.

A counter above what its holders book is lowered only when two passes, --reconcile-confirm
apart, see the same excess: a release deletes its holder before it decrements, and a single look
between the two would return the slot twice. The direct run therefore takes a second pass when
the first one found such counters.

By default this runs on the manager through the live API, with the manager's own safety margin
(RBAC: create reconciles in the system namespace). --force runs it directly in MongoDB
(--mongodb-uri) with the margins below; it needs no manager and runs no handler.`,
		Example: `  kubectl lease reconcile
  kubectl lease reconcile --reconcile-safety 2m -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.validate(); err != nil {
				return err
			}
			if safety < 0 {
				return fmt.Errorf("--reconcile-safety must not be negative")
			}
			if confirm < leasestore.MinReconcileConfirm {
				return fmt.Errorf("--reconcile-confirm %s: must be at least %s, the time a release's decrement may still be in flight on the manager or an agent; a shorter wait could return its slot twice",
					confirm, leasestore.MinReconcileConfirm)
			}
			ctx, cancel := o.withTimeout(cmd.Context())
			defer cancel()

			if !force {
				if cmd.Flags().Changed("reconcile-safety") || cmd.Flags().Changed("reconcile-confirm") {
					warn := newPrinter(o.streams.ErrOut)
					warn.println("Warning: --reconcile-safety and --reconcile-confirm apply to the direct reconcile (--force); the manager uses its own settings.")
					if err := warn.done(); err != nil {
						return err
					}
				}
				lc, err := o.live()
				if err != nil {
					return err
				}
				var rec livev1alpha1.Reconcile
				req := &livev1alpha1.Reconcile{
					TypeMeta:   metav1.TypeMeta{APIVersion: livev1alpha1.GroupVersion.String(), Kind: "Reconcile"},
					ObjectMeta: metav1.ObjectMeta{GenerateName: "kubectl-lease-"},
				}
				if err := lc.create(ctx, livev1alpha1.ResourceReconciles, req, &rec); err != nil {
					return err
				}
				res := reconcileViewOf(rec.Result)
				if out.json() {
					return writeJSON(o.streams.Out, reconcileJSON{ReconcileView: res, Via: viaManager})
				}
				p := newPrinter(o.streams.Out)
				p.printf("Reconciled the counters on the manager (through %s):\n", lc.host)
				printReconcile(p, " ", res)
				return p.done()
			}

			if safety < 10*time.Second {
				warn := newPrinter(o.streams.ErrOut)
				warn.printf("Warning: a safety margin of %s may correct the counters of acquisitions and releases still in flight; the next reconcile repairs that.\n", safety)
				if err := warn.done(); err != nil {
					return err
				}
			}
			s, err := o.openStore(leasestore.WithSafetyMargin(safety), leasestore.WithReconcileConfirm(confirm))
			if err != nil {
				return err
			}
			defer s.close()
			res, err := reconcileDirect(ctx, s, safety, confirm, o.streams.ErrOut)
			if err != nil {
				return err
			}
			if out.json() {
				return writeJSON(o.streams.Out, reconcileJSON{ReconcileView: res, Via: viaStore})
			}
			p := newPrinter(o.streams.Out)
			p.printf("Reconciled the counters directly in MongoDB (database %s; no manager, no handler involved; safety margin %s):\n", s.db, safety)
			printReconcile(p, " ", res)
			return p.done()
		},
	}
	c.Flags().BoolVar(&force, "force", false, "reconcile directly in MongoDB (--mongodb-uri), without the manager")
	c.Flags().DurationVar(&safety, "reconcile-safety", leasestore.DefaultSafetyMargin,
		"touch only counters unchanged this long (direct reconcile; the manager's default is the same)")
	c.Flags().DurationVar(&confirm, "reconcile-confirm", 2*leasestore.DefaultOpTimeout,
		"direct reconcile: wait between the two passes that must see the same excess before a counter is lowered (longer than a decrement in flight on the manager may take)")
	out.bind(c)
	return c
}

// confirmSlack is added to the wait between the passes: the store measures it on the server's
// clock, which need not tick in step with this machine's.
const confirmSlack = 100 * time.Millisecond

// reconcileDirect runs the store's reconcile, and when counters above their booked holders
// (older than the safety margin) are left, waits confirm and runs the confirming pass that
// lowers them. progress gets a note before the wait.
func reconcileDirect(ctx context.Context, s *store, safety, confirm time.Duration, progress io.Writer) (opsview.ReconcileView, error) {
	first, err := s.Reconcile(ctx)
	if err != nil {
		return opsview.ReconcileView{}, s.wrap("reconciling", err)
	}
	res := opsview.ReconcileView{Corrected: first.Corrected, Deleted: first.Deleted, Created: first.Created, Skipped: first.Skipped, Unmarked: first.Unmarked}
	if first.Skipped == 0 {
		return res, nil
	}
	pending, err := pendingLowerings(ctx, s, safety)
	if err != nil {
		return res, err
	}
	if pending == 0 {
		return res, nil
	}
	note := newPrinter(progress)
	note.printf("Confirming %s above their booked holders: second pass in %s ...\n",
		plural(pending, "counter", "counters"), confirm)
	if err := note.done(); err != nil {
		return res, err
	}
	select {
	case <-ctx.Done():
		return res, fmt.Errorf("waiting for the confirming reconcile pass: %w (the first pass is done: %+v)", ctx.Err(), res)
	case <-time.After(confirm + confirmSlack):
	}
	second, err := s.Reconcile(ctx)
	if err != nil {
		return res, s.wrap("reconciling (confirming pass)", err)
	}
	res.Corrected += second.Corrected
	res.Deleted += second.Deleted
	res.Created += second.Created
	res.Unmarked += second.Unmarked
	res.Skipped = second.Skipped
	return res, nil
}

// pendingLowerings counts the counters above their booked holders that are older than the
// safety margin: those a confirming pass may lower.
func pendingLowerings(ctx context.Context, s *store, safety time.Duration) (int, error) {
	now, err := s.ServerTime(ctx)
	if err != nil {
		return 0, s.wrap("reading the server time", err)
	}
	counters, err := s.ListCounters(ctx, leasestore.CounterFilter{})
	if err != nil {
		return 0, s.wrap("reading the counters", err)
	}
	n := 0
	for _, c := range counters {
		if c.Count > c.Booked && c.UpdatedAt.Before(now.Add(-safety)) {
			n++
		}
	}
	return n, nil
}

func printReconcile(p *printer, prefix string, r opsview.ReconcileView) {
	p.printf("%s %d corrected, %d recreated, %d deleted (no holder books them), %d skipped\n",
		prefix, r.Corrected, r.Created, r.Deleted, r.Skipped)
	if r.Unmarked > 0 {
		p.printf("%s %s: their tenants are back within their caps\n",
			prefix, plural(r.Unmarked, "borrowed mark dropped", "borrowed marks dropped"))
	}
	if r.Skipped > 0 {
		p.printf("%s %s: changed within the safety margin or while being read, or a lowering awaiting confirmation; run again later\n",
			prefix, plural(r.Skipped, "counter to correct or delete was left alone", "counters to correct or delete were left alone"))
	}
}

func reconcileViewOf(r livev1alpha1.ReconcileResult) opsview.ReconcileView {
	return opsview.ReconcileView{Corrected: int(r.Corrected), Deleted: int(r.Deleted), Created: int(r.Created), Skipped: int(r.Skipped), Unmarked: int(r.Unmarked)}
}
