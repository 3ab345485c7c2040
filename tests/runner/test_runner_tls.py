"""Storage over TLS: the Secret's CA is trusted (upstream ignored it without a client cert)."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from contract.exitcodes import ExitCode
from hack.pki import Pki, make_pki
from hack.storage_service import StorageService
from tests.runner.conftest import (
    World,
    iris_contract,
    storage_secrets,
    storage_service,
)


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki")


@pytest.fixture
async def tls_storage(tmp_path: Path, pki: Pki) -> AsyncIterator[StorageService]:
    context = pki.loopback_server_context()
    async with storage_service(tmp_path / "tls.sqlite", tls=context) as service:
        service.seed_iris("iris")
        yield service


@pytest.mark.parametrize("encoding", ["pem", "base64-of-pem"])
async def test_the_secrets_ca_is_trusted(
    world: World, tls_storage: StorageService, pki: Pki, encoding: str
) -> None:
    ca = pki.ca_cert.read_text()
    if encoding == "base64-of-pem":
        ca = base64.b64encode(ca.encode()).decode()
    secrets = storage_secrets(tls_storage.url)
    for data in secrets.secrets.values():
        data["certificate-authority-data"] = ca

    outcome = await world.run(iris_contract(world.model_server.infer_url()), secrets)

    assert tls_storage.url.startswith("https://")
    assert outcome.exit_code == ExitCode.DONE, outcome.termination
    assert len(tls_storage.predictions("iris_predictions")) == 150


async def test_an_unknown_ca_fails_at_once_without_retries(
    world: World, tls_storage: StorageService
) -> None:
    outcome = await world.run(
        iris_contract(world.model_server.infer_url()), storage_secrets(tls_storage.url)
    )

    assert outcome.exit_code == ExitCode.INPUT
    assert "TLS failed" in outcome.termination
    assert "CERTIFICATE_VERIFY_FAILED" in outcome.termination
    assert tls_storage.calls["sklearninput"] == 0
    assert not [e for e in outcome.events() if e["event"] == "storage request failed, retrying"]


async def test_insecure_skips_verification(world: World, tls_storage: StorageService) -> None:
    secrets = storage_secrets(tls_storage.url)
    for data in secrets.secrets.values():
        data["insecure"] = "true"

    outcome = await world.run(iris_contract(world.model_server.infer_url()), secrets)

    assert outcome.exit_code == ExitCode.DONE, outcome.termination
