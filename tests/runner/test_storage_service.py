"""The finops-database-handler look-alike over HTTP: the rules the runner must live with."""

from __future__ import annotations

import base64
from typing import Any

import aiohttp
import pytest

from hack.storage_service import StorageService
from tests.runner.conftest import STORAGE_PASSWORD, STORAGE_USER

JSON = {"Accept": "application/json"}


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


AUTH = basic(STORAGE_USER, STORAGE_PASSWORD)


async def call(
    storage: StorageService,
    notebook: str,
    body: Any,
    headers: dict[str, str] | None = None,
    auth: str | None = AUTH,
) -> tuple[int, str, str]:
    sent = {**(headers or {}), **({"Authorization": auth} if auth else {})}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{storage.url}/compute/{notebook}", json=body, headers=sent) as answer,
    ):
        return answer.status, answer.content_type, await answer.text()


async def test_basic_auth_is_required(storage: StorageService) -> None:
    storage.seed_iris("iris")
    assert (await call(storage, "sklearninput", {}, JSON, auth=None))[0] == 401
    wrong = basic(STORAGE_USER, "nope")
    assert (await call(storage, "sklearninput", {}, JSON, auth=wrong))[0] == 401


@pytest.mark.parametrize(
    ("accept", "content_type"),
    [
        ("application/json", "application/json"),
        ("application/json, text/plain", "text/html"),
        ("*/*", "text/html"),
    ],
)
async def test_json_only_for_exactly_accept_application_json(
    storage: StorageService, accept: str, content_type: str
) -> None:
    storage.seed_iris("iris")
    status, kind, text = await call(
        storage, "sklearninput", {"input_table_name": "iris"}, {"Accept": accept}
    )
    assert (status, kind) == (200, content_type)
    assert text.startswith('{"result":[[5.1,3.5,1.4,0.2]')


async def test_a_failing_notebook_answers_200_with_its_error(storage: StorageService) -> None:
    status, kind, text = await call(storage, "sklearninput", {"input_table_name": "absent"}, JSON)
    assert (status, kind) == (200, "application/json")
    assert text.startswith("Traceback (most recent call last)")
    assert text.rstrip().endswith("no such table: absent")


async def test_a_successful_store_answers_200_with_an_empty_body(storage: StorageService) -> None:
    body = {"output_table_name": "o", "job_uid": "j", "pod_uid": "p", "predictions": "[1]"}
    assert await call(storage, "sklearnoutput", body, JSON) == (200, "application/json", "")
    assert storage.predictions("o") == [("j", "p", 1.0, 0)]


async def test_a_missing_argument_is_a_200_with_upstreams_message(storage: StorageService) -> None:
    status, _, text = await call(storage, "tritonoutput", {"output_table_name": "o"}, JSON)
    assert status == 200
    assert "missing agument for call: job_uid" in text


async def test_a_number_in_the_body_is_a_500(storage: StorageService) -> None:
    status, _, text = await call(storage, "sklearninput", {"input_table_name": 3}, JSON)
    assert status == 500
    assert "not int" in text


async def test_an_unknown_notebook_is_a_404(storage: StorageService) -> None:
    assert (await call(storage, "nope", {}, JSON))[0] == 404
