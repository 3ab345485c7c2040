"""The runner against an OpenAI-compatible server (``modelVersion: openai``).

The server is ``hack.openai_server`` (KServe's OpenAI types, the deterministic
``echo`` model: answers are prompts reversed, tokens are words); the storage is
the storage look-alike: its Krateo notebooks (``krateo``, one read, one write) or its
plain JSON routes (``http`` with paging: the streaming path, keyed writes).
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from contract.exitcodes import ExitCode
from hack.openai_server import chat_reply, completion_text, content_text, embedding
from hack.storage_service import StorageService
from tests.runner.conftest import (
    STORAGE_PASSWORD,
    STORAGE_USER,
    InMemorySecrets,
    Outcome,
    World,
    krateo_entry,
    storage_secrets,
)
from tests.runner.test_runner_s3 import Bucket, bucket, s3_secrets
from tests.servers import OpenAIServer

__all__ = ["bucket"]

NAMESPACE = "llm"
SECRET = "rows-store"


def secrets(storage: StorageService) -> InMemorySecrets:
    """The ``http`` provider's Secret and the ``krateo`` one."""
    both = storage_secrets(storage.url)
    both.secrets[(NAMESPACE, SECRET)] = {
        "url": storage.url,
        "username": STORAGE_USER,
        "password": STORAGE_PASSWORD,
    }
    return both


def prompts(count: int) -> list[tuple[str, str]]:
    return [
        (f"p-{i:04d}", f"question number {i} about {'llamas' * (i % 3 + 1)}") for i in range(count)
    ]


def llm_contract(
    server: OpenAIServer,
    *,
    openai: dict[str, Any] | None = None,
    paging: dict[str, Any] | None = None,
    key_column: str | None = "id",
    batching: dict[str, Any] | None = None,
) -> dict[str, Any]:
    ref = {"secretRef": {"name": SECRET, "namespace": NAMESPACE}}
    join = {"keyColumn": key_column} if key_column else {}
    if paging:
        source = {
            "http": {
                **ref,
                "method": "GET",
                "path": "/tables/prompts/rows",
                "rowsField": "rows",
                "paging": paging,
                **join,
            }
        }
        sink = {"http": {**ref, "path": "/tables/answers/predictions"}}
    else:
        source = krateo_entry("/compute/sklearninput", **join)
        sink = krateo_entry("/compute/sklearnoutput", chunkSize=200)
    return {
        "jobId": "job-llm-7c1d",
        "jobName": "inf-llm-7c1d",
        "kserve": {
            "modelName": "echo",
            "modelUrl": server.base_url,
            "modelVersion": "openai",
            "openai": {"request": {"max_tokens": 64, "temperature": 0}, **(openai or {})},
        },
        "input": source,
        "output": sink,
        "parameters": {
            "rows_as": "objects",
            "input_table_name": "prompts",
            "output_table_name": "answers",
        },
        "batching": {"concurrency": 8, **(batching or {})},
    }


async def run(llm: World, contract: dict[str, Any], **env: str) -> Outcome:
    return await llm.run(contract, secrets(llm.storage), env=env)


def stored(storage: StorageService) -> list[Any]:
    values = storage.stored_values("answers")
    assert [counter for counter, _ in values] == list(range(len(values)))
    return [value for _, value in values]


@pytest.mark.parametrize("paging", [None, {"pageSize": 150}], ids=["one-read", "streaming"])
async def test_chat_completions_over_1000_prompts_in_order_keyed(
    llm: World, openai_server: OpenAIServer, paging: dict[str, Any] | None
) -> None:
    table = prompts(1000)
    llm.storage.seed_table("prompts", ("id", "prompt"), table)
    outcome = await run(llm, llm_contract(openai_server, paging=paging))
    assert outcome.exit_code == ExitCode.DONE, outcome.termination
    assert outcome.result["rows"] == outcome.result["predictions"] == 1000
    answers = stored(llm.storage)
    assert len(answers) == 1000
    for (key, prompt), answer in zip(table, answers, strict=True):
        text, reason = chat_reply([{"role": "user", "content": prompt}], 64)
        assert answer == {
            "id": key,
            "prediction": text,
            "finish_reason": reason,
            "usage": {
                "prompt_tokens": len(prompt.split()),
                "completion_tokens": len(text.split()),
                "total_tokens": len(prompt.split()) + len(text.split()),
            },
        }
    assert (await openai_server.stats())["answered"] == 1000


