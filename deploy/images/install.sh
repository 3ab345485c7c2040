#!/bin/sh
# Installs one component of this project into a virtualenv, the one way both
# images (Dockerfile.controller, Dockerfile.runner) and the test that checks
# them (tests/integration/test_images.py) do it.
#
#   install.sh VENV controller   the package with its dependencies
#                                (pyproject.toml [project.dependencies])
#   install.sh VENV runner       the package without those, plus only the
#                                `runner` extra ([project.optional-dependencies])
#
# Run from the directory holding pyproject.toml. INSTALL is the installer
# command (default: the venv's own pip); the test sets it to `uv pip install
# --python VENV/bin/python` so it runs in seconds. PYTHON (default python3) is
# any Python >= 3.11, used to read pyproject.toml.
set -eu

venv=${1:?usage: install.sh VENV controller|runner}
component=${2:?usage: install.sh VENV controller|runner}
install=${INSTALL:-"$venv/bin/python -m pip install --no-cache-dir --disable-pip-version-check"}
python=${PYTHON:-python3}

case "$component" in
  controller)
    $install .
    ;;
  runner)
    # The package's own dependencies are the controller's; the runner needs
    # only its extra, so the runner image carries no controller dependency.
    requirements=$(mktemp)
    "$python" - "$requirements" <<'PY'
import sys
import tomllib

with open("pyproject.toml", "rb") as f:
    extras = tomllib.load(f)["project"].get("optional-dependencies", {})
if "runner" not in extras:
    sys.exit("pyproject.toml has no [project.optional-dependencies] runner extra")
with open(sys.argv[1], "w") as out:
    out.write("".join(f"{req}\n" for req in extras["runner"]))
PY
    $install --no-deps .
    $install -r "$requirements"
    rm -f "$requirements"
    ;;
  *)
    echo "install.sh: unknown component '$component' (controller or runner)" >&2
    exit 2
    ;;
esac
