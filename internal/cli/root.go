// Package cli is the kubectl plugin `kubectl lease` (docs/operations.md, the operational view):
// it reads and acts through the live API (live.lease.vancetope.io, docs/live-api.md) with
// the kubeconfig's credentials alone, so RBAC decides which tenants' leases a user sees and
// revokes, and the manager runs the revocation handlers. --force is the break-glass path
// straight to MongoDB (--mongodb-uri), for when no manager answers: no handler runs then.
//
// Reads: list, show, counters (with BOOKED and the drift marker), definition, acquire
// --dry-run (what an acquisition would answer now). Acts: revoke, revoke-pod, sweep,
// reconcile.
//
// cmd/kubectl-lease only calls Run; everything else lives here so that tests run the
// commands in-process with their own output streams.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/settings"
)

// Environment variables the flags fall back to.
const (
	EnvMongoURI      = settings.EnvMongoURI
	EnvMongoDatabase = settings.EnvMongoDatabase
)

// Defaults of the flags; the store defaults are the manager's.
const (
	DefaultMongoURI      = settings.DefaultMongoURI
	DefaultMongoDatabase = settings.DefaultMongoDatabase
	DefaultTimeout       = 90 * time.Second
)

// IOStreams are the command's standard streams; tests pass buffers.
type IOStreams struct {
	In     io.Reader
	Out    io.Writer
	ErrOut io.Writer
}

// StdStreams returns the process's standard streams.
func StdStreams() IOStreams {
	return IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr}
}

// Option configures the root command.
type Option func(*options)

// WithEnv replaces os.Getenv for the flags' environment fallbacks (tests).
func WithEnv(getenv func(string) string) Option {
	return func(o *options) { o.getenv = getenv }
}

// options are the global flags, shared by every sub-command.
type options struct {
	streams IOStreams
	getenv  func(string) string

	kube            kubeFlags
	namespace       string
	systemNamespace string
	mongoURI        string
	mongoDatabase   string
	timeout         time.Duration
}

// Run executes the plugin with args (without the program name) and returns the process's
// exit code: 0 on success, 1 on any error, whose message goes to streams.ErrOut.
func Run(ctx context.Context, args []string, streams IOStreams, opts ...Option) int {
	// The error may quote what tenants wrote (sanitize.go).
	streams.ErrOut = newTerminalWriter(streams.ErrOut)
	root := NewRootCommand(streams, opts...)
	root.SetArgs(args)
	if err := root.ExecuteContext(ctx); err != nil {
		// Nothing is left to report a failing stderr to.
		_, _ = fmt.Fprintf(streams.ErrOut, "error: %v\n", err)
		var ue *usageError
		if errors.As(err, &ue) {
			_, _ = fmt.Fprintf(streams.ErrOut, "See '%s --help' for usage.\n", ue.command)
		}
		return 1
	}
	return 0
}

// usageError is a bad invocation (unknown flag, wrong number of arguments).
type usageError struct {
	command string
	err     error
}

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// NewRootCommand returns the `kubectl lease` command tree, writing to streams. Whatever it
// writes has the characters that would act on a terminal escaped (sanitize.go).
func NewRootCommand(streams IOStreams, opts ...Option) *cobra.Command {
	streams.Out = newTerminalWriter(streams.Out)
	streams.ErrOut = newTerminalWriter(streams.ErrOut)
	o := &options{streams: streams, getenv: os.Getenv}
	for _, opt := range opts {
		opt(o)
	}
	root := &cobra.Command{
		Use:   "kubectl-lease",
		Short: "Operate the lease system: holders, counters, definitions, revocation",
		Long: `kubectl lease is the view of the lease system through the kubeconfig alone.

Every command uses the cluster's live API (kubectl get leaseholders, leasecounters) with your
own credentials: you see and revoke the leases of the namespaces RBAC grants you (-n NAMESPACE,
default every namespace you may list). Revocations, sweeps and reconciles run on the manager,
which runs the revocation handlers. The merged definition (definition) is read from the
cluster's LeaseDefinitions. acquire --dry-run asks the manager what an acquisition would
answer now, without acquiring.

--force is the break-glass path for when no manager answers: it reads and writes MongoDB
directly (--mongodb-uri), and no revocation handler runs.

ui serves the same view of one namespace as a local web page, for tenant administrators.`,
		Annotations:   map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl lease"},
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return cmd.Help()
		},
	}
	root.CompletionOptions.HiddenDefaultCmd = true
	root.SetIn(streams.In)
	root.SetOut(streams.Out)
	root.SetErr(streams.ErrOut)
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return &usageError{command: c.CommandPath(), err: err}
	})

	pf := root.PersistentFlags()
	pf.StringVar(&o.mongoURI, "mongodb-uri", "",
		"MongoDB connection string of the lease store (default $"+EnvMongoURI+", else "+DefaultMongoURI+")")
	pf.StringVar(&o.mongoDatabase, "mongodb-database", "",
		"MongoDB database of the counters and holders (default $"+EnvMongoDatabase+", else "+DefaultMongoDatabase+")")
	pf.StringVar(&o.kube.kubeconfig, "kubeconfig", "", "path to the kubeconfig file (default $KUBECONFIG, else ~/.kube/config)")
	pf.StringVar(&o.kube.context, "context", "", "kubeconfig context to use")
	pf.StringVarP(&o.namespace, "namespace", "n", "", "only this namespace (default: every namespace RBAC lets you list)")
	pf.StringVar(&o.systemNamespace, "system-namespace", "",
		"the manager's namespace, where revoke-pod, sweep and reconcile run (default $"+EnvSystemNamespace+", else "+DefaultSystemNamespace+")")
	pf.DurationVar(&o.timeout, "timeout", DefaultTimeout, "bound of the whole command")
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		if o.timeout <= 0 {
			return &usageError{command: cmd.CommandPath(), err: fmt.Errorf("--timeout must be positive, not %s", o.timeout)}
		}
		return nil
	}

	root.AddCommand(
		newListCommand(o),
		newShowCommand(o),
		newCountersCommand(o),
		newWaitersCommand(o),
		newDefinitionCommand(o),
		newAcquireCommand(o),
		newRevokeCommand(o),
		newRevokePodCommand(o),
		newSweepCommand(o),
		newReconcileCommand(o),
		newUICommand(o),
	)
	wrapArgs(root)
	for _, c := range root.Commands() {
		wrapArgs(c)
	}
	return root
}

