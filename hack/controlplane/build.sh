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

. "$(dirname "${BASH_SOURCE[0]}")/../gobuild.sh"
gobuild_bins=(etcd kube-apiserver kube-controller-manager kubectl)

gobuild_use_env controlplane KUBEBUILDER_ASSETS
k8s_version=$(gobuild_version controlplane k8s.io/kubernetes)
etcd_version=$(gobuild_version controlplane go.etcd.io/etcd/server/v3)
out="$gobuild_cache_root/controlplane/${k8s_version}-etcd${etcd_version}-$(gobuild_key)"
gobuild_reuse controlplane "$out"

build() {
  # etcd shares almost no package with kubernetes: built beside it, it fills the
  # cores while the kubernetes build waits on downloads and links.
  # The module's main package is named after the last path element ("v3").
  go build -ldflags "-s -w" -o "$1/etcd" go.etcd.io/etcd/server/v3 &
  local etcd=$!
  # One invocation builds the main packages concurrently and shares the work.
  go build -ldflags "$(gobuild_k8s_ldflags "$k8s_version")" -o "$1/" \
    k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kubectl
  wait "$etcd"
}
gobuild_build controlplane "$out" "kubernetes $k8s_version and etcd $etcd_version" build
