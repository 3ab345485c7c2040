#!/usr/bin/env bash
# Builds versitygw (github.com/versity/versitygw/cmd/versitygw, pinned by the
# `tool` line and the require in go.mod/go.sum beside this file) into a
# per-version cache directory outside the repository, and prints the binary's
# path. versitygw is an S3 gateway; its POSIX backend serves a local directory
# as buckets and objects. The s3 storage provider's tests (tests/servers.py,
# through hack/s3server.py) and the s3 demo run it on loopback.
#
# Reuse rules, checked in this order:
#   1. VERSITYGW_BINARY names an executable -> use it (no build).
#   2. The cache directory for this exact go.mod+go.sum holds the binary -> use it.
#   3. Otherwise build (GOTOOLCHAIN=local, static, trimmed) into the cache.
# Everything but the final path goes to stderr so callers can capture it.
set -euo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/../gobuild.sh"

build() { go build -ldflags "-s -w" -o "$1/versitygw" github.com/versity/versitygw/cmd/versitygw; }
gobuild_tool versitygw versitygw VERSITYGW_BINARY github.com/versity/versitygw %s build
