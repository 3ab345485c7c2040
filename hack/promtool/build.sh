#!/usr/bin/env bash
# Builds promtool (Prometheus' rule checker and rule unit tester) from its Go
# module (pinned in go.mod/go.sum beside this file) into a per-version cache
# directory outside the repository, and prints the binary's path. The alert
# tests (tests/integration/test_chart_metrics.py) use it when no promtool is
# installed.
#
# Reuse rules, checked in this order:
#   1. PROMTOOL names an executable -> use it (no build).
#   2. The cache directory for this exact go.mod+go.sum holds the binary -> use it.
#   3. Debian's `prometheus` package, downloaded (not installed: no root, no
#      service started) and unpacked into the cache -> use its promtool.
#      Seconds, where the Go build takes ~10 minutes on 2 cores.
#   4. Otherwise build (GOTOOLCHAIN=local, static, trimmed) into the cache.
# Everything but the final path goes to stderr so callers can capture it.
set -euo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/../gobuild.sh"
gobuild_bins=(promtool)

gobuild_use_env promtool PROMTOOL
module_version=$(gobuild_version promtool github.com/prometheus/prometheus)
# Module v0.X.Y is Prometheus vX/100.X%100.Y (v0.316.0 is 3.16.0).
minor=${module_version#v0.}
minor=${minor%%.*}
patch=${module_version##*.}
release="$((minor / 100)).$((minor % 100)).$patch"
out="$gobuild_cache_root/promtool/${release}-$(gobuild_key)"
gobuild_reuse promtool "$out"

# 3. Debian's package, when apt can fetch it.
if command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null; then
  deb_dir="$gobuild_cache_root/promtool/debian"
  if [ -x "$deb_dir/promtool" ]; then
    echo "promtool: cached Debian promtool in $deb_dir (no build)" >&2
    echo "$deb_dir/promtool"
    exit 0
  fi
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  fetched=0
  (cd "$work" && apt-get download -qq prometheus >/dev/null 2>&1) && fetched=1
  if [ "$fetched" = 0 ] && [ "$(id -u)" = 0 ]; then
    # A fresh machine has no package lists yet.
    apt-get update -qq >/dev/null 2>&1 || true
    (cd "$work" && apt-get download -qq prometheus >/dev/null 2>&1) && fetched=1
  fi
  if [ "$fetched" = 1 ]; then
    dpkg-deb -x "$work"/prometheus_*.deb "$work/root"
    rm -rf "$deb_dir.partial" && mkdir -p "$deb_dir.partial"
    cp "$work/root/usr/bin/promtool" "$deb_dir.partial/promtool"
    rm -rf "$deb_dir" && mv "$deb_dir.partial" "$deb_dir"
    echo "promtool: unpacked Debian's $("$deb_dir/promtool" --version 2>&1 | head -1) into $deb_dir" >&2
    echo "$deb_dir/promtool"
    exit 0
  fi
  echo "promtool: Debian's prometheus package could not be fetched; building instead" >&2
fi

# The stamps Prometheus' own release build sets, so that `promtool --version`
# names the pinned release.
build() {
  local ld="-s -w -X github.com/prometheus/common/version.Version=$release"
  ld="$ld -X github.com/prometheus/common/version.Branch=HEAD"
  go build -tags tools -ldflags "$ld" -o "$1/promtool" github.com/prometheus/prometheus/cmd/promtool
}
gobuild_build promtool "$out" "promtool $release ($module_version)" build
