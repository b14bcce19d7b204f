package definition

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/vancetope/lease-operator/internal/lease"
)

// ErrLayerRead marks an UnavailableError caused by a failure to read the stored documents
// (rather than by a broken document); a retry may succeed.
var ErrLayerRead = errors.New("reading lease definitions")

// LayerSource reads the stored layer documents (system, tenant, project).
type LayerSource interface {
	// Layers returns every document stored under key, with Kind and Source set. More than one
	// document is a conflict. An error means the documents could not be read.
	Layers(ctx context.Context, key LayerKey) ([]Layer, error)
	// SystemLayers returns every system-layer document (tenant SystemTenant, project
	// TenantProject) of every lease name, with Kind and Source set: the operator's caps of a
	// resource come from every system-scope definition that books it (Bound). An error means
	// the documents could not be read.
	SystemLayers(ctx context.Context) ([]Layer, error)
}

// DefaultReadTimeout bounds one resolution's reads from the LayerSource.
const DefaultReadTimeout = 5 * time.Second

// Resolver resolves lease references to merged definitions and caches them per
// (tenant, project, name). Failed resolutions are never cached. It is safe for concurrent use.
//
// The cache must be invalidated on every change of a stored document (Invalidate with the
// document's key); every replica does this from its own informer, so invalidation is
// cross-pod by construction.
type Resolver struct {
	builtins    *Builtins
	source      LayerSource
	readTimeout time.Duration

	cacheSize int

	mu       sync.Mutex
	epoch    uint64    // bumped by every invalidation
	cache    *defCache // bounded LRU: (name, scope) -> definition
	onChange []func()  // run after every invalidation (OnChange)
}

type scopeKey struct{ tenant, project string }

// Option configures a Resolver.
type Option func(*Resolver)

// WithReadTimeout bounds one resolution's reads from the LayerSource (default
// DefaultReadTimeout).
func WithReadTimeout(d time.Duration) Option {
	return func(r *Resolver) { r.readTimeout = d }
}

// WithCacheSize bounds the cached definitions (default DefaultCacheSize); the least
// recently used is dropped first.
func WithCacheSize(n int) Option {
	return func(r *Resolver) { r.cacheSize = n }
}

// NewResolver returns a Resolver over the built-in layer (nil for none) and the stored layers
// (nil for none: built-in definitions only).
func NewResolver(builtins *Builtins, source LayerSource, opts ...Option) *Resolver {
	r := &Resolver{
		builtins:    builtins,
		source:      source,
		readTimeout: DefaultReadTimeout,
		cacheSize:   DefaultCacheSize,
	}
	for _, o := range opts {
		o(r)
	}
	r.cache = newDefCache(r.cacheSize)
	return r
}

