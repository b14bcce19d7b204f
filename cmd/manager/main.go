// Command manager is the lease operator. Run without a mode it is the manager (definitions
// controller, pod watch, sweeps, revocation dispatch, admission HTTP API, sidecar injection
// webhook); `manager agent` is the lease agent that the webhook injects as a sidecar (the
// admission API on 127.0.0.1 with the pod's own identity, and the endpoint that receives
// revocations forwarded by other pods).
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/vancetope/lease-operator/internal/settings"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

func main() {
	args := os.Args[1:]
	mode := "manager"
	if len(args) > 0 && (args[0] == "agent" || args[0] == "manager") {
		mode, args = args[0], args[1:]
	}
	var err error
	switch mode {
	case "agent":
		err = runAgent(args)
	default:
		err = runManager(args)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", mode, err)
		os.Exit(1)
	}
}

// storeFlags are the store settings shared by both modes.
type storeFlags struct {
	uri         string
	database    string
	defaultsDir string
	secret      string
}

func (s *storeFlags) bind(fs *flag.FlagSet) {
	fs.StringVar(&s.uri, "mongodb-uri", envOr(settings.EnvMongoURI, settings.DefaultMongoURI),
		"MongoDB connection string (env MONGODB_URI).")
	fs.StringVar(&s.database, "mongodb-database", envOr(settings.EnvMongoDatabase, settings.DefaultMongoDatabase),
		"MongoDB database of the counters and holders (env MONGODB_DATABASE).")
	fs.StringVar(&s.defaultsDir, "defaults-dir", "",
		"Directory of built-in lease definition files <name>.yaml that extend the compiled-in ones.")
	fs.StringVar(&s.secret, "internal-secret", os.Getenv(settings.EnvInternalSecret),
		"Shared secret of the internal revocation endpoints (env LEASE_INTERNAL_SECRET). Empty: the manager uses the Secret lease-internal-secret of the system namespace, creating it once; an agent without a key refuses every forward.")
}

// parse parses args with zap's flags added and installs the logger.
func parse(fs *flag.FlagSet, args []string) error {
	opts := zap.Options{Development: false}
	opts.BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	return nil
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
