// Package liveapi serves the live holders and counters of the lease store as a Kubernetes
// aggregated API (group live.lease.vancetope.io): `kubectl get leaseholders`, `kubectl
// delete leaseholder` (a revocation) and the operator's actions, authenticated and
// authorized by the cluster (front-proxy, TokenReview, SubjectAccessReview) so that RBAC on
// namespaces decides who sees and revokes which tenant's leases. Nothing is kept in etcd:
// every request reads or writes MongoDB through internal/leasestore, so any manager replica
// answers. See docs/live-api.md.
package liveapi

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	openapinamer "k8s.io/apiserver/pkg/endpoints/openapi"
	"k8s.io/apiserver/pkg/registry/rest"
	genericapiserver "k8s.io/apiserver/pkg/server"
	genericoptions "k8s.io/apiserver/pkg/server/options"
	"k8s.io/component-base/compatibility"
	"k8s.io/utils/clock"

	liveopenapi "github.com/vancetope/lease-operator/api/live/openapi"
	livev1alpha1 "github.com/vancetope/lease-operator/api/live/v1alpha1"
	"github.com/vancetope/lease-operator/internal/metrics"
	"github.com/vancetope/lease-operator/internal/tenancy"
)

var (
	scheme         = runtime.NewScheme()
	codecs         = serializer.NewCodecFactory(scheme)
	parameterCodec = runtime.NewParameterCodec(scheme)
)

func init() {
	utilruntime.Must(livev1alpha1.AddToScheme(scheme))
	// The unversioned meta types (Status, APIGroupList...) every API server answers with.
	metav1.AddToGroupVersion(scheme, schema.GroupVersion{Version: "v1"})
	// The apiserver refuses field selectors the scheme does not know.
	utilruntime.Must(scheme.AddFieldLabelConversionFunc(livev1alpha1.GroupVersion.WithKind("LeaseHolder"), holderFieldLabel))
	utilruntime.Must(scheme.AddFieldLabelConversionFunc(livev1alpha1.GroupVersion.WithKind("LeaseCounter"), counterFieldLabel))
	utilruntime.Must(scheme.AddFieldLabelConversionFunc(livev1alpha1.GroupVersion.WithKind("LeaseWaiter"), holderFieldLabel))
}

func holderFieldLabel(label, value string) (string, string, error) {
	switch label {
	case fieldName, fieldNS, fieldResource, fieldType, fieldProject, fieldUser, fieldPod, fieldTenant:
		return label, value, nil
	}
	return "", "", fmt.Errorf("field label not supported: %s", label)
}

func counterFieldLabel(label, value string) (string, string, error) {
	switch label {
	case fieldName, fieldNS, fieldCounterTenant:
		return label, value, nil
	}
	return "", "", fmt.Errorf("field label not supported: %s", label)
}

// Scheme returns the scheme of the live API (tests and clients decode with it).
func Scheme() *runtime.Scheme { return scheme }

// Defaults of the options.
const (
	DefaultPort = 8444
	// DefaultCertName is the pair name in CertDir: tls.crt and tls.key (cert-manager's
	// Secret layout).
	DefaultCertName = "tls"
	// DefaultTimeout bounds one request that touches many holders (revoke-pod, sweep).
	DefaultTimeout = 60 * time.Second
	// watchDrain is how long a stopping server lets its watches drain.
	watchDrain = 2 * time.Second
)

// Options configure the server.
type Options struct {
	// BindAddress and Port are where it listens (ignored with Listener).
	BindAddress net.IP
	Port        int
	// Listener, when set, is used instead of BindAddress and Port (tests).
	Listener net.Listener
	// CertDir holds tls.crt and tls.key; empty (or missing files) serves a self-signed
	// certificate generated in memory, which the APIService then has to trust with
	// insecureSkipTLSVerify (development only).
	CertDir string
	// Kubeconfig is used for the delegated TokenReviews and SubjectAccessReviews and to read
	// the front-proxy CA; empty means in-cluster.
	Kubeconfig string
}

// Deps are the collaborators of the server.
type Deps struct {
	// Store is the lease store (*leasestore.Store).
	Store Store
	// Tenants maps namespaces and tenants (docs/tenancy.md).
	Tenants tenancy.Map
	// Listener receives revoked holders (the revocation dispatcher); nil only logs them,
	// and then no handler runs.
	Listener Listener
	// Sweeper runs one reaper round (nil: sweeps answer 503).
	Sweeper Sweeper
	// Caps resolves the definitions of the holders that book a counter, to publish its cap
	// (*definition.Resolver; nil: counters publish no cap). See docs/live-api.md, "Caps".
	Caps CapResolver
	// Reviewer runs the dry run of leaseacquisitionreviews (*leasing.Service; nil: reviews
	// answer 503).
	Reviewer Reviewer
	// Pods reports pod liveness for the ALIVE column (nil: unknown).
	Pods PodStatus
	// Feed is this replica's change feed, which watches read (nil: watch is not served).
	Feed Feed
	// BookmarkInterval is how often a watch that allows bookmarks gets one (0:
	// DefaultBookmarkInterval).
	BookmarkInterval time.Duration
	// Clock for ages and idle times (nil: the real clock).
	Clock clock.PassiveClock
	// Log for the audit lines of revocations (zero: discard).
	Log logr.Logger
	// Metrics counts reconciles (nil: metrics.Default()); revocations are counted by the
	// listener, sweeps by the sweeper.
	Metrics *metrics.Metrics
}

