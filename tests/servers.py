"""Loopback servers shared by the runner and end-to-end tests.

``model_server``: KServe's own model server (``python -m hack.model_server``,
iris and TTM models trained at start) in a subprocess, started once per test
session (it needs seconds to start) and stopped with its whole process group.

``s3_server``: a real S3 server (versitygw's POSIX backend, :mod:`hack.s3server`)
on a temporary directory, one per session; each test makes its own bucket
(:meth:`hack.s3server.S3Server.create_bucket`).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hack.cluster import free_port, spawn, stop_process, wait_http
from hack.s3server import S3Server

REPO = Path(__file__).resolve().parents[1]

__all__ = ["ModelServer", "S3Server", "free_port", "model_server", "s3_server"]


@dataclass(frozen=True)
class ModelServer:
    url: str

    def infer_url(self, model: str = "sklearn-iris") -> str:
        return f"{self.url}/v2/models/{model}/infer"


@pytest.fixture(scope="session")
def model_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelServer]:
    port = free_port()
    log_path = tmp_path_factory.mktemp("model-server") / "server.log"
    process = spawn(
        [sys.executable, "-m", "hack.model_server", "--port", str(port)], log_path, cwd=REPO
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/v2/health/ready", process, log_path, within=120)
        yield ModelServer(url=url)
    finally:
        stop_process(process, grace=15)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    server = S3Server(tmp_path_factory.mktemp("s3-server"))
    server.start()
    try:
        yield server
    finally:
        server.stop()
