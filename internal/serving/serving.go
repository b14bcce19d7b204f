// Package serving holds what the manager (cmd/manager) and the lease agent (cmd/agent) both
// build, so that the two binaries connect, route, wait and receive revocations in exactly the
// same way: the store flags, the route table of the admission servers, the HTTP server, the
// receiver of forwarded revocations and the wiring of waiting. It imports nothing of
// Kubernetes' client libraries, so that the agent links none of them.
package serving

import (
	"context"
	"errors"
	"flag"
	"os"
	"time"

	"github.com/go-logr/logr"

	"github.com/vancetope/lease-operator/internal/agentlink"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/revocation"
	"github.com/vancetope/lease-operator/internal/settings"

	"net/http"
)

// EventsKeep is how long a revocation notice stays readable by the app's long-poll.
const EventsKeep = 5 * time.Minute

// MaxWait bounds how long one acquire request may wait for a slot, so that its answer fits
// in the servers' write timeout; a definition's longer waitMs is cut to it.
const MaxWait = 80 * time.Second

// StoreFlags are the store settings of both binaries.
type StoreFlags struct {
	URI         string
	Database    string
	DefaultsDir string
	Secret      string
}

// Bind binds the flags to fs.
func (s *StoreFlags) Bind(fs *flag.FlagSet) {
	fs.StringVar(&s.URI, "mongodb-uri", EnvOr(settings.EnvMongoURI, settings.DefaultMongoURI),
		"MongoDB connection string (env MONGODB_URI).")
	fs.StringVar(&s.Database, "mongodb-database", EnvOr(settings.EnvMongoDatabase, settings.DefaultMongoDatabase),
		"MongoDB database of the counters and holders (env MONGODB_DATABASE).")
	fs.StringVar(&s.DefaultsDir, "defaults-dir", "",
		"Directory of built-in lease definition files <name>.yaml that extend the compiled-in ones.")
	fs.StringVar(&s.Secret, "internal-secret", os.Getenv(settings.EnvInternalSecret),
		"Shared secret of the internal revocation endpoints (env LEASE_INTERNAL_SECRET). Empty: the manager uses the Secret lease-internal-secret of the system namespace, creating it once; an agent without a key refuses every forward.")
}

// Connect connects to MongoDB. The returned close function is deferred by the caller.
func (s StoreFlags) Connect(opts ...leasestore.Option) (*leasestore.Store, func(), error) {
	store, err := leasestore.Connect(s.URI, s.Database, opts...)
	if err != nil {
		return nil, nil, err
	}
	return store, func() { _ = store.Close(context.Background()) }, nil
}

// EnvOr is the environment variable key, or def when it is empty.
func EnvOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// NewReceiver builds the endpoint for forwarded revocations: it accepts only messages signed
// with key (and passing opts' checks), and acts only once the store confirms that the holder
// is gone.
func NewReceiver(self lease.PodRef, registry *revocation.Registry, key string, store *leasestore.Store, log logr.Logger, opts ...agentlink.ReceiverOption) http.Handler {
	return agentlink.NewReceiver(self, registry, append([]agentlink.ReceiverOption{
		agentlink.WithAgentKey(key),
		agentlink.WithReceiverLogger(log),
		agentlink.WithHolderCheck(stillHeld(store))}, opts...)...)
}

// stillHeld asks the store whether a holder exists: a forwarded revocation is only acted on
// once the holder is gone.
func stillHeld(store *leasestore.Store) agentlink.HeldFunc {
	return func(ctx context.Context, token string) (bool, error) {
		_, err := store.GetHolder(ctx, token)
		if errors.Is(err, lease.ErrLost) {
			return false, nil
		}
		return err == nil, err
	}
}
