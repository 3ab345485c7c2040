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

. "$(dirname "${BASH_SOURCE[0]}")/../gobuild.sh"

# $2: the version. The same stamps upstream's Makefile sets for a tagged
# release, so that `helm version` reports the pinned version rather than
# "v4.3-unreleased".
build() {
  local ld="-s -w -X helm.sh/helm/v4/internal/version.version=$2"
  ld="$ld -X helm.sh/helm/v4/internal/version.metadata="
  ld="$ld -X helm.sh/helm/v4/internal/version.gitTreeState=clean"
  go build -ldflags "$ld" -o "$1/helm" helm.sh/helm/v4/cmd/helm
}
gobuild_tool helm helm HELM_BINARY helm.sh/helm/v4 "helm %s" build
