"""Loopback servers shared by the runner and end-to-end tests.

``model_server``: KServe's own model server (``python -m hack.model_server``,
iris and TTM models trained at start) in a subprocess, started once per test
session (it needs seconds to start) and stopped with its whole process group.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hack.cluster import free_port

REPO = Path(__file__).resolve().parents[1]

__all__ = ["ModelServer", "free_port", "model_server"]


@dataclass(frozen=True)
class ModelServer:
    url: str

    def infer_url(self, model: str = "sklearn-iris") -> str:
        return f"{self.url}/v2/models/{model}/infer"


def _wait_ready(url: str, process: subprocess.Popen[bytes], within: float) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the model server exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=2) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the model server was not ready within {within}s")


@pytest.fixture(scope="session")
def model_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelServer]:
    port = free_port()
    log_path = tmp_path_factory.mktemp("model-server") / "server.log"
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "hack.model_server", "--port", str(port)],
            cwd=REPO,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_ready(url, process, within=120)
            yield ModelServer(url=url)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
