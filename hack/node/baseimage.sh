#!/usr/bin/env bash
# Makes the base image the two Dockerfiles build FROM (their PYTHON_IMAGE) on a
# machine with no container registry: Debian bookworm from debootstrap with
# Debian's Python 3.11 and venv, as a root filesystem tarball for
# `docker import`. Cached outside the repository; the path is the last line
# printed. Must run as root (debootstrap).
#
# The machine's own CA bundle and pip settings go into the image so that pip
# inside `docker build` trusts what the host trusts (a TLS-inspecting proxy in
# front of PyPI, for instance), as a company base image would.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
suite=bookworm
packages=python3,python3-venv,python-is-python3,ca-certificates
mirror=${DEBIAN_MIRROR:-$(awk '$1 == "URIs:" {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)}
mirror=${mirror:-http://deb.debian.org/debian}
key=$(printf '%s\n' "$suite" "$packages" "$mirror" | cat - "$here/baseimage.sh" | sha256sum | cut -c1-12)
cache_root=${KSC_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kserve-controller}
out="$cache_root/node/base-${suite}-${key}.tar"

mkdir -p "$(dirname "$out")"
exec 9>"$out.lock"
flock 9
if [ -s "$out" ]; then
  echo "baseimage: cached in $out (no build)" >&2
  echo "$out"
  exit 0
fi
[ "$(id -u)" = 0 ] || { echo "baseimage: debootstrap needs root" >&2; exit 1; }
command -v debootstrap >/dev/null || { echo "baseimage: debootstrap is not installed (hack/node/packages.sh)" >&2; exit 1; }

start=$(date +%s)
rootfs=$(mktemp -d "$cache_root/node/rootfs.XXXXXX")
trap 'rm -rf "$rootfs"' EXIT
echo "baseimage: debootstrap $suite ($packages) from $mirror" >&2
debootstrap --variant=minbase --include="$packages" "$suite" "$rootfs" "$mirror" >&2
cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' > "$rootfs/etc/pip.conf"
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* "$rootfs"/tmp/*
tar --numeric-owner -C "$rootfs" -cf "$out.partial" .
mv "$out.partial" "$out"
echo "baseimage: built in $(( $(date +%s) - start ))s" >&2
echo "$out"
