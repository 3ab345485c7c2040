"""A model behind an authenticating gateway, from a config: the token, the Host header, no leak.

The gateway (``hack.loopback.AuthProxy``, in front of KServe's model server)
answers 401 unless the request carries the bearer token it expects, as
KServe's ``enable-auth`` does. The runner pod (node agent) gets the token
from a Secret the controller mounts, or as a projected ServiceAccount token
with an audience.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client, watch

from hack.controllerproc import ControllerProcess
from hack.loopback import AuthProxy
from hack.pki import Pki, make_pki
from tests.e2e.conftest import E2E, iris_config, iris_run
from tests.e2e.test_probe_job import probed
from tests.kubehelpers import wait_for_events
from tests.runs import condition, status
from tests.servers import running

TOKEN = "model-token-3b9e61f0c2d7a845"
WRONG = "model-token-wrong-77aa01de9c3b"
HOST = "sklearn-iris.models.example.com"


@pytest.fixture
async def gateway(e2e: E2E) -> AsyncIterator[AuthProxy]:
    async with running(AuthProxy(e2e.model_server.url, TOKEN)) as proxy:
        yield proxy


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


class ProbeLogs:
    """The logs of a namespace's probe pods, read while they exist (the controller deletes them).

    A pod's log is read on every change the pods' watch brings until its
    container has ended, then once more: ``logs`` holds the last read of each
    pod, ``ended`` the pods whose log was read after their container ended. A
    watch, not a poll: the ending is seen as it happens, and the log read at
    once, before the controller's clean-up takes the pod away.
    """

    SELECTOR = "app.kubernetes.io/component=inference-probe"

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.core = client.CoreV1Api(api)
        self.namespace = namespace
        self.logs: dict[str, str] = {}
        self.ended: set[str] = set()

    async def _look(self, pod: Any) -> None:
        name = pod.metadata.name
        states = [s.state for s in pod.status.container_statuses or []]
        if name in self.ended or not states:
            return
        ended = all(s.terminated is not None for s in states)
        with contextlib.suppress(client.ApiException):  # not started yet, or deleted
            self.logs[name] = await self.core.read_namespaced_pod_log(name, self.namespace)
            if ended:
                self.ended.add(name)

    async def follow(self) -> None:
        while True:  # a watch the API server ends is started again
            with contextlib.suppress(client.ApiException):
                stream = watch.Watch().stream(
                    self.core.list_namespaced_pod,
                    self.namespace,
                    label_selector=self.SELECTOR,
                    timeout_seconds=300,
                )
                async for event in stream:
                    await self._look(event["object"])


async def test_the_probe_reports_a_refused_token_by_name_without_showing_it(
    e2e: E2E, gateway: AuthProxy, probing_controller: ControllerProcess
) -> None:
    await token_secret(e2e, "model-token", WRONG)
    config = auth_config("cfg", gateway, {"bearerTokenSecretRef": {"name": "model-token"}})
    logs = ProbeLogs(e2e.api, e2e.namespace)
    follower = asyncio.create_task(logs.follow())
    try:
        await e2e.runs.create(config)
        result = await probed(e2e.runs, "cfg")
        for _ in range(300):  # the last read of the pod's log, if it is not in yet
            if logs.ended:
                break
            await asyncio.sleep(0.1)
    finally:
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follower
    assert (result["status"], result["reason"]) == ("False", "ModelAuthFailed"), result
    assert "probe exited with code 9" in result["message"]
    assert "the model refused access (see kserve.auth)" in result["message"]
    assert "answered 401: Jwt verification fails" in result["message"]
    assert WRONG in gateway.tokens  # sent by the probe, and refused
    assert set(gateway.hosts) == {HOST}

    # The Event is recorded after the status write, so it may come a moment later.
    await wait_for_events(
        e2e.api, e2e.namespace, "cfg", "ModelAuthFailed", what="the ModelAuthFailed Event"
    )
    events = await client.CoreV1Api(e2e.api).list_namespaced_event(e2e.namespace)
    said = [f"{e.reason} {e.message}" for e in events.items]
    assert any(line.startswith("ModelAuthFailed ") for line in said), said
    assert logs.ended, "no probe pod's log was read after it ended"
    pod_logs = "\n".join(logs.logs[name] for name in logs.ended)
    assert "refused access" in pod_logs, pod_logs
    stored = await e2e.runs.get("cfg", "inferenceconfigs")
    assert stored is not None
    assert WRONG not in json.dumps(stored)
    assert WRONG not in "\n".join(said)
    assert WRONG not in pod_logs
    assert WRONG not in probing_controller.output()


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki")


@pytest.fixture
async def tls_gateway(e2e: E2E, pki: Pki) -> AsyncIterator[AuthProxy]:
    """The gateway over HTTPS, with a certificate for 127.0.0.1 from a CA of the test's own."""
    context = pki.loopback_server_context()
    async with running(AuthProxy(e2e.model_server.url, TOKEN, ssl_context=context)) as proxy:
        yield proxy


async def test_https_to_the_model_with_a_ca_from_a_secret_or_not_verified_with_a_warning(
    e2e: E2E,
    iris: list[list[float]],
    tls_gateway: AuthProxy,
    pki: Pki,
    controller: ControllerProcess,
) -> None:
    assert tls_gateway.url.startswith("https://")
    await token_secret(e2e, "model-token", TOKEN)
    await client.CoreV1Api(e2e.api).create_namespaced_secret(
        e2e.namespace,
        {"metadata": {"name": "model-ca"}, "stringData": {"ca.crt": pki.ca_cert.read_text()}},
    )
    auth = {"bearerTokenSecretRef": {"name": "model-token"}}
    trusted: Any = auth_config("cfg", tls_gateway, auth)
    trusted["spec"]["kserve"]["tls"] = {"caBundle": {"secretRef": {"name": "model-ca"}}}
    done = await e2e.finish(trusted, iris_run("run", "cfg"), "Succeeded", within=120)
    assert status(done)["result"]["predictions"] == len(iris) == 150
    assert status(done)["contract"]["kserve"]["transport"]["caFile"] == (
        "/var/run/secrets/kserve-inference/model-ca/ca.crt"
    )
    assert condition(done, "Warning") is None
    assert tls_gateway.forwarded > 0

    # No CA, no checking: it works, and the config and its run say so for as long as it is set.
    loose: Any = auth_config("loose", tls_gateway, auth)
    loose["spec"]["kserve"]["tls"] = {"insecureSkipVerify": True}
    unchecked = await e2e.finish(
        loose, iris_run("unchecked", "loose", output="unchecked"), "Succeeded", within=120
    )
    assert status(unchecked)["result"]["predictions"] == 150
    warning = condition(unchecked, "Warning")
    assert warning is not None
    assert (warning["status"], warning["reason"]) == ("True", "InsecureSkipVerify")
    config = await e2e.runs.get("loose", "inferenceconfigs")
    assert config is not None
    config_warning = condition(config, "Warning")
    assert config_warning is not None
    assert config_warning["reason"] == "InsecureSkipVerify"
    assert TOKEN not in await everything_said(e2e, controller, "run")
