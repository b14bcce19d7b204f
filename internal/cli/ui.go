package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/spf13/cobra"

	"github.com/vancetope/lease-operator/internal/tenantview"
)

// DefaultUIAddress is where kubectl lease ui listens unless --address says otherwise.
const DefaultUIAddress = "127.0.0.1:8765"

func newUICommand(o *options) *cobra.Command {
	var address string
	c := &cobra.Command{
		Use:   "ui",
		Short: "Serve the tenant's view of holders and counters on a local web page",
		Long: `Serve a web page on this machine that shows the holders and the tenant, project and user
counters of one namespace (a tenant's namespace), with drift and occupancy against the caps,
and lets you revoke a holder.

As for the other commands (without --force), every read and every revocation is a call to
the live lease API of the cluster (live.lease.vancetope.io, leaseholders and leasecounters)
with the credentials of your kubeconfig, so your RoleBindings alone decide what you see and may
revoke, exactly as with kubectl get/delete leaseholders. The page never reads MongoDB.

-n names the namespace (default: the kubeconfig context's namespace, "default" when it names
none); --kubeconfig and --context choose the credentials. The page listens on a loopback
address only, since it acts with your credentials; it prints the
URL and opens nothing by itself. Stop it with Ctrl-C. See docs/tenant-view.md.`,
		Example: `  kubectl lease ui
  kubectl lease ui --namespace acme --address 127.0.0.1:9000`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			addr, err := loopbackAddress(address)
			if err != nil {
				return err
			}
			cfg, err := o.restConfig()
			if err != nil {
				return err
			}
			ns := o.namespace
			if ns == "" {
				if ns, _, err = o.clientConfig().Namespace(); err != nil {
					return fmt.Errorf("reading the namespace of the kubeconfig context: %w", err)
				}
			}
			src, err := tenantview.NewKubeSource(cfg)
			if err != nil {
				return err
			}
			view, err := tenantview.New(src, ns)
			if err != nil {
				return err
			}
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				return fmt.Errorf("--address %s: %w", addr, err)
			}
			return serveUI(cmd.Context(), o, ln, view.Handler(tenantview.HostsOf(ln.Addr())...), ns, cfg.Host)
		},
	}
	c.Flags().StringVar(&address, "address", DefaultUIAddress, "loopback host:port to listen on (port 0 picks a free one)")
	return c
}

// serveUI serves h on ln until ctx ends.
func serveUI(ctx context.Context, o *options, ln net.Listener, h http.Handler, ns, host string) error {
	// Requests end with the command: the page's event stream does not hold the shutdown.
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, BaseContext: func(net.Listener) context.Context { return ctx }}
	p := newPrinter(o.streams.Out)
	p.printf("Serving the lease view of namespace %s (cluster %s) at http://%s/\nPress Ctrl-C to stop.\n", ns, host, ln.Addr())
	if err := p.done(); err != nil {
		_ = ln.Close()
		return err
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serving the view: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("stopping the view: %w", err)
	}
	return nil
}

// loopbackAddress accepts host:port only on a loopback host: the view acts with the
// caller's credentials, so anyone who reaches it acts as the caller.
func loopbackAddress(address string) (string, error) {
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return "", fmt.Errorf("--address %q: want host:port, e.g. %s", address, DefaultUIAddress)
	}
	if host == "localhost" {
		return net.JoinHostPort("127.0.0.1", port), nil
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return "", fmt.Errorf("--address %q: the view acts with your Kubernetes credentials, so it listens only on a loopback address (127.0.0.1, ::1 or localhost)", address)
	}
	return address, nil
}