// Server is the live API server.
type Server struct {
	generic *genericapiserver.GenericAPIServer
}

// New builds the server: secure serving, delegated authentication and authorization, and
// the live.lease.vancetope.io/v1alpha1 resources over deps.
func New(opts Options, deps Deps) (*Server, error) {
	if deps.Store == nil || deps.Tenants == nil {
		return nil, fmt.Errorf("live API: a store and a tenancy map are required")
	}
	if deps.Clock == nil {
		deps.Clock = clock.RealClock{}
	}
	if deps.Metrics == nil {
		deps.Metrics = metrics.Default()
	}
	if deps.Log.GetSink() == nil {
		deps.Log = logr.Discard()
	}
	cfg := genericapiserver.NewRecommendedConfig(codecs)
	// The emulation version only gates built-in APIs; this server has none.
	cfg.EffectiveVersion = compatibility.NewEffectiveVersionFromString("1.37", "", "")
	// A replica that stops ends its watches at once (clients resume on another replica, or
	// on it once restarted) instead of holding its shutdown until they time out.
	cfg.ShutdownWatchTerminationGracePeriod = watchDrain
	// OpenAPI (generated by `make generate` into api/live/openapi): kubectl explain, and the
	// models the generic server builds its field managers from.
	namer := openapinamer.NewDefinitionNamer(scheme)
	cfg.OpenAPIConfig = genericapiserver.DefaultOpenAPIConfig(liveopenapi.GetOpenAPIDefinitions, namer)
	cfg.OpenAPIConfig.Info.Title = "lease-live"
	cfg.OpenAPIConfig.Info.Version = livev1alpha1.GroupVersion.Version
	cfg.OpenAPIV3Config = genericapiserver.DefaultOpenAPIV3Config(liveopenapi.GetOpenAPIDefinitions, namer)
	cfg.OpenAPIV3Config.Info.Title = "lease-live"
	cfg.OpenAPIV3Config.Info.Version = livev1alpha1.GroupVersion.Version

	serving := genericoptions.NewSecureServingOptions().WithLoopback()
	serving.BindPort = opts.Port
	if serving.BindPort == 0 {
		serving.BindPort = DefaultPort
	}
	if opts.BindAddress != nil {
		serving.BindAddress = opts.BindAddress
	}
	serving.Listener = opts.Listener
	// Without a directory the self-signed certificate stays in memory.
	serving.ServerCert.CertDirectory = opts.CertDir
	serving.ServerCert.PairName = DefaultCertName
	if err := serving.MaybeDefaultWithSelfSignedCerts("localhost", nil, []net.IP{net.ParseIP("127.0.0.1")}); err != nil {
		return nil, fmt.Errorf("live API: serving certificate: %w", err)
	}
	if err := serving.ApplyTo(&cfg.SecureServing, &cfg.LoopbackClientConfig); err != nil {
		return nil, fmt.Errorf("live API: serving: %w", err)
	}
	authn := genericoptions.NewDelegatingAuthenticationOptions()
	authn.RemoteKubeConfigFile = opts.Kubeconfig
	if err := authn.ApplyTo(&cfg.Authentication, cfg.SecureServing, nil); err != nil {
		return nil, fmt.Errorf("live API: delegated authentication: %w", err)
	}
	authz := genericoptions.NewDelegatingAuthorizationOptions()
	authz.RemoteKubeConfigFile = opts.Kubeconfig
	if err := authz.ApplyTo(&cfg.Authorization); err != nil {
		return nil, fmt.Errorf("live API: delegated authorization: %w", err)
	}

	generic, err := cfg.Complete().New("lease-live-api", genericapiserver.NewEmptyDelegate())
	if err != nil {
		return nil, fmt.Errorf("live API: %w", err)
	}
	group := genericapiserver.NewDefaultAPIGroupInfo(livev1alpha1.GroupName, scheme, parameterCodec, codecs)
	group.VersionedResourcesStorageMap[livev1alpha1.GroupVersion.Version] = storages(deps)
	if err := generic.InstallAPIGroup(&group); err != nil {
		return nil, fmt.Errorf("live API: installing %s: %w", livev1alpha1.GroupVersion, err)
	}
	return &Server{generic: generic}, nil
}

func storages(deps Deps) map[string]rest.Storage {
	v := newViews(deps)
	return map[string]rest.Storage{
		livev1alpha1.ResourceHolders:            &holderStorage{views: v, deps: deps},
		livev1alpha1.ResourceCounters:           &counterStorage{views: v, deps: deps},
		livev1alpha1.ResourceWaiters:            &waiterStorage{views: v, deps: deps},
		livev1alpha1.ResourcePodRevocations:     &podRevocationStorage{views: v, deps: deps},
		livev1alpha1.ResourceSweeps:             &sweepStorage{views: v, deps: deps},
		livev1alpha1.ResourceReconciles:         &reconcileStorage{views: v, deps: deps},
		livev1alpha1.ResourceAcquisitionReviews: &reviewStorage{views: v, deps: deps},
	}
}

// Run serves until ctx ends.
func (s *Server) Run(ctx context.Context) error {
	return s.generic.PrepareRun().RunWithContext(ctx)
}
