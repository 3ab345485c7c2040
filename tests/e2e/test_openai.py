"""LLM batch runs as a user meets them: InferenceConfigs with ``modelVersion: openai``.

The controller runs under the chart's RBAC and the node agent runs the real
runner, as in the other end-to-end tests; the model is ``hack.openai_server``
(KServe's OpenAI types, the deterministic ``echo`` model: answers are prompts
reversed), the storage the finops-database-handler look-alike (prompts in a
table) or a real S3 server (an OpenAI Batch API file).
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import obstore
import orjson
import pytest
from kubernetes_asyncio import client

from hack.openai_server import chat_reply
from hack.s3server import REGION, ROOT_ACCESS_KEY, ROOT_SECRET_KEY, S3Server
from hack.storage_service import StorageService
from tests.e2e.conftest import PASSWORD, RUNNER_IMAGE, USER, endpoint_secret, krateo
from tests.isvc import InferenceServices, inference_service, not_ready_status, ready_status
from tests.runs import Runs, condition, inference_config, inference_run, status
from tests.servers import OpenAIServer, running

S3_SECRET = "s3-credentials"


@dataclass
class LLM:
    """One test's namespace: the storage, its Secret, the OpenAI server."""

    api: client.ApiClient
    namespace: str
    runs: Runs
    storage: StorageService
    server: OpenAIServer

    def config(self, name: str, storage: dict[str, Any], **openai: Any) -> dict[str, Any]:
        config = inference_config(name, RUNNER_IMAGE, storage=storage)
        config["spec"]["kserve"] = {
            "modelName": "echo",
            "modelUrl": self.server.base_url,
            "modelVersion": "openai",
            "openai": {"request": {"max_tokens": 64, "temperature": 0}, **openai},
        }
        config["spec"]["batching"] = {"concurrency": 8}
        return config

    def table_config(self, name: str, **openai: Any) -> dict[str, Any]:
        """Chat completions over the table ``prompts`` (id, prompt) into ``answers``."""
        source = krateo("/compute/sklearninput")
        source["krateo"]["keyColumn"] = "id"
        sink = krateo("/compute/sklearnoutput")
        sink["krateo"]["chunkSize"] = 250
        return self.config(name, {"input": source, "output": sink}, **openai)

    async def finish(
        self, config: dict[str, Any], run: dict[str, Any], phase: str, *, within: float = 240
    ) -> dict[str, Any]:
        await self.runs.create(config)
        await self.runs.create(run)
        return await self.runs.wait_phase(run["metadata"]["name"], phase, within=within)


def table_run(name: str, config: str, **spec: Any) -> dict[str, Any]:
    parameters = {
        "input_table_name": "prompts",
        "output_table_name": "answers",
        "rows_as": "objects",
    }
    return inference_run(name, config, **{"timeoutSeconds": 240, "parameters": parameters, **spec})


def prompts(count: int) -> list[tuple[str, str]]:
    return [(f"q-{i:04d}", f"tell me about item {i} of {count}") for i in range(count)]


@pytest.fixture
async def llm(
    api_client: client.ApiClient,
    namespace: str,
    openai_server: OpenAIServer,
    tmp_path: Path,
) -> AsyncIterator[LLM]:
    async with running(StorageService(tmp_path / "storage.sqlite", USER, PASSWORD)) as storage:
        await endpoint_secret(api_client, namespace, storage.url)
        yield LLM(api_client, namespace, Runs(api_client, namespace), storage, openai_server)


