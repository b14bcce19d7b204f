package cli

import (
	"fmt"
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
		safety time.Duration
		force  bool
		out    outputFlag
	)
	c := &cobra.Command{
		Use:   "reconcile",
		Short: "Correct counter drift now (on the manager; --force directly in MongoDB)",
		Long: `Repair every counter: remove the entries that name a holder that is gone (a write that
arrived after its holder was released), and delete the counters nobody has booked for the safety
margin. Every write is conditional on what was read, so concurrent acquisitions and releases win.

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
			ctx, cancel := o.withTimeout(cmd.Context())
			defer cancel()

			if !force {
				if cmd.Flags().Changed("reconcile-safety") {
					warn := newPrinter(o.streams.ErrOut)
					warn.println("Warning: --reconcile-safety applies to the direct reconcile (--force); the manager uses its own setting.")
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

			s, err := o.openStore(leasestore.WithSafetyMargin(safety))
			if err != nil {
				return err
			}
			defer s.close()
			r, err := s.Reconcile(ctx)
			if err != nil {
				return s.wrap("reconciling", err)
			}
			res := opsview.ReconcileView{Corrected: r.Corrected, Deleted: r.Deleted, Repaired: r.Repaired, Skipped: r.Skipped, Unmarked: r.Unmarked}
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
		"delete only counters nobody has booked this long (direct reconcile; the manager's default is the same)")
	out.bind(c)
	return c
}

func printReconcile(p *printer, prefix string, r opsview.ReconcileView) {
	p.printf("%s %d corrected (%s), %d deleted (nobody books them), %d skipped\n",
		prefix, r.Corrected, plural(r.Repaired, "entry of a gone holder removed", "entries of gone holders removed"), r.Deleted, r.Skipped)
	if r.Unmarked > 0 {
		p.printf("%s %s: their tenants are back within their caps\n",
			prefix, plural(r.Unmarked, "borrowed mark dropped", "borrowed marks dropped"))
	}
	if r.Skipped > 0 {
		p.printf("%s %s: changed while being read; run again later\n",
			prefix, plural(r.Skipped, "counter to correct or delete was left alone", "counters to correct or delete were left alone"))
	}
}

func reconcileViewOf(r livev1alpha1.ReconcileResult) opsview.ReconcileView {
	return opsview.ReconcileView{Corrected: int(r.Corrected), Deleted: int(r.Deleted), Repaired: int(r.Repaired), Skipped: int(r.Skipped), Unmarked: int(r.Unmarked)}
}
