#!/usr/bin/env bash
# The Debian packages a real node needs here: a container runtime (containerd,
# runc, the CNI plugins), an image builder (docker.io's dockerd with its
# built-in BuildKit), debootstrap for the base image, and iptables, which
# dockerd and the kubelet call. Installs the missing ones when run as root;
# otherwise says exactly what is missing and fails.
set -euo pipefail

# package -> a file it installs, to tell whether it is there without dpkg locks.
declare -A files=(
  [containerd]=/usr/bin/containerd
  [runc]=/usr/sbin/runc
  [containernetworking-plugins]=/usr/lib/cni/loopback
  [docker.io]=/usr/sbin/dockerd
  [debootstrap]=/usr/sbin/debootstrap
  [iptables]=/usr/sbin/iptables
)
missing=()
for pkg in "${!files[@]}"; do
  [ -x "${files[$pkg]}" ] || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "node: missing Debian packages: ${missing[*]} (run as root, or: sudo apt-get install ${missing[*]})" >&2
  exit 1
fi
echo "node: installing ${missing[*]}" >&2
exec 9>/var/lib/dpkg/ksc-node.lock
flock 9
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q --no-install-recommends "${missing[@]}" >&2 \
  || { apt-get update -q >&2 && apt-get install -y -q --no-install-recommends "${missing[@]}" >&2; }