@pytest.mark.timeout(420)
@pytest.mark.usefixtures("controller")
async def test_chat_completions_over_1000_prompts_store_1000_answers_in_order(llm: LLM) -> None:
    table = prompts(1000)
    llm.storage.seed_table("prompts", ("id", "prompt"), table)
    done = await llm.finish(llm.table_config("llm"), table_run("llm-run", "llm"), "Succeeded")
    assert status(done)["result"]["rows"] == 1000
    assert status(done)["result"]["predictions"] == 1000
    assert condition(done, "Complete")["status"] == "True"  # type: ignore[index]
    stored = llm.storage.stored_values("answers")
    assert [counter for counter, _ in stored] == list(range(1000))
    for (key, prompt), (_, answer) in zip(table, stored, strict=True):
        assert answer["id"] == key
        assert answer["prediction"] == chat_reply([{"role": "user", "content": prompt}], 64)[0]
        assert answer["finish_reason"] == "stop"
        assert answer["usage"]["prompt_tokens"] == len(prompt.split())
    assert (await llm.server.stats())["answered"] == 1000


@pytest.mark.timeout(420)
@pytest.mark.usefixtures("controller")
async def test_a_429_storm_is_ridden_out_within_the_deadline(llm: LLM) -> None:
    table = prompts(40)
    llm.storage.seed_table("prompts", ("id", "prompt"), table)
    await llm.server.fault(429, 400, retry_after="0.1")
    done = await llm.finish(llm.table_config("storm"), table_run("storm-run", "storm"), "Succeeded")
    assert status(done)["result"]["predictions"] == 40
    stats = await llm.server.stats()
    assert stats["faulted"] == 400  # ten 429s per row on average: maxRetries is 5
    assert stats["answered"] == 40
    assert [answer["id"] for _, answer in llm.storage.stored_values("answers")] == [
        key for key, _ in table
    ]


@pytest.mark.timeout(420)
@pytest.mark.usefixtures("controller")
async def test_a_request_the_model_refuses_fails_the_run_with_the_servers_words(llm: LLM) -> None:
    llm.storage.seed_table("prompts", ("id", "prompt"), prompts(300))
    config = llm.table_config("refused", request={"temperature": 5})
    failed = await llm.finish(config, table_run("refused-run", "refused"), "Failed")
    st = status(failed)
    assert st["reason"] == "InferenceRejected"
    assert st["message"].startswith("runner exited with code 7: ")
    assert "temperature: Input should be less than or equal to 2" in st["message"]
    # The Job failed at once (exit 7 is permanent): one pod, a few requests, nothing stored.
    pods = await client.CoreV1Api(llm.api).list_namespaced_pod(
        llm.namespace, label_selector=f"ai.krateo.io/run-uid={failed['metadata']['uid']}"
    )
    assert len(pods.items) == 1
    assert (await llm.server.stats())["requests"] <= 9
    assert not llm.storage.has_table("answers")


@pytest.mark.timeout(420)
@pytest.mark.usefixtures("controller")
async def test_an_openai_batch_file_round_trips_through_s3(llm: LLM, s3_server: S3Server) -> None:
    bucket = s3_server.create_bucket()
    store = s3_server.root_store(bucket)

    def b64(text: str) -> str:
        return base64.b64encode(text.encode()).decode()

    await client.CoreV1Api(llm.api).create_namespaced_secret(
        llm.namespace,
        {
            "metadata": {"name": S3_SECRET},
            "data": {
                "AWS_ACCESS_KEY_ID": b64(ROOT_ACCESS_KEY),
                "AWS_SECRET_ACCESS_KEY": b64(ROOT_SECRET_KEY),
            },
        },
    )
    # A file as written for a hosted API: its model, its own parameters per line.
    lines: list[dict[str, Any]] = [
        {
            "custom_id": f"request-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "gpt-4o-mini",
                "messages": [
                    {"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": f"Hello world number {i}!"},
                ],
                "max_tokens": 1000,
            },
        }
        for i in range(50)
    ]
    data = b"".join(orjson.dumps(line) + b"\n" for line in lines)
    await obstore.put_async(store, "batches/input.jsonl", data)
    entry = {
        "bucket": bucket,
        "endpointUrl": s3_server.url,
        "region": REGION,
        "secretRef": {"name": S3_SECRET},
    }
    storage = {
        "input": {"s3": {**entry, "key": "batches/input.jsonl", "format": "openai-batch"}},
        "output": {"s3": {**entry, "prefix": "results", "format": "openai-batch"}},
    }
    config = llm.config("batch", storage, format="batch", request={})
    run = inference_run("batch-run", "batch", timeoutSeconds=240, parameters={})
    done = await llm.finish(config, run, "Succeeded")
    assert status(done)["result"]["predictions"] == 50

    keys: list[str] = []
    async for page in obstore.list(store, "results", chunk_size=1000):
        keys.extend(meta["path"] for meta in page)
    parts = sorted(k for k in keys if k.rsplit("/", 1)[-1].startswith("part-"))
    assert parts
    assert f"results/{done['metadata']['uid']}/_manifest.json" in keys
    out: list[dict[str, Any]] = []
    for key in parts:
        got = await obstore.get_async(store, key)
        out.extend(orjson.loads(x) for x in bytes(await got.bytes_async()).splitlines())
    assert [o["custom_id"] for o in out] == [line["custom_id"] for line in lines]
    for line, result in zip(lines, out, strict=True):
        assert result["error"] is None
        assert result["response"]["status_code"] == 200
        body = result["response"]["body"]
        assert body["model"] == "echo"
        assert body["choices"][0]["message"]["content"] == chat_reply(line["body"]["messages"])[0]


