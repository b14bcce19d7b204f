#!/usr/bin/env bash
# `make run`: the manager on the embedded defaults. Starts the development MongoDB server
# (hack/mongodev) and, unless KUBECONFIG names a cluster, a local control plane (envtest's
# kube-apiserver and etcd, built once by hack/envtest-bins.sh) with the CRDs, the sample
# LeaseDefinitions (system layer in lease-system, acme's layers in the namespace acme) and the
# tenancy admission policy (config/policy) and the live API's ClusterRoles, where pods run
# (kwok, built once by hack/kwok-bin.sh, plays the kubelet of one node); then runs the
# manager, with lease-system as its system namespace, and prints the lines to paste once it
# is ready: the admission API answers and the live API is Available (hack/devcluster
# await). Its log follows. Ctrl-C stops everything.
#
# Environment: MONGODB_URI (use a real MongoDB instead of the dev server), KUBECONFIG (use
# that cluster instead of the local control plane), API_ADDR (default 127.0.0.1:8082),
# LEASE_ADMIN_SECRET (operator API secret, default dev-admin-secret), ADMIN_ADDR (the operator
# API's own listener, default 127.0.0.1:8083; never the admission port), LEASE_INTERNAL_SECRET
# (internal secret of forwarded revocations, default a random one per run), SYSTEM_NAMESPACE
# (default lease-system; docs/tenancy.md), LIVE_API_PORT (the live API, registered with the
# local control plane's aggregation layer; default 8444), MONGODEV_FLAGS (more flags of the
# development server, e.g. "--log-level info --slow-command 20ms" logs every command that
# holds it longer into its log), KWOK (off: pods of the local control plane stay Pending, as
# before kwok; docs/operations.md#the-development-cluster). On the local control plane the
# manager serves its webhooks (pod admission, agent injection), and the agent of every
# injected pod runs as a local process on the pod's address (devcluster agents).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$PWD/bin
api=${API_ADDR:-127.0.0.1:8082}
admin=${ADMIN_ADDR:-127.0.0.1:8083}
system_ns=${SYSTEM_NAMESPACE:-lease-system}
export LEASE_SYSTEM_NAMESPACE=$system_ns
live_port=${LIVE_API_PORT:-8444}
kwok=${KWOK:-on}
live_flags=()
webhook_flags=()
kwok_flags=()
await_flags=()
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
ready_timeout=${READY_TIMEOUT:-2m}
trap cleanup EXIT INT TERM

wait_for() { # file pattern timeout pid
  for _ in $(seq 1 "$3"); do
    grep -q "$2" "$1" 2>/dev/null && return 0
    kill -0 "$4" 2>/dev/null || break
    sleep 1
  done
  echo "run: $2 did not appear in $1" >&2; cat "$1" >&2; return 1
}

logs=$(mktemp -d)
go build -o "$bin/devcluster" ./hack/devcluster
if [[ -z "${MONGODB_URI:-}" ]]; then
  read -ra mongodev_flags <<<"${MONGODEV_FLAGS:-}"
  "$bin/mongodev" --listen 127.0.0.1:0 "${mongodev_flags[@]}" >"$logs/mongodev.log" 2>&1 &
  pids+=($!)
  wait_for "$logs/mongodev.log" "mongodev listening" 60 "${pids[-1]}"
  MONGODB_URI=$(sed -n 's/^mongodev listening on \(mongodb:[^ ]*\).*/\1/p' "$logs/mongodev.log")
  echo "run: development store at $MONGODB_URI"
fi
export MONGODB_URI

