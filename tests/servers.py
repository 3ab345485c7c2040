"""Loopback servers shared by the runner and end-to-end tests.

``model_server``: KServe's own model server (``python -m hack.model_server``,
iris and TTM models trained at start) in a subprocess, started once per test
session (it needs seconds to start) and stopped with its whole process group.

``openai_server``: an OpenAI-compatible server on KServe's OpenAI types
(``python -m hack.openai_server``, the deterministic ``echo`` model), one per
session; its faults are set per test over HTTP (:meth:`OpenAIServer.fault`).

``s3_server``: a real S3 server (versitygw's POSIX backend, :mod:`hack.s3server`)
on a temporary directory, one per session; each test makes its own bucket
(:meth:`hack.s3server.S3Server.create_bucket`).

``postgres_server``: a private PostgreSQL cluster (:mod:`hack.postgres`), started
once per session as an unprivileged user, TLS or not (``postgres_pki``);
``postgres``: a fresh database of it for one test (:class:`Database`).
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import aiohttp
import pytest

from hack.cluster import free_port, spawn, stop_process, wait_http
from hack.pki import Pki, make_pki
from hack.postgres import PostgresServer
from hack.s3server import S3Server

REPO = Path(__file__).resolve().parents[1]


class Server(Protocol):
    async def start(self) -> object: ...

    async def stop(self) -> None: ...


ServerT = TypeVar("ServerT", bound=Server)


@contextlib.asynccontextmanager
async def running(server: ServerT) -> AsyncIterator[ServerT]:
    """``server`` started, and stopped on the way out whatever happens."""
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


__all__ = [
    "Database",
    "ModelServer",
    "OpenAIServer",
    "S3Server",
    "free_port",
    "model_server",
    "openai_server",
    "postgres",
    "postgres_pki",
    "postgres_server",
    "s3_server",
]


@dataclass(frozen=True)
class ModelServer:
    url: str

    def infer_url(self, model: str = "sklearn-iris") -> str:
        return f"{self.url}/v2/models/{model}/infer"


@contextlib.contextmanager
def loopback_server(module: str, ready_path: str, log_dir: Path) -> Iterator[str]:
    """``python -m module --port PORT`` on a free port, its log in ``log_dir``; its URL.

    Yields once ``ready_path`` answers (two minutes at the most); stopped after.
    """
    port = free_port()
    log_path = log_dir / "server.log"
    process = spawn([sys.executable, "-m", module, "--port", str(port)], log_path, cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}{ready_path}", process, log_path, within=120)
        yield url
    finally:
        stop_process(process, grace=15)


@pytest.fixture(scope="session")
def model_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelServer]:
    log_dir = tmp_path_factory.mktemp("model-server")
    with loopback_server("hack.model_server", "/v2/health/ready", log_dir) as url:
        yield ModelServer(url=url)


@dataclass(frozen=True)
class OpenAIServer:
    url: str

    @property
    def base_url(self) -> str:
        """The OpenAI API's base, on KServe's route prefix."""
        return f"{self.url}/openai/v1"

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{self.url}{path}", json=body) as response,
        ):
            response.raise_for_status()
            answer: dict[str, Any] = await response.json()
            return answer

    async def fault(self, status: int, count: int, retry_after: str | None = None) -> None:
        """Answer the next ``count`` model requests with ``status`` (and ``Retry-After``)."""
        await self._post(
            "/admin/faults", {"status": status, "count": count, "retryAfter": retry_after}
        )

    async def reset(self) -> None:
        await self._post("/admin/reset", {})

    async def stats(self) -> dict[str, int]:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{self.url}/admin/stats") as response,
        ):
            response.raise_for_status()
            answer: dict[str, int] = await response.json()
            return answer


@pytest.fixture(scope="session")
def openai_server_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpenAIServer]:
    log_dir = tmp_path_factory.mktemp("openai-server")
    with loopback_server("hack.openai_server", "/openai/v1/models", log_dir) as url:
        yield OpenAIServer(url=url)


@pytest.fixture
async def openai_server(openai_server_process: OpenAIServer) -> OpenAIServer:
    """The session's OpenAI server, its faults and counters cleared for this test."""
    await openai_server_process.reset()
    return openai_server_process


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    server = S3Server(tmp_path_factory.mktemp("s3-server"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def postgres_pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A CA and certificates for 127.0.0.1 (``node_cert``: the PostgreSQL server's)."""
    return make_pki(tmp_path_factory.mktemp("postgres-pki"))


@pytest.fixture(scope="session")
def postgres_server(postgres_pki: Pki) -> Iterator[PostgresServer]:
    """One PostgreSQL server for the session (``initdb`` takes seconds), TLS or not."""
    server = PostgresServer(tls=(postgres_pki.node_cert, postgres_pki.node_key))
    server.start()
    try:
        yield server
    finally:
        server.remove()


@dataclass(frozen=True)
class Database:
    """One test's database on the session's server."""

    server: PostgresServer
    name: str

    def execute(self, statement: str, rows: Any = ()) -> None:
        self.server.execute(self.name, statement, rows)

    def query(self, statement: str) -> list[tuple[object, ...]]:
        return self.server.query(self.name, statement)


@pytest.fixture
def postgres(postgres_server: PostgresServer, request: pytest.FixtureRequest) -> Database:
    """A fresh database named after the test, on the session's server."""
    name = re.sub(r"[^a-z0-9_]", "_", request.node.name.lower())[:40]
    digest = hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:8]
    return Database(postgres_server, postgres_server.create_database(f"t_{name}_{digest}"))
