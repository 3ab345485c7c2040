"""The shell blocks a newcomer copies from the README and docs/install.md's Install, run.

Every ```sh block of the README and of docs/install.md's "Install"
section runs as written, in order, in one bash session per document (so a
variable set by one block is there for the next), from the repository root,
with the local control plane's kubectl and the pinned helm on PATH and its
admin kubeconfig in KUBECONFIG. A block that cannot run here says so on the
line before it::

    <!-- docs-test: not run (why) -->

and is left out. A block that runs must exit 0 within BLOCK_TIMEOUT; the
test fails if a document has no block at all, if nothing ran, or if a
"not run" marker gives no reason. It never starts ``make demo`` or
``make test`` (the README's quick start is marked: they run this suite).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hack.chart import helm_binary
from hack.cluster import LocalCluster
from hack.crds import install_crds
from tests.chart import REPO

# Each block is a few kubectl/helm calls against a local API server.
BLOCK_TIMEOUT = 120
pytestmark = pytest.mark.timeout(600)

# (document, the section whose blocks run: None for all of it)
DOCUMENTS = [("README.md", None), ("docs/install.md", "## Install")]
NOT_RUN = re.compile(r"<!-- docs-test: not run \((?P<why>[^)]*)\) -->")
FENCE = re.compile(r"^```(?P<lang>\S*)\n(?P<body>.*?)^```\n", re.MULTILINE | re.DOTALL)
# Commands that start the whole system or this suite: never run from a test.
RECURSIVE = re.compile(r"\bmake\s+(?:demo|test|integration|unit|node|demo-node|bench)\b")
# What docs/install.md's Install creates on the cluster (and the test removes).
NAMESPACE = "kserve-controller-system"
RELEASE = "kserve-inference-controller"


@dataclass(frozen=True)
class Block:
    document: str
    line: int
    body: str
    not_run: str | None  # the reason, when marked


def section(text: str, heading: str | None) -> tuple[str, int]:
    """The text under ``heading`` (to the next heading of its level) and its first line."""
    if heading is None:
        return text, 1
    start = text.index(f"\n{heading}\n") + 1
    level = heading.split()[0]
    end = text.find(f"\n{level} ", start + len(heading))
    return text[start : end + 1 if end != -1 else len(text)], text[:start].count("\n") + 1


def blocks(document: str, heading: str | None) -> list[Block]:
    text, first = section((REPO / document).read_text(), heading)
    found = []
    for fence in FENCE.finditer(text):
        if fence["lang"] != "sh":
            continue
        before = text[: fence.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marked = NOT_RUN.fullmatch(before.strip())
        assert "docs-test" not in before or marked, f"{document}: malformed marker {before!r}"
        line = first + text[: fence.start()].count("\n")
        found.append(Block(document, line, fence["body"], marked["why"] if marked else None))
    return found


def test_every_document_has_blocks_and_every_marker_a_reason() -> None:
    for document, heading in DOCUMENTS:
        found = blocks(document, heading)
        assert found, f"{document} {heading or ''}: no sh block found"
        for block in found:
            if block.not_run is not None:
                assert block.not_run.strip(), f"{document}:{block.line}: no reason given"
            else:
                assert not RECURSIVE.search(block.body), (
                    f"{document}:{block.line} runs the demo or the suite: mark it not run"
                )


@pytest.fixture
def installed_by_the_guide(cluster: LocalCluster) -> Iterator[None]:
    """Removes what docs/install.md's Install blocks create, CRDs and their objects excepted."""
    install_crds(cluster)  # as every test cluster has them: the page applies them again
    yield
    rendered = subprocess.run(
        [
            str(helm_binary()),
            "template",
            RELEASE,
            str(REPO / "deploy" / RELEASE),
            "--namespace",
            NAMESPACE,
            "--skip-tests",
            "--set",
            "crds.install=false",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    cluster.kubectl("delete", "--ignore-not-found", "--wait=false", "-f", "-", input=rendered)
    cluster.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=false")


def run_bounded(script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``bash -c script`` in its own process group, killed whole after BLOCK_TIMEOUT."""
    with subprocess.Popen(
        ["bash", "-c", script],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as proc:
        try:
            out, err = proc.communicate(timeout=BLOCK_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            err += f"\n(killed after {BLOCK_TIMEOUT} s)"
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def run_document(cluster: LocalCluster, found: list[Block], workdir: Path) -> list[Block]:
    """Runs the blocks not marked, in order, in one bash session; returns those it ran."""
    env = {
        **os.environ,
        "PATH": f"{cluster.bin_dir}:{helm_binary().parent}:{os.environ['PATH']}",
        "KUBECONFIG": str(cluster.kubeconfig_for("admin")),
        "HOME": str(workdir),  # helm's and kubectl's caches stay in the test's directory
    }
    ran = []
    state = workdir / "state.sh"
    state.write_text("")
    for block in found:
        if block.not_run is not None:
            continue
        assert not RECURSIVE.search(block.body), (
            f"{block.document}:{block.line} runs the demo or the suite: mark it not run"
        )
        # Each block in its own bash, with the variables the earlier ones left.
        script = (
            f"set -euo pipefail\nsource {state}\n{block.body}\ndeclare -p > {state}.new || true\n"
        )
        done = run_bounded(script, env)
        assert done.returncode == 0, (
            f"{block.document}:{block.line} exited {done.returncode}:\n{block.body}\n"
            f"--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
        )
        new = Path(f"{state}.new")
        if new.exists():
            # Only plain variables: bash's own read-only ones cannot be declared again.
            kept = [
                ln
                for ln in new.read_text().splitlines()
                if ln.startswith(("declare -- ", "declare -x "))
            ]
            state.write_text("\n".join(kept) + "\n")
        ran.append(block)
    return ran


@pytest.mark.usefixtures("installed_by_the_guide")
def test_the_readme_and_the_install_steps_run_as_written(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    ran: list[Block] = []
    for document, heading in DOCUMENTS:
        ran += run_document(cluster, blocks(document, heading), tmp_path)
    assert ran, "no block ran"
    # What they did: the namespace enforces "restricted", the controller is declared.
    labels = cluster.kubectl(
        "get", "namespace", NAMESPACE, "-o", "jsonpath={.metadata.labels}"
    ).stdout
    assert '"pod-security.kubernetes.io/enforce":"restricted"' in labels, labels
    deployment = cluster.kubectl(
        "get", "deployment", RELEASE, "-n", NAMESPACE, "-o", "name"
    ).stdout.strip()
    assert deployment == f"deployment.apps/{RELEASE}"
    # The test hook was left out, as --skip-tests promises.
    pods = cluster.kubectl("get", "pods", "-n", NAMESPACE, "-o", "name").stdout
    assert "selfcheck" not in pods, pods
