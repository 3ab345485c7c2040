"""Dockerfile.controller and Dockerfile.runner, read statically.

A build stage on a slim Python, a final stage ``FROM scratch`` that only copies
the root filesystem the build stage assembled (no RUN, hence no build tools, no
shell, no package manager), a virtualenv made without pip, an SBOM written at
build time, a numeric non-root USER matching the chart's securityContext,
exec-form ENTRYPOINTs, and a build context (.dockerignore) that holds what the
images COPY. Installing exactly as the images do is tested in
tests/integration/test_images.py; the built images are scanned on the node tier
(tests/node/test_image_scan.py).
"""

from __future__ import annotations

import fnmatch
import json
import re
import tomllib
from importlib.metadata import packages_distributions

import pytest
import yaml

from tests.chart import CHART_DIR
from tests.dockerfiles import (
    CLIENT,
    COMPONENTS,
    CONTROLLER_ONLY,
    PLUGIN,
    REPO,
    SHARED,
    dockerfile,
    instructions,
    stages,
    third_party_imports,
)

pytestmark = pytest.mark.unit

SLIM_PYTHON = re.compile(r"^python:3\.1[1-9](\.\d+)?-slim(-[a-z]+)?$")
FINAL_STAGE_KEYWORDS = {"LABEL", "ENV", "COPY", "USER", "EXPOSE", "ENTRYPOINT", "WORKDIR"}


@pytest.mark.parametrize("component", COMPONENTS)
def test_built_on_slim_python_run_from_scratch(component: str) -> None:
    parsed = stages(dockerfile(component).read_text())
    assert len(parsed) == 2
    assert parsed[0].name == "build"
    assert SLIM_PYTHON.match(parsed[0].image), parsed[0].image
    # The final stage holds only what the build stage assembled from its own
    # interpreter (deploy/images/rootfs.sh): nothing of the base image else.
    assert parsed[-1].image == "scratch"


@pytest.mark.parametrize("component", COMPONENTS)
def test_final_stage_only_copies_the_assembled_root_filesystem(component: str) -> None:
    final = stages(dockerfile(component).read_text())[-1]
    keywords = {i.keyword for i in final.instructions}
    # No RUN: nothing is installed or compiled in the final image.
    assert keywords <= FINAL_STAGE_KEYWORDS, keywords - FINAL_STAGE_KEYWORDS
    assert final.all("COPY") == ["--from=build /rootfs /"]
    build = stages(dockerfile(component).read_text())[0]
    assert "--chmod=0755 deploy/images/rootfs.sh /usr/local/bin/ksc-rootfs" in build.all("COPY")
    assert any(run.endswith("ksc-rootfs /rootfs /opt/venv") for run in build.all("RUN"))


@pytest.mark.parametrize("component", COMPONENTS)
def test_image_venv_gets_no_installer_and_an_sbom(component: str) -> None:
    build = stages(dockerfile(component).read_text())[0]
    runs = " ; ".join(build.all("RUN"))
    # The image's virtualenv never has pip or setuptools; pip runs from a second one.
    assert "python -m venv --without-pip /opt/venv" in runs
    assert "/opt/tools/bin/python -m pip --python /opt/venv/bin/python install" in " ".join(
        build.all("ENV")
    )
    # The SBOM tool at its locked versions (hack/lock.py), outside the image's venv.
    assert "-r requirements-sbom.txt" in runs
    assert any("deploy/images/requirements-sbom.txt" in copy for copy in build.all("COPY"))
    assert (
        "/opt/tools/bin/cyclonedx-py environment --pyproject pyproject.toml "
        f"--output-reproducible -o /rootfs/usr/share/sbom/kserve-inference-{component}.cdx.json "
        "/opt/venv" in runs
    )


@pytest.mark.parametrize("component", COMPONENTS)
def test_runs_as_the_charts_numeric_non_root_user(component: str) -> None:
    final = stages(dockerfile(component).read_text())[-1]
    (user,) = final.all("USER")
    uid, _, gid = user.partition(":")
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    assert int(uid) == values["securityContext"]["runAsUser"] == 65532
    assert int(gid) == values["securityContext"]["runAsGroup"]
    # USER must come after everything that needs root.
    assert final.instructions[-2].keyword in ("USER", "EXPOSE")


