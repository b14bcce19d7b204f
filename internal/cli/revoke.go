package cli

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	livev1alpha1 "github.com/vancetope/lease-operator/api/live/v1alpha1"
	"github.com/vancetope/lease-operator/internal/opsview"
)

// How a revocation was carried out (the "via" of -o json).
const (
	viaManager = "manager"
	viaStore   = "store"
)

// Handler notes of the outputs.
const (
	// noHandlerNote is what a forced revocation leaves undone (docs/operations.md, "Revocation").
	noHandlerNote = "No handler ran (--force bypasses the manager): the slot is free; the holder fails at its next check (LEASE_LOST); " +
		"a resource in a foreign system (such as the remote MCP session of a dead pod) is left to its own expiry."
	managerHandlerNote = "The manager runs each holder's type handler through its dispatcher (reason revoke, as a reap); " +
		"the holder gets LEASE_LOST at its next check."
)

// revokeJSON is the -o json answer of revoke.
type revokeJSON struct {
	opsview.RevokeResult
	Via string `json:"via"`
	// Handlers says whether the type's handler was dispatched.
	Handlers string `json:"handlers"`
}

// revokePodJSON is the -o json answer of revoke-pod.
type revokePodJSON struct {
	opsview.RevokePodResult
	Via      string `json:"via"`
	Handlers string `json:"handlers"`
}

func newRevokeCommand(o *options) *cobra.Command {
	var (
		tenant string
		force  bool
		out    outputFlag
	)
	c := &cobra.Command{
		Use:   "revoke ID",
		Short: "Revoke one lease holder (through the manager, which runs its handler)",
		Long: `Revoke one lease holder. A revocation is a reap on the operator's decision, not a release:
the holder is deleted, its levels are returned, and the manager runs the type's handler through
its dispatcher, exactly as for a sweep. The holder gets LEASE_LOST at its next check.

ID is the holder's public ID as kubectl lease list shows it; a token is turned into its ID on
this machine and is never sent. With --tenant only a holder of that tenant is revoked (the
binding is in the delete filter).

--force revokes directly in MongoDB, for when no manager is reachable. Then no handler runs: the
slot is free, the holder fails at its next check, and a resource in a foreign system (a remote
MCP session of a dead pod) is left to its own expiry.`,
		Example: `  kubectl lease revoke lh-5d0c3e1f9a2b4c6d7e8f9a0b
  kubectl lease revoke lh-5d0c3e1f9a2b4c6d7e8f9a0b -n acme
  kubectl lease revoke lh-5d0c3e1f9a2b4c6d7e8f9a0b --force`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := out.validate(); err != nil {
				return err
			}
			id, err := holderIDArg(args[0])
			if err != nil {
				return err
			}
			ctx, cancel := o.withTimeout(cmd.Context())
			defer cancel()

			if force {
				s, err := o.openStore()
				if err != nil {
					return err
				}
				defer s.close()
				h, ok, err := s.RevokeByID(ctx, id, tenant)
				if !ok && err == nil {
					return notFound(id, tenant)
				}
				if ok {
					res := revokeJSON{
						RevokeResult: opsview.RevokeResult{Revoked: true, Holder: toHolderJSON(h).HolderView},
						Via:          viaStore, Handlers: noHandlerNote,
					}
					if werr := o.printRevoked(out, res, "directly in MongoDB (database "+s.db+")", err != nil); werr != nil {
						return werr
					}
				}
				if err != nil {
					if ok {
						return s.wrap("returning the levels of the revoked holder (the holder is gone; reconcile repairs the counters)", err)
					}
					return s.wrap("revoking holder "+id, err)
				}
				return nil
			}

			lc, err := o.live()
			if err != nil {
				return err
			}
			found, err := lc.findHolder(ctx, id, tenant)
			if err != nil {
				return err
			}
			gone, err := lc.revoke(ctx, found)
			if err != nil {
				return err
			}
			res := revokeJSON{
				RevokeResult: opsview.RevokeResult{Revoked: true, Holder: toHolderJSON(holderOf(gone)).HolderView},
				Via:          viaManager, Handlers: managerHandlerNote,
			}
			return o.printRevoked(out, res, "through the live API (namespace "+found.Namespace+")", false)
		},
	}
	c.Flags().StringVar(&tenant, "tenant", "", "revoke only if the holder belongs to this tenant")
	c.Flags().BoolVar(&force, "force", false, "revoke directly in MongoDB, without the manager: no handler runs")
	out.bind(c)
	return c
}

func notFound(id, tenant string) error {
	msg := "no holder " + id
	if tenant != "" {
		msg += " in tenant " + tenant
	}
	return errors.New(msg + " (released, reaped or revoked already?)")
}

func (o *options) printRevoked(out outputFlag, res revokeJSON, how string, failed bool) error {
	if out.json() {
		return writeJSON(o.streams.Out, res)
	}
	p := newPrinter(o.streams.Out)
	h := res.Holder
	p.printf("Revoked lease %s %s.\n", h.ID, how)
	p.printf("  %s\n", describeHolderView(h))
	p.printf("  returned levels: %s\n", joinOrNone(h.Levels))
	if failed {
		p.println("  (returning the levels failed: see the error; reconcile repairs the counters)")
	}
	p.println(res.Handlers)
	return p.done()
}

