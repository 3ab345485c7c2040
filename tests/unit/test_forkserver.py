"""hack/forkserver.py: programs forked from a server run as ``python -m`` would run them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hack.forkserver import ForkedProcess, ForkServer

REPO = Path(__file__).resolve().parents[2]
PROGRAM = "tests.unit.forked_program"
# The program itself, and a module it never imports (it reports whether it has it).
PRELOAD = (PROGRAM, "xml.dom.minidom")


@pytest.fixture(scope="module")
def server() -> Iterator[ForkServer]:
    forks = ForkServer(PRELOAD, cwd=REPO)
    yield forks
    forks.stop()


def start(
    server: ForkServer, tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> ForkedProcess:
    return server.start_module(
        PROGRAM, list(args), tmp_path / "out.log", env=env or {"ONLY": "this"}, cwd=tmp_path
    )


def started_with(log: Path) -> dict[str, object]:
    """The first line the program printed: what it was started with."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if log.exists() and log.read_text().endswith("\n"):
            return dict(json.loads(log.read_text().splitlines()[0]))
        time.sleep(0.02)
    raise AssertionError(f"the program printed nothing to {log}")


def test_a_forked_program_gets_exactly_its_args_env_cwd_and_status(
    server: ForkServer, tmp_path: Path
) -> None:
    proc = start(server, tmp_path, "exit", "3", env={"ONLY": "this", "LANG": "C.UTF-8"})
    assert proc.wait(30) == 3
    assert proc.poll() == 3
    assert proc.returncode == 3
    lines = (tmp_path / "out.log").read_text().splitlines()
    seen = json.loads(lines[0])
    assert seen["argv"] == ["exit", "3"]
    assert seen["env"] == {"ONLY": "this", "LANG": "C.UTF-8"}  # nothing of the server's
    assert seen["cwd"] == str(tmp_path)
    assert seen["stdin"] == ""  # /dev/null, as hack.cluster.spawn gives
    assert seen["preloaded"] is True  # imported once, by the server, before the fork
    # It ended as an interpreter ends (atexit), and runpy did not warn about a preloaded module.
    assert lines[1:] == ["atexit ran"]


def test_a_failing_program_exits_1_with_its_traceback(server: ForkServer, tmp_path: Path) -> None:
    proc = start(server, tmp_path, "raise")
    assert proc.wait(30) == 1
    output = (tmp_path / "out.log").read_text()
    assert "RuntimeError: the program failed" in output
    assert "atexit ran" in output


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_signalled_program_reports_the_signal_as_popen_does(
    server: ForkServer, tmp_path: Path, sig: signal.Signals
) -> None:
    proc = start(server, tmp_path, "sleep")
    started_with(tmp_path / "out.log")
    assert proc.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(0.1)
    assert os.getpgid(proc.pid) == proc.pid  # a session (and group) of its own
    proc.send_signal(sig)
    assert proc.wait(30) == -sig
    proc.kill()  # after the end: nothing to signal, no error


def test_environments_the_interpreter_reads_at_start_are_refused(
    server: ForkServer, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="PYTHONHASHSEED"):
        start(server, tmp_path, "exit", "0", env={"PYTHONHASHSEED": "0"})


def test_children_die_with_the_server(tmp_path: Path) -> None:
    forks = ForkServer(PRELOAD, cwd=REPO)
    try:
        proc = start(forks, tmp_path, "sleep")
        started_with(tmp_path / "out.log")
        pid = forks.pid
        assert pid is not None
    finally:
        forks.stop()
    assert proc.wait(30) == -signal.SIGKILL
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{proc.pid}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{proc.pid}")
    # A later start brings a new server up.
    try:
        again = start(forks, tmp_path / "again", "exit", "0")
        assert again.wait(30) == 0
        assert forks.pid not in (None, pid)
    finally:
        forks.stop()
