#!/usr/bin/env bash
# Builds etcd, kube-apiserver, kube-controller-manager and kubectl from their Go
# modules (pinned in go.mod/go.sum beside this file) into a per-version cache
# directory outside the repository, and prints that directory.
#
# Reuse rules, checked in this order:
#   1. KUBEBUILDER_ASSETS names a directory holding all four binaries -> use it.
#   2. The cache directory for this exact go.sum already holds them -> use it.
#   3. Otherwise build (GOTOOLCHAIN=local, static, trimmed) and stamp versions.
# Everything but the final directory goes to stderr so callers can capture it.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bins=(etcd kube-apiserver kube-controller-manager kubectl)

has_all() {
  local d=$1 b
  for b in "${bins[@]}"; do [ -x "$d/$b" ] || return 1; done
}

if [ -n "${KUBEBUILDER_ASSETS:-}" ] && has_all "$KUBEBUILDER_ASSETS"; then
  echo "controlplane: using KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS (no build)" >&2
  echo "$KUBEBUILDER_ASSETS"
  exit 0
fi

k8s_version=$(awk '$1 == "k8s.io/kubernetes" && NF >= 2 {print $2; exit}' "$here/go.mod")
etcd_version=$(awk '$1 == "go.etcd.io/etcd/server/v3" && NF >= 2 {print $2; exit}' "$here/go.mod")
# The key covers go.sum too, so any dependency change gets its own directory.
key=$(cat "$here/go.mod" "$here/go.sum" | sha256sum | cut -c1-12)
cache_root=${KSC_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kserve-controller}
out="$cache_root/controlplane/${k8s_version}-etcd${etcd_version}-${key}"

# One build at a time per cache directory: tests, the demo and CI may all ask
# at once, and a second build would pull the first one's directory away.
mkdir -p "$(dirname "$out")"
exec 9>"$out.lock"
flock 9
if has_all "$out"; then
  echo "controlplane: cached binaries in $out (no build)" >&2
  echo "$out"
  exit 0
fi

echo "controlplane: building kubernetes $k8s_version and etcd $etcd_version into $out" >&2
start=$(date +%s)
mkdir -p "$out.partial"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-trimpath -mod=readonly"
minor=$(echo "$k8s_version" | cut -d. -f2)
ld="-s -w"
for kv in "gitVersion=$k8s_version" gitMajor=1 "gitMinor=$minor" gitTreeState=clean \
          "buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"; do
  ld="$ld -X k8s.io/component-base/version.$kv -X k8s.io/client-go/pkg/version.$kv"
done
cd "$here"
# One invocation builds the main packages concurrently and shares the work.
go build -ldflags "$ld" -o "$out.partial/" \
  k8s.io/kubernetes/cmd/kube-apiserver \
  k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kubectl >&2
# The module's main package is named after the last path element ("v3").
go build -ldflags "-s -w" -o "$out.partial/etcd" go.etcd.io/etcd/server/v3 >&2
rm -rf "$out"
mv "$out.partial" "$out"
echo "controlplane: built in $(( $(date +%s) - start ))s" >&2
echo "$out"
