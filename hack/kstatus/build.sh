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

. "$(dirname "${BASH_SOURCE[0]}")/../gobuild.sh"

build() { go build -ldflags "-s -w" -o "$1/kstatus-check" .; }
# The key covers main.go too: the program is ours, not upstream's.
gobuild_tool kstatus-check kstatus KSTATUS_CHECK_BINARY sigs.k8s.io/cli-utils "against cli-utils %s" build main.go
