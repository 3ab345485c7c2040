"""Each image's install, replayed into a fresh virtualenv.

The build stage of Dockerfile.<component> copies some files from the context
into /src and runs ``ksc-install /opt/venv <component>``
(deploy/images/install.sh). This test copies the same files (read from the
Dockerfile's COPY lines) into a scratch directory and runs the same script with
the same component, with ``uv pip install`` as the installer (so it takes
seconds and uses the local uv cache), then runs the entry points and imports
everything the component's code imports.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from hack import lock
from tests.dockerfiles import (
    COMPONENTS,
    CONTROLLER_ONLY,
    REPO,
    SHARED,
    dockerfile,
    stages,
    third_party_imports,
)

INSTALL_SCRIPT = REPO / "deploy" / "images" / "install.sh"
UV = Path(sys.executable).parent / "uv"


def replay_build_context(component: str, src: Path) -> None:
    """Copy what the build stage COPYs into its WORKDIR (/src) from the context."""
    build = stages(dockerfile(component).read_text())[0]
    (workdir,) = build.all("WORKDIR")
    for args in build.all("COPY"):
        *sources, dest = [word for word in args.split() if not word.startswith("--")]
        if dest.startswith("/") and not dest.startswith(workdir):
            continue  # e.g. the install script itself, run from the repository below
        target = src / dest.removeprefix(workdir).lstrip("/").removeprefix("./")
        for source in sources:
            path = REPO / source
            if path.is_dir():
                shutil.copytree(path, target, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target / path.name)


def install(component: str, tmp: Path) -> Path:
    src, venv = tmp / "src", tmp / "venv"
    src.mkdir()
    replay_build_context(component, src)
    subprocess.run(
        [str(UV), "venv", "--quiet", "--python", sys.executable, str(venv)],
        check=True,
        capture_output=True,
    )
    env = {
        **os.environ,
        "INSTALL": f"{UV} pip install --quiet --python {venv / 'bin' / 'python'}",
        "PYTHON": sys.executable,
    }
    done = subprocess.run(
        ["sh", str(INSTALL_SCRIPT), str(venv), component],
        cwd=src,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return venv / "bin" / "python"


def run(python: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    # A neutral cwd and no PYTHONPATH: only what the venv holds can be imported.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(
        [str(python), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("component", COMPONENTS)
def test_installed_entry_point_runs(component: str, tmp_path: Path) -> None:
    python = install(component, tmp_path)
    done = run(python, "-m", component, "--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"python -m {component}" in done.stdout
    # The code comes from the venv, not from this checkout.
    where = run(python, "-c", f"import {component}; print({component}.__file__)", cwd=tmp_path)
    assert str(tmp_path / "venv") in where.stdout, where.stdout + where.stderr


@pytest.mark.parametrize("component", COMPONENTS)
def test_everything_the_component_imports_is_installed(component: str, tmp_path: Path) -> None:
    python = install(component, tmp_path)
    # The controller's Kubernetes libraries are imported by the API client it carries.
    carried = CONTROLLER_ONLY if component == "controller" else ()
    packages = (component, *SHARED, *carried)
    modules = sorted(set().union(*(third_party_imports(REPO / p) for p in packages)))
    assert modules
    done = run(python, "-c", "\n".join(f"import {m}" for m in modules), cwd=tmp_path)
    assert done.returncode == 0, f"{component} image lacks a dependency: {done.stderr}"


_IMPORT_ALL = """
import importlib, pkgutil, sys
package = importlib.import_module(sys.argv[1])
for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
    if not module.name.endswith("__main__"):
        importlib.import_module(module.name)
"""


@pytest.mark.parametrize("component", COMPONENTS)
def test_every_module_of_the_component_imports(component: str, tmp_path: Path) -> None:
    # Catches imports across packages (the controller uses contract.document) that
    # the image would lack.
    python = install(component, tmp_path)
    carried = CONTROLLER_ONLY if component == "controller" else ()
    for package in (component, *SHARED, *carried):
        done = run(python, "-c", _IMPORT_ALL, package, cwd=tmp_path)
        assert done.returncode == 0, f"{component} image: {done.stderr}"


# Installed in the venv beside the runner's requirements, by whom (uv and pip themselves).
_TOOLING = {"pip", "setuptools", "wheel"}

_CLOSURE = r"""
import json, re, sys, tomllib
from importlib import metadata

def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()

def name_of(requirement):
    return norm(re.match(r"[A-Za-z0-9._-]+", requirement).group(0))

def extras_of(requirement):
    asked = re.match(r"[A-Za-z0-9._-]+\[([^\]]*)\]", requirement)
    return frozenset(e.strip() for e in asked.group(1).split(",")) if asked else frozenset()

# A requirement's extras ("psycopg[binary]") bring in the requirements marked with them.
roots = [(name_of(r), extras_of(r)) for r in tomllib.load(open(sys.argv[1], "rb"))["project"]
         ["optional-dependencies"]["runner"]]
installed = {norm(d.metadata["Name"]): d for d in metadata.distributions()}
needed, seen, todo = set(), set(), list(roots)
while todo:
    name, extras = todo.pop()
    if (name, extras) in seen or name not in installed:
        continue
    seen.add((name, extras))
    needed.add(name)
    for requirement in installed[name].requires or []:
        marker = re.search(r"extra\s*==\s*.([A-Za-z0-9._-]+).", requirement)
        if marker is None or marker.group(1) in extras:
            todo.append((name_of(requirement), extras_of(requirement)))
