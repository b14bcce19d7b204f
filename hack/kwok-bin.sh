#!/usr/bin/env bash
# Builds kwok (sigs.k8s.io/kwok, "Kubernetes WithOut Kubelet") from the Go module proxy when it
# is missing, into a per-version cache outside the repository, assembles next to it the stage
# file the development cluster runs it with, and prints the binary's path.
#
#   hack/kwok-bin.sh            # build if missing, print the path of the kwok binary
#
# kwok plays the kubelet for the local control plane (docs/testing.md#pods-that-run): nodes it
# manages become Ready and pods bound to them Running, Ready, with an IP. What it does to which
# object is set by Stage objects; stages.yaml (next to the binary) is put together from the
# stages kwok ships in its module, read from the module cache, so none of kwok's YAML is kept
# in this repository:
#   node/fast/node-initialize                  a new node becomes Ready at once
#   node/heartbeat-with-lease/node-heartbeat-with-lease
#                                              its conditions are refreshed every ten minutes
#                                              (kwok renews the node's Lease in between)
#   pod/fast/pod-ready                         a bound pod becomes Running and Ready, with an IP
#   pod/fast/pod-complete                      a running pod owned by a Job becomes Succeeded
#   pod/fast/pod-delete                        a deleted pod goes away at once
#
# Environment: KWOK_VERSION (default 0.8.0), KWOK_CACHE (default
# ${XDG_CACHE_HOME:-$HOME/.cache}/lease-operator/kwok). A cold build takes about 5 minutes on
# 2 cores (measured 4 min 26 s with an empty build cache, 4 min 44 s with the module downloads).
set -euo pipefail

version=${KWOK_VERSION:-0.8.0}
cache=${KWOK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lease-operator/kwok}
dir="$cache/v$version"
module=sigs.k8s.io/kwok@v$version
stages=(
  kustomize/stage/node/fast/node-initialize.yaml
  kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml
  kustomize/stage/pod/fast/pod-ready.yaml
  kustomize/stage/pod/fast/pod-complete.yaml
  kustomize/stage/pod/fast/pod-delete.yaml
)

log() { echo "kwok-bin: $*" >&2; }

if [[ -x "$dir/kwok" && -s "$dir/stages.yaml" ]]; then
  echo "$dir/kwok"
  exit 0
fi
mkdir -p "$dir"
# Outside any module, so that the repository's go.mod plays no part.
cd "$dir"

if [[ ! -x "$dir/kwok" ]]; then
  log "building kwok v$version (about 5 minutes cold)"
  GOBIN="$dir/bin.tmp" CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@v$version"
  mv "$dir/bin.tmp/kwok" "$dir/kwok"
  rmdir "$dir/bin.tmp"
fi

src=$(go mod download -json "$module" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
[[ -n "$src" && -d "$src" ]] || { log "cannot locate $module in the module cache"; exit 1; }
{
  echo "# Assembled by hack/kwok-bin.sh from $module; see that script."
  for s in "${stages[@]}"; do
    echo "---"
    echo "# $s"
    cat "$src/$s"
  done
} >"$dir/stages.yaml.tmp"
mv "$dir/stages.yaml.tmp" "$dir/stages.yaml"
echo "$dir/kwok"
