"""Failures no retry can fix exit 6/7/8 at once; the others still exit 3/4/5 after retries.

The Job fails at once on 6, 7 and 8 (a ``podFailurePolicy`` ``FailJob`` rule) and
may retry the pod on 3, 4 and 5, so the line between them is drawn here against
the real servers: KServe's model server and the storage service on loopback.
Every quoted error is the server's own words, never the request's rows.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import pytest

from contract.exitcodes import ExitCode
from hack.loopback import FaultProxy
from hack.storage_service import StorageService
from runner.httputil import SERVER_MESSAGE_LIMIT
from tests.runner.conftest import (
    World,
    iris_contract,
    krateo_entry,
    storage_secrets,
)
from tests.servers import free_port, running

INFER = "/v2/models/sklearn-iris/infer"
# What KServe's FastAPI answers a v1 body sent to the v2 endpoint, without the body.
V1_ON_V2 = (
    "model answered 422: body.InferenceRequest.inputs: Field required; "
    "body.bytes: Input should be a valid bytes"
)
# A decimal number, as every iris feature is: none may reach the termination message.
DECIMAL = re.compile(r"\d\.\d")


def row_text(row: list[float]) -> str:
    """How a row appears in a JSON body (orjson's, or a server's own echo)."""
    return ",".join(str(value) for value in row)


def quoted_bound(prefix: str) -> int:
    return len(prefix) + SERVER_MESSAGE_LIMIT


def retries(outcome_events: list[dict[str, object]], event: str) -> int:
    return sum(1 for e in outcome_events if e["event"] == event)


# -- the model -------------------------------------------------------------------------------


async def test_a_v1_request_to_a_v2_endpoint_is_rejected_at_once_with_exit_7(
    world: World, fault_proxy: FaultProxy
) -> None:
    world.storage.seed_iris("iris")
    contract = iris_contract(f"{fault_proxy.url}{INFER}")
    contract["kserve"]["modelVersion"] = "v1"

    outcome = await world.run(contract)

    assert outcome.exit_code == ExitCode.INFERENCE_REJECTED
    assert outcome.termination == f"inference: {V1_ON_V2}"
    assert fault_proxy.seen[INFER] == 1
    assert retries(outcome.events(), "model request failed, retrying") == 0
    assert world.storage.calls["sklearnoutput"] == 0


async def test_a_422_echoing_every_row_is_quoted_without_them(
    world: World, fault_proxy: FaultProxy
) -> None:
    # FastAPI's 422 repeats the whole request in each error's "input": ~300 KB here.
    rows = world.seed_random_iris("many", 5000)
    contract = iris_contract(
        f"{fault_proxy.url}{INFER}", input_table="many", batching={"batchSize": 5000}
    )
    contract["kserve"]["modelVersion"] = "v1"

    outcome = await world.run(contract)

    assert outcome.exit_code == ExitCode.INFERENCE_REJECTED
    assert outcome.termination == f"inference: {V1_ON_V2}"
    assert len(outcome.termination) <= quoted_bound("inference: model answered 422: ")
    failed = next(e for e in outcome.events() if e["event"] == "run failed")
    assert failed["reason"] == outcome.termination
    for output in (outcome.stdout, outcome.stderr):
        assert "instances" not in output
        assert row_text(rows[0]) not in output


@pytest.mark.parametrize(
    ("kind", "echo", "expected"),
    [
        pytest.param(
            "500",
            True,
            "inference: model answered 500: injected 500: cannot process request {…} "
            "(gave up after 3 attempts)",
            id="a-5xx-quoting-the-request-without-the-rows",
        ),
        pytest.param(
            "408",
            False,
            "inference: model answered 408: injected 408 (gave up after 3 attempts)",
            id="a-408-retried-like-a-timeout",
        ),
    ],
)
async def test_a_retried_model_failure_still_exits_4_after_retries(
    world: World, fault_proxy: FaultProxy, kind: str, echo: bool, expected: str
) -> None:
    world.storage.seed_iris("iris")
    fault_proxy.rate, fault_proxy.kinds, fault_proxy.echo = 1.0, (kind,), echo
    contract = iris_contract(f"{fault_proxy.url}{INFER}", batching={"maxRetries": 2})

    outcome = await world.run(contract)

    assert outcome.exit_code == ExitCode.INFERENCE
    assert fault_proxy.seen[INFER] == 3
    assert outcome.termination == expected
    assert not DECIMAL.search(outcome.termination)


async def test_an_unreachable_model_still_exits_4_after_retries(world: World) -> None:
    world.storage.seed_iris("iris")
    contract = iris_contract(f"http://127.0.0.1:{free_port()}{INFER}", batching={"maxRetries": 2})

    outcome = await world.run(contract)

    assert outcome.exit_code == ExitCode.INFERENCE
    assert outcome.termination.startswith("inference: model call failed: ")
    assert outcome.termination.endswith(" (gave up after 3 attempts)")
    assert retries(outcome.events(), "model request failed, retrying") == 2


# -- the storage -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("role", "code"), [("input", ExitCode.INPUT_REJECTED), ("output", ExitCode.OUTPUT_REJECTED)]
)
async def test_a_storage_4xx_is_rejected_at_once_with_exit_6_or_8(
    world: World, role: str, code: ExitCode
) -> None:
    world.storage.seed_iris("iris")
    contract = iris_contract(world.model_server.infer_url())
    contract[role] = krateo_entry("/compute/no-such-notebook")

    outcome = await world.run(contract)

    assert outcome.exit_code == code
    assert outcome.termination == (
        f"{role}: POST {world.storage.url}/compute/no-such-notebook answered 404: "
        "notebook no-such-notebook not found"
    )
    assert retries(outcome.events(), "storage request failed, retrying") == 0


@pytest.fixture
async def storage_proxy(storage: StorageService) -> AsyncIterator[FaultProxy]:
    async with running(FaultProxy(storage.url, rate=1.0)) as proxy:
        yield proxy


async def test_an_input_408_is_retried_and_exits_3(world: World, storage_proxy: FaultProxy) -> None:
    storage_proxy.kinds = ("408",)

    outcome = await world.run(
        iris_contract(world.model_server.infer_url()), storage_secrets(storage_proxy.url)
    )

    assert outcome.exit_code == ExitCode.INPUT
    assert outcome.termination == (
        f"input: POST {storage_proxy.url}/compute/sklearninput answered 408: injected 408 "
        "(gave up after 4 attempts)"
    )
    assert storage_proxy.seen["/compute/sklearninput"] == 4