@pytest.mark.parametrize("component", COMPONENTS)
def test_exec_form_entrypoint(component: str) -> None:
    final = stages(dockerfile(component).read_text())[-1]
    (entrypoint,) = final.all("ENTRYPOINT")
    assert json.loads(entrypoint) == ["python", "-m", component]
    assert "PATH=/opt/venv/bin:" in " ".join(final.all("ENV"))


@pytest.mark.parametrize("component", COMPONENTS)
def test_build_stage_installs_its_component_with_the_shared_script(component: str) -> None:
    build = stages(dockerfile(component).read_text())[0]
    runs = build.all("RUN")
    assert any(run.startswith(f"ksc-install /opt/venv {component} ") for run in runs), runs
    assert "--chmod=0755 deploy/images/install.sh /usr/local/bin/ksc-install" in build.all("COPY")
    # Beside pyproject.toml, the locked requirements the script installs (hack/lock.py).
    assert any(
        f"deploy/images/requirements-{component}.txt" in copy.split()[:-1]
        and copy.split()[-1] in ("./", "/src/")
        for copy in build.all("COPY")
    ), build.all("COPY")


def test_runner_image_does_not_carry_the_controller() -> None:
    build = stages(dockerfile("runner").read_text())[0]
    copied = " ".join(build.all("COPY"))
    assert "controller" not in copied.replace("ksc-install", "")
    # Nor the controller's API client and plugin: the runner talks to no API server
    # through them.
    for package in CONTROLLER_ONLY:
        assert package not in copied, package


def test_controller_image_does_not_carry_the_runner() -> None:
    # What the controller needs of the runner is the contract both import (contract/).
    sources = context_sources("controller")
    assert "controller" in sources, sources
    # The kubectl plugin (its own package) ships in the controller image, as before,
    # and so does the API client both import (its own package too).
    assert PLUGIN in sources, sources
    assert CLIENT in sources, sources
    assert not any(source.split("/")[0] == "runner" for source in sources), sources


@pytest.mark.parametrize("component", COMPONENTS)
def test_image_copies_the_contract_both_sides_import(component: str) -> None:
    sources = context_sources(component)
    assert component in sources, sources
    for shared in SHARED:
        assert shared in sources, f"Dockerfile.{component} does not copy {shared}/"


def context_sources(component: str) -> list[str]:
    sources: list[str] = []
    for stage in stages(dockerfile(component).read_text()):
        for args in stage.all("COPY"):
            words = args.split()
            if any(w.startswith("--from=") for w in words):
                continue
            sources += [w for w in words[:-1] if not w.startswith("--")]
    return sources


def dockerignore_allows(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins; ``!`` re-includes."""
    included = True
    for pattern in patterns:
        negated = pattern.startswith("!")
        body = pattern[1:] if negated else pattern
        body = body.rstrip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch.fnmatchcase(prefix, body) for prefix in prefixes):
            included = negated
    return included


@pytest.mark.parametrize("component", COMPONENTS)
def test_dockerignore_keeps_what_the_image_copies(component: str) -> None:
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for source in context_sources(component):
        assert (REPO / source).exists(), source
        assert dockerignore_allows(source, patterns), f"{source} is excluded by .dockerignore"
    for excluded in (".venv", ".git", "tests/unit/test_chart.py", "docs/operator-guide.md"):
        assert not dockerignore_allows(excluded, patterns), excluded


def test_instruction_reader_joins_continuations_and_drops_comments() -> None:
    text = "FROM a AS b\n# note\nRUN one \\\n # inside\n  && two\nUSER 1:1\n"
    parsed = instructions(text)
    assert [(i.keyword, i.args) for i in parsed] == [
        ("FROM", "a AS b"),
        ("RUN", "one && two"),
        ("USER", "1:1"),
    ]


def test_runner_extra_lists_every_distribution_the_runner_imports() -> None:
    # The runner image installs only pyproject.toml's `runner` extra.
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extra = {_dist_name(req) for req in project["optional-dependencies"]["runner"]}
    owners = packages_distributions()
    imported = third_party_imports(REPO / "runner")
    for shared in SHARED:
        imported |= third_party_imports(REPO / shared)
    needed = {_dist_name(owners[module][0]) for module in imported}
    missing = sorted(needed - extra)
    assert not missing, f"pyproject.toml's `runner` extra lacks {missing}"


def _dist_name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert match, requirement
    return re.sub(r"[-_.]+", "-", match.group(0)).lower()
