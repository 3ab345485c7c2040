"""A model behind an authenticating gateway, from a config: the token, the Host header, no leak.

The gateway (``hack.loopback.AuthProxy``, in front of KServe's model server)
answers 401 unless the request carries the bearer token it expects, as
KServe's ``enable-auth`` does. The runner pod (node agent) gets the token
from a Secret the controller mounts, or as a projected ServiceAccount token
with an audience.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator

import pytest
from kubernetes_asyncio import client

from hack.loopback import AuthProxy
from tests.controllerproc import ControllerProcess
from tests.e2e.conftest import E2E, iris_config, iris_run
from tests.runs import condition, status

TOKEN = "model-token-3b9e61f0c2d7a845"
WRONG = "model-token-wrong-77aa01de9c3b"
HOST = "sklearn-iris.models.example.com"


@pytest.fixture
async def gateway(e2e: E2E) -> AsyncIterator[AuthProxy]:
    proxy = AuthProxy(e2e.model_server.url, TOKEN)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.stop()


async def token_secret(e2e: E2E, name: str, token: str) -> None:
    await client.CoreV1Api(e2e.api).create_namespaced_secret(
        e2e.namespace,
        {"metadata": {"name": name}, "stringData": {"token": token}},
    )


def auth_config(name: str, gateway: AuthProxy, auth: dict[str, object]) -> dict[str, object]:
    config = iris_config(name, f"{gateway.url}/v2/models/sklearn-iris/infer")
    config["spec"]["kserve"]["auth"] = auth
    config["spec"]["kserve"]["headers"] = {"Host": HOST}
    return config


async def everything_said(e2e: E2E, controller: ControllerProcess, run: str) -> str:
    """The run and its config as stored, the namespace's Events, the contract and the logs."""
    events = await client.CoreV1Api(e2e.api).list_namespaced_event(e2e.namespace)
    configmaps = await client.CoreV1Api(e2e.api).list_namespaced_config_map(e2e.namespace)
    stored = [await e2e.runs.get(run), await e2e.runs.get("cfg", "inferenceconfigs")]
    return "\n".join(
        [
            json.dumps(stored),
            *(f"{e.reason} {e.message}" for e in events.items),
            *(json.dumps(c.data) for c in configmaps.items),
            controller.output(),
        ]
    )


async def test_a_token_from_a_secret_and_a_host_header_reach_the_model(
    e2e: E2E, iris: list[list[float]], gateway: AuthProxy, controller: ControllerProcess
) -> None:
    await token_secret(e2e, "model-token", TOKEN)
    config = auth_config("cfg", gateway, {"bearerTokenSecretRef": {"name": "model-token"}})
    done = await e2e.finish(config, iris_run("run", "cfg"), "Succeeded", within=120)
    assert status(done)["result"]["predictions"] == len(iris)
    assert set(gateway.tokens) == {TOKEN}
    assert set(gateway.hosts) == {HOST}
    assert status(done)["contract"]["kserve"]["transport"] == {
        "headers": {"Host": HOST},
        "tokenFile": "/var/run/secrets/kserve-inference/model-token/token",
    }
    assert TOKEN not in await everything_said(e2e, controller, "run")


async def test_a_wrong_token_fails_the_run_as_model_auth_failed_without_showing_it(
    e2e: E2E, iris: list[list[float]], gateway: AuthProxy, controller: ControllerProcess
) -> None:
    await token_secret(e2e, "model-token", WRONG)
    config = auth_config("cfg", gateway, {"bearerTokenSecretRef": {"name": "model-token"}})
    failed = await e2e.finish(config, iris_run("run", "cfg"), "Failed", within=120)
    assert status(failed)["reason"] == "ModelAuthFailed"
    assert "model answered 401: Jwt verification fails" in status(failed)["message"]
    assert condition(failed, "Failed")["reason"] == "ModelAuthFailed"  # type: ignore[index]
    assert WRONG in gateway.tokens  # sent, and refused
    assert WRONG not in await everything_said(e2e, controller, "run")


async def test_a_projected_service_account_token_carries_its_audience(
    e2e: E2E, iris: list[list[float]], gateway: AuthProxy, controller: ControllerProcess
) -> None:
    gateway.token = None  # any bearer token: the test reads what came
    audience = "sklearn-iris.models.example.com"
    config = auth_config("cfg", gateway, {"serviceAccountToken": {"audience": audience}})
    await e2e.finish(config, iris_run("run", "cfg"), "Succeeded", within=120)
    assert gateway.tokens
    jwt = gateway.tokens[0]
    payload = jwt.split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    assert claims["aud"] == [audience]
    assert claims["sub"].startswith(f"system:serviceaccount:{e2e.namespace}:")