print(json.dumps({"installed": sorted(installed), "needed": sorted(needed)}))
"""


def test_runner_image_holds_only_the_runner_extra(tmp_path: Path) -> None:
    python = install("runner", tmp_path)
    done = run(python, "-c", _CLOSURE, str(REPO / "pyproject.toml"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    extra = set(found["installed"]) - set(found["needed"]) - _TOOLING
    assert extra == {"kserve-inference-controller"}, (
        f"installed but not required by the runner extra: {sorted(extra)}"
    )
    # The controller's code is not in the runner image either, nor the API client.
    for package in ("controller", *CONTROLLER_ONLY):
        missing = run(python, "-c", f"import {package}", cwd=tmp_path)
        assert missing.returncode != 0, package


_VERSIONS = """
import json
from importlib import metadata
print(json.dumps({d.metadata["Name"]: d.version for d in metadata.distributions()}))
"""


@pytest.mark.parametrize("component", COMPONENTS)
def test_image_installs_exactly_the_locked_versions(component: str, tmp_path: Path) -> None:
    python = install(component, tmp_path)
    done = run(python, "-c", _VERSIONS, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    installed = {lock.normalize(name): v for name, v in json.loads(done.stdout).items()}
    locked = tomllib.loads(lock.LOCK.read_text())
    ours = lock.normalize("kserve-inference-controller")
    checked = {name: v for name, v in installed.items() if name not in _TOOLING | {ours}}
    assert checked, installed
    for name, version in checked.items():
        assert lock.locked_version(locked, name) == version, name


# What scanners flag in an image (setuptools' known CVEs, pkg_resources with it)
# and what only installs: none of it may be in either image's virtualenv.
INSTALLERS = ("pip", "setuptools", "pkg_resources", "_distutils_hack", "wheel")

_INSTALLED = """
import importlib.util, json, sys
from importlib import metadata
print(json.dumps({
    "distributions": sorted(d.metadata["Name"].lower() for d in metadata.distributions()),
    "importable": sorted(m for m in sys.argv[1:] if importlib.util.find_spec(m) is not None),
    "scripts": sorted(
        (ep.name, ep.module) for ep in metadata.entry_points(group="console_scripts")
    ),
}))
"""


@pytest.mark.parametrize("component", COMPONENTS)
def test_no_installer_and_no_dead_command_in_the_venv(component: str, tmp_path: Path) -> None:
    python = install(component, tmp_path)
    done = run(python, "-c", _INSTALLED, *INSTALLERS, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["distributions"], found
    assert not set(found["distributions"]) & set(INSTALLERS), found["distributions"]
    assert found["importable"] == [], found["importable"]
    # Every command in bin/ runs a module the venv holds; the package declares the
    # controller's commands too, and install.sh removes them from the runner's venv.
    bin_dir = tmp_path / "venv" / "bin"
    declared = {name: module for name, module in found["scripts"]}
    present = {name for name in declared if (bin_dir / name).exists()}
    assert f"kserve-inference-{component}" in present
    for name in present:
        top = declared[name].split(".")[0]
        check = run(python, "-c", f"import {top}", cwd=tmp_path)
        assert check.returncode == 0, f"bin/{name} runs {declared[name]}, not installed"
    if component == "runner":
        assert {"kserve-inference-controller", "kubectl-infer"} <= set(declared) - present
    else:
        assert {"kubectl-infer", "kubectl_complete-infer"} <= present


# The S3 tests start a real S3 server and run a few dozen runs: minutes on a busy machine.
@pytest.mark.timeout(1800)
def test_the_runners_s3_tests_pass_on_its_pruned_pyarrow(tmp_path: Path) -> None:
    # install.sh removes what the runner never loads from pyarrow's wheel (Flight,
    # Arrow's own S3/GCS/Azure/HDFS filesystems, ORC, headers) and strips symbol
    # tables; the runner's S3 tests (CSV, JSON Lines, Parquet, against a real S3
    # server on loopback) then run with that pyarrow ahead of the project's.
    python = install("runner", tmp_path)
    where = run(
        python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))", cwd=tmp_path
    )
    site = Path(where.stdout.strip())
    arrow = site / "pyarrow"
    assert list(arrow.glob("libparquet.so.*")), sorted(p.name for p in arrow.iterdir())
    for gone in ("libarrow_flight.so.*", "libarrow_s3.so.*", "_flight.*.so", "_s3fs.*.so"):
        assert not list(arrow.glob(gone)), gone
    assert not (arrow / "include").exists()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(site)
    probe = subprocess.run(
        [sys.executable, "-c", "import pyarrow.parquet, pyarrow; print(pyarrow.__file__)"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip().startswith(str(arrow)), probe.stdout
    tests = ["tests/runner/test_runner_s3.py", "tests/unit/test_runner_s3_logic.py"]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *tests, "-q", "-p", "no:cacheprovider", "-x"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=1700,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    summary = done.stdout.strip().splitlines()[-1]
    assert " passed" in summary, summary
    assert "failed" not in summary, summary
    assert "skipped" not in summary, summary
