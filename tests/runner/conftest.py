"""Fixtures for runs of the real runner against real loopback servers.

- ``model_server``: KServe's own model server (``python -m hack.model_server``) in a
  subprocess, started once per session (it needs seconds to start) and killed
  with its whole process group at the end.
- ``storage``: the finops-database-handler look-alike (``hack.storage_service``)
  on a fresh SQLite file, in the test's event loop.
- ``FaultProxy``: a loopback proxy in front of the model server that answers
  some requests itself with 500/503/429 (or any status) or a reset connection.
- ``InMemorySecrets``: the tests' Secret source, handed to the runner in code.
- ``run_runner``: one in-process run of ``runner.app.run`` with a contract dict,
  returning the exit code, the termination message and everything printed.
"""

from __future__ import annotations

import os
import random
import socket
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import orjson
import pytest
from aiohttp import web

from hack.storage_service import StorageService
from runner import app, logs
from runner.progress import Progress, last_progress
from runner.secrets import SecretError
from tests.servers import ModelServer

REPO = Path(__file__).resolve().parents[2]
STORAGE_USER = "finops"
STORAGE_PASSWORD = "storage-pw-7f3a"
STORAGE_SECRET = "finops-database-handler-endpoint"
SECRET_NAMESPACE = "krateo-system"


@pytest.fixture
async def storage(tmp_path: Path) -> AsyncIterator[StorageService]:
    service = StorageService(tmp_path / "storage.sqlite", STORAGE_USER, STORAGE_PASSWORD)
    await service.start()
    try:
        yield service
    finally:
        await service.stop()


class InMemorySecrets:
    """A Secret source for tests: ``{(namespace, name): {key: value}}``."""

    def __init__(self, secrets: Mapping[tuple[str, str], Mapping[str, str]] | None = None) -> None:
        self.secrets = {key: dict(value) for key, value in (secrets or {}).items()}
        self.reads: list[tuple[str, str]] = []

    async def read(self, namespace: str, name: str) -> Mapping[str, str]:
        self.reads.append((namespace, name))
        try:
            return self.secrets[(namespace, name)]
        except KeyError:
            raise SecretError(f"Secret {namespace}/{name} not found") from None


def storage_secrets(url: str, password: str = STORAGE_PASSWORD) -> InMemorySecrets:
    return InMemorySecrets(
        {
            (SECRET_NAMESPACE, STORAGE_SECRET): {
                "server-url": url,
                "username": STORAGE_USER,
                "password": password,
            }
        }
    )


def krateo_entry(path: str, **extra: Any) -> dict[str, Any]:
    return {
        "krateo": {
            "api": {
                "endpointRef": {"name": STORAGE_SECRET, "namespace": SECRET_NAMESPACE},
                "path": path,
                "verb": "POST",
                "headers": ["Accept: application/json"],
            },
            **extra,
        }
    }


def iris_contract(
    model_url: str,
    *,
    input_table: str = "iris",
    output_table: str = "iris_predictions",
    **extra: Any,
) -> dict[str, Any]:
    return {
        "jobId": "3f1c2a9e-job",
        "jobName": "inf-iris-3f1c2a9e",
        "kserve": {"modelName": "sklearn-iris", "modelUrl": model_url, "modelVersion": "v2"},
        "input": krateo_entry("/compute/sklearninput"),
        "output": krateo_entry("/compute/sklearnoutput"),
        "parameters": {"input_table_name": input_table, "output_table_name": output_table},
        **extra,
    }


@dataclass(frozen=True)
class Outcome:
    exit_code: int
    termination: str
    stdout: str
    stderr: str

    @property
    def result(self) -> dict[str, Any]:
        parsed = orjson.loads(self.termination)
        assert isinstance(parsed, dict)
        return parsed

    @property
    def progress(self) -> Progress | None:
        return last_progress(self.stdout)

    def events(self) -> list[dict[str, Any]]:
        return [orjson.loads(line) for line in self.stdout.splitlines() if line.startswith("{")]