// Resolve returns the merged definition of the lease reference name for an acquisition in
// (tenant, project). The reference "none" or "" is a NOOP. Errors: *InvalidError (lease.ErrInvalid)
// for a bad name or scope, *UnavailableError (lease.ErrUnavailable) when a layer is broken, in
// conflict or unreadable.
func (r *Resolver) Resolve(ctx context.Context, tenant, project, name string) (Definition, error) {
	if name == "" || name == NoneReference {
		return Definition{}, nil
	}
	if err := validateReference(tenant, project, name); err != nil {
		return Definition{}, err
	}
	sk := scopeKey{tenant, project}
	r.mu.Lock() // not RLock: a hit moves the entry to the front of the LRU order
	d, ok := r.cache.get(name, sk)
	epoch := r.epoch
	r.mu.Unlock()
	if ok {
		return d, nil
	}

	res, err := r.explain(ctx, tenant, project, name)
	if err != nil {
		return Definition{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	// An invalidation since the read may have been for a document this result was built
	// without; return the result but do not cache it.
	if r.epoch == epoch {
		r.cache.put(name, sk, res.Definition)
	}
	return res.Definition, nil
}

// ResolveInline checks and resolves an inline definition (see Inline).
func (r *Resolver) ResolveInline(tenant, project string, spec InlineSpec) (Definition, error) {
	return Inline(tenant, project, spec)
}

// Explain merges the definition of name in (tenant, project) from the current documents,
// bypassing the cache, and returns it with its provenance and the ignored fields. Tenant
// SystemTenant with project TenantProject gives the system scope, project TenantProject the
// tenant-wide scope.
func (r *Resolver) Explain(ctx context.Context, tenant, project, name string) (Result, error) {
	if err := validateReference(tenant, project, name); err != nil {
		return Result{}, err
	}
	return r.explain(ctx, tenant, project, name)
}

func validateReference(tenant, project, name string) error {
	if !ValidName(name) {
		return &lease.InvalidError{Field: "lease", Detail: fmt.Sprintf("%q is not a valid lease name (want [A-Za-z0-9][A-Za-z0-9_-]{0,63})", name)}
	}
	return ValidateScope(tenant, project)
}

func (r *Resolver) explain(ctx context.Context, tenant, project, name string) (Result, error) {
	scope := LayerKey{Name: name, Tenant: tenant, Project: project}
	unavailable := func(source string, err error) error {
		return &UnavailableError{Name: name, Tenant: tenant, Project: project, Source: source, Err: err}
	}
	stack := Stack{Scope: scope}
	builtin, err := r.builtins.Layer(name)
	if err != nil {
		var ue *UnavailableError
		if errors.As(err, &ue) {
			return Result{}, unavailable(ue.Source, ue.Err)
		}
		return Result{}, unavailable("built-in layer", err)
	}
	stack.Builtin = builtin

	if r.source == nil {
		return r.bound(stack, nil) // built-in layer only
	}
	ctx, cancel := context.WithTimeout(ctx, r.readTimeout)
	defer cancel()
	system, err := r.source.SystemLayers(ctx)
	if err != nil {
		return Result{}, unavailable("system layer", fmt.Errorf("%w: %w", ErrLayerRead, err))
	}
	for _, key := range ScopeKeys(tenant, project, name) {
		docs, err := r.source.Layers(ctx, key)
		if err != nil {
			return Result{}, unavailable(string(key.Kind())+" layer "+key.String(), fmt.Errorf("%w: %w", ErrLayerRead, err))
		}
		switch len(docs) {
		case 0:
			continue
		case 1:
		default:
			sources := make([]string, 0, len(docs))
			for _, d := range docs {
				sources = append(sources, d.Source)
			}
			return Result{}, unavailable(string(key.Kind())+" layer "+key.String(), conflictError(sources))
		}
		doc := docs[0]
		switch key.Kind() {
		case KindSystem:
			stack.System = &doc
		case KindTenant:
			stack.Tenant = &doc
		default:
			stack.Project = &doc
		}
	}
	return r.bound(stack, system)
}

// bound merges stack and bounds the result by the operator's caps of its resource, computed
// from the built-in layer and the system documents (Bound).
func (r *Resolver) bound(stack Stack, system []Layer) (Result, error) {
	res, err := Merge(stack)
	if err != nil {
		return Result{}, err
	}
	stacks, broken := systemStacks(r.builtins, system)
	return Bound(res, stack, IndexResources(stacks, broken...))
}

// OnChange registers fn to run after every invalidation, once the cache no longer holds
// what it dropped: a definition may have changed (a cap raised, say), and the process's
// waiting acquisitions re-check at once (docs/waiting.md, "Definition changes"). fn runs
// on the invalidating goroutine (an informer's) and must not block.
func (r *Resolver) OnChange(fn func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.onChange = append(r.onChange, fn)
}

// Invalidate drops the cached definitions a change of the document under key can affect: a
// system document drops every cached definition (it can change the caps of its resource,
// which other lease names may book: Bound), a tenant document the name in every scope of
// that tenant, a project document only that scope.
func (r *Resolver) Invalidate(key LayerKey) {
	r.mu.Lock()
	r.epoch++
	if key.Kind() == KindSystem {
		r.cache.clear()
	}
	for sk := range r.cache.scopes(key.Name) {
		if key.Affects(LayerKey{Name: key.Name, Tenant: sk.tenant, Project: sk.project}) {
			r.cache.remove(key.Name, sk)
		}
	}
	hooks := r.onChange
	r.mu.Unlock()
	for _, fn := range hooks {
		fn()
	}
}

// InvalidateAll drops every cached definition.
func (r *Resolver) InvalidateAll() {
	r.mu.Lock()
	r.epoch++
	r.cache.clear()
	hooks := r.onChange
	r.mu.Unlock()
	for _, fn := range hooks {
		fn()
	}
}
