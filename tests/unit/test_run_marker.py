"""The suite's run marker (``KSC_TEST_RUN``, tests/conftest.py) under pytest-xdist.

Each case runs a small inner suite with ``-n 2`` and this repository's
conftest, in a subprocess: a worker that ends its session must not kill what
another worker still runs, and a process a worker leaves behind must still be
killed, reported and fail the run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import MARKER_ENV

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]

# The repository's hooks, and a file per worker once its session has ended.
INNER_CONFTEST = """
import os
from pathlib import Path

import pytest

from tests.conftest import pytest_configure, pytest_sessionfinish, pytest_testnodedown

DONE = Path(os.environ["KSC_INNER_DONE"])


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    worker = getattr(config, "workerinput", {}).get("workerid")
    if worker:
        (DONE / worker).touch()
"""

# Two groups, so xdist's loadgroup scheduling gives one to each worker.
INNER_TESTS = """
import os
import subprocess
import time
from pathlib import Path

import pytest

DONE = Path(os.environ["KSC_INNER_DONE"])


@pytest.mark.xdist_group("quick")
def test_quick():
    pass


@pytest.mark.xdist_group("slow")
def test_child_outlives_the_other_workers_session():
    me = os.environ["PYTEST_XDIST_WORKER"]
    child = subprocess.Popen(["sleep", "300"])
    try:
        deadline = time.monotonic() + 120
        while not [p for p in DONE.iterdir() if p.name != me]:
            assert time.monotonic() < deadline, "the other worker never finished"
            time.sleep(0.1)
        time.sleep(1)  # its session end (the leftover scan) is over by now
        assert child.poll() is None, "the other worker's session end killed this test's child"
    finally:
        child.kill()
        child.wait()
"""

LEAVES_A_CHILD = """
import subprocess


def test_leaves_a_child_behind():
    subprocess.Popen(["sleep", "301"])


def test_other():
    pass
"""

# Controllers are forked from a server (hack/forkserver.py) whose children
# carry its marker: one left running is reported, the server itself is not.
LEAVES_A_FORKED_CHILD = """
import os
from pathlib import Path

from hack.controllerproc import FORK_SERVER, REPO

PROGRAM = "tests.unit.forked_program"
DONE = Path(os.environ["KSC_INNER_DONE"])


def test_leaves_a_forked_child_behind(tmp_path):
    left = FORK_SERVER.start_module(PROGRAM, ["sleep"], tmp_path / "left.log", env={}, cwd=REPO)
    (DONE / "left").write_text(str(left.pid))


def test_forks_and_waits(tmp_path):
    done = FORK_SERVER.start_module(PROGRAM, ["exit", "0"], tmp_path / "done.log", env={}, cwd=REPO)
    assert done.wait(30) == 0
"""


def run_inner(
    tmp_path: Path, tests: str, outer: str | None = None, workers: int | None = 2
) -> subprocess.CompletedProcess[str]:
    suite = tmp_path / "inner"
    suite.mkdir()
    (suite / "conftest.py").write_text(textwrap.dedent(INNER_CONFTEST))
    (suite / "test_inner.py").write_text(textwrap.dedent(tests))
    done = tmp_path / "done"
    done.mkdir()
    env = {k: v for k, v in os.environ.items() if k != MARKER_ENV and not k.startswith("PYTEST_")}
    env |= {"KSC_INNER_DONE": str(done), "PYTHONPATH": str(REPO)}
    if outer is not None:
        env[MARKER_ENV] = outer
    return subprocess.run(
        [
            *(sys.executable, "-m", "pytest"),
            *(("-n", str(workers), "--dist", "loadgroup") if workers else ("-p", "no:xdist")),
            *("-p", "no:cacheprovider", "-q", "--rootdir", str(suite), str(suite)),
        ],
        cwd=suite,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_a_workers_session_end_leaves_other_workers_processes_alone(tmp_path: Path) -> None:
    done = run_inner(tmp_path, INNER_TESTS)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout


def test_a_process_left_by_a_worker_is_killed_and_fails_the_run(tmp_path: Path) -> None:
    done = run_inner(tmp_path, LEAVES_A_CHILD)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "processes started by the test suite outlived it" in done.stdout, done.stdout
    assert "2 passed" in done.stdout
    (pid,) = re.findall(r"gw\d pid (\d+): sleep 301", done.stdout)
    stat = Path(f"/proc/{pid}/stat")
    # Killed: gone, or a zombie not yet reaped by init.
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[-1].split()[0] == "Z"


def test_a_pytest_started_by_a_test_leaves_the_outer_sessions_processes_alone(
    tmp_path: Path,
) -> None:
    # A process of the outer session (an xdist worker's control plane, say),
    # with its marker; the inner pytest runs in one process, as test_images.py's.
    outer = f"outer-{os.getpid()}-gw0"
    held = subprocess.Popen(["sleep", "302"], env={**os.environ, MARKER_ENV: outer})
    try:
        done = run_inner(tmp_path, LEAVES_A_CHILD, outer=outer, workers=None)
        # The inner session still finds and kills its own leftover...
        assert done.returncode == 1, done.stdout + done.stderr
        assert re.findall(r"pid \d+: sleep 301", done.stdout), done.stdout
        # ...and never the outer session's process.
        assert "sleep 302" not in done.stdout, done.stdout
        assert held.poll() is None, "the inner session's leftover scan killed the outer's process"
    finally:
        held.kill()
        held.wait()


def test_a_forked_child_left_running_is_reported_and_its_server_is_not(tmp_path: Path) -> None:
    done = run_inner(tmp_path, LEAVES_A_FORKED_CHILD, workers=None)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "2 passed" in done.stdout
    left = int((tmp_path / "done" / "left").read_text())
    reported = [int(pid) for pid in re.findall(r"pid (\d+): \S+ -m hack\.forkserver", done.stdout)]
    assert reported == [left], done.stdout  # the child, and not the server it was forked from
    stat = Path(f"/proc/{left}/stat")
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[-1].split()[0] == "Z"
