#!/usr/bin/env bash
# Builds what a real node needs beyond the control plane: kubelet and
# kube-scheduler from the same wrapper module as the control plane
# (hack/controlplane/go.mod, so every Kubernetes binary is the same version),
# and the pause binary compiled from that module's build/pause/linux/pause.c.
# Output goes to a per-version cache directory outside the repository, whose
# path is the last line printed. Reused when already built; one build at a time.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/../gobuild.sh"
module=$(cd "$here/../controlplane" && pwd)
bins=(kubelet kube-scheduler pause)

has_all() {
  local d=$1 b
  for b in "${bins[@]}"; do [ -x "$d/$b" ] || return 1; done
}

k8s_version=$(awk '$1 == "k8s.io/kubernetes" && NF >= 2 {print $2; exit}' "$module/go.mod")
key=$(cat "$module/go.mod" "$module/go.sum" "$here/build.sh" | sha256sum | cut -c1-12)
cache_root=${KSC_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kserve-controller}
out="$cache_root/node/bin-${k8s_version}-${key}"

mkdir -p "$(dirname "$out")"
exec 9>"$out.lock"
flock 9
if has_all "$out"; then
  echo "node: cached binaries in $out (no build)" >&2
  echo "$out"
  exit 0
fi
command -v gcc >/dev/null || { echo "node: gcc is needed to build the pause binary" >&2; exit 1; }

echo "node: building kubelet, kube-scheduler and pause $k8s_version into $out" >&2
start=$(date +%s)
rm -rf "$out.partial"
mkdir -p "$out.partial"
# The control plane's flags and version stamps: its packages are reused.
gobuild_env
cd "$module"
go build -ldflags "$(gobuild_k8s_ldflags "$k8s_version")" -o "$out.partial/" \
  k8s.io/kubernetes/cmd/kubelet \
  k8s.io/kubernetes/cmd/kube-scheduler >&2
# The pause source ships inside the kubernetes module; its Makefile's flags.
src=$(go list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause/linux/pause.c
gcc -Os -Wall -Werror -static "-DVERSION=${k8s_version}-ksc" -o "$out.partial/pause" "$src" >&2
rm -rf "$out"
mv "$out.partial" "$out"
echo "node: built in $(( $(date +%s) - start ))s" >&2
echo "$out"
