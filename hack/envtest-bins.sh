#!/usr/bin/env bash
# Builds the envtest control-plane binaries (kube-apiserver, etcd) from the Go module
# proxy when they are missing, into a per-version cache outside the repository, and
# prints the directory to use as KUBEBUILDER_ASSETS.
#
#   hack/envtest-bins.sh            # build if missing, print the assets directory
#
# Environment: ENVTEST_K8S_VERSION (default 1.37.2), ENVTEST_ETCD_VERSION (default 3.6.16),
# ENVTEST_CACHE (default ${XDG_CACHE_HOME:-$HOME/.cache}/lease-operator/envtest).
# Pre-built binaries cannot be downloaded on this project's machines, so they are compiled:
# cold this takes about 10 minutes for kube-apiserver and 4 for etcd on 2 cores.
set -euo pipefail

k8s_version=${ENVTEST_K8S_VERSION:-1.37.2}
etcd_version=${ENVTEST_ETCD_VERSION:-3.6.16}
cache=${ENVTEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lease-operator/envtest}
dir="$cache/k8s-$k8s_version-etcd-$etcd_version"

log() { echo "envtest-bins: $*" >&2; }

if [[ -x "$dir/kube-apiserver" && -x "$dir/etcd" ]]; then
  echo "$dir"
  exit 0
fi
mkdir -p "$dir"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

build_etcd() {
  [[ -x "$dir/etcd" ]] && return 0
  log "building etcd v$etcd_version (about 4 minutes cold)"
  mkdir -p "$work/etcd" && cd "$work/etcd"
  go mod init envtest.local/etcd >/dev/null 2>&1
  # The main package of etcd's server module is its root.
  printf 'package main\nimport _ "go.etcd.io/etcd/server/v3"\n' >tools.go
  go mod edit -require="go.etcd.io/etcd/server/v3@v$etcd_version"
  go mod tidy >&2
  rm tools.go
  CGO_ENABLED=0 go build -trimpath -o "$dir/etcd.tmp" go.etcd.io/etcd/server/v3
  mv "$dir/etcd.tmp" "$dir/etcd"
}

build_apiserver() {
  [[ -x "$dir/kube-apiserver" ]] && return 0
  log "building kube-apiserver v$k8s_version (about 10 minutes cold)"
  mkdir -p "$work/kas" && cd "$work/kas"
  go mod init envtest.local/kas >/dev/null 2>&1
  local gomod
  gomod=$(go mod download -json "k8s.io/kubernetes@v$k8s_version" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  [[ -n "$gomod" ]] || { log "cannot locate go.mod of k8s.io/kubernetes@v$k8s_version"; return 1; }
  local staging_version="v0.${k8s_version#*.}"
  go mod edit -require="k8s.io/kubernetes@v$k8s_version"
  # Kubernetes replaces its staging modules by local directories; point each at its release.
  local mod n=0
  while read -r mod; do
    go mod edit -replace="$mod=$mod@$staging_version"
    n=$((n + 1))
  done < <(grep -E '^\s*k8s\.io/[^ ]+ => \./staging/' "$gomod" | awk '{print $1}')
  log "replaced $n staging modules by $staging_version"
  printf 'package main\nimport _ "k8s.io/kubernetes/cmd/kube-apiserver"\n' >tools.go
  go mod tidy >&2
  rm tools.go
  local pkg=k8s.io/component-base/version cpkg=k8s.io/client-go/pkg/version
  local minor=${k8s_version#*.}; minor=${minor%%.*}
  local date; date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  local ld=""
  for p in $pkg $cpkg; do
    ld+=" -X $p.gitVersion=v$k8s_version -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    ld+=" -X $p.gitTreeState=clean -X $p.buildDate=$date -X $p.gitCommit=envtest-built"
  done
  CGO_ENABLED=0 go build -trimpath -ldflags "-s -w$ld" -o "$dir/kube-apiserver.tmp" k8s.io/kubernetes/cmd/kube-apiserver
  mv "$dir/kube-apiserver.tmp" "$dir/kube-apiserver"
}

(build_etcd)
(build_apiserver)
echo "$dir"
