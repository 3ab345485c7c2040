"""``python -m runner --check`` against KServe's model server and the storage look-alike.

A check must say what is wrong with a configuration without moving data: no
notebook runs on the storage (``storage.calls``), no inference request reaches
the model (``fault_proxy.seen``).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from contract.exitcodes import ExitCode
from hack.loopback import FaultProxy, LoopbackApp
from tests.runner.conftest import (
    SECRET_NAMESPACE,
    STORAGE_SECRET,
    InMemorySecrets,
    World,
    iris_contract,
    krateo_entry,
    runner_cli,
    storage_secrets,
)
from tests.servers import free_port, running

INFER = "/v2/models/sklearn-iris/infer"
METADATA = "/v2/models/sklearn-iris"


def config_contract(model_url: str, **kserve: Any) -> dict[str, Any]:
    """What the controller mounts for a check: a run's contract without parameters."""
    contract = iris_contract(model_url)
    del contract["parameters"]
    contract["jobId"] = "5d0c7a2e-config-uid"
    contract["kserve"] = {**contract["kserve"], **kserve}
    return contract


async def test_a_good_config_passes_without_moving_data(
    world: World, fault_proxy: FaultProxy
) -> None:
    contract = config_contract(f"{fault_proxy.url}{INFER}", modelInputName="input-0")

    outcome = await world.check(contract)

    assert outcome.exit_code == ExitCode.DONE, outcome.termination
    assert outcome.result == {
        "check": "ok",
        "protocol": "v2",
        "model": "sklearn-iris",
        "input": "input-0",
        "inputs": [{"name": "input-0", "datatype": "FP32", "shape": [-1, 4]}],
    }
    # The notebooks' names were listed (input and output), none was run.
    assert world.storage.listings == 2
    assert dict(world.storage.calls) == {}
    assert not world.storage.has_table("iris_predictions")
    # One metadata request, no inference.
    assert dict(fault_proxy.seen) == {METADATA: 1}
    passed = {e["step"]: e for e in outcome.events() if e["event"] == "check step passed"}
    assert list(passed) == ["contract", "secrets", "storage", "model"]
    assert passed["secrets"]["read"] == [f"{SECRET_NAMESPACE}/{STORAGE_SECRET}"] * 2


async def test_a_v1_model_is_checked_by_its_v1_metadata(
    world: World, fault_proxy: FaultProxy
) -> None:
    url = f"{fault_proxy.url}/v1/models/sklearn-iris:predict"

    outcome = await world.check(config_contract(url, modelVersion="v1"))

    assert outcome.exit_code == ExitCode.DONE, outcome.termination
    assert outcome.result == {
        "check": "ok",
        "protocol": "v1",
        "model": "sklearn-iris",
        "inputs": [],
    }
    assert dict(fault_proxy.seen) == {"/v1/models/sklearn-iris": 1}


async def test_an_unreachable_model_exits_4(world: World) -> None:
    closed = f"http://127.0.0.1:{free_port()}"

    outcome = await world.check(config_contract(f"{closed}{INFER}"))

    assert outcome.exit_code == ExitCode.INFERENCE
    assert outcome.termination.startswith(f"inference: GET {closed}{METADATA} failed: ")


async def test_a_wrong_model_name_exits_7_naming_it(world: World) -> None:
    contract = config_contract(world.model_server.infer_url("sklearn-irsi"))

    outcome = await world.check(contract)

    assert outcome.exit_code == ExitCode.INFERENCE_REJECTED
    assert outcome.termination.startswith(
        f"inference: model 'sklearn-irsi': GET {world.model_server.url}/v2/models/sklearn-irsi "
        "answered 404: "
    )
    # The model server's own words.
    assert "sklearn-irsi" in outcome.termination.partition("answered 404: ")[2]


async def test_a_wrong_input_name_exits_7_listing_the_models_inputs(
    world: World, fault_proxy: FaultProxy
) -> None:
    contract = config_contract(f"{fault_proxy.url}{INFER}", modelInputName="past_values")

    outcome = await world.check(contract)

    assert outcome.exit_code == ExitCode.INFERENCE_REJECTED
    assert outcome.termination == (
        "inference: model 'sklearn-iris' has no input 'past_values' (kserve.modelInputName); "
        "its inputs: input-0 (FP32 [-1, 4])"
    )
    assert fault_proxy.seen[INFER] == 0


async def test_a_missing_secret_exits_6_naming_it_before_any_request(
    world: World, fault_proxy: FaultProxy
) -> None:
    outcome = await world.check(config_contract(f"{fault_proxy.url}{INFER}"), InMemorySecrets())

    assert outcome.exit_code == ExitCode.INPUT_REJECTED
    assert outcome.termination == f"input: Secret {SECRET_NAMESPACE}/{STORAGE_SECRET} not found"
    assert world.storage.listings == 0
    assert dict(fault_proxy.seen) == {}


