"""The locked install: ``uv.lock`` and the two image requirement files made from it.

``uv.lock`` pins every distribution the project, its extras and its tools
use. ``make setup`` installs from it (``uv sync --frozen``); the images
(Dockerfile.controller, Dockerfile.runner) have no uv, so ``make lock`` also
writes what each of them installs, with the lock's versions and hashes, to
``deploy/images/requirements-<component>.txt``:

- controller: the closure of ``[project.dependencies]`` (``uv export``);
- runner: the lines of ``uv export --extra runner`` (the project's dependencies
  and the runner extra's, such as the postgres driver the controller does not
  need), kept only for the closure of the ``runner`` extra, computed from the
  dependency graph recorded in ``uv.lock``;
- sbom: the same for the ``sbom`` extra (cyclonedx-py), which both build
  stages install outside the image's virtualenv to write its SBOM.

``python -m hack.lock images`` rewrites both files, ``python -m hack.lock
check`` fails when they (or ``uv.lock``) disagree with ``pyproject.toml``, and
``python -m hack.lock uv-version`` prints the locked uv, which ``make setup``
bootstraps. Only the standard library is used, so this runs before the
virtualenv exists.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
LOCK = REPO / "uv.lock"
PYPROJECT = REPO / "pyproject.toml"
IMAGES_DIR = REPO / "deploy" / "images"
COMPONENTS = ("controller", "runner")
# Extras written to their own file: the runner image's, and the build stages' SBOM tool.
EXTRAS = ("runner", "sbom")
# deploy/images/requirements-<name>.txt, one per image and one for the SBOM tool.
REQUIREMENT_FILES = (*COMPONENTS, "sbom")

_HEADER = (
    "# What Dockerfile.{component} installs (deploy/images/install.sh): the locked\n"
    "# versions and hashes of {what}.\n"
    "# Generated from uv.lock by `make lock`; do not edit.\n"
)
_SBOM_HEADER = (
    "# What both Dockerfiles' build stage installs, outside the image's virtualenv,\n"
    "# to write the image's SBOM: the locked versions and hashes of the `sbom` extra.\n"
    "# Generated from uv.lock by `make lock`; do not edit.\n"
)


def normalize(name: str) -> str:
    """A distribution name as the lock spells it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if not match:
        raise ValueError(f"not a requirement: {requirement!r}")
    return normalize(match.group(1))


def requirement_extras(requirement: str) -> list[str]:
    match = re.match(r"\s*[A-Za-z0-9][A-Za-z0-9._-]*\s*\[([^\]]*)\]", requirement)
    return [normalize(e) for e in match.group(1).split(",") if e.strip()] if match else []


Graph = dict[tuple[str, str | None], set[tuple[str, str | None]]]


def lock_graph(lock: Mapping[str, Any]) -> Graph:
    """What each locked distribution (or one of its extras) may require, under any marker.

    Nodes are (distribution, None) for the distribution itself and
    (distribution, extra) for one of its extras; a requirement of ``x[y]``
    leads to both (x, None) and (x, y).
    """

    def edges(deps: Iterable[Mapping[str, Any]]) -> set[tuple[str, str | None]]:
        found: set[tuple[str, str | None]] = set()
        for dep in deps:
            name = normalize(dep["name"])
            found.add((name, None))
            found.update((name, extra) for extra in dep.get("extra", []))
        return found

    graph: Graph = {}
    for package in lock.get("package", []):
        name = normalize(package["name"])
        graph.setdefault((name, None), set()).update(edges(package.get("dependencies", [])))
        for extra, deps in package.get("optional-dependencies", {}).items():
            graph.setdefault((name, extra), set()).update(edges(deps))
    return graph


def closure(graph: Graph, roots: Iterable[str]) -> set[str]:
    """The distributions ``roots`` (requirement strings) and all they require, transitively."""
    found: set[tuple[str, str | None]] = set()
    todo: list[tuple[str, str | None]] = []
    for root in roots:
        name = requirement_name(root)
        todo.append((name, None))
        todo.extend((name, extra) for extra in requirement_extras(root))
    while todo:
        node = todo.pop()
        if node in found:
            continue
        if node not in graph:
            what = node[0] if node[1] is None else f"{node[0]}[{node[1]}]"
            raise ValueError(f"{what} is not in uv.lock: run `make lock`")
        found.add(node)
        todo.extend(graph[node])
    return {name for name, _ in found}


