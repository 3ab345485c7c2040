"""A canary credential never appears in anything the runner writes."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from contract.exitcodes import ExitCode
from hack.storage_service import StorageService
from tests.runner.conftest import (
    SECRET_NAMESPACE,
    STORAGE_SECRET,
    STORAGE_USER,
    InMemorySecrets,
    Outcome,
    World,
    iris_contract,
    storage_service,
)
from tests.servers import free_port


@pytest.fixture
def canary() -> str:
    return f"canary-{uuid.uuid4().hex}"


def secret(**data: str) -> InMemorySecrets:
    return InMemorySecrets({(SECRET_NAMESPACE, STORAGE_SECRET): data})


def assert_not_shown(canary: str, outcome: Outcome) -> None:
    """Nothing the runner wrote (stdout, stderr, the termination message) holds ``canary``."""
    for output in (outcome.stdout, outcome.stderr, outcome.termination):
        assert canary not in output


@contextlib.asynccontextmanager
async def canary_storage(tmp_path: Path, password: str) -> AsyncIterator[StorageService]:
    async with storage_service(tmp_path / "canary.sqlite", password) as service:
        service.seed_iris("iris")
        yield service


@pytest.mark.parametrize("log_level", ["debug", "info"])
async def test_a_successful_run_never_shows_the_password(
    world: World, canary: str, log_level: str
) -> None:
    async with canary_storage(world.tmp_path, canary) as storage:
        outcome = await world.run(
            iris_contract(world.model_server.infer_url()),
            secret(**{"server-url": storage.url, "username": STORAGE_USER, "password": canary}),
            log_level=log_level,
        )

    assert outcome.exit_code == ExitCode.DONE, outcome.termination
    assert len(storage.predictions("iris_predictions")) == 150
    assert_not_shown(canary, outcome)


async def test_a_refused_password_is_reported_without_it(world: World, canary: str) -> None:
    async with canary_storage(world.tmp_path, "the-real-password") as storage:
        outcome = await world.run(
            iris_contract(world.model_server.infer_url()),
            secret(**{"server-url": storage.url, "username": STORAGE_USER, "password": canary}),
        )

    # A wrong password stays wrong: the Job is failed at once, not retried.
    assert outcome.exit_code == ExitCode.INPUT_REJECTED
    assert outcome.termination.endswith("answered 401: Unauthorized Access")
    assert_not_shown(canary, outcome)


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
    world: World, canary: str, data: dict[str, str]
) -> None:
    values = {key: value.format(c=canary) for key, value in data.items()}
    values["server-url"] = "https://127.0.0.1:1"

    outcome = await world.run(iris_contract(world.model_server.infer_url()), secret(**values))

    assert outcome.exit_code == ExitCode.INPUT
    assert_not_shown(canary, outcome)


async def test_credentials_in_the_server_url_are_used_and_never_shown(
    world: World, canary: str
) -> None:
    async with canary_storage(world.tmp_path, canary) as storage:
        host = storage.url.removeprefix("http://")
        outcome = await world.run(
            iris_contract(world.model_server.infer_url()),
            secret(**{"server-url": f"http://{STORAGE_USER}:{canary}@{host}"}),
        )

    assert outcome.exit_code == ExitCode.DONE, outcome.termination
    assert_not_shown(canary, outcome)


async def test_an_unreachable_server_url_with_credentials_is_reported_without_them(
    world: World, canary: str
) -> None:
    url = f"http://{STORAGE_USER}:{canary}@127.0.0.1:{free_port()}"

    outcome = await world.run(
        iris_contract(world.model_server.infer_url()), secret(**{"server-url": url})
    )

    assert outcome.exit_code == ExitCode.INPUT
    assert "cannot connect" in outcome.termination
    assert_not_shown(canary, outcome)
