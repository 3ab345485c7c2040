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