// wrapArgs turns argument-count errors into usage errors.
func wrapArgs(c *cobra.Command) {
	if c.Args == nil {
		return
	}
	check := c.Args
	c.Args = func(cmd *cobra.Command, args []string) error {
		if err := check(cmd, args); err != nil {
			return &usageError{command: cmd.CommandPath(), err: err}
		}
		return nil
	}
}

// withTimeout bounds the command by --timeout.
func (o *options) withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, o.timeout)
}

func (o *options) env(key, def string) string {
	if v := o.getenv(key); v != "" {
		return v
	}
	return def
}

func (o *options) storeURI() string {
	if o.mongoURI != "" {
		return o.mongoURI
	}
	return o.env(EnvMongoURI, DefaultMongoURI)
}

func (o *options) storeDatabase() string {
	if o.mongoDatabase != "" {
		return o.mongoDatabase
	}
	return o.env(EnvMongoDatabase, DefaultMongoDatabase)
}

// openStore connects to the lease store. The connection is lazy: an unreachable server shows
// at the first call, as a storeError.
func (o *options) openStore(extra ...leasestore.Option) (*store, error) {
	opTimeout := min(leasestore.DefaultOpTimeout, o.timeout)
	opts := append([]leasestore.Option{leasestore.WithOpTimeout(opTimeout)}, extra...)
	uri, db := o.storeURI(), o.storeDatabase()
	s, err := leasestore.Connect(uri, db, opts...)
	if err != nil {
		return nil, fmt.Errorf("opening the lease store (%s, database %s): %w; check --mongodb-uri or $%s",
			redactURI(uri), db, err, EnvMongoURI)
	}
	return &store{Store: s, uri: uri, db: db}, nil
}

// store is the lease store with what the error messages need to name it.
type store struct {
	*leasestore.Store
	uri, db string
}

// wrap names the store in a store error and says what to check.
func (s *store) wrap(op string, err error) error {
	if errors.Is(err, lease.ErrUnavailable) {
		return fmt.Errorf("%s: cannot use the lease store (MongoDB %s, database %s): %w; check --mongodb-uri or $%s and that the server is reachable from here",
			op, redactURI(s.uri), s.db, err, EnvMongoURI)
	}
	return fmt.Errorf("%s: %w", op, err)
}

// close disconnects, bounded, whatever happened to the command's context.
func (s *store) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = s.Close(ctx) // nothing is left to flush: every write was acknowledged or failed
}

// redactURI hides the password of a connection string. It does not use net/url, which
// rejects some valid MongoDB seed lists.
func redactURI(uri string) string {
	scheme, rest, ok := strings.Cut(uri, "://")
	if !ok {
		return uri
	}
	authority := rest
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		authority = rest[:i]
	}
	at := strings.LastIndex(authority, "@")
	if at < 0 {
		return uri
	}
	user, _, hasPassword := strings.Cut(authority[:at], ":")
	if !hasPassword {
		return uri
	}
	return scheme + "://" + user + ":xxxxx" + rest[at:]
}