def export_blocks(text: str) -> list[tuple[str, str]]:
    """Split ``uv export`` output into (distribution, its lines), comments dropped."""
    blocks: list[tuple[str, str]] = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line[0].isspace():
            if not blocks:
                raise ValueError(f"continuation before any requirement: {line!r}")
            name, body = blocks[-1]
            blocks[-1] = (name, body + line + "\n")
        else:
            blocks.append((requirement_name(line), line + "\n"))
    return blocks


def uv() -> str:
    return str(Path(sys.executable).parent / "uv")


def export_controller(extras: Iterable[str] = ()) -> str:
    """``uv export`` of the project's own dependencies (and ``extras``), from the lock as is."""
    done = subprocess.run(
        [
            uv(),
            "export",
            "--frozen",
            "--no-emit-project",
            "--no-header",
            "--no-annotate",
            "--format",
            "requirements-txt",
            *(f"--extra={extra}" for extra in extras),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(f"uv export failed: {done.stderr.strip()}")
    return done.stdout


def _extra_lines(
    extra: str, exported: str, lock: Mapping[str, Any], project: Mapping[str, Any]
) -> str:
    """The lines of ``exported`` (``uv export --extra <extra>``) in the closure of ``extra``."""
    extras = project.get("optional-dependencies", {})
    if extra not in extras:
        raise ValueError(f"pyproject.toml has no [project.optional-dependencies] {extra} extra")
    needed = closure(lock_graph(lock), extras[extra])
    blocks = export_blocks(exported)
    missing = sorted(needed - {name for name, _ in blocks})
    if missing:
        raise ValueError(f"the {extra} extra needs {missing}, which uv export did not print")
    return "".join(body for name, body in blocks if name in needed)


def image_requirements(
    exported: str,
    lock: Mapping[str, Any],
    project: Mapping[str, Any],
    extras_exported: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The text of ``requirements-<name>.txt`` for each image and each of :data:`EXTRAS`.

    ``extras_exported`` maps an extra to ``uv export --extra <extra>``, where its
    lines come from; an extra it lacks takes them from ``exported``.
    """
    blocks = export_blocks(exported)
    if not blocks:
        raise ValueError("uv export printed no requirement")
    given = extras_exported or {}
    return {
        "controller": _HEADER.format(component="controller", what="[project.dependencies]")
        + "".join(body for _, body in blocks),
        "runner": _HEADER.format(component="runner", what="the `runner` extra")
        + _extra_lines("runner", given.get("runner", exported), lock, project),
        "sbom": _SBOM_HEADER + _extra_lines("sbom", given.get("sbom", exported), lock, project),
    }


def requirements_path(component: str) -> Path:
    return IMAGES_DIR / f"requirements-{component}.txt"


def expected_image_requirements() -> dict[str, str]:
    lock = tomllib.loads(LOCK.read_text())
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    return image_requirements(
        export_controller(),
        lock,
        project,
        {extra: export_controller(extras=[extra]) for extra in EXTRAS},
    )


def lock_is_current() -> str | None:
    """None when uv.lock satisfies pyproject.toml, else uv's explanation (no network)."""
    done = subprocess.run(
        [uv(), "lock", "--check", "--offline"], cwd=REPO, capture_output=True, text=True
    )
    return None if done.returncode == 0 else (done.stderr.strip() or done.stdout.strip())


def locked_version(lock: Mapping[str, Any], name: str) -> str:
    versions = {str(p["version"]) for p in lock.get("package", []) if normalize(p["name"]) == name}
    if len(versions) != 1:
        raise ValueError(f"uv.lock holds {sorted(versions) or 'no'} version(s) of {name}")
    return versions.pop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hack.lock", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("images", help="write deploy/images/requirements-*.txt from uv.lock")
    sub.add_parser("check", help="fail if uv.lock or the image requirements are stale")
    sub.add_parser("uv-version", help="print the locked version of uv")
    args = parser.parse_args(argv)
    if args.command == "uv-version":
        print(locked_version(tomllib.loads(LOCK.read_text()), "uv"))
        return 0
    if args.command == "images":
        for component, text in expected_image_requirements().items():
            requirements_path(component).write_text(text)
        return 0
    stale = lock_is_current()
    if stale is not None:
        print(f"uv.lock does not match pyproject.toml; run `make lock`:\n{stale}", file=sys.stderr)
        return 1
    for component, text in expected_image_requirements().items():
        path = requirements_path(component)
        if not path.exists() or path.read_text() != text:
            print(f"{path.relative_to(REPO)} is stale; run `make lock`", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
