package main

import (
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/vancetope/lease-operator/internal/agentauth"
	"github.com/vancetope/lease-operator/internal/agentlink"
	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/deflink"
	"github.com/vancetope/lease-operator/internal/httpapi"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/leasing"
	"github.com/vancetope/lease-operator/internal/notify"
	"github.com/vancetope/lease-operator/internal/revocation"
	"github.com/vancetope/lease-operator/internal/serving"
	"github.com/vancetope/lease-operator/internal/sweeper"
	"github.com/vancetope/lease-operator/internal/tenancy"
	"github.com/vancetope/lease-operator/internal/tenancy/k8stenancy"
)

// admissionParts are what the manager's admission port is built from.
type admissionParts struct {
	svc      *leasing.Service
	store    *leasestore.Store
	resolver leasing.Resolver
	tenants  tenancy.Map
	// identify finds the pod at a request's source address (podByIP).
	identify agentauth.PodIdentity
	versions *deflink.Versions
	hub      *notify.Hub
	self     lease.PodRef
	registry *revocation.Registry
	// listener dispatches what the agents' relays reap and reclaim (the dispatcher).
	listener sweeper.Listener
}

// admissionHandlers are the handlers of the manager's admission port: the admission API, bound
// to the calling pod's tenant (callers that are no pod only with --allow-non-pod-callers), and
// the /internal routes, which answer the injected agents only, whatever that flag says: one
// agentauth.Verifier accepts a request from a pod, signed with its namespace's agent key, for
// the definitions, the sweep relay and the reclaim relay; forwarded revocations are signed with
// the manager's namespace's key and sent by its replicas (docs/security.md).
func admissionHandlers(f managerFlags, p admissionParts) serving.Handlers {
	agentKey := func(namespace string) string { return agentlink.AgentKey(f.store.Secret, namespace) }
	agents := agentauth.NewVerifier(p.identify, agentKey, agentauth.WithLogger(ctrl.Log.WithName("agents")))
	return serving.Handlers{
		API: httpapi.NewHandler(p.svc, httpapi.WithPodIdentity(httpapi.PodIdentity(p.identify)),
			httpapi.WithTenantBinder(managerBinder(p.tenants, f.allowNonPod)), httpapi.WithEvents(p.hub), httpapi.WithMaxWait(serving.MaxWait)),
		Revoked: serving.NewReceiver(p.self, p.registry, agentKey(p.self.Namespace), p.store, ctrl.Log.WithName("receiver"), agentlink.WithSenders(agents.From(p.self.Namespace))),
		// Agents ask for the lazy idle sweep here, so that the reaped holders go through this
		// manager's dispatch matrix (an agent watches no pods); they name a lease, which is
		// resolved for their own tenant.
		Relay: sweeper.RelayHandler(p.store, p.listener, agents, p.tenants, p.resolver,
			sweeper.WithRelayClock(realClock), sweeper.WithRelayLogger(ctrl.Log.WithName("relay"))),
		// Agents ask for their waiters' borrowing reclaims here, for the same reason.
		Reclaim: sweeper.ReclaimRelayHandler(p.svc, agents, leasing.ErrNotOwed,
			sweeper.WithRelayClock(realClock), sweeper.WithRelayLogger(ctrl.Log.WithName("reclaim"))),
		// Agents read no Kubernetes API: they ask here for their tenant and definitions.
		Definitions: deflink.NewHandler(p.resolver, p.tenants, agents, p.versions, deflink.WithLogger(ctrl.Log.WithName("definitions"))),
	}
}

// agentVersions is the version the agents' definition watches follow: every invalidation of the
// resolver and every change of a namespace's tenant moves it (docs/security.md, "Agents ask the
// manager").
func agentVersions(resolver *definition.Resolver, tenants *k8stenancy.Informed) *deflink.Versions {
	versions := deflink.NewVersions()
	resolver.OnChange(versions.Bump)
	tenants.OnChange(func(string) { versions.Bump() })
	return versions
}
