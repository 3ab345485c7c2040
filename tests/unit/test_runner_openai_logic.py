"""The pure parts of runner/openai.py: URLs, requests, answers, batch lines, row errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from pydantic import ValidationError

from contract.document import Contract, KServe, OpenAI
from contract.exitcodes import ContractError
from controller.api import InferenceConfig
from runner.app import RunnerEnv, plan
from runner.inference import ModelRefused
from runner.join import Selection, SelectionError
from runner.openai import (
    Answer,
    BatchLine,
    RowReader,
    RowRefused,
    batch_line,
    batch_output,
    batch_request_id,
    build_batch_request,
    build_request,
    check_selection,
    classify,
    join,
    output_columns,
    output_names,
    parse_answer,
    target_from_contract,
)
from runner.retry import Transient
from runner.storage.base import Page, Partition

pytestmark = pytest.mark.unit

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def kserve(url: str = "llm.models.svc/openai/v1", **openai: Any) -> KServe:
    return KServe.model_validate(
        {"modelName": "echo", "modelUrl": url, "modelVersion": "openai", "openai": openai}
    )


@pytest.mark.parametrize(
    ("url", "base"),
    [
        ("llm.models.svc/openai/v1", "http://llm.models.svc/openai/v1"),
        ("https://llm.example/v1/", "https://llm.example/v1"),
        ("http://h:8080/openai/v1/chat/completions", "http://h:8080/openai/v1"),
        ("http://h/v1/completions", "http://h/v1"),
        ("http://h/v1/embeddings", "http://h/v1"),
    ],
)
def test_the_base_url_is_the_api_s_whatever_the_url_ends_with(url: str, base: str) -> None:
    target = target_from_contract(kserve(url))
    assert target.base_url == base
    assert target.url("chat/completions") == f"{base}/chat/completions"
    assert target.model == "echo"


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("", "kserve.modelUrl is required"),
        ("ftp://h/v1", "must be an http(s) URL with a host"),
        ("http://h/v1?key=1", "must not have a query"),
    ],
)
def test_bad_urls_are_contract_errors(url: str, words: str) -> None:
    with pytest.raises(ContractError, match=words.replace("(", r"\(").replace(")", r"\)")):
        target_from_contract(kserve(url))


def test_a_request_needs_a_model_name() -> None:
    nameless = KServe(model_url="h/v1", model_version="openai")
    with pytest.raises(
        ContractError, match=r"set kserve\.modelName or kserve\.openai\.request\.model"
    ):
        target_from_contract(nameless)
    templated = nameless.model_copy(update={"openai": OpenAI(request={"model": "m"})})
    assert target_from_contract(templated).model is None


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"request": {"stream": True}}, "stream: true is not supported"),
        ({"endpoint": "completions", "request": {"prompt": "x"}}, "request.prompt comes from"),
        ({"endpoint": "embeddings", "request": {"input": "x"}}, "request.input comes from"),
        ({"request": {"messages": "hi"}}, "request.messages must be a list"),
        ({"outputColumns": {"text": "a", "usage": "a"}}, "outputColumns name ['a'] more than once"),
        ({"endpoint": "images"}, "Input should be 'chat/completions'"),
        ({"onRowErrors": "record"}, "Extra inputs are not permitted"),
    ],
)
def test_settings_that_make_no_sense_are_refused(settings: dict[str, Any], words: str) -> None:
    with pytest.raises(ValidationError) as failure:
        OpenAI.model_validate(settings)
    assert words in str(failure.value)


def test_row_errors_default_to_fail_for_rows_and_record_for_batch_files() -> None:
    assert OpenAI().row_errors == "fail"
    assert OpenAI(format="batch").row_errors == "record"
    assert OpenAI(format="batch", on_row_error="fail").row_errors == "fail"
    assert output_names(OpenAI()) == ["prediction", "finish_reason", "usage"]
    assert output_names(OpenAI(on_row_error="record")) == [
        "prediction",
        "finish_reason",
        "usage",
        "error",
    ]


def test_chat_requests_from_a_prompt_or_messages() -> None:
    settings = OpenAI(
        request={
            "max_tokens": 32,
            "temperature": 0,
            "messages": [{"role": "system", "content": "Be brief."}],
        }
    )
    body = build_request(settings, "echo", "What is KServe?")
    assert body == {
        "max_tokens": 32,
        "temperature": 0,
        "model": "echo",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is KServe?"},
        ],
    }
    conversation = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    assert build_request(settings, "echo", conversation)["messages"][1:] == conversation
    # The template's model wins over kserve.modelName; the template is not changed.
    templated = OpenAI(request={"model": "llama-3"})
    assert build_request(templated, "echo", "x")["model"] == "llama-3"
    assert templated.request == {"model": "llama-3"}


def test_completion_and_embedding_requests() -> None:
    assert build_request(OpenAI(endpoint="completions"), "m", "Once upon") == {
        "model": "m",
        "prompt": "Once upon",
    }
    assert build_request(OpenAI(endpoint="embeddings"), "m", ["a", "b"]) == {
        "model": "m",
        "input": ["a", "b"],
    }


def answer(body: Any) -> bytes:
    return orjson.dumps(body)


def test_chat_completion_answers() -> None:
    usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    body = answer(
        {
            "choices": [
                {"index": 0, "finish_reason": "length", "message": {"content": "Hi there"}}
            ],
            "usage": usage,
        }
    )
    assert parse_answer("chat/completions", body) == Answer("Hi there", "length", usage)


def test_completion_and_embedding_answers() -> None:
    text = answer({"choices": [{"text": "abc", "finish_reason": "stop"}]})
    assert parse_answer("completions", text) == Answer("abc", "stop", None)
    one = answer({"data": [{"index": 0, "embedding": [0.5, 1.0]}], "usage": {"total_tokens": 2}})
    assert parse_answer("embeddings", one) == Answer([0.5, 1.0], None, {"total_tokens": 2})
    two = answer({"data": [{"index": 1, "embedding": [2.0]}, {"index": 0, "embedding": [1.0]}]})
    assert parse_answer("embeddings", two).text == [[1.0], [2.0]]


@pytest.mark.parametrize(
    ("endpoint", "body", "words"),
    [
        ("chat/completions", b"<html>busy</html>", "is not JSON"),
        ("chat/completions", b"[1, 2]", "is not a JSON object"),
        ("chat/completions", b'{"choices": []}', "has no choices"),
        ("chat/completions", b'{"choices": [{"text": "x"}]}', "has no message"),
        ("embeddings", b'{"data": []}', "has no data"),
        ("embeddings", b'{"data": [{"index": 0}]}', "has no embedding"),
    ],
)
def test_answers_that_are_not_answers_are_refusals(endpoint: Any, body: bytes, words: str) -> None:
    with pytest.raises(ModelRefused) as failure:
        parse_answer(endpoint, body)
    assert words in failure.value.message
    assert failure.value.permanent


def test_output_columns_leave_out_what_is_null_and_record_errors_when_asked() -> None:
    settings = OpenAI.model_validate(
        {"outputColumns": {"text": "answer", "usage": None}, "onRowError": "record"}
    )
    got = output_columns(settings, Answer("yes", "stop", {"total_tokens": 1}), None)
    assert got == {"answer": "yes", "finish_reason": "stop", "error": None}
    failed = output_columns(settings, None, "model answered 400: too long")
    assert failed == {
        "answer": None,
        "finish_reason": None,
        "error": "model answered 400: too long",
    }
    assert "error" not in output_columns(OpenAI(), Answer("x", None, None), None)


@pytest.mark.parametrize(
    ("status", "kind", "rate_limited", "recordable"),
    [
        (429, Transient, True, None),
        (503, Transient, False, None),
        (408, Transient, False, None),
        (400, RowRefused, None, True),
        (422, RowRefused, None, True),
        (413, RowRefused, None, True),
        (401, RowRefused, None, False),
        (404, RowRefused, None, False),
    ],
)
def test_classify(
    status: int, kind: type, rate_limited: bool | None, recordable: bool | None
) -> None:
    error = classify(status, b'{"error": {"message": "nope"}}', "2", "req-1")
    assert isinstance(error, kind)
    assert "nope" in str(error)
    if isinstance(error, Transient):
        assert error.rate_limited is rate_limited
        assert error.retry_after == 2.0
    else:
        assert isinstance(error, RowRefused)
        assert error.recordable is recordable
        assert error.permanent
        assert error.request_id == "req-1"


LINE: dict[str, Any] = {
    "custom_id": "request-1",
    "method": "POST",
    "url": "/v1/chat/completions",
    "body": {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": "Hello world!"}],
        "max_tokens": 1000,
    },
}


def test_batch_lines_become_requests() -> None:
    line = batch_line(LINE, "row 0")
    assert line == BatchLine("request-1", "chat/completions", LINE["body"])
    settings = OpenAI(format="batch", request={"temperature": 0, "max_tokens": 5})
    body = build_batch_request(settings, "echo", line)
    # kserve.modelName replaces the hosted model; the line's own fields win over the template.
    assert body == {**LINE["body"], "model": "echo", "temperature": 0}
    assert build_batch_request(settings, None, line)["model"] == "gpt-4o-mini"
    for url, endpoint in [("/v1/embeddings", "embeddings"), ("/v1/completions", "completions")]:
        assert batch_line({**LINE, "url": url}, "row 0").endpoint == endpoint


@pytest.mark.parametrize(
    ("line", "words"),
    [
        (["a"], "row 3 is not a batch request object"),
        ({"custom_id": "a", "method": "POST"}, "row 3 has no url, body"),
        ({**LINE, "custom_id": ""}, "custom_id must be a non-empty string"),
        ({**LINE, "method": "GET"}, "method must be POST, got 'GET'"),
        ({**LINE, "body": "x"}, "body must be an object"),
        (
            {**LINE, "url": "/v1/responses"},
            "url '/v1/responses' is not one of /v1/chat/completions",
        ),
    ],
)
def test_bad_batch_lines_name_the_row(line: Any, words: str) -> None:
    with pytest.raises(SelectionError) as failure:
        batch_line(line, "row 3")
    assert words in str(failure.value)


def test_batch_output_lines() -> None:
    line = batch_line(LINE, "row 0")
    body = b'{"id": "chatcmpl-1", "choices": []}'
    out = batch_output("job-1", line, 200, body, "req-9")
    assert out == {
        "id": batch_request_id("job-1", "request-1"),
        "custom_id": "request-1",
        "response": {"status_code": 200, "request_id": "req-9", "body": orjson.loads(body)},
        "error": None,
    }
    assert out["id"].startswith("batch_req_")
    assert batch_request_id("job-1", "request-1") != batch_request_id("job-2", "request-1")
    refused = batch_output("job-1", line, 400, b"bad things", None)
    assert refused["response"] == {
        "status_code": 400,
        "request_id": "",
        "body": {"error": {"message": "bad things"}},
    }
    failed = batch_output("job-1", line, None, None, None, "timed out")
    assert failed["response"] is None
    assert failed["error"] == {"code": "request_failed", "message": "timed out"}


def test_rows_become_prompts_and_carried_values() -> None:
    reader = RowReader(OpenAI(), Selection(key_column="id", passthrough_columns=["lang"]))
    rows = [
        {"id": 7, "lang": "en", "prompt": "hi"},
        {"id": 8, "lang": "it", "prompt": [{"role": "user", "content": "ciao"}]},
    ]
    inputs, carried = reader.read(rows)
    assert inputs == ["hi", [{"role": "user", "content": "ciao"}]]
    assert carried == [(7, "en"), (8, "it")]
    outputs = [{"prediction": "ih"}, {"prediction": "oaic"}]
    assert join(OpenAI(), reader.selection, carried, outputs) == [
        {"id": 7, "lang": "en", "prediction": "ih"},
        {"id": 8, "lang": "it", "prediction": "oaic"},
    ]
    # Bare strings (a provider answering a list of prompts) are prompts themselves.
    assert RowReader(OpenAI(), None).read(["a", "b"]) == (["a", "b"], [])


@pytest.mark.parametrize(
    ("row", "words"),
    [
        ({"id": 1, "question": "x"}, "row 5 has no column 'prompt' (kserve.openai.inputColumn)"),
        ({"id": 1, "prompt": None}, "row 5: 'prompt' must be a string or a list of messages"),
        ({"id": 1, "prompt": []}, "got an empty list"),
        ({"id": 1, "prompt": ["hi"]}, "messages must be a list of objects"),
        ({"prompt": "x"}, "row 5 has no column 'id' (keyColumn or passthroughColumns)"),
        ({"id": None, "prompt": "x"}, "row 5: its keyColumn 'id' is null"),
        (["x", "y"], "row 5 is not an object with named columns"),
    ],
)
def test_rows_that_cannot_be_prompts_name_the_row(row: Any, words: str) -> None:
    reader = RowReader(OpenAI(), Selection(key_column="id"))
    with pytest.raises(SelectionError) as failure:
        reader.read([row], first=5)
    assert words in str(failure.value)


def test_a_streaming_page_keeps_its_carried_values_until_its_output() -> None:
    reader = RowReader(OpenAI(), Selection(key_column="id"), Partition(1, 2))
    page = reader.split(Page(10, [{"id": "a", "prompt": "x"}, {"id": "b", "prompt": "y"}], 40))
    assert page == Page(10, ["x", "y"], 40)
    assert reader.output(page, [{"prediction": 1}, {"prediction": 2}]) == [
        {"id": "a", "prediction": 1},
        {"id": "b", "prediction": 2},
    ]
    assert reader.carried == {}


def test_join_settings_that_do_not_fit_an_openai_run() -> None:
    with pytest.raises(ValueError, match="leave columns out"):
        check_selection(OpenAI(), Selection(columns=["prompt"]))
    with pytest.raises(ValueError, match=r"carried column\(s\) \['usage'\]"):
        check_selection(OpenAI(), Selection(key_column="usage"))
    with pytest.raises(ValueError, match=r"do not apply to kserve\.openai\.format batch"):
        check_selection(OpenAI(format="batch"), Selection(key_column="id"))
    check_selection(OpenAI(), Selection(key_column="id"))


def contract(**kserve_fields: Any) -> Contract:
    return Contract.model_validate(
        {
            "jobId": "j",
            "jobName": "n",
            "kserve": {"modelUrl": "h/openai/v1", "modelName": "echo", **kserve_fields},
            "input": {"http": {"secretRef": {"name": "s"}, "keyColumn": "id", "columns": ["a"]}},
            "output": {"http": {"secretRef": {"name": "s"}}},
        }
    )


def test_the_plan_refuses_join_keys_an_openai_run_cannot_use() -> None:
    env = RunnerEnv.from_environ({})
    with pytest.raises(ContractError, match="input columns: an OpenAI run reads its prompt"):
        plan(contract(modelVersion="openai"), env)
    # The same contract with the Open Inference Protocol is fine.
    assert plan(contract(modelVersion="v2"), env).openai is None


def test_the_llm_examples_plan_in_the_runner() -> None:
    """examples/*.yaml with modelVersion openai: the contract they render, planned as a run."""
    planned = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc["kind"] != "InferenceConfig":
                continue
            doc["metadata"].update(namespace="ns", uid="0000")
            config = InferenceConfig.model_validate(doc)
            kserve = config.spec.effective_kserve()
            if kserve.model_version != "openai":
                continue
            contract = Contract(
                job_id="job",
                job_name="inf-job",
                kserve=kserve,
                input=config.spec.storage.input,
                output=config.spec.storage.output,
                parameters={"day": "2026-11-26"},
                batching=config.spec.batching,
            )
            work = plan(contract, RunnerEnv.from_environ({}))
            assert work.openai is not None
            planned.append((path.name, work.openai.settings.format))
    assert planned == [("llm-chat.yaml", "rows"), ("openai-batch.yaml", "batch")]
