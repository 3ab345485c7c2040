"""Fixtures for runs of the real runner against real loopback servers.

- ``model_server``: KServe's own model server (``python -m hack.model_server``) in a
  subprocess, started once per session (it needs seconds to start) and killed
  with its whole process group at the end.
- ``storage``: the finops-database-handler look-alike (``hack.storage_service``)
  on a fresh SQLite file, in the test's event loop (:func:`storage_service`).
- ``fault_proxy``: a ``hack.loopback.FaultProxy`` in front of the model server that
  answers some requests itself with 500/503/429 (or any status) or a reset connection.
- ``postgres_server``, ``postgres`` (:mod:`tests.servers`): a private PostgreSQL
  cluster started once per session, and a fresh database of it for one test.
- ``InMemorySecrets``: the tests' Secret source, handed to the runner in code.
- ``small_disk``: mounts size-limited filesystems (tmpfs, root only) for a store
  that runs out of space, and resizes them to free it again.
- ``world``: one test's storage and model server, and in-process runs of the runner
  (``runner.app.run``) or its check (``runner.check.run``) against them, each
  returning the exit code, the termination message and everything printed; or a
  run in a process of its own for a test to kill (``World.start_killable``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from contract.progress import Progress, last_progress
from hack.loopback import FaultProxy
from hack.storage_service import IRIS_COLUMNS, StorageService
from runner import app, logs
from runner import check as config_check
from runner.secrets import SecretError
from tests.servers import ModelServer, OpenAIServer, running

REPO = Path(__file__).resolve().parents[2]
STORAGE_USER = "finops"
STORAGE_PASSWORD = "storage-pw-7f3a"
STORAGE_SECRET = "finops-database-handler-endpoint"
SECRET_NAMESPACE = "krateo-system"


def runner_cli(
    *args: str, env: Mapping[str, str] | None = None, check: bool = False
) -> subprocess.CompletedProcess[str]:
    """``python -m runner <args>`` run from the repository, its output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "runner", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=check,
    )


@contextlib.asynccontextmanager
async def storage_service(
    db: Path, password: str = STORAGE_PASSWORD, tls: ssl.SSLContext | None = None
) -> AsyncIterator[StorageService]:
    """The storage look-alike on ``db``, for :data:`STORAGE_USER` with ``password``."""
    service = StorageService(db, STORAGE_USER, password)
    await service.start(tls=tls)
    try:
        yield service
    finally:
        await service.stop()


@pytest.fixture
async def storage(tmp_path: Path) -> AsyncIterator[StorageService]:
    async with storage_service(tmp_path / "storage.sqlite") as service:
        yield service


class SmallDisk:
    """tmpfs mounts of a fixed size: where a real server's writes fail with ENOSPC.

    Needs root (``mount``); where that is missing the test skips saying so, and
    under ``CI=true`` fails instead. Every mount is undone when the test ends.
    """

    def __init__(self) -> None:
        self.mounts: list[Path] = []

    def mount(self, path: Path, size: str, owner: tuple[int, int] | None = None) -> Path:
        """A ``size`` (``64k``, ``8m``) tmpfs on ``path`` (made if missing), owned by ``owner``."""
        if os.geteuid() != 0:
            message = "a store out of space needs a small filesystem: mount needs root"
            if os.environ.get("CI") == "true":
                pytest.fail(f"{message} (CI=true: it must run)", pytrace=False)
            pytest.skip(message)
        path.mkdir(parents=True, exist_ok=True)
        options = f"size={size},mode=0700"
        if owner is not None:
            options += f",uid={owner[0]},gid={owner[1]}"
        subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], check=True)
        self.mounts.append(path)
        return path

    def resize(self, path: Path, size: str) -> None:
        subprocess.run(["mount", "-o", f"remount,size={size}", str(path)], check=True)

    def unmount_all(self) -> None:
        for path in reversed(self.mounts):
            if subprocess.run(["umount", str(path)], capture_output=True).returncode:
                subprocess.run(["umount", "-l", str(path)], check=False)
        self.mounts.clear()


@pytest.fixture
def small_disk() -> Iterator[SmallDisk]:
    disk = SmallDisk()
    try:
        yield disk
    finally:
        disk.unmount_all()


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


# What the runner's entry points look like: ``runner.app.run`` and ``runner.check.run``.
Main = Callable[..., Awaitable[int]]


