#!/usr/bin/env bash
# Builds helm-docs (the chart README's values table from values.yaml's `# --`
# comments) from its Go module (pinned in go.mod/go.sum beside this file) into
# a per-version cache directory outside the repository, and prints the binary's
# path. tests/unit/test_values_table.py calls this.
#
# Reuse rules, checked in this order:
#   1. HELM_DOCS names an executable -> use it (no build).
#   2. The cache directory for this exact go.mod+go.sum holds the binary -> use it.
#   3. Otherwise build (GOTOOLCHAIN=local, static, trimmed) into the cache.
# Everything but the final path goes to stderr so callers can capture it.
set -euo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/../gobuild.sh"

build() {
  go build -ldflags "-s -w -X main.version=$2" -o "$1/helm-docs" github.com/norwoodj/helm-docs/cmd/helm-docs
}
gobuild_tool helm-docs helm-docs HELM_DOCS github.com/norwoodj/helm-docs "helm-docs %s" build