async def test_a_missing_output_secret_exits_8(world: World) -> None:
    contract = config_contract(world.model_server.infer_url())
    contract["output"]["krateo"]["api"]["endpointRef"] = {"name": "gone", "namespace": "apps"}

    outcome = await world.check(contract)

    assert outcome.exit_code == ExitCode.OUTPUT_REJECTED
    assert outcome.termination == "output: Secret apps/gone not found"


async def test_storage_unreachable_exits_3(world: World, fault_proxy: FaultProxy) -> None:
    closed = f"http://127.0.0.1:{free_port()}"

    outcome = await world.check(
        config_contract(f"{fault_proxy.url}{INFER}"), storage_secrets(closed)
    )

    assert outcome.exit_code == ExitCode.INPUT
    assert outcome.termination.startswith(f"input: GET {closed}/compute/list: cannot connect: ")
    assert dict(fault_proxy.seen) == {}


async def test_a_refused_password_exits_6(world: World) -> None:
    secrets = storage_secrets(world.storage.url, password="not-the-password")

    outcome = await world.check(config_contract(world.model_server.infer_url()), secrets)

    assert outcome.exit_code == ExitCode.INPUT_REJECTED
    assert outcome.termination == (
        f"input: GET {world.storage.url}/compute/list answered 401: Unauthorized Access "
        "(the credentials are refused)"
    )


async def test_a_notebook_the_handler_lacks_exits_8(world: World) -> None:
    contract = config_contract(world.model_server.infer_url())
    contract["output"] = krateo_entry("/compute/sklearnoutptu")

    outcome = await world.check(contract)

    assert outcome.exit_code == ExitCode.OUTPUT_REJECTED
    assert outcome.termination == (
        f"output: finops-database-handler at {world.storage.url} has no notebook 'sklearnoutptu' "
        "(it has: sklearninput, sklearnoutput, tritoninput, tritonoutput)"
    )
    assert dict(world.storage.calls) == {}


async def test_an_accept_header_the_handler_answers_with_html_exits_6(world: World) -> None:
    contract = config_contract(world.model_server.infer_url())
    contract["input"]["krateo"]["api"]["headers"] = ["Accept: application/json, */*"]

    outcome = await world.check(contract)

    assert outcome.exit_code == ExitCode.INPUT_REJECTED
    assert outcome.termination == (
        "input: api.headers set 'Accept: application/json, */*': finops-database-handler "
        "answers notebook calls as JSON only to 'Accept: application/json', exactly"
    )


class TokenApi(LoopbackApp):
    """A JSON service checking a Bearer token on every path, before routing."""

    base_path = "/api"

    def __init__(self, token: str) -> None:
        super().__init__()
        self.token = token
        self.requests: list[tuple[str, str]] = []

    def application(self) -> web.Application:
        @web.middleware
        async def auth(request: web.Request, handler: Any) -> web.StreamResponse:
            self.requests.append((request.method, request.path))
            if request.headers.get("Authorization") != f"Bearer {self.token}":
                raise web.HTTPUnauthorized(text="bad token")
            response: web.StreamResponse = await handler(request)
            return response

        async def rows(request: web.Request) -> web.Response:
            return web.json_response({"result": [[1.0, 2.0, 3.0, 4.0]]})

        app = web.Application(middlewares=[auth])
        app.router.add_post("/api/rows", rows)
        return app


@pytest.fixture
async def token_api() -> AsyncIterator[TokenApi]:
    async with running(TokenApi("tok-3e1a")) as api:
        yield api


@pytest.mark.parametrize(("token", "code"), [("tok-3e1a", 0), ("wrong", 6)])
async def test_an_http_storage_is_probed_with_a_head_of_its_base(
    world: World, token_api: TokenApi, token: str, code: int
) -> None:
    entry = {"http": {"secretRef": {"name": "rows"}, "path": "/rows"}}
    contract = {**config_contract(world.model_server.infer_url()), "input": entry, "output": entry}
    secrets = InMemorySecrets({("default", "rows"): {"url": token_api.url, "token": token}})

    outcome = await world.check(contract, secrets)

    assert outcome.exit_code == code, outcome.termination
    assert token_api.requests[0] == ("HEAD", "/api")
    assert all(method == "HEAD" for method, _ in token_api.requests)
    if code:
        assert outcome.termination == (
            f"input: HEAD {token_api.url} answered 401: (empty body) (the credentials are refused)"
        )


def test_the_cli_takes_check_and_refuses_a_bad_contract_with_2(tmp_path: Path) -> None:
    contract = tmp_path / "contract.json"
    contract.write_text('{"jobId": "x"}')
    termination = tmp_path / "termination-log"
    env = {
        **os.environ,
        "CONTRACT_PATH": str(contract),
        "TERMINATION_LOG_PATH": str(termination),
    }

    done = runner_cli("--check", env=env)

    assert done.returncode == ExitCode.BAD_CONTRACT
    assert termination.read_text().startswith("contract: invalid contract: jobName")
    last = orjson.loads(done.stdout.splitlines()[-1])
    assert (last["event"], last["exitCode"]) == ("check failed", 2)
    helped = runner_cli("--help", check=True)
    assert "--check" in helped.stdout