@pytest.mark.timeout(420)
@pytest.mark.usefixtures("isvc_controller")
async def test_an_llm_named_by_its_inferenceservice_is_called_on_kserves_openai_routes(
    llm: LLM,
) -> None:
    # A Hugging Face runtime's InferenceService (the stand-in CRD): KServe
    # serves the OpenAI API under /openai/v1 on the predictor, and the model's
    # name is the service's. The URL used to be the bare address, so every
    # request went to <address>/chat/completions and was answered 404.
    services = InferenceServices(llm.api, llm.namespace)
    service = inference_service("echo")
    service["spec"]["predictor"] = {
        "model": {"modelFormat": {"name": "huggingface"}, "storageUri": "hf://echo/echo"}
    }
    await services.create(service)
    said = "Revision echo-predictor-00001 is waiting for its first pod to be ready"
    await services.set_status("echo", not_ready_status("RevisionMissing", said))
    table = prompts(30)
    llm.storage.seed_table("prompts", ("id", "prompt"), table)
    config = llm.table_config("llm")
    config["spec"]["kserve"] = {
        "inferenceServiceRef": {"name": "echo"},
        "modelVersion": "openai",
        "openai": {"request": {"max_tokens": 64, "temperature": 0}},
    }
    await llm.runs.create(config)
    await llm.runs.create(table_run("llm-run", "llm"))
    waiting = await llm.runs.wait_reason("llm-run", "ModelNotReady")
    assert said in status(waiting)["message"]

    await services.set_status("echo", ready_status(llm.server.url))
    done = await llm.runs.wait_phase("llm-run", "Succeeded", within=240)
    kserve = status(done)["contract"]["kserve"]
    assert (kserve["modelUrl"], kserve["modelName"], kserve["modelVersion"]) == (
        f"{llm.server.url}/openai/v1",
        "echo",
        "openai",
    )
    assert status(done)["result"]["predictions"] == 30
    stored = llm.storage.stored_values("answers")
    assert len(stored) == 30
    for (key, prompt), (_, answer) in zip(table, stored, strict=True):
        assert answer["id"] == key
        assert answer["prediction"] == chat_reply([{"role": "user", "content": prompt}], 64)[0]
    assert (await llm.server.stats())["answered"] == 30
    cfg = await llm.runs.get("llm", "inferenceconfigs")
    assert cfg is not None
    assert status(cfg)["model"] == {
        "url": f"{llm.server.url}/openai/v1",
        "protocol": "openai",
        "name": "echo",
        "inferenceService": f"{llm.namespace}/echo",
    }