func describeHolderView(h opsview.HolderView) string {
	s := fmt.Sprintf("type %s, resource %s, tenant %s, project %s", h.Type, h.Resource, h.Tenant, h.Project)
	if h.User != "" {
		s += ", user " + h.User
	}
	if h.Pod != "" {
		s += ", pod " + h.Pod
		if h.PodBound {
			s += " (pod-bound)"
		}
	}
	return s
}

func joinOrNone(s []string) string {
	if len(s) == 0 {
		return "<none>"
	}
	return strings.Join(s, ", ")
}

func newRevokePodCommand(o *options) *cobra.Command {
	var (
		force bool
		out   outputFlag
	)
	c := &cobra.Command{
		Use:   "revoke-pod NAMESPACE/NAME",
		Short: "Revoke every lease holder of a pod (through the manager, which runs the handlers)",
		Long: `Revoke every lease holder of the pod NAMESPACE/NAME, whatever its UID: each is a reap on the
operator's decision, and the manager runs each holder's handler through its dispatcher.

--force revokes directly in MongoDB, for when no manager is reachable; then no handler runs.`,
		Example: `  kubectl lease revoke-pod apps/brain-7d9f-x2
  kubectl lease revoke-pod apps/brain-7d9f-x2 --force`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := out.validate(); err != nil {
				return err
			}
			ns, name, err := splitPod(args[0])
			if err != nil {
				return err
			}
			ctx, cancel := o.withTimeout(cmd.Context())
			defer cancel()

			if force {
				s, err := o.openStore()
				if err != nil {
					return err
				}
				defer s.close()
				holders, err := s.RevokePod(ctx, ns, name)
				views := make([]opsview.HolderView, 0, len(holders))
				for _, h := range holders {
					views = append(views, toHolderJSON(h).HolderView)
				}
				res := revokePodJSON{
					RevokePodResult: opsview.RevokePodResult{Revoked: len(views), Holders: views},
					Via:             viaStore, Handlers: noHandlerNote,
				}
				if err != nil && len(holders) == 0 {
					return s.wrap("revoking the holders of pod "+args[0], err)
				}
				if werr := o.printRevokedPod(out, args[0], res, "directly in MongoDB (database "+s.db+")"); werr != nil {
					return werr
				}
				if err != nil {
					return s.wrap("revoking the holders of pod "+args[0]+" (those above are revoked)", err)
				}
				return nil
			}

			lc, err := o.live()
			if err != nil {
				return err
			}
			var res livev1alpha1.PodRevocation
			req := &livev1alpha1.PodRevocation{
				TypeMeta:     metav1.TypeMeta{APIVersion: livev1alpha1.GroupVersion.String(), Kind: "PodRevocation"},
				ObjectMeta:   metav1.ObjectMeta{GenerateName: "kubectl-lease-"},
				PodNamespace: ns, PodName: name,
			}
			if err := lc.create(ctx, livev1alpha1.ResourcePodRevocations, req, &res); err != nil {
				return err
			}
			views := make([]opsview.HolderView, 0, len(res.Holders))
			for _, h := range res.Holders {
				views = append(views, toHolderJSON(holderOf(h)).HolderView)
			}
			return o.printRevokedPod(out, args[0], revokePodJSON{
				RevokePodResult: opsview.RevokePodResult{Revoked: len(views), Holders: views},
				Via:             viaManager, Handlers: managerHandlerNote,
			}, "through the live API")
		},
	}
	c.Flags().BoolVar(&force, "force", false, "revoke directly in MongoDB, without the manager: no handler runs")
	out.bind(c)
	return c
}

func (o *options) printRevokedPod(out outputFlag, pod string, res revokePodJSON, how string) error {
	if out.json() {
		if res.Holders == nil {
			res.Holders = []opsview.HolderView{}
		}
		return writeJSON(o.streams.Out, res)
	}
	p := newPrinter(o.streams.Out)
	if len(res.Holders) == 0 {
		p.printf("Pod %s holds no leases: nothing revoked (%s).\n", pod, strings.TrimPrefix(how, "through "))
		return p.done()
	}
	p.printf("Revoked %s of pod %s %s.\n", plural(len(res.Holders), "lease", "leases"), pod, how)
	var tb strings.Builder
	t := newTable(&tb, "ID", "TYPE", "RESOURCE", "TENANT", "PROJECT", "USER", "POD-UID", "POD-BOUND")
	for _, h := range res.Holders {
		t.row(h.ID, h.Type, h.Resource, h.Tenant, h.Project, h.User, h.PodUID, fmt.Sprint(h.PodBound))
	}
	if err := t.flush(); err != nil {
		return err
	}
	p.print(tb.String())
	p.println(res.Handlers)
	return p.done()
}
