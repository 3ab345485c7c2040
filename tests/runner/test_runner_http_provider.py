"""The ``http`` provider against a small JSON service (not finops-database-handler)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from aiohttp import web

from contract.exitcodes import ExitCode
from hack.loopback import LoopbackApp
from tests.runner.conftest import (
    InMemorySecrets,
    Outcome,
    World,
    direct_iris,
    random_iris_rows,
)
from tests.servers import running

TOKEN = "api-token-5b1e"


class RowsApi(LoopbackApp):
    """GET /api/tables/{t} -> {"data": {"rows": ...}}; POST /api/predictions stores the body."""

    base_path = "/api"

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[float]]] = {}
        self.received: list[dict[str, Any]] = []
        self.store_answer: tuple[int, str] = (204, "")

    def application(self) -> web.Application:
        app = web.Application(client_max_size=1 << 28)
        app.router.add_get("/api/tables/{table}", self._rows)
        app.router.add_post("/api/predictions", self._store)
        return app

    def _check(self, request: web.Request) -> None:
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            raise web.HTTPUnauthorized(text="bad token")

    async def _rows(self, request: web.Request) -> web.Response:
        self._check(request)
        assert request.query["limit"] == "all"
        rows = self.tables[request.match_info["table"]]
        return web.json_response({"data": {"rows": rows}})

    async def _store(self, request: web.Request) -> web.Response:
        self._check(request)
        self.received.append(orjson.loads(await request.read()))
        status, text = self.store_answer
        return web.Response(status=status, text=text or None)


@pytest.fixture
async def rows_api() -> AsyncIterator[RowsApi]:
    async with running(RowsApi()) as api:
        yield api


def http_contract(model_url: str, **output_extra: Any) -> dict[str, Any]:
    ref = {"secretRef": {"name": "rows-api"}}
    return {
        "jobId": "job-http",
        "jobName": "inf-http-00000000",
        "kserve": {"modelUrl": model_url},
        "input": {
            "http": {**ref, "method": "GET", "path": "/tables/flowers", "rowsField": "data.rows"}
        },
        "output": {"http": {**ref, "path": "predictions", **output_extra}},
        "parameters": {"limit": "all"},
    }


async def run_in_apps(world: World, rows_api: RowsApi, **output_extra: Any) -> Outcome:
    """A run in namespace ``apps``, its Secret ``rows-api`` naming ``rows_api`` and its token."""
    secrets = InMemorySecrets({("apps", "rows-api"): {"url": rows_api.url, "token": TOKEN}})
    contract = http_contract(world.model_server.infer_url(), **output_extra)
    return await world.run(contract, secrets, env={"POD_NAMESPACE": "apps"})


async def test_rows_and_predictions_travel_over_plain_json(world: World, rows_api: RowsApi) -> None:
    rows = random_iris_rows(250)
    rows_api.tables["flowers"] = rows

    outcome = await run_in_apps(world, rows_api, chunkSize=100)

    assert outcome.exit_code == ExitCode.DONE, outcome.termination
    assert [body["predictions_offset"] for body in rows_api.received] == ["0", "100", "200"]
    for body in rows_api.received:
        assert (body["job_uid"], body["pod_uid"], body["limit"]) == ("job-http", "pod-0a1b", "all")
    predictions = [p for body in rows_api.received for p in body["predictions"]]
    assert predictions == direct_iris(rows)


async def test_a_200_with_an_error_text_is_an_output_failure(
    world: World, rows_api: RowsApi
) -> None:
    rows_api.tables["flowers"] = random_iris_rows(10)
    rows_api.store_answer = (200, "database is read-only")

    outcome = await run_in_apps(world, rows_api, predictionsAs="string")

    assert outcome.exit_code == ExitCode.OUTPUT_REJECTED
    assert outcome.termination.endswith(
        "answered 200 with an error instead of storing: database is read-only"
    )
    assert isinstance(rows_api.received[0]["predictions"], str)


async def test_an_output_422_echoing_the_predictions_is_rejected_without_them(
    world: World, rows_api: RowsApi
) -> None:
    rows_api.tables["flowers"] = random_iris_rows(300)
    # A FastAPI service refusing the body repeats it, predictions and all.
    rows_api.store_answer = (
        422,
        '{"detail": [{"type": "string_type", "loc": ["body", "predictions"], '
        '"msg": "Input should be a valid string", "input": ['
        + ", ".join(["1.0", "0.0", "2.0"] * 100)
        + "]}]}",
    )

    outcome = await run_in_apps(world, rows_api, chunkSize=100)

    assert outcome.exit_code == ExitCode.OUTPUT_REJECTED
    assert outcome.termination == (
        "output: chunk 1 of 3 (predictions from 0) failed, 0 chunk(s) stored: "
        f"POST {rows_api.url}/predictions answered 422: "
        "body.predictions: Input should be a valid string"
    )
    assert len(rows_api.received) == 1