async def test_template_messages_output_columns_and_completions(
    llm: World, openai_server: OpenAIServer
) -> None:
    table = prompts(20)
    llm.storage.seed_table("prompts", ("id", "prompt"), table)
    contract = llm_contract(
        openai_server,
        openai={
            "endpoint": "completions",
            "request": {"max_tokens": 2},
            "outputColumns": {"text": "answer", "finishReason": "why", "usage": None},
        },
    )
    outcome = await run(llm, contract)
    assert outcome.exit_code == ExitCode.DONE, outcome.termination
    answers = stored(llm.storage)
    expected = [completion_text(prompt, 2) for _, prompt in table]
    assert answers == [
        {"id": key, "answer": text, "why": why}
        for (key, _), (text, why) in zip(table, expected, strict=True)
    ]
    assert {why for _, why in expected} == {"length"}


async def test_embeddings(llm: World, openai_server: OpenAIServer) -> None:
    table = prompts(10)
    llm.storage.seed_table("prompts", ("id", "prompt"), table)
    contract = llm_contract(openai_server, openai={"endpoint": "embeddings", "request": {}})
    outcome = await run(llm, contract)
    assert outcome.exit_code == ExitCode.DONE, outcome.termination
    answers = stored(llm.storage)
    assert [a["prediction"] for a in answers] == [embedding(p) for _, p in table]
    assert [a["id"] for a in answers] == [k for k, _ in table]


async def test_a_429_storm_is_ridden_out(llm: World, openai_server: OpenAIServer) -> None:
    """600 answers 429 in a row: far past maxRetries (5) per row, yet every row is answered."""
    table = prompts(60)
    llm.storage.seed_table("prompts", ("id", "prompt"), table)
    await openai_server.fault(429, 600, retry_after="0.05")
    outcome = await run(llm, llm_contract(openai_server), RUNNER_DEADLINE_SECONDS="300")
    assert outcome.exit_code == ExitCode.DONE, outcome.termination
    stats = await openai_server.stats()
    assert stats["faulted"] == 600
    assert stats["answered"] == 60
    assert [a["id"] for a in stored(llm.storage)] == [k for k, _ in table]
    retries = [e for e in outcome.events() if e.get("event") == "model request failed, retrying"]
    assert len(retries) == 600
    assert {e["retryInSeconds"] for e in retries} == {0.05}


async def test_a_4xx_no_retry_can_fix_fails_the_run_at_once_with_the_servers_words(
    llm: World, openai_server: OpenAIServer
) -> None:
    llm.storage.seed_table("prompts", ("id", "prompt"), prompts(500))
    contract = llm_contract(openai_server, openai={"request": {"temperature": 5}})
    outcome = await run(llm, contract)
    assert outcome.exit_code == ExitCode.INFERENCE_REJECTED
    assert outcome.termination.startswith("inference: model answered 400")
    assert "temperature: Input should be less than or equal to 2" in outcome.termination
    # At once: the requests in flight when the first refusal came, not the 500 rows.
    assert (await openai_server.stats())["requests"] <= 8 + 1
    assert not llm.storage.has_table("answers")


