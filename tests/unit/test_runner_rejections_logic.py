"""Which failures are permanent (exit 6/7/8: the Job fails at once) and which are not."""

from __future__ import annotations

import pytest

from contract.exitcodes import (
    PERMANENT,
    REASONS,
    STAGE_ERRORS,
    ContractError,
    ExitCode,
    InferenceError,
    InferenceRejected,
    InputError,
    InputRejected,
    OutputError,
    OutputRejected,
)
from runner.inference import ModelRefused, classify, parse_v1_response, parse_v2_response
from runner.retry import Transient
from runner.storage.base import StorageError, StorageRejected
from runner.storage.transport import Answer, check_stored, rows_from

pytestmark = pytest.mark.unit


def test_the_exit_codes() -> None:
    assert {code.name: int(code) for code in ExitCode} == {
        "DONE": 0,
        "BAD_CONTRACT": 2,
        "INPUT": 3,
        "INFERENCE": 4,
        "OUTPUT": 5,
        "INPUT_REJECTED": 6,
        "INFERENCE_REJECTED": 7,
        "OUTPUT_REJECTED": 8,
        "MODEL_AUTH": 9,
        "TERMINATED": 143,
    }
    assert sorted(PERMANENT) == [2, 6, 7, 8, 9]
    assert set(REASONS) == set(ExitCode)
    assert [REASONS[ExitCode(code)] for code in (6, 7, 8)] == [
        "InputRejected",
        "InferenceRejected",
        "OutputRejected",
    ]
    # What nobody foresaw (a bug, most likely) stays retryable.
    assert {stage: cls.exit_code for stage, cls in STAGE_ERRORS.items()} == {
        "contract": ExitCode.BAD_CONTRACT,
        "input": ExitCode.INPUT,
        "inference": ExitCode.INFERENCE,
        "output": ExitCode.OUTPUT,
    }


@pytest.mark.parametrize(
    ("error", "retryable", "stage", "code", "permanent"),
    [
        (ContractError, None, "contract", 2, True),
        (InputError, None, "input", 3, False),
        (InputRejected, InputError, "input", 6, True),
        (InferenceError, None, "inference", 4, False),
        (InferenceRejected, InferenceError, "inference", 7, True),
        (OutputError, None, "output", 5, False),
        (OutputRejected, OutputError, "output", 8, True),
    ],
)
def test_each_rejection_is_its_stages_error_with_its_own_code(
    error: type[ContractError], retryable: type | None, stage: str, code: int, permanent: bool
) -> None:
    raised = error("why")
    assert (raised.stage, int(raised.exit_code), raised.permanent) == (stage, code, permanent)
    if retryable is not None:
        # The termination message names the stage, whichever of its two codes it ends with.
        assert isinstance(raised, retryable)


@pytest.mark.parametrize(
    ("status", "permanent"),
    [
        (400, True),
        (401, True),
        (403, True),
        (404, True),
        (413, True),
        (415, True),
        (422, True),
        (408, None),
        (429, None),
        (500, None),
        (502, None),
        (503, None),
        (504, None),
    ],
)
def test_model_answers_are_retried_or_rejected(status: int, permanent: bool | None) -> None:
    error = classify(status, b'{"error": "nope"}', None)
    if permanent is None:
        assert isinstance(error, Transient)
    else:
        assert isinstance(error, ModelRefused)
        assert error.permanent is permanent


def test_a_2xx_that_is_not_an_answer_is_permanent() -> None:
    for call, body in (
        (parse_v2_response, b"<html>login</html>"),
        (parse_v2_response, b'{"outputs": []}'),
        (parse_v2_response, b'{"outputs": [{"data": [1, 2, 3]}]}'),
        (parse_v1_response, b'{"error": "no predictions today"}'),
    ):
        with pytest.raises(ModelRefused) as refused:
            call(body, 2)
        assert refused.value.permanent, body


def test_a_refusal_without_an_answer_is_not_permanent() -> None:
    # TLS: not worth retrying within the pod, but certificates can be fixed.
    assert not ModelRefused("model call failed: TLS: bad certificate").permanent


def answer(body: bytes, content_type: str = "application/json") -> Answer:
    return Answer("POST", "http://h/compute/x", 200, content_type, body)


@pytest.mark.parametrize(
    "body",
    [
        b"sqlite3.OperationalError: no such table: t",
        b'{"rows": []}',
        b'{"result": {"a": 1}}',
    ],
)
def test_input_that_is_not_rows_is_rejected(body: bytes) -> None:
    with pytest.raises(StorageRejected):
        rows_from(answer(body), "result")


def test_an_error_text_instead_of_storing_is_rejected() -> None:
    with pytest.raises(StorageRejected) as rejected:
        check_stored(answer(b"NotebookFailed: invalid table name"))
    assert isinstance(rejected.value, StorageError)
