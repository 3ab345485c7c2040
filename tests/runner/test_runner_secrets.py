"""A canary credential never appears in anything the runner writes."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from hack.storage_service import StorageService
from runner.exitcodes import ExitCode
from tests.runner.conftest import (
    SECRET_NAMESPACE,
    STORAGE_SECRET,
    STORAGE_USER,
    InMemorySecrets,
    iris_contract,
    run_runner,
)
from tests.servers import ModelServer, free_port


@pytest.fixture
def canary() -> str:
    return f"canary-{uuid.uuid4().hex}"


def secret(**data: str) -> InMemorySecrets:
    return InMemorySecrets({(SECRET_NAMESPACE, STORAGE_SECRET): data})


async def canary_storage(tmp_path: Path, canary: str) -> StorageService:
    service = StorageService(tmp_path / "canary.sqlite", STORAGE_USER, canary)
    await service.start()
    service.seed_iris("iris")
    return service


@pytest.mark.parametrize("log_level", ["debug", "info"])
async def test_a_successful_run_never_shows_the_password(
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    model_server: ModelServer,
    canary: str,
    log_level: str,
) -> None:
    storage = await canary_storage(tmp_path, canary)
    try:
        outcome = await run_runner(
            tmp_path,
            iris_contract(model_server.infer_url()),
            secret(**{"server-url": storage.url, "username": STORAGE_USER, "password": canary}),
            capfd,
            log_level=log_level,
        )
    finally:
        await storage.stop()

    assert outcome.exit_code == ExitCode.DONE, outcome.termination
    assert len(storage.predictions("iris_predictions")) == 150
    for output in (outcome.stdout, outcome.stderr, outcome.termination):
        assert canary not in output


async def test_a_refused_password_is_reported_without_it(
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    model_server: ModelServer,
    canary: str,
) -> None:
    storage = await canary_storage(tmp_path, "the-real-password")
    try:
        outcome = await run_runner(
            tmp_path,
            iris_contract(model_server.infer_url()),
            secret(**{"server-url": storage.url, "username": STORAGE_USER, "password": canary}),
            capfd,
        )
    finally:
        await storage.stop()

    # A wrong password stays wrong: the Job is failed at once, not retried.
    assert outcome.exit_code == ExitCode.INPUT_REJECTED
    assert outcome.termination.endswith("answered 401: Unauthorized Access")
    for output in (outcome.stdout, outcome.stderr, outcome.termination):
        assert canary not in output


@pytest.mark.parametrize(
    "data",
    [
        pytest.param({"token": "{c}", "password": "{c}-2"}, id="token-and-password"),
        pytest.param({"insecure": "{c}"}, id="bad-boolean"),
        pytest.param({"proxy-url": "socks5://u:{c}@127.0.0.1:1"}, id="proxy-with-password"),
        pytest.param({"certificate-authority-data": "{c}"}, id="bad-ca"),
    ],
)
async def test_secret_problems_are_reported_without_the_secret(
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    model_server: ModelServer,
    canary: str,
    data: dict[str, str],
) -> None:
    values = {key: value.format(c=canary) for key, value in data.items()}
    values["server-url"] = "https://127.0.0.1:1"

    outcome = await run_runner(
        tmp_path, iris_contract(model_server.infer_url()), secret(**values), capfd
    )

    assert outcome.exit_code == ExitCode.INPUT
    for output in (outcome.stdout, outcome.stderr, outcome.termination):
        assert canary not in output


async def test_credentials_in_the_server_url_are_used_and_never_shown(
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    model_server: ModelServer,
    canary: str,
) -> None:
    storage = await canary_storage(tmp_path, canary)
    host = storage.url.removeprefix("http://")
    try:
        outcome = await run_runner(
            tmp_path,
            iris_contract(model_server.infer_url()),
            secret(**{"server-url": f"http://{STORAGE_USER}:{canary}@{host}"}),
            capfd,
        )
    finally:
        await storage.stop()

    assert outcome.exit_code == ExitCode.DONE, outcome.termination
    for output in (outcome.stdout, outcome.stderr, outcome.termination):
        assert canary not in output


async def test_an_unreachable_server_url_with_credentials_is_reported_without_them(
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    model_server: ModelServer,
    canary: str,
) -> None:
    url = f"http://{STORAGE_USER}:{canary}@127.0.0.1:{free_port()}"

    outcome = await run_runner(
        tmp_path, iris_contract(model_server.infer_url()), secret(**{"server-url": url}), capfd
    )

    assert outcome.exit_code == ExitCode.INPUT
    assert "cannot connect" in outcome.termination
    for output in (outcome.stdout, outcome.stderr, outcome.termination):
        assert canary not in output
