#!/bin/sh
# Installs one component of this project into a virtualenv, the one way both
# images (Dockerfile.controller, Dockerfile.runner) and the test that checks
# them (tests/integration/test_images.py) do it: first exactly the locked
# dependencies, then the package itself with none.
#
#   install.sh VENV controller   requirements-controller.txt: the locked closure
#                                of pyproject.toml's [project.dependencies]
#   install.sh VENV runner       requirements-runner.txt: the locked closure of
#                                only the `runner` extra, so the runner image
#                                carries no controller dependency
#
# Run from the directory holding pyproject.toml and requirements-COMPONENT.txt
# (written from uv.lock by `make lock`; every line pins a version and its
# hashes, so the image gets the very files the lock names). INSTALL is the
# installer command (default: the venv's own pip); the test sets it to `uv pip
# install --python VENV/bin/python` so it runs in seconds.
set -eu

venv=${1:?usage: install.sh VENV controller|runner}
component=${2:?usage: install.sh VENV controller|runner}
install=${INSTALL:-"$venv/bin/python -m pip install --no-cache-dir --disable-pip-version-check"}

case "$component" in
  controller|runner) ;;
  *)
    echo "install.sh: unknown component '$component' (controller or runner)" >&2
    exit 2
    ;;
esac
requirements="requirements-$component.txt"
if [ ! -f "$requirements" ]; then
  echo "install.sh: $requirements is missing (make lock writes it to deploy/images/)" >&2
  exit 2
fi
# --no-deps: the file is the whole closure; nothing outside the lock comes in.
$install --no-deps --require-hashes -r "$requirements"
$install --no-deps .

python=$venv/bin/python
site=$("$python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')

# No dead entry points: the package declares every command of both components
# ([project.scripts]); a command whose module is not installed here (the
# controller's, in the runner's venv) is removed.
"$python" - "$venv/bin" <<'PY'
import importlib.util, os, sys
from importlib import metadata

for ep in metadata.entry_points(group="console_scripts"):
    if importlib.util.find_spec(ep.module.split(".")[0]) is None:
        path = os.path.join(sys.argv[1], ep.name)
        if os.path.exists(path):
            os.remove(path)
            print(f"install.sh: removed {ep.name} ({ep.module} is not installed)")
PY

# pyarrow's wheel carries all of Arrow; the runner uses its CSV, JSON and
# Parquet readers and writers (runner/storage/_s3formats.py) and talks to S3
# with obstore. Removed: Flight (RPC), Arrow's own S3/GCS/Azure/HDFS
# filesystems, ORC, the C++ test library, and the headers and Cython sources
# for building extensions. Kept: what pyarrow.lib links (libarrow, compute,
# acero, dataset, substrait, parquet). tests/integration/test_images.py runs
# the runner's S3 tests on the pruned venv.
arrow=$site/pyarrow
if [ -d "$arrow" ]; then
  rm -rf "$arrow/tests" "$arrow/include" "$arrow/includes" "$arrow/src"
  rm -f "$arrow"/libarrow_flight.so.* "$arrow"/_flight.*.so "$arrow"/libarrow_python_flight.so* \
    "$arrow"/libarrow_s3.so.* "$arrow"/_s3fs.*.so "$arrow"/_gcsfs.*.so "$arrow"/_azurefs.*.so \
    "$arrow"/_hdfs.*.so "$arrow"/_orc.*.so "$arrow"/_dataset_orc.*.so \
    "$arrow"/_pyarrow_cpp_tests.*.so "$arrow"/flight.py "$arrow"/orc.py
  # Copies of libraries under the names only a compiler links by (the loader
  # asks for lib*.so.<ABI>).
  rm -f "$arrow/libarrow_python.so" "$arrow"/libarrow_python.so.*.*.* \
    "$arrow/libarrow_python_parquet_encryption.so" "$arrow"/libarrow_python_parquet_encryption.so.*.*.*
  find "$arrow" \( -name '*.pyx' -o -name '*.pxd' -o -name '*.pxi' -o -name '*.h' -o -name '*.cc' \) \
    -delete
fi

# Symbol tables the wheels' shared libraries carry for debuggers (pyarrow's
# are a fifth of their size); what the loader links by (.dynsym) stays. Where
# binutils is installed (both build stages install it). Each stripped copy is
# a new file renamed over the old one, never a rewrite in place: an installer
# may have hard-linked the file from its cache (uv does), and a rewrite would
# change every virtualenv sharing it, under the processes that have it mapped.
if command -v strip >/dev/null; then
  find "$site" -type f -name '*.so*' | while read -r lib; do
    if strip --strip-unneeded -o "$lib.stripped" "$lib" 2>/dev/null; then
      chmod --reference="$lib" "$lib.stripped" && mv -f "$lib.stripped" "$lib"
    else
      rm -f "$lib.stripped"
    fi
  done
fi
