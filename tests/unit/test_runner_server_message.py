"""Quoting a server's error: its own words, one short line, never the request's data."""

from __future__ import annotations

import orjson
import pytest

from runner.httputil import (
    SCAN_LIMIT,
    SERVER_MESSAGE_LIMIT,
    STRUCTURE_LIMIT,
    server_message,
    strip_data,
    trim,
)
from runner.redact import REDACTED, REDACTOR

pytestmark = pytest.mark.unit

ROWS = [[5.1, 3.5, 1.4, 0.2], [6.2, 2.9, 4.3, 1.3]] * 500


def fastapi_422(request: object) -> bytes:
    """What KServe's and MLServer's FastAPI answer a body they cannot parse (measured)."""
    return orjson.dumps(
        {
            "detail": [
                {
                    "type": "missing",
                    "loc": ["body", "InferenceRequest", "inputs"],
                    "msg": "Field required",
                    "input": request,
                },
                {
                    "type": "bytes_type",
                    "loc": ["body", "bytes"],
                    "msg": "Input should be a valid bytes",
                    "input": request,
                },
            ]
        }
    )


def test_a_fastapi_422_is_its_locations_and_messages_without_the_input() -> None:
    message = server_message(fastapi_422({"instances": ROWS}))

    assert message == (
        "body.InferenceRequest.inputs: Field required; body.bytes: Input should be a valid bytes"
    )


def test_many_validation_errors_are_counted_not_listed() -> None:
    errors = [{"loc": ["body", "inputs", i], "msg": "bad", "input": ROWS[i]} for i in range(9)]
    message = server_message(orjson.dumps({"detail": errors}))

    assert message == (
        "body.inputs.0: bad; body.inputs.1: bad; body.inputs.2: bad; body.inputs.3: bad; 5 more"
    )


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"error": "Model with name x does not exist."}', "Model with name x does not exist."),
        (b'{"detail": "Not Found"}', "Not Found"),
        (b'{"message": "quota exceeded"}', "quota exceeded"),
        (b'{"error": {"code": 3, "message": "no such tensor"}}', "no such tensor"),
        (b'{"error": "", "message": "the second field"}', "the second field"),
        # Short structures are words: a shape, an example body.
        (
            b'{"error": "expected rows of 4 features, got an array of shape [10, 3]"}',
            "expected rows of 4 features, got an array of shape [10, 3]",
        ),
        (
            b'{"error": "expected a v2 request or a v1 body {\\"instances\\": [...]}"}',
            'expected a v2 request or a v1 body {"instances": [...]}',
        ),
        (
            b'Traceback (most recent call last):\n  File "m.py", line 3, in predict\n'
            b"ValueError: X has 3 features, but the model expects 4\n",
            "ValueError: X has 3 features, but the model expects 4",
        ),
        (b"plain\n  text", "plain text"),
        (b"", "(empty body)"),
    ],
)
def test_the_servers_own_field_is_quoted(body: bytes, expected: str) -> None:
    assert server_message(body) == expected


def test_rows_echoed_inside_the_error_text_are_collapsed() -> None:
    text = f"cannot process request {orjson.dumps({'inputs': ROWS}).decode()} at all"

    assert server_message(orjson.dumps({"error": text})) == "cannot process request {…} at all"


def test_an_echo_cut_off_by_the_server_ends_the_message() -> None:
    text = f"bad input: {orjson.dumps(ROWS).decode()[:2000]}"

    assert server_message(text.encode()) == "bad input: […"


def test_pydantics_input_value_is_dropped() -> None:
    # MLServer quotes pydantic's ValidationError text, which repeats the input.
    text = (
        "1 validation error for InferenceRequest\ninputs.0.data\n"
        "  Input should be a valid list [type=list_type, input_value={'name': 'input-0', "
        "'data': '5.1 3.5'}, input_type=dict]\n"
        "    For further information visit https://errors.pydantic.dev/2.9/v/list_type"
    )

    message = server_message(orjson.dumps({"error": text}))

    assert "5.1" not in message
    assert message == (
        "1 validation error for InferenceRequest inputs.0.data Input should be a valid list "
        "[type=list_type, input_type=dict] For further information visit "
        "https://errors.pydantic.dev/2.9/v/list_type"
    )


def test_a_run_of_bare_numbers_is_data() -> None:
    values = " ".join(str(v) for row in ROWS[:10] for v in row)

    assert strip_data(f"got values {values} instead") == "got values … instead"
    assert strip_data("version 1.2.3, 4 retries, 10 s") == "version 1.2.3, 4 retries, 10 s"


def test_structures_up_to_the_limit_are_words() -> None:
    short = "[" + "x" * (STRUCTURE_LIMIT - 2) + "]"
    long = "[" + "x" * (STRUCTURE_LIMIT - 1) + "]"
    assert strip_data(f"a {short} b") == f"a {short} b"
    assert strip_data(f"a {long} b") == "a […] b"


def test_the_message_is_one_line_within_the_bound() -> None:
    message = server_message(orjson.dumps({"error": "word\n" * 1000}))

    assert len(message) == SERVER_MESSAGE_LIMIT
    assert message.endswith("…")
    assert "\n" not in message


def test_a_credential_at_the_cut_is_redacted_whole() -> None:
    secret = "s3cr3t-value-9f2c"
    REDACTOR.add(secret)
    text = "x" * (SERVER_MESSAGE_LIMIT - 8) + " " + secret

    message = server_message(text.encode())

    assert secret[:6] not in message
    assert trim(f"token {secret}") == f"token {REDACTED}"


def test_huge_bodies_are_reduced_too() -> None:
    body = fastapi_422({"inputs": [{"data": ROWS * 50}]})
    assert len(body) > SCAN_LIMIT  # still parsed whole: the words are in its JSON
    assert server_message(body).startswith("body.InferenceRequest.inputs: Field required")
    assert server_message(b"[" * 2_000_000) == "[…"
