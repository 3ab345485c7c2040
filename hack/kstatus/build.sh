#!/usr/bin/env bash
# Builds kstatus-check (main.go beside this file: sigs.k8s.io/cli-utils'
# status.Compute on one object, pinned in go.mod/go.sum) into a per-version
# cache directory outside the repository, and prints the binary's path. The
# health-tool tests (tests/integration/test_health_tools.py) call this.
#
# Reuse rules, checked in this order:
#   1. KSTATUS_CHECK_BINARY names an executable -> use it (no build).
#   2. The cache directory for this exact go.mod+go.sum+main.go holds the
#      binary -> use it.
#   3. Otherwise build (GOTOOLCHAIN=local, static, trimmed) into the cache.
# Everything but the final path goes to stderr so callers can capture it.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

if [ -n "${KSTATUS_CHECK_BINARY:-}" ] && [ -x "$KSTATUS_CHECK_BINARY" ]; then
  echo "kstatus-check: using KSTATUS_CHECK_BINARY=$KSTATUS_CHECK_BINARY (no build)" >&2
  echo "$KSTATUS_CHECK_BINARY"
  exit 0
fi

version=$(awk '$1 == "sigs.k8s.io/cli-utils" && NF >= 2 {print $2; exit}' "$here/go.mod")
if [ -z "$version" ]; then
  echo "kstatus-check: no sigs.k8s.io/cli-utils requirement in $here/go.mod" >&2
  exit 1
fi
# The key covers go.sum (any dependency change) and main.go (the program is
# ours, not upstream's), so each gets its own directory.
key=$(cat "$here/go.mod" "$here/go.sum" "$here/main.go" | sha256sum | cut -c1-12)
cache_root=${KSC_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kserve-controller}
out="$cache_root/kstatus/${version}-${key}"

# One build at a time per cache directory: tests, the demo and CI may all ask
# at once, and a second build would pull the first one's directory away.
mkdir -p "$(dirname "$out")"
exec 9>"$out.lock"
flock 9
if [ -x "$out/kstatus-check" ]; then
  echo "kstatus-check: cached binary in $out (no build)" >&2
  echo "$out/kstatus-check"
  exit 0
fi

echo "kstatus-check: building against cli-utils $version into $out" >&2
start=$(date +%s)
rm -rf "$out.partial"
mkdir -p "$out.partial"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-trimpath -mod=readonly"
cd "$here"
go build -ldflags "-s -w" -o "$out.partial/kstatus-check" . >&2
rm -rf "$out"
mv "$out.partial" "$out"
echo "kstatus-check: built in $(( $(date +%s) - start ))s" >&2
echo "$out/kstatus-check"
