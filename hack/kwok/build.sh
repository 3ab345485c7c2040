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

. "$(dirname "${BASH_SOURCE[0]}")/../gobuild.sh"

build() { go build -ldflags "-s -w" -o "$1/kwok" sigs.k8s.io/kwok/cmd/kwok; }
gobuild_tool kwok kwok KWOK_BINARY sigs.k8s.io/kwok %s build