async def test_row_errors_recorded_and_the_run_goes_on(
    llm: World, openai_server: OpenAIServer
) -> None:
    table = prompts(12)
    llm.storage.seed_table("prompts", ("id", "prompt"), table)
    await openai_server.fault(400, 3)
    contract = llm_contract(
        openai_server, openai={"onRowError": "record"}, batching={"concurrency": 1}
    )
    outcome = await run(llm, contract)
    assert outcome.exit_code == ExitCode.DONE, outcome.termination
    answers = stored(llm.storage)
    assert [a["id"] for a in answers] == [k for k, _ in table]
    failed = [a for a in answers if a["error"] is not None]
    assert [a["id"] for a in failed] == ["p-0000", "p-0001", "p-0002"]
    assert all(a["error"] == "model answered 400: injected fault: 400" for a in failed)
    assert all(a["prediction"] is None for a in failed)
    assert all(a["prediction"] for a in answers[3:])


async def test_unknown_model_fails_even_when_row_errors_are_recorded(
    llm: World, openai_server: OpenAIServer
) -> None:
    llm.storage.seed_table("prompts", ("id", "prompt"), prompts(5))
    contract = llm_contract(openai_server, openai={"onRowError": "record"})
    contract["kserve"]["modelName"] = "gpt-4o"
    outcome = await run(llm, contract)
    assert outcome.exit_code == ExitCode.INFERENCE_REJECTED
    assert "model answered 404: The model `gpt-4o` does not exist." in outcome.termination


async def test_a_prompt_missing_from_a_row_is_the_inputs_fault(
    llm: World, openai_server: OpenAIServer
) -> None:
    llm.storage.seed_table("prompts", ("id", "question"), prompts(3))
    outcome = await run(llm, llm_contract(openai_server))
    assert outcome.exit_code == ExitCode.INPUT_REJECTED
    assert "row 0 has no column 'prompt' (kserve.openai.inputColumn)" in outcome.termination
    assert (await openai_server.stats())["requests"] == 0


# -- OpenAI Batch files, in and out of S3 ----------------------------------------------


def batch_file(count: int) -> list[dict[str, Any]]:
    """Lines as a hosted API's batch file has them: each its own model, body and fields."""
    lines: list[dict[str, Any]] = []
    for i in range(count):
        if i % 3 == 2:
            line = {
                "custom_id": f"emb-{i}",
                "method": "POST",
                "url": "/v1/embeddings",
                "body": {"model": "text-embedding-3-small", "input": f"text {i}"},
            }
        else:
            content: Any = f"say {i} backwards"
            if i % 3 == 1:
                content = [{"type": "text", "text": content}]
            line = {
                "custom_id": f"chat-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": "gpt-4o-mini",
                    "messages": [{"role": "user", "content": content}],
                    **({"max_tokens": 1} if i % 4 == 0 else {}),
                },
            }
        lines.append(line)
    return lines


def batch_contract(
    server: OpenAIServer, bucket: Bucket, *, page_size: int = 40, **openai: Any
) -> dict[str, Any]:
    return {
        "jobId": "job-batch-51e0",
        "jobName": "inf-batch-51e0",
        "kserve": {
            "modelName": "echo",
            "modelUrl": server.base_url,
            "modelVersion": "openai",
            "openai": {"format": "batch", **openai},
        },
        "input": bucket.entry(
            key="batches/input.jsonl", format="openai-batch", paging={"pageSize": page_size}
        ),
        "output": bucket.entry(prefix="results", format="openai-batch"),
        "batching": {"concurrency": 6},
    }


async def output_lines(bucket: Bucket, prefix: str = "results") -> list[dict[str, Any]]:
    """The output file: the chunks' lines, in key order."""
    lines: list[dict[str, Any]] = []
    keys = [k for k in await bucket.keys(prefix) if k.rsplit("/", 1)[-1].startswith("part-")]
    assert keys, f"no chunk under {prefix}"
    for key in keys:
        lines.extend(orjson.loads(line) for line in (await bucket.get(key)).splitlines())
    return lines