if [[ -z "${KUBECONFIG:-}" ]]; then
  KUBEBUILDER_ASSETS=$(hack/envtest-bins.sh)
  export KUBEBUILDER_ASSETS
  if [[ "$kwok" != off ]]; then
    KWOK_BIN=$(hack/kwok-bin.sh)
    export KWOK_BIN
    kwok_flags=(--kwok --kwok-dir "$logs/kwok")
  fi
  "$bin/devcluster" --write-kubeconfig "$bin/dev.kubeconfig" --apply config/samples,config/policy \
    --live-api-port "$live_port" --system-namespace "$system_ns" --webhooks config/webhook "${kwok_flags[@]}" >"$logs/devcluster.log" 2>&1 &
  pids+=($!)
  wait_for "$logs/devcluster.log" "devcluster ready" 120 "${pids[-1]}"
  export KUBECONFIG=$bin/dev.kubeconfig
  echo "run: local control plane, KUBECONFIG=$KUBECONFIG (config/samples, config/policy and the live API's ClusterRoles applied)"
  sed -n 's/^devcluster kwok: /run: kwok: /p' "$logs/devcluster.log"
  # The local control plane routes live.lease.vancetope.io to this manager.
  live_flags=(--live-api-bind-address "127.0.0.1:$live_port")
  # The webhooks, as a cluster has them: annotated pods are gated and admitted by lease
  # (docs/pod-admission.md), and pods annotated for injection get the agent, which
  # `devcluster agents` runs below, since no container runs here.
  read -ra webhook_flags <<<"$(sed -n 's/^devcluster webhooks: //p' "$logs/devcluster.log")"
  webhook_flags+=(--pod-admission-webhook --agent-image lease-operator:dev --agent-manager-url "http://$api")
  await_flags=(--live --kubeconfig "$KUBECONFIG")
fi

# A development secret for the operator API, so that kubectl lease can revoke and sweep.
export LEASE_ADMIN_SECRET=${LEASE_ADMIN_SECRET:-dev-admin-secret}
# The internal secret of forwarded revocations (unsigned ones are refused): a fresh random
# one per run unless given (docs/security.md).
export LEASE_INTERNAL_SECRET=${LEASE_INTERNAL_SECRET:-$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')}
# The manager's log goes to a file until it is ready, then follows the lines to paste.
"$bin/manager" --api-bind-address "$api" --admin-bind-address "$admin" --metrics-bind-address 127.0.0.1:8080 \
  --health-probe-bind-address 127.0.0.1:8081 --reap-interval 10s --system-namespace "$system_ns" --zap-devel \
  --allow-non-pod-callers "${live_flags[@]}" "${webhook_flags[@]}" "$@" >"$logs/manager.log" 2>&1 &
manager=$!
pids+=("$manager")
echo "run: starting the manager (log: $logs/manager.log) ..."
if ! "$bin/devcluster" await --admission "http://$api" --pid "$manager" --timeout "$ready_timeout" "${await_flags[@]}"; then
  echo "run: the manager is not ready; the end of its log:" >&2
  tail -n 40 "$logs/manager.log" >&2
  exit 1
fi
cat <<TXT
run: DEVELOPMENT SETTING --allow-non-pod-callers: callers that are no pod (this host's curl) may act
     for any tenant; pods act only for their namespace's tenant (docs/tenancy.md). Deployed managers refuse them.
run: admission API on http://$api   (logs of the helpers: $logs)
     curl -sS -X POST http://$api/v1/leases -d '{"type":"tex","lease":"tex","tenant":"acme","project":"thesis","user":"ann"}'
run: operator API on http://$admin/internal/lease/admin/ (Authorization: Bearer \$LEASE_ADMIN_SECRET)
run: the operator's view, in another shell (the kubeconfig is all it needs):
     export KUBECONFIG=${KUBECONFIG}
     kubectl get leaseholders -A; kubectl get leasecounters -A
     bin/kubectl-lease list; bin/kubectl-lease counters; bin/kubectl-lease definition tex --tenant acme --project thesis
TXT
if ((${#kwok_flags[@]})); then
  # The agents of injected pods, as local processes on the pods' addresses.
  "$bin/devcluster" agents --kubeconfig "$KUBECONFIG" --agent-bin "$bin/agent" --mongodb-uri "$MONGODB_URI" \
    --log-dir "$logs" >"$logs/agents.log" 2>&1 &
  pids+=($!)
  cat <<TXT
run: pods run here (kwok): kubectl -n acme run app --image=busybox; kubectl -n acme get pod app -o wide
     shows its IP (127.1.0.x), which this host can send from: curl --interface <IP> ... acts as that pod
run: the webhooks are served: a pod annotated lease.vancetope.io/inject=true gets the agent, run here on
     <pod IP>:8090 (log: $logs/agents.log); one annotated lease.vancetope.io/admit-lease waits for its lease
TXT
fi
tail -n +1 -f --pid "$manager" "$logs/manager.log" &
pids+=($!)
status=0
wait "$manager" || status=$?
wait "${pids[-1]}" 2>/dev/null || true
exit "$status"