async def run_runner(
    tmp_path: Path,
    contract: Mapping[str, Any] | bytes,
    secrets: Any,
    capfd: pytest.CaptureFixture[str],
    env: Mapping[str, str] | None = None,
    log_level: str = "info",
) -> Outcome:
    """One in-process run; stdout/stderr are captured at the file-descriptor level."""
    contract_file = tmp_path / "contract.json"
    contract_file.write_bytes(contract if isinstance(contract, bytes) else orjson.dumps(contract))
    termination_file = tmp_path / "termination-log"
    termination_file.unlink(missing_ok=True)
    environ = {
        "CONTRACT_PATH": str(contract_file),
        "TERMINATION_LOG_PATH": str(termination_file),
        "pod_uid": "pod-0a1b",
        "PATH": os.environ.get("PATH", ""),
        **(env or {}),
    }
    capfd.readouterr()
    logs.configure(log_level)
    code = await app.run(environ, secrets=secrets)
    captured = capfd.readouterr()
    return Outcome(
        exit_code=code,
        termination=termination_file.read_text() if termination_file.exists() else "",
        stdout=captured.out,
        stderr=captured.err,
    )


class FaultProxy:
    """Forwards to ``target``; answers a ``rate`` share of requests itself with a fault.

    Faults cycle through ``kinds``: by default 500, 503, 429 (with ``Retry-After:
    0``) and a reset connection; any other status given as a string is answered
    as it is. A fault's body is ``{"error": "injected <kind>"}``; with ``echo`` the
    error text goes on to quote the request's whole body, as some servers do.
    ``seen`` counts requests per path; ``faults`` counts faults by kind.
    """

    KINDS = ("500", "503", "429", "reset")

    def __init__(self, target: str, rate: float = 0.0, seed: int = 7) -> None:
        self.target = target.rstrip("/")
        self.rate = rate
        self.kinds: tuple[str, ...] = self.KINDS
        self.echo = False
        self.rng = random.Random(seed)
        self.seen: Counter[str] = Counter()
        self.faults: Counter[str] = Counter()
        self.forwarded_rows = 0
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> str:
        app_ = web.Application(client_max_size=1 << 30)
        app_.router.add_route("*", "/{tail:.*}", self._handle)
        self._session = aiohttp.ClientSession()
        self._runner = web.AppRunner(app_, access_log=None)
        await self._runner.setup()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        await web.SockSite(self._runner, sock).start()
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.seen[request.path] += 1
        body = await request.read()
        if request.method == "POST" and self.rng.random() < self.rate:
            kind = self.kinds[sum(self.faults.values()) % len(self.kinds)]
            self.faults[kind] += 1
            if kind == "reset":
                assert request.transport is not None
                request.transport.abort()
                # The client sees a dropped connection; aiohttp only needs an answer object.
                return web.Response(status=500)
            headers = {"Retry-After": "0"} if kind == "429" else {}
            error = f"injected {kind}"
            if self.echo:
                error += f": cannot process request {body.decode()}"
            return web.json_response({"error": error}, status=int(kind), headers=headers)
        assert self._session is not None
        async with self._session.request(
            request.method,
            f"{self.target}{request.path_qs}",
            data=body,
            headers={"Content-Type": request.headers.get("Content-Type", "application/json")},
        ) as answer:
            payload = await answer.read()
            if request.method == "POST" and answer.status == 200:
                inputs = orjson.loads(body).get("inputs") or [{}]
                self.forwarded_rows += int((inputs[0].get("shape") or [0])[0])
            return web.Response(
                status=answer.status,
                body=payload,
                content_type=answer.content_type,
            )


@pytest.fixture
async def fault_proxy(model_server: ModelServer) -> AsyncIterator[FaultProxy]:
    proxy = FaultProxy(model_server.url)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.stop()


def random_iris_rows(count: int, seed: int = 11) -> list[list[float]]:
    """Rows spread over iris' feature ranges, so all three classes come up in any order."""
    rng = np.random.default_rng(seed)
    low, high = np.array([4.3, 2.0, 1.0, 0.1]), np.array([7.9, 4.4, 6.9, 2.5])
    values = rng.uniform(low, high, size=(count, 4)).round(1)
    return [[float(v) for v in row] for row in values]


def direct_iris(rows: list[list[float]]) -> list[float]:
    """What the model predicts for ``rows``, computed locally by the same classifier."""
    from hack.model_server import iris_predict

    return [float(v) for v in iris_predict(rows)]
