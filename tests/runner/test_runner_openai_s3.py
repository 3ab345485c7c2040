"""LLM answers with the ``s3`` provider and rows (not batch files): Parquet prompts in and out.

``test_runner_openai`` covers the OpenAI Batch file format in S3; this is the
table case: a Parquet object of prompts with a key and a passthrough column,
answered into Parquet chunks where each answer's text, finish reason and token
usage (a struct) stand beside the row's key. The model is ``hack.openai_server``
(the ``echo`` model: the last message reversed, tokens are words); the bucket is
a real S3 server.
"""

from __future__ import annotations

import pyarrow as pa

from contract.exitcodes import ExitCode
from hack.openai_server import chat_reply
from tests.runner.conftest import World
from tests.runner.test_runner_s3 import RUN, Bucket, bucket, parquet_bytes, s3_secrets
from tests.servers import OpenAIServer

__all__ = ["bucket"]


async def test_parquet_prompts_in_s3_are_answered_into_parquet_beside_their_keys(
    llm: World, openai_server: OpenAIServer, bucket: Bucket
) -> None:
    count = 260
    ids = [9000 + 5 * i for i in range(count)]
    questions = [f"what is {'very ' * (i % 5)}item {i}?" for i in range(count)]
    topics = [None if i % 6 == 0 else f"topic-{i % 4}" for i in range(count)]
    table = pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "question": pa.array(questions, pa.string()),
            "topic": pa.array(topics, pa.string()),
        }
    )
    await bucket.put("prompts/day.parquet", parquet_bytes(table, 100))
    source = bucket.entry(key="prompts/day.parquet", paging={"pageSize": 90})
    source["s3"].update(keyColumn="id", passthroughColumns=["topic"])
    contract = {
        "jobId": RUN,
        "jobName": "inf-llm-s3-9c0f",
        "kserve": {
            "modelName": "echo",
            "modelUrl": openai_server.base_url,
            "modelVersion": "openai",
            "openai": {"request": {"max_tokens": 3}, "inputColumn": "question"},
        },
        "input": source,
        "output": bucket.entry(prefix="answers"),
        "batching": {"concurrency": 6},
    }

    outcome = await llm.run(contract, s3_secrets())

    assert outcome.exit_code == ExitCode.DONE, outcome.termination
    assert (outcome.result["rows"], outcome.result["predictions"]) == (count, count)
    out = await bucket.output("answers")
    assert out.num_rows == count
    assert out.column("row").to_pylist() == list(range(count))
    assert out.column("id").to_pylist() == ids
    assert out.column("topic").to_pylist() == topics
    answers = [chat_reply([{"role": "user", "content": q}], 3) for q in questions]
    assert out.column("prediction").to_pylist() == [text for text, _ in answers]
    assert out.column("finish_reason").to_pylist() == [reason for _, reason in answers]
    assert "length" in out.column("finish_reason").to_pylist()  # max_tokens cut some
    usage = out.column("usage").to_pylist()
    assert [u["prompt_tokens"] for u in usage] == [len(q.split()) for q in questions]
    assert [u["completion_tokens"] for u in usage] == [len(t.split()) for t, _ in answers]
    assert (await openai_server.stats())["answered"] == count
