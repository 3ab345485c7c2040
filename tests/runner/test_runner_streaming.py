"""Streaming runs: paged input on both providers, keyed chunks stored exactly once, shards
reading only their own rows, and a runner process killed mid-run that a second pod resumes.

Real servers only: KServe's model server, the storage look-alike (its notebooks for
``krateo``, its plain JSON routes for ``http``), a forwarding proxy that loses an answer.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from contract.exitcodes import ExitCode
from hack.loopback import FaultProxy, ForwardingProxy, serve
from hack.storage_service import StorageService
from tests.runner.conftest import (
    SECRET_NAMESPACE,
    STORAGE_PASSWORD,
    STORAGE_USER,
    InMemorySecrets,
    World,
    direct_iris,
    iris_contract,
    krateo_entry,
    random_iris_rows,
    storage_secrets,
)
from tests.servers import running

HTTP_SECRET = "rows-store"


def paged_krateo_contract(
    model_url: str, page_size: int, *, resume: bool = True, **extra: Any
) -> dict[str, Any]:
    contract = iris_contract(
        model_url, input_table="big", output_table="out", batching={"batchSize": 64}, **extra
    )
    contract["input"] = krateo_entry("/compute/sklearninput", paging={"pageSize": page_size})
    contract["output"] = krateo_entry(
        "/compute/sklearnoutput", **({"resumePath": "/compute/sklearnoutput"} if resume else {})
    )
    return contract


def paged_http_contract(
    model_url: str, page_size: int, storage_url: str | None = None, **extra: Any
) -> dict[str, Any]:
    ref = {"secretRef": {"name": HTTP_SECRET, "namespace": SECRET_NAMESPACE}}
    output: dict[str, Any] = {**ref, "path": "/tables/out/predictions"}
    output["resumePath"] = "/tables/out/progress"
    return {
        "jobId": "job-http-paged",
        "jobName": "inf-http-paged-00000000",
        "kserve": {"modelUrl": model_url},
        "input": {
            "http": {
                **ref,
                "method": "GET",
                "path": "/tables/big/rows",
                "rowsField": "rows",
                "paging": {"pageSize": page_size},
            }
        },
        "output": {"http": output},
        "batching": {"batchSize": 50, "concurrency": 3},
        **extra,
    }


def http_secrets(url: str) -> InMemorySecrets:
    return InMemorySecrets(
        {
            (SECRET_NAMESPACE, HTTP_SECRET): {
                "url": url,
                "username": STORAGE_USER,
                "password": STORAGE_PASSWORD,
            }
        }
    )


def assert_exactly_once(storage: StorageService, job: str, rows: list[list[float]]) -> None:
    stored = storage.keyed_predictions("out")
    assert [counter for _, _, counter, _, _ in stored] == list(range(len(rows)))
    assert len({key for _, _, _, key, _ in stored}) == len(rows)
    assert {j for j, _, _, _, _ in stored} == {job}
    assert [value for _, _, _, _, value in stored] == direct_iris(rows)


async def test_krateo_paging_streams_pages_and_stores_keyed_chunks(
    world: World, fault_proxy: FaultProxy
) -> None:
    rows = world.seed_random_iris("big", 1000)
    contract = paged_krateo_contract(f"{fault_proxy.url}/v2/models/sklearn-iris/infer", 300)
    contract["input"]["krateo"]["paging"]["pagesInFlight"] = 4

    outcome = await world.run(contract)

    assert outcome.exit_code == ExitCode.DONE, outcome.termination
    # 300 + 300 + 300 + 100: the short page is the last; one keyed write per page.
    assert world.storage.calls["sklearninput"] == 4
    # One resume question, then one keyed write per page.
    assert world.storage.calls["sklearnoutput"] == 1 + 4
    assert fault_proxy.forwarded_rows == 1000
    assert_exactly_once(world.storage, "3f1c2a9e-job", rows)
    result = outcome.result
    assert (result["rows"], result["predictions"], result["resumedRows"]) == (1000, 1000, 0)
    assert (result["pages"], result["chunks"], result["duplicates"]) == (4, 4, 0)
    assert outcome.progress is not None
    assert (outcome.progress.rows_done, outcome.progress.rows_total) == (1000, 1000)


async def test_http_paging_reads_pages_with_get_and_resumes_nothing_on_a_fresh_run(
    world: World,
) -> None:
    rows = world.seed_random_iris("big", 450)

    outcome = await world.run(
        paged_http_contract(world.model_server.infer_url(), 150), http_secrets(world.storage.url)
    )

    assert outcome.exit_code == ExitCode.DONE, outcome.termination
    # 150 * 3, then an empty page ends the input (the last full page cannot know).
    assert world.storage.calls["/tables/big/rows"] == 4
    assert world.storage.calls["/tables/out/predictions"] == 3
    assert world.storage.calls["/tables/out/progress"] == 1
    assert_exactly_once(world.storage, "job-http-paged", rows)
    assert outcome.result["pages"] == 4
    assert outcome.result["chunks"] == 3


async def test_the_same_run_twice_stores_every_prediction_once(world: World) -> None:
    rows = world.seed_random_iris("big", 500)
    # No resumePath: a retried pod redoes everything, and the keys make it harmless.
    contract = paged_krateo_contract(world.model_server.infer_url(), 200, resume=False)

    first = await world.run(contract)
    second = await world.run(contract, env={"pod_uid": "pod-retry"})

    assert first.exit_code == second.exit_code == ExitCode.DONE, second.termination
    assert first.result["duplicates"] == 0
    assert second.result["duplicates"] == 500
    assert_exactly_once(world.storage, "3f1c2a9e-job", rows)
    assert {pod for pod, *_ in (row[1:] for row in world.storage.predictions("out"))} == {
        "pod-0a1b"
    }


class LosesAnAnswer(ForwardingProxy):
    """Forwards to the storage; the ``lose``-th prediction write is stored, its answer lost."""

    def __init__(self, target: str, lose: int) -> None:
        super().__init__(target, client_max_size=1 << 28)
        self.lose = lose
        self.writes = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() != "host"}
        answer = await self.forward(request, body, headers)
        if request.path.endswith("/predictions"):
            self.writes += 1
            if self.writes == self.lose:
                # Stored on the other side; this side sees a dropped connection.
                assert request.transport is not None
                request.transport.abort()
        return answer


@pytest.fixture
async def lossy(storage: StorageService) -> AsyncIterator[LosesAnAnswer]:
    async with running(LosesAnAnswer(storage.url, lose=2)) as proxy:
        yield proxy


async def test_a_write_retried_after_its_answer_was_lost_is_stored_once(
    world: World, lossy: LosesAnAnswer
) -> None:
    rows = world.seed_random_iris("big", 400)

    outcome = await world.run(
        paged_http_contract(world.model_server.infer_url(), 100), http_secrets(lossy.url)
    )

    assert outcome.exit_code == ExitCode.DONE, outcome.termination
    # Chunk 2 went twice: once stored with its answer lost, once answered "duplicates".
    assert world.storage.calls["/tables/out/predictions"] == 5
    assert outcome.result["chunks"] == 4
    assert outcome.result["duplicates"] == 100
    assert_exactly_once(world.storage, "job-http-paged", rows)


async def test_shards_read_disjoint_parts_of_the_input(world: World) -> None:
    rows = world.seed_random_iris("big", 1001)
    contract = paged_krateo_contract(world.model_server.infer_url(), 100, sharding={"count": 3})
    served: dict[int, int] = {}

    for index in range(3):
        before = world.storage.calls["sklearninput"]
        outcome = await world.run_shard(contract, index)
        assert outcome.exit_code == ExitCode.DONE, outcome.termination
        served[index] = outcome.result["rows"]
        # Its own third only: 334 or 333 rows in pages of 100, never the whole input.
        assert world.storage.calls["sklearninput"] - before == 4
        assert outcome.progress is not None
        assert outcome.progress.rows_total == len(range(index, 1001, 3))

    assert served == {i: len(range(i, 1001, 3)) for i in range(3)}
    stored = world.storage.keyed_predictions("out")
    assert [counter for _, _, counter, _, _ in stored] == list(range(1001))
    assert [shard for _, shard, counter, _, _ in stored] == [c % 3 for c in range(1001)]
    assert [value for *_, value in stored] == direct_iris(rows)


async def test_a_paged_input_with_a_reserved_parameter_is_a_bad_contract(world: World) -> None:
    contract = paged_krateo_contract("http://127.0.0.1:9/v2/models/m/infer", 10)
    contract["parameters"]["idempotency_key"] = "mine"

    outcome = await world.run(contract)

    assert outcome.exit_code == ExitCode.BAD_CONTRACT
    assert "idempotency_key" in outcome.termination


async def test_a_runner_killed_mid_run_is_resumed_by_the_next_pod(
    world: World, fault_proxy: FaultProxy
) -> None:
    rows = world.seed_random_iris("big", 3000)
    contract = paged_krateo_contract(f"{fault_proxy.url}/v2/models/sklearn-iris/infer", 250)
    # The storage stalls on the 5th write: the runner process is killed while it waits.
    world.storage.hold_writes_after(4)
    process = await world.start_killable(contract, storage_secrets(world.storage.url))
    try:
        await asyncio.wait_for(world.storage.writes_held.wait(), 60)
    finally:
        process.send_signal(signal.SIGKILL)
        await process.wait()
    assert process.returncode == -signal.SIGKILL
    world.storage.release_writes()
    await asyncio.sleep(0.5)  # the held write, already received, lands (or not): either is fine
    predicted_before = fault_proxy.forwarded_rows
    stored_before = len(world.storage.keyed_predictions("out"))
    assert 1000 <= stored_before <= 1250 <= predicted_before < 3000

    outcome = await world.run(contract, env={"pod_uid": "pod-retry"})

    assert outcome.exit_code == ExitCode.DONE, outcome.termination
    assert_exactly_once(world.storage, "3f1c2a9e-job", rows)
    result = outcome.result
    assert result["resumedRows"] == stored_before
    assert (result["rows"], result["predictions"], result["duplicates"]) == (3000, 3000, 0)
    # The new pod predicted only what was not stored; the rows the killed pod had
    # predicted but not stored: the chunk held at the storage and the page after it.
    assert fault_proxy.forwarded_rows - predicted_before == 3000 - stored_before
    assert predicted_before - stored_before <= 2 * 250
    assert outcome.progress is not None
    assert (outcome.progress.rows_done, outcome.progress.rows_total) == (3000, 3000)
    first_progress = next(e for e in outcome.events() if e.get("event") == "progress")
    assert first_progress["rowsResumed"] == stored_before


async def test_an_input_that_ignores_paging_is_rejected_not_read_forever(world: World) -> None:
    async def everything(request: web.Request) -> web.Response:
        return web.json_response({"rows": random_iris_rows(30)})

    app = web.Application()
    app.router.add_get("/rows", everything)
    site, url = await serve(app)
    contract = paged_http_contract(world.model_server.infer_url(), 10)
    contract["input"]["http"]["path"] = "/rows"
    del contract["output"]["http"]["resumePath"]
    try:
        outcome = await world.run(contract, http_secrets(url))
    finally:
        await site.cleanup()

    assert outcome.exit_code == ExitCode.INPUT_REJECTED
    assert outcome.termination.startswith(
        "input: the input answered 30 rows to a page of 10 (offset 0): it does not honour"
    )
    assert outcome.termination.endswith("(stored: nothing of the input; missing from row 0)")
