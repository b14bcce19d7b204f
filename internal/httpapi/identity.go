package httpapi

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/settings"
)

// AgentIdentityFromEnv reads the agent's own pod from the downward API environment
// (POD_NAMESPACE, POD_NAME, POD_UID); all three are required, since a holder's pod is
// namespace, name and UID.
func AgentIdentityFromEnv() (lease.PodRef, error) {
	return identityFrom(os.Getenv)
}

func identityFrom(getenv func(string) string) (lease.PodRef, error) {
	pod := lease.PodRef{Namespace: getenv(settings.EnvPodNamespace), Name: getenv(settings.EnvPodName), UID: getenv(settings.EnvPodUID)}
	var missing []error
	for _, v := range []struct{ name, value string }{
		{settings.EnvPodNamespace, pod.Namespace}, {settings.EnvPodName, pod.Name}, {settings.EnvPodUID, pod.UID},
	} {
		if v.value == "" {
			missing = append(missing, fmt.Errorf("%s is not set", v.name))
		}
	}
	if err := errors.Join(missing...); err != nil {
		return lease.PodRef{}, fmt.Errorf("reading the pod identity from the downward API: %w", err)
	}
	return pod, nil
}

// StaticPodIdentity identifies every caller as pod: the agent serves only its own pod.
func StaticPodIdentity(pod lease.PodRef) PodIdentity {
	return func(*http.Request) (lease.PodRef, error) { return pod, nil }
}

// remoteHost is the source address of r without its port.
func remoteHost(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}