@dataclass
class World:
    """One test's storage and model server, and in-process runs of the runner against them.

    A run's stdout and stderr are captured at the file-descriptor level; its
    Secrets default to the storage's endpoint Secret (:func:`storage_secrets`).
    """

    tmp_path: Path
    capfd: pytest.CaptureFixture[str]
    storage: StorageService
    model_server: ModelServer

    def seed_random_iris(self, table: str, count: int, seed: int = 11) -> list[list[float]]:
        """``count`` rows of :func:`random_iris_rows` stored as the storage's ``table``."""
        rows = random_iris_rows(count, seed)
        self.storage.seed_table(table, IRIS_COLUMNS, rows)
        return rows

    async def run(
        self,
        contract: Mapping[str, Any] | bytes,
        secrets: Any = None,
        *,
        env: Mapping[str, str] | None = None,
        log_level: str = "info",
    ) -> Outcome:
        """One in-process run of ``runner.app.run``, as the pod ``pod-0a1b`` unless ``env`` says."""
        environ = {"pod_uid": "pod-0a1b", **(env or {})}
        return await self._call(app.run, contract, secrets, environ, log_level)

    async def run_shard(self, contract: Mapping[str, Any], index: int) -> Outcome:
        """The run of shard ``index``: an Indexed Job's pod ``pod-<index>``."""
        env = {"JOB_COMPLETION_INDEX": str(index), "pod_uid": f"pod-{index}"}
        return await self.run(contract, env=env)

    async def check(self, contract: Mapping[str, Any], secrets: Any = None) -> Outcome:
        """One in-process ``python -m runner --check`` (``runner.check.run``)."""
        return await self._call(config_check.run, contract, secrets, {})

    async def start_killable(
        self, contract: Mapping[str, Any], secrets: InMemorySecrets, *, stderr: int | None = None
    ) -> asyncio.subprocess.Process:
        """A run in a process of its own (the pod ``pod-killed``), for a test to kill mid-run.

        Its ``secrets`` travel in its environment; its stdout is dropped, and its
        stderr (its log) too unless ``stderr`` says where.
        """
        contract_file = self.tmp_path / "killed.json"
        contract_file.write_bytes(orjson.dumps(contract))
        given = {f"{ns}/{name}": data for (ns, name), data in secrets.secrets.items()}
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            _KILLABLE_RUNNER,
            cwd=REPO,
            env={
                "PATH": os.environ.get("PATH", ""),
                "CONTRACT_PATH": str(contract_file),
                "TERMINATION_LOG_PATH": str(self.tmp_path / "killed-termination"),
                "pod_uid": "pod-killed",
                "TEST_SECRETS": orjson.dumps(given).decode(),
            },
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL if stderr is None else stderr,
        )

    async def _call(
        self,
        main: Main,
        contract: Mapping[str, Any] | bytes,
        secrets: Any,
        env: Mapping[str, str],
        log_level: str = "info",
    ) -> Outcome:
        contract_file = self.tmp_path / "contract.json"
        contract_file.write_bytes(
            contract if isinstance(contract, bytes) else orjson.dumps(contract)
        )
        termination_file = self.tmp_path / "termination-log"
        termination_file.unlink(missing_ok=True)
        environ = {
            "CONTRACT_PATH": str(contract_file),
            "TERMINATION_LOG_PATH": str(termination_file),
            "PATH": os.environ.get("PATH", ""),
            **env,
        }
        if secrets is None:
            secrets = storage_secrets(self.storage.url)
        self.capfd.readouterr()
        logs.configure(log_level)
        code = await main(environ, secrets=secrets)
        captured = self.capfd.readouterr()
        return Outcome(
            exit_code=code,
            termination=termination_file.read_text() if termination_file.exists() else "",
            stdout=captured.out,
            stderr=captured.err,
        )


# The runner of World.start_killable, its Secrets read from TEST_SECRETS.
_KILLABLE_RUNNER = """
import asyncio, os, sys
import orjson
from runner import app, logs

class Secrets:
    async def read(self, namespace, name):
        return orjson.loads(os.environ["TEST_SECRETS"])[f"{namespace}/{name}"]

logs.configure("info")
sys.exit(asyncio.run(app.run(os.environ, secrets=Secrets())))
"""


@pytest.fixture
def world(
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    storage: StorageService,
    model_server: ModelServer,
) -> World:
    return World(tmp_path, capfd, storage, model_server)


@pytest.fixture
def llm(
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    storage: StorageService,
    openai_server: OpenAIServer,
) -> World:
    """A world whose model is the OpenAI-compatible test server."""
    return World(tmp_path, capfd, storage, ModelServer(openai_server.url))


@pytest.fixture
async def fault_proxy(model_server: ModelServer) -> AsyncIterator[FaultProxy]:
    async with running(FaultProxy(model_server.url)) as proxy:
        yield proxy


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
