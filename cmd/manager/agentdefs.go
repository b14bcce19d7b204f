package main

import (
	"net/http"

	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/vancetope/lease-operator/internal/agentauth"
	"github.com/vancetope/lease-operator/internal/agentlink"
	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/deflink"
	"github.com/vancetope/lease-operator/internal/podwatch"
	"github.com/vancetope/lease-operator/internal/tenancy"
)

// agentDefinitions serves the injected agents their tenant and their merged definitions
// (deflink): the caller is the pod at the request's source address, the request must be
// signed with that pod's namespace's agent key, and only that namespace's tenant is
// answered. Every invalidation of the resolver and every change of a namespace's tenant
// moves the version the agents' long-polls follow (docs/security.md, "Agents ask the
// manager").
func agentDefinitions(resolver *definition.Resolver, tenants *tenancy.Informed, watcher *podwatch.Watcher, secret string) http.Handler {
	versions := deflink.NewVersions()
	resolver.OnChange(versions.Bump)
	tenants.OnChange(func(string) { versions.Bump() })
	agents := agentauth.NewVerifier(podByIP(watcher), func(namespace string) string { return agentlink.AgentKey(secret, namespace) },
		agentauth.WithLogger(ctrl.Log.WithName("agents")))
	return deflink.NewHandler(resolver, tenants, agents, versions, deflink.WithLogger(ctrl.Log.WithName("definitions")))
}
