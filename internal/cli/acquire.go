package cli

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	livev1alpha1 "github.com/vancetope/lease-operator/api/live/v1alpha1"
)

// errAcquireNeedsDryRun refuses `acquire` without --dry-run: a lease belongs to the workload
// that uses the resource, which checks it at every use and releases it; a command that ends
// at once could do neither.
var errAcquireNeedsDryRun = errors.New("kubectl lease acquire supports only --dry-run: a lease is held by the workload that uses the resource, which checks it at every use and releases it (docs/client.md); a command that exits could do neither")

// acquireJSON is the -o json answer of acquire --dry-run: lease for one LEASE (as it was
// before several could be asked for at once), leases for several; the status carries the
// parts of a grant and the full part of a busy answer.
type acquireJSON struct {
	DryRun    bool     `json:"dryRun"`
	Namespace string   `json:"namespace"`
	Lease     *string  `json:"lease,omitempty"`
	Leases    []string `json:"leases,omitempty"`
	Tenant    string   `json:"tenant"`
	Project   string   `json:"project"`
	User      string   `json:"user,omitempty"`
	livev1alpha1.LeaseAcquisitionReviewStatus
}

func newAcquireCommand(o *options) *cobra.Command {
	var (
		dryRun bool
		spec   livev1alpha1.LeaseAcquisitionReviewSpec
		out    outputFlag
	)
	c := &cobra.Command{
		Use:   "acquire LEASE [LEASE...] --dry-run --project PROJECT [--user USER] (-n NAMESPACE | --tenant TENANT)",
		Short: "Show what an acquisition of a lease would answer now (--dry-run only): granted, busy, NOOP or an error",
		Long: `Ask the manager what an acquisition of LEASE would answer now, for a tenant, project and
user, without acquiring: granted (with the levels it would book), busy (with the first full
level, its count and cap), NOOP (no lease applies) or an error (the definition cannot be
used). Nothing is booked and nothing waits: this is the admission API's dry run
(docs/api.md, "Dry run"), run by the manager as a LeaseAcquisitionReview of the live API.

Several LEASE names ask about one acquisition of all of them, granted together or not at
all (docs/api.md, "Several leases at once"): granted lists the levels of each lease, in the
order of their resources; busy names the first full lease in that order. A name twice, or
two leases that book the same resource, is refused as the acquisition would be.

The tenant is that of -n NAMESPACE (RBAC: create leaseacquisitionreviews there, which the
live-viewer role grants), or --tenant TENANT from the system namespace (the live-operator
role). Without either, the namespace of the kubeconfig's context.

Only --dry-run is supported: a lease is held by the workload that uses the resource.`,
		Example: `  kubectl lease acquire --dry-run -n acme --project thesis --user ann render
  kubectl lease acquire --dry-run --tenant acme --project thesis --user ann render -o json
  kubectl lease acquire --dry-run -n acme --project thesis --user ann gpu licence`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !dryRun {
				return errAcquireNeedsDryRun
			}
			if err := out.validate(); err != nil {
				return err
			}
			if spec.Project == "" {
				return &usageError{command: cmd.CommandPath(), err: errors.New("--project is required")}
			}
			// One name is the review of one lease, as before several could be asked for.
			if len(args) == 1 {
				spec.Lease = args[0]
			} else {
				spec.Leases = args
			}
			lc, err := o.live()
			if err != nil {
				return err
			}
			ctx, cancel := o.withTimeout(cmd.Context())
			defer cancel()
			ns, err := reviewNamespace(ctx, lc, spec.Tenant)
			if err != nil {
				return err
			}
			rev, err := lc.review(ctx, ns, spec)
			if err != nil {
				return err
			}
			res := acquireJSON{DryRun: true, Namespace: rev.Namespace, Leases: spec.Leases, Tenant: rev.Status.Tenant,
				Project: spec.Project, User: spec.User, LeaseAcquisitionReviewStatus: rev.Status}
			if spec.Leases == nil {
				res.Lease = &spec.Lease
			}
			if out.json() {
				return writeJSON(o.streams.Out, res)
			}
			return printReview(o, res)
		},
	}
	c.Flags().BoolVar(&dryRun, "dry-run", false, "show what an acquisition would answer now, without acquiring (required)")
	c.Flags().StringVar(&spec.Tenant, "tenant", "", "tenant to ask for (default: the tenant of -n NAMESPACE; without -n, asked in the system namespace)")
	c.Flags().StringVar(&spec.Project, "project", "", "project to ask for (required)")
	c.Flags().StringVar(&spec.User, "user", "", "user to ask for (required when the lease caps the user level)")
	c.Flags().StringVar(&spec.Type, "type", "", "lease type (optional: it selects only the revocation handler)")
	out.bind(c)
	return c
}

