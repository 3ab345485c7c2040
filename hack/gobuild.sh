# shellcheck shell=bash
# The skeleton the hack/*/build.sh scripts share; sourced, not run. Each script
# sits beside a Go module (go.mod/go.sum pinning what it builds) and:
#   1. uses a binary its caller names in an environment variable, as is;
#   2. else reuses the cache directory for this exact go.mod+go.sum (plus any
#      source of ours beside it): $cache_root/<tool>/<version>-<key>;
#   3. else builds there (GOTOOLCHAIN=local, static, trimmed) and installs the
#      directory in one rename, so a reader never sees half a build.
# It prints what it uses (the binary, or the directory of several) as its last
# line; everything else goes to stderr so callers can capture that line.
#
# The cache layout and keys are a contract: warm caches (~/.cache, CI's) hit
# only while $cache_root/<tool>/<version>-<key> is computed exactly so.

# The module directory: the sourcing script's own.
gobuild_dir=$(cd "$(dirname "${BASH_SOURCE[1]}")" && pwd)
gobuild_cache_root=${KSC_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kserve-controller}
# What the script installs; it sets this before calling the functions below.
gobuild_bins=()

# True when directory $1 holds every binary of gobuild_bins.
gobuild_has_all() {
  local b
  for b in "${gobuild_bins[@]}"; do [ -x "$1/$b" ] || return 1; done
}

# Prints what a script hands back for install directory $1: the binary when it
# installs one, the directory when it installs several.
gobuild_result() {
  if [ "${#gobuild_bins[@]}" = 1 ]; then echo "$1/${gobuild_bins[0]}"; else echo "$1"; fi
}

# gobuild_use_env LABEL VAR: when $VAR names the binary (or, for several, a
# directory holding them all), print it and exit: the caller's own build wins.
gobuild_use_env() {
  local label=$1 var=$2 path=${!2:-} usable=0
  [ -n "$path" ] || return 0
  if [ "${#gobuild_bins[@]}" = 1 ]; then
    [ -x "$path" ] && usable=1
  else
    gobuild_has_all "$path" && usable=1
  fi
  [ "$usable" = 1 ] || return 0
  echo "$label: using $var=$path (no build)" >&2
  echo "$path"
  exit 0
}

# gobuild_version LABEL MODULE: the version go.mod requires MODULE at, in a
# require block or on a one-line `require`; fails, saying so, when it has none.
gobuild_version() {
  local version
  version=$(awk -v m="$2" '$1 == "require" && $2 == m {print $3; exit} $1 == m && NF >= 2 {print $2; exit}' "$gobuild_dir/go.mod")
  if [ -z "$version" ]; then
    echo "$1: no $2 requirement in $gobuild_dir/go.mod" >&2
    return 1
  fi
  echo "$version"
}

# gobuild_key [FILE...]: 12 hex digits of go.mod+go.sum (and FILEs beside them),
# so any dependency change, or a change to a program of ours, gets its own directory.
gobuild_key() {
  local files=("$gobuild_dir/go.mod" "$gobuild_dir/go.sum") f
  for f in "$@"; do files+=("$gobuild_dir/$f"); done
  cat "${files[@]}" | sha256sum | cut -c1-12
}

# gobuild_reuse LABEL OUT: take the lock of cache directory OUT (held until the
# script exits) and, when OUT already holds the binaries, print it and exit.
gobuild_reuse() {
  local label=$1 out=$2 what=binary
  # One build at a time per cache directory: tests, the demo and CI may all ask
  # at once, and a second build would pull the first one's directory away.
  mkdir -p "$(dirname "$out")"
  exec 9>"$out.lock"
  flock 9
  gobuild_has_all "$out" || return 0
  [ "${#gobuild_bins[@]}" = 1 ] || what=binaries
  echo "$label: cached $what in $out (no build)" >&2
  gobuild_result "$out"
  exit 0
}

# gobuild_build LABEL OUT WHAT FN [ARG...]: build into OUT by running
# `FN OUT.partial ARG...` in the module directory, then install OUT in one
# rename and print the result. WHAT says what is built, for the log.
gobuild_build() {
  local label=$1 out=$2 what=$3 fn=$4 start
  shift 4
  echo "$label: building $what into $out" >&2
  start=$(date +%s)
  rm -rf "$out.partial"
  mkdir -p "$out.partial"
  gobuild_env
  (cd "$gobuild_dir" && "$fn" "$out.partial" "$@") >&2
  rm -rf "$out"
  mv "$out.partial" "$out"
  echo "$label: built in $(( $(date +%s) - start ))s" >&2
  gobuild_result "$out"
}

# gobuild_env: how every Go build here runs: the go.mod's own toolchain (no
# download), static binaries with no local paths in them, go.sum taken as it
# is, and no DWARF. The links strip it (-s -w), so the compiler need not make
# it: 10-19% less CPU for a cold build (versitygw, two runs each way). The
# node's build (hack/node/build.sh) uses the same flags, so that kubelet
# reuses the control plane's packages from Go's build cache.
# The compiler itself collects garbage only near 1 GiB a process (GOGC=off
# with a GOMEMLIMIT): 7% less CPU for a cold versitygw build, the same bytes
# out, at most ~1 GiB per compile (GOGC=off alone: 12% less, but 1.4 GiB and
# unbounded on a larger package). Neither is part of Go's cache keys.
gobuild_env() {
  export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-trimpath -mod=readonly -gcflags=all=-dwarf=false"
  export GOGC=off GOMEMLIMIT=1GiB
}

# gobuild_tool LABEL SUBDIR VAR MODULE WHAT FN [KEYFILE...]: the whole of a
# script that builds one binary named LABEL, pinned by MODULE's version, into
# $cache_root/SUBDIR/<version>-<key>; $VAR overrides it. WHAT is a printf
# format for the log (%s: the version); FN gets the partial directory and the
# version; KEYFILEs are our own sources beside go.mod that the key covers too.
gobuild_tool() {
  local label=$1 subdir=$2 var=$3 module=$4 what=$5 fn=$6 version out
  shift 6
  gobuild_bins=("$label")
  gobuild_use_env "$label" "$var"
  version=$(gobuild_version "$label" "$module")
  out="$gobuild_cache_root/$subdir/${version}-$(gobuild_key "$@")"
  gobuild_reuse "$label" "$out"
  # shellcheck disable=SC2059 # WHAT is the caller's format on purpose.
  gobuild_build "$label" "$out" "$(printf "$what" "$version")" "$fn" "$version"
}

# gobuild_k8s_ldflags VERSION: -ldflags for a Kubernetes binary, with the
# version stamps the upstream release build sets (what `--version` reports).
gobuild_k8s_ldflags() {
  local ld="-s -w" kv
  for kv in "gitVersion=$1" gitMajor=1 "gitMinor=$(echo "$1" | cut -d. -f2)" gitTreeState=clean \
            "buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"; do
    ld="$ld -X k8s.io/component-base/version.$kv -X k8s.io/client-go/pkg/version.$kv"
  done
  echo "$ld"
}