async def test_a_batch_file_round_trips_through_s3(
    llm: World, openai_server: OpenAIServer, bucket: Bucket
) -> None:
    lines = batch_file(100)
    # One line the model refuses (a role it does not know): recorded, as the Batch API does.
    lines[49]["body"]["messages"][0]["role"] = "robot"
    await bucket.put("batches/input.jsonl", b"".join(orjson.dumps(x) + b"\n" for x in lines))
    outcome = await llm.run(batch_contract(openai_server, bucket), s3_secrets())
    assert outcome.exit_code == ExitCode.DONE, outcome.termination
    out = await output_lines(bucket)
    assert [o["custom_id"] for o in out] == [x["custom_id"] for x in lines]
    assert len({o["id"] for o in out}) == 100
    for line, result in zip(lines, out, strict=True):
        assert set(result) == {"id", "custom_id", "response", "error"}
        assert result["id"].startswith("batch_req_")
        response = result["response"]
        body = line["body"]
        if line["custom_id"] == "chat-49":
            assert response["status_code"] == 400
            assert "messages.0" in response["body"]["error"]["message"]
            continue
        assert result["error"] is None
        assert response["status_code"] == 200
        assert response["request_id"].startswith("req-")
        answer = response["body"]
        assert answer["model"] == "echo"
        if line["url"] == "/v1/embeddings":
            assert answer["data"][0]["embedding"] == embedding(body["input"])
            continue
        messages = body["messages"]
        text, reason = chat_reply(
            [{"role": "user", "content": content_text(messages[0]["content"])}],
            body.get("max_tokens"),
        )
        assert answer["choices"][0]["message"]["content"] == text
        assert answer["choices"][0]["finish_reason"] == reason
    # The input is unchanged by the run: the same file could go to a hosted API.
    assert (await bucket.get("batches/input.jsonl")).splitlines() == [
        orjson.dumps(x) for x in lines
    ]
    manifests = [k for k in await bucket.keys("results") if k.endswith("_manifest.json")]
    assert len(manifests) == 2  # the shard's and the run's: the output is complete


async def test_a_batch_line_that_is_not_a_request_fails_naming_it(
    llm: World, openai_server: OpenAIServer, bucket: Bucket
) -> None:
    lines = batch_file(5)
    del lines[3]["url"]
    body = b"".join(orjson.dumps(x) + b"\n" for x in lines)
    await bucket.put("batches/input.jsonl", body)
    outcome = await llm.run(batch_contract(openai_server, bucket), s3_secrets())
    assert outcome.exit_code == ExitCode.INPUT_REJECTED
    assert "row 3 has no url (a batch line has all of them)" in outcome.termination
    await bucket.put("batches/input.jsonl", body.replace(b"\n", b"\n{oops\n", 1))
    outcome = await llm.run(batch_contract(openai_server, bucket), s3_secrets())
    assert outcome.exit_code == ExitCode.INPUT_REJECTED
    assert "line 2 is not JSON" in outcome.termination


# -- the probe (python -m runner --check) ------------------------------------------------


async def test_the_check_finds_the_model_in_the_servers_list(
    llm: World, openai_server: OpenAIServer
) -> None:
    outcome = await llm.check(llm_contract(openai_server), secrets(llm.storage))
    assert outcome.exit_code == ExitCode.DONE, outcome.termination
    assert outcome.result == {
        "check": "ok",
        "protocol": "openai",
        "model": "echo",
        "models": ["echo"],
    }
    assert (await openai_server.stats())["requests"] == 0  # no request sent: no data moved


async def test_the_check_names_a_model_the_server_does_not_serve(
    llm: World, openai_server: OpenAIServer
) -> None:
    contract = llm_contract(openai_server)
    contract["kserve"]["modelName"] = "gpt-4o"
    outcome = await llm.check(contract, secrets(llm.storage))
    assert outcome.exit_code == ExitCode.INFERENCE_REJECTED
    assert "model 'gpt-4o' is not served there (kserve.modelName); the server lists: 'echo'" in (
        outcome.termination
    )
