#!/usr/bin/env bash
# Builds the helm binary from its Go module (pinned in go.mod/go.sum beside this
# file) into a per-version cache directory outside the repository, and prints
# the binary's path. The chart tests (tests/chart.py) call this.
#
# Reuse rules, checked in this order:
#   1. HELM_BINARY names an executable -> use it (no build).
#   2. The cache directory for this exact go.mod+go.sum holds the binary -> use it.
#   3. Otherwise build (GOTOOLCHAIN=local, static, trimmed) into the cache.
# Everything but the final path goes to stderr so callers can capture it.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

if [ -n "${HELM_BINARY:-}" ] && [ -x "$HELM_BINARY" ]; then
  echo "helm: using HELM_BINARY=$HELM_BINARY (no build)" >&2
  echo "$HELM_BINARY"
  exit 0
fi

helm_version=$(awk '$1 == "helm.sh/helm/v4" && NF >= 2 {print $2; exit}' "$here/go.mod")
if [ -z "$helm_version" ]; then
  echo "helm: no helm.sh/helm/v4 requirement in $here/go.mod" >&2
  exit 1
fi
# The key covers go.sum too, so any dependency change gets its own directory.
key=$(cat "$here/go.mod" "$here/go.sum" | sha256sum | cut -c1-12)
cache_root=${KSC_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kserve-controller}
out="$cache_root/helm/${helm_version}-${key}"

# One build at a time per cache directory: tests, the demo and CI may all ask
# at once, and a second build would pull the first one's directory away.
mkdir -p "$(dirname "$out")"
exec 9>"$out.lock"
flock 9
if [ -x "$out/helm" ]; then
  echo "helm: cached binary in $out (no build)" >&2
  echo "$out/helm"
  exit 0
fi

echo "helm: building helm $helm_version into $out" >&2
start=$(date +%s)
rm -rf "$out.partial"
mkdir -p "$out.partial"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-trimpath -mod=readonly"
# The same stamps upstream's Makefile sets for a tagged release, so that
# `helm version` reports the pinned version rather than "v4.3-unreleased".
ld="-s -w -X helm.sh/helm/v4/internal/version.version=$helm_version"
ld="$ld -X helm.sh/helm/v4/internal/version.metadata="
ld="$ld -X helm.sh/helm/v4/internal/version.gitTreeState=clean"
cd "$here"
go build -ldflags "$ld" -o "$out.partial/helm" helm.sh/helm/v4/cmd/helm >&2
rm -rf "$out"
mv "$out.partial" "$out"
echo "helm: built in $(( $(date +%s) - start ))s" >&2
echo "$out/helm"
