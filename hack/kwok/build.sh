#!/usr/bin/env bash
# Builds kwok (sigs.k8s.io/kwok/cmd/kwok, pinned by the `tool` line and the
# require in go.mod/go.sum beside this file) into a per-version cache directory
# outside the repository, and prints the binary's path. kwok fakes nodes and
# pod lifecycles against a real API server: the scale bench (bench/scale.py,
# through hack/kwok.py) and tests/integration/test_kwok.py use it.
#
# Reuse rules, checked in this order:
#   1. KWOK_BINARY names an executable -> use it (no build).
#   2. The cache directory for this exact go.mod+go.sum holds the binary -> use it.
#   3. Otherwise build (GOTOOLCHAIN=local, static, trimmed) into the cache.
# Everything but the final path goes to stderr so callers can capture it.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

if [ -n "${KWOK_BINARY:-}" ] && [ -x "$KWOK_BINARY" ]; then
  echo "kwok: using KWOK_BINARY=$KWOK_BINARY (no build)" >&2
  echo "$KWOK_BINARY"
  exit 0
fi

version=$(awk '$1 == "sigs.k8s.io/kwok" && NF >= 2 {print $2; exit}' "$here/go.mod")
if [ -z "$version" ]; then
  echo "kwok: no sigs.k8s.io/kwok requirement in $here/go.mod" >&2
  exit 1
fi
# The key covers go.sum too, so any dependency change gets its own directory.
key=$(cat "$here/go.mod" "$here/go.sum" | sha256sum | cut -c1-12)
cache_root=${KSC_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kserve-controller}
out="$cache_root/kwok/${version}-${key}"

# One build at a time per cache directory: the test and the bench may ask at
# once, and a second build would pull the first one's directory away.
mkdir -p "$(dirname "$out")"
exec 9>"$out.lock"
flock 9
if [ -x "$out/kwok" ]; then
  echo "kwok: cached binary in $out (no build)" >&2
  echo "$out/kwok"
  exit 0
fi

echo "kwok: building $version into $out" >&2
start=$(date +%s)
rm -rf "$out.partial"
mkdir -p "$out.partial"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-trimpath -mod=readonly"
cd "$here"
go build -ldflags "-s -w" -o "$out.partial/kwok" sigs.k8s.io/kwok/cmd/kwok >&2
rm -rf "$out"
mv "$out.partial" "$out"
echo "kwok: built in $(( $(date +%s) - start ))s" >&2
echo "$out/kwok"
