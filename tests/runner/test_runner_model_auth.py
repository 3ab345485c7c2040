"""The model behind an authenticating gateway: a bearer token, extra headers, TLS.

An ``AuthProxy`` (hack/loopback.py) in front of KServe's model server answers
401 unless the request carries the bearer token it expects, as KServe's
``enable-auth`` gateway does. The runner reads the token from a file (what a
mounted Secret or a projected ServiceAccount token is in a pod) and reads it
again when it changes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from contract.exitcodes import ExitCode
from hack.loopback import AuthProxy
from hack.pki import Pki, make_pki
from tests.runner.conftest import World, iris_contract
from tests.servers import running

TOKEN = "tok-7d41c0a9e2b84f1f"
NEW_TOKEN = "tok-rotated-55e0c3b1a9"
HOST = "sklearn-iris.models.example.com"


def with_transport(
    world: World, proxy: AuthProxy, output: str = "iris_predictions", **transport: Any
) -> dict[str, Any]:
    contract = iris_contract(f"{proxy.url}/v2/models/sklearn-iris/infer", output_table=output)
    contract["kserve"]["transport"] = transport
    return contract


def leaks(outcome: Any, *secrets: str) -> list[str]:
    text = outcome.stdout + outcome.stderr + outcome.termination
    return [s for s in secrets if s in text]


@pytest.fixture
async def gateway(world: World) -> AsyncIterator[AuthProxy]:
    world.storage.seed_iris("iris")
    async with running(AuthProxy(world.model_server.url, TOKEN)) as proxy:
        yield proxy


async def test_the_token_and_the_host_header_reach_the_model(
    world: World, gateway: AuthProxy, tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    contract = with_transport(world, gateway, tokenFile=str(token_file), headers={"Host": HOST})
    outcome = await world.run(contract)
    assert outcome.exit_code == ExitCode.DONE, outcome.termination
    assert outcome.result["predictions"] == 150
    assert gateway.forwarded > 0
    assert gateway.refused == 0
    assert set(gateway.tokens) == {TOKEN}
    assert set(gateway.hosts) == {HOST}
    assert leaks(outcome, TOKEN) == []


async def test_without_the_token_the_gateway_refuses_and_the_run_says_auth(
    world: World, gateway: AuthProxy
) -> None:
    outcome = await world.run(with_transport(world, gateway))
    assert outcome.exit_code == ExitCode.MODEL_AUTH
    assert outcome.termination.startswith(
        "inference: the model refused access (see kserve.auth): model answered 401: Jwt is missing"
    ), outcome.termination


async def test_a_wrong_token_fails_at_once_without_showing_it(
    world: World, gateway: AuthProxy, tmp_path: Path
) -> None:
    wrong = "tok-wrong-0b9f2c66aa71"
    token_file = tmp_path / "token"
    token_file.write_text(wrong)
    outcome = await world.run(with_transport(world, gateway, tokenFile=str(token_file)))
    assert outcome.exit_code == ExitCode.MODEL_AUTH, outcome.termination
    assert outcome.termination.startswith(
        "inference: the model refused access (see kserve.auth): model answered 401: "
        "Jwt verification fails"
    ), outcome.termination
    assert gateway.refused >= 1
    assert wrong in gateway.tokens  # it was sent...
    assert leaks(outcome, wrong) == []  # ...and never printed


async def test_a_rotated_token_is_read_again(
    world: World, gateway: AuthProxy, tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    calls = 0

    def rotate(request: web.Request) -> None:
        # At the third inference request the kubelet writes a new token, and
        # the gateway takes only that one from the next request on.
        nonlocal calls
        if request.method != "POST":
            return
        calls += 1
        if calls == 3:
            token_file.write_text(NEW_TOKEN)
        elif calls == 4:
            gateway.token = NEW_TOKEN

    gateway.on_request = rotate
    contract = with_transport(world, gateway, tokenFile=str(token_file))
    contract["batching"] = {"batchSize": 10, "concurrency": 1}
    outcome = await world.run(contract)
    assert outcome.exit_code == ExitCode.DONE, outcome.termination
    assert gateway.refused == 0
    assert TOKEN in gateway.tokens
    assert NEW_TOKEN in gateway.tokens
    # Read again at once (the fourth request), not at the next attempt.
    assert calls > 4
    assert leaks(outcome, TOKEN, NEW_TOKEN) == []


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki")


@pytest.fixture
async def tls_gateway(world: World, pki: Pki) -> AsyncIterator[AuthProxy]:
    world.storage.seed_iris("iris")
    context = pki.loopback_server_context()
    async with running(AuthProxy(world.model_server.url, None, ssl_context=context)) as proxy:
        yield proxy


async def test_https_with_the_ca_bundle_or_not_verified(
    world: World, tls_gateway: AuthProxy, pki: Pki, tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    assert tls_gateway.url.startswith("https://")
    unknown = await world.run(with_transport(world, tls_gateway, tokenFile=str(token_file)))
    assert unknown.exit_code == ExitCode.INFERENCE, unknown.termination
    assert "TLS" in unknown.termination
    trusted = await world.run(
        with_transport(world, tls_gateway, tokenFile=str(token_file), caFile=str(pki.ca_cert))
    )
    assert trusted.exit_code == ExitCode.DONE, trusted.termination
    unverified = await world.run(
        with_transport(
            world, tls_gateway, "unverified", tokenFile=str(token_file), insecureSkipVerify=True
        )
    )
    assert unverified.exit_code == ExitCode.DONE, unverified.termination