// reviewNamespace is where the review is created: -n, else the system namespace when a
// tenant is named, else the kubeconfig context's namespace.
func reviewNamespace(ctx context.Context, lc *liveClient, tenant string) (string, error) {
	switch {
	case lc.namespace != "":
		return lc.namespace, nil
	case tenant != "":
		return lc.systemNamespace(ctx), nil
	case lc.contextNamespace != "":
		return lc.contextNamespace, nil
	}
	return "", errors.New("name the tenant: -n NAMESPACE (a namespace of the tenant) or --tenant TENANT (asked in the system namespace)")
}

// review creates a LeaseAcquisitionReview in ns and returns the manager's answer.
func (c *liveClient) review(ctx context.Context, ns string, spec livev1alpha1.LeaseAcquisitionReviewSpec) (livev1alpha1.LeaseAcquisitionReview, error) {
	req := &livev1alpha1.LeaseAcquisitionReview{
		TypeMeta:   metav1.TypeMeta{APIVersion: livev1alpha1.GroupVersion.String(), Kind: "LeaseAcquisitionReview"},
		ObjectMeta: metav1.ObjectMeta{GenerateName: "kubectl-lease-"},
		Spec:       spec,
	}
	var out livev1alpha1.LeaseAcquisitionReview
	err := c.rc.Post().Namespace(ns).Resource(livev1alpha1.ResourceAcquisitionReviews).Body(req).Do(ctx).Into(&out)
	if err != nil {
		// -n is the namespace asked in: the generic hint to narrow it does not apply.
		op := "reviewing the acquisition in namespace " + ns
		if apierrors.IsForbidden(err) {
			return out, fmt.Errorf("%s: %w (RBAC: create leaseacquisitionreviews in %s; the live-viewer role grants it in a tenant's namespace)", op, err, ns)
		}
		return out, c.wrap(op, err)
	}
	return out, nil
}

// printReview writes a review's answer for people.
func printReview(o *options, r acquireJSON) error {
	p := newPrinter(o.streams.Out)
	who := "tenant " + r.Tenant + ", project " + r.Project
	if r.User != "" {
		who += ", user " + r.User
	}
	if r.Lease != nil {
		p.printf("Dry run of lease %s for %s (namespace %s); nothing was booked.\n", *r.Lease, who, r.Namespace)
	} else {
		p.printf("Dry run of leases %s together for %s (namespace %s); nothing was booked.\n", strings.Join(r.Leases, ", "), who, r.Namespace)
	}
	switch r.Outcome {
	case livev1alpha1.ReviewGranted:
		if r.Lease == nil {
			return printGrantedParts(p, r)
		}
		p.printf("GRANTED now: every capped level of resource %s has room.\n\n", r.Resource)
		var b strings.Builder
		t := newTable(&b, "LEVEL", "SCOPE", "CAP")
		for _, lv := range r.Levels {
			t.row(lv.Level, lv.Scope, strconv.FormatInt(lv.Cap, 10))
		}
		if err := t.flush(); err != nil {
			return err
		}
		p.print(b.String())
	case livev1alpha1.ReviewBusy:
		b := r.Busy
		if b == nil {
			b = &livev1alpha1.ReviewBusyLevel{}
		}
		if r.Lease != nil {
			p.printf("BUSY now: resource %s is full at level %s (scope %s): %d of %d in use.\n", r.Resource, b.Level, b.Scope, b.Count, b.Cap)
			p.println("An acquisition would wait for a slot (at most its definition's waitMs), then answer LEASE_BUSY.")
			break
		}
		p.printf("BUSY now: lease %s (resource %s) is full at level %s (scope %s): %d of %d in use.\n", b.Lease, r.Resource, b.Level, b.Scope, b.Count, b.Cap)
		p.println("An acquisition would wait for a slot there, booking none of the leases meanwhile (at most the shortest waitMs of their definitions), then answer LEASE_BUSY.")
	case livev1alpha1.ReviewNoOp:
		p.println("NOOP: no lease applies; an acquisition succeeds at once and books nothing.")
	default:
		p.printf("ERROR: %s\n", r.Message)
	}
	return p.done()
}

// printGrantedParts writes the grant of several leases: one table of every lease's levels,
// in the order of their resources, and the leases that book nothing.
func printGrantedParts(p *printer, r acquireJSON) error {
	resources := make([]string, len(r.Parts))
	booking := map[string]bool{}
	for i, pt := range r.Parts {
		resources[i] = pt.Resource
		booking[pt.Lease] = true
	}
	p.printf("GRANTED now: every capped level of resources %s has room; an acquisition would get all of the leases together.\n\n", strings.Join(resources, ", "))
	var b strings.Builder
	t := newTable(&b, "LEASE", "RESOURCE", "LEVEL", "SCOPE", "CAP")
	for _, pt := range r.Parts {
		for _, lv := range pt.Levels {
			t.row(pt.Lease, pt.Resource, lv.Level, lv.Scope, strconv.FormatInt(lv.Cap, 10))
		}
	}
	if err := t.flush(); err != nil {
		return err
	}
	p.print(b.String())
	for _, name := range r.Leases {
		if !booking[name] {
			p.printf("Lease %s caps no level: it books nothing.\n", name)
		}
	}
	return p.done()
}
