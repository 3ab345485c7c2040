#!/bin/sh
# Assembles the whole root filesystem of an image (its final stage is `FROM
# scratch` + this tree) from a build stage that has installed VENV: the
# interpreter VENV runs on with its standard library, the shared libraries that
# it, its extension modules and VENV's load (found with ldd), the CA bundle, a
# passwd/group naming uid 65532, and VENV itself. Nothing else: no shell, no
# package manager, no pip or setuptools, no Debian python3-venv wheels.
#
#   rootfs.sh ROOTFS VENV
#
# Works on the Debian interpreter (/usr/bin/python3.11, the node tier's
# debootstrap base) and on python:3.11-slim's (/usr/local/bin/python3.11 with
# libpython in /usr/local/lib, found through the ld.so.cache written here).
set -eu

rootfs=${1:?usage: rootfs.sh ROOTFS VENV}
venv=${2:?usage: rootfs.sh ROOTFS VENV}
mkdir -p "$rootfs"

# The merged-/usr links of the base (/lib -> usr/lib, /lib64, /bin), kept as links.
for link in /bin /sbin /lib /lib32 /lib64 /libx32; do
  if [ -L "$link" ]; then
    ln -sfn "$(readlink "$link")" "$rootfs$link"
  fi
done

# copy PATH: the file (or link) at PATH, its directories created, mode kept.
copy() {
  mkdir -p "$rootfs$(dirname "$1")"
  cp -a "$1" "$rootfs$(dirname "$1")/"
}

# The interpreter: the venv's bin/python link chain, each link and its target.
python=$venv/bin/python
while [ -L "$python" ]; do
  target=$(readlink "$python")
  case "$target" in
    /*) python=$target ;;
    *) python=$(dirname "$python")/$target ;;
  esac
  case "$python" in
    "$venv"/*) ;;
    *) [ -e "$rootfs$python" ] || copy "$python" ;;
  esac
done
stdlib=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("stdlib"))')
dynload=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("platstdlib"))')/lib-dynload
# The standard library, byte-compiled (the root filesystem is read-only at run
# time), less what no service runs: tests, IDLE, Tk, ensurepip (the pip and
# setuptools wheels), lib2to3, the turtle demos, help()'s topics, and the
# terminal and dbm modules (readline, curses, dbm: they alone load libreadline,
# ncurses and Berkeley DB).
"$venv/bin/python" -m compileall -q "$stdlib" >/dev/null || true
mkdir -p "$rootfs$stdlib"
(cd "$stdlib" && tar -cf - \
  --exclude=./test --exclude=./idlelib --exclude=./tkinter --exclude=./turtledemo \
  --exclude=./ensurepip --exclude=./lib2to3 --exclude=./site-packages \
  --exclude=./dist-packages --exclude='./config-*' --exclude=./pydoc_data \
  --exclude='./lib-dynload/readline.*' --exclude='./lib-dynload/_curses*' \
  --exclude='./lib-dynload/_dbm.*' --exclude='./lib-dynload/_gdbm.*' \
  .) | tar -xf - -C "$rootfs$stdlib"
# Links out of the tree (Debian's sitecustomize.py -> /etc/python3.11/) become files.
find "$rootfs$stdlib" -type l | while read -r link; do
  case "$(readlink "$link")" in
    /*) rm "$link" && if [ -e "${link#"$rootfs"}" ]; then cp -L "${link#"$rootfs"}" "$link"; fi ;;
  esac
done
if [ -d "$dynload" ] && [ ! -d "$rootfs$dynload" ]; then
  mkdir -p "$rootfs$dynload" && cp -a "$dynload/." "$rootfs$dynload/"
fi

# The virtualenv, then the shared libraries every ELF file of the tree needs,
# each under its canonical directory with the name the loader asks for.
mkdir -p "$rootfs$(dirname "$venv")"
cp -a "$venv" "$rootfs$(dirname "$venv")/"
find "$rootfs" -type f \( -name '*.so' -o -name '*.so.*' -o -perm -u+x \) | while read -r elf; do
  head -c 4 "$elf" | grep -q 'ELF' || continue
  ldd "$elf" 2>/dev/null | awk '/=> \// {print $3} /^\t\/[^ ]* \(/ {print $1}'
done | sort -u | while read -r lib; do
  # Libraries shipped inside the tree (a wheel's .libs) are there already.
  case "$lib" in "$venv"/*|"$rootfs"/*) continue ;; esac
  # The directory resolved (/lib64 -> /usr/lib64), the name kept: the loader
  # opens exactly that path (PT_INTERP, the default directories).
  dir=$(readlink -f "$(dirname "$lib")")
  mkdir -p "$rootfs$dir"
  [ -e "$rootfs$dir/$(basename "$lib")" ] || cp -L "$lib" "$rootfs$dir/$(basename "$lib")"
done
# The loader's cache, for libraries outside its default directories (/usr/local/lib).
mkdir -p "$rootfs/etc"
if [ -f /etc/ld.so.conf ]; then
  cp /etc/ld.so.conf "$rootfs/etc/"
  [ -d /etc/ld.so.conf.d ] && cp -a /etc/ld.so.conf.d "$rootfs/etc/"
  ldconfig -r "$rootfs" 2>/dev/null || true
fi

# TLS, users, name resolution; /tmp (a volume in the pods, but a default too).
mkdir -p "$rootfs/etc/ssl/certs" "$rootfs/tmp"
chmod 1777 "$rootfs/tmp"
cp -L /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/"
# OpenSSL's own default file (Debian's: /usr/lib/ssl/cert.pem), which
# ssl.create_default_context() loads, points at that bundle as in the base.
cafile=$("$venv/bin/python" -c 'import ssl; print(ssl.get_default_verify_paths().openssl_cafile)')
mkdir -p "$rootfs$(dirname "$cafile")"
ln -sfn /etc/ssl/certs/ca-certificates.crt "$rootfs$cafile"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/tmp:/sbin/nologin\n' \
  > "$rootfs/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' > "$rootfs/etc/group"
printf 'passwd: files\ngroup: files\nhosts: files dns\n' > "$rootfs/etc/nsswitch.conf"
