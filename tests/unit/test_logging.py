"""Structured logging and credential redaction (controller/logging.py).

What counts as a credential is tested with its definition, in test_credentials.py.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
import structlog

from controller.logging import bound, configure_logging, get_logger

pytestmark = pytest.mark.unit


def unconfigure(buffer: io.StringIO) -> None:
    structlog.reset_defaults()
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, logging.StreamHandler) and handler.stream is buffer:
            root.removeHandler(handler)


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    buffer = io.StringIO()
    configure_logging("DEBUG", "json", buffer)
    yield buffer
    unconfigure(buffer)


def lines(stream: io.StringIO) -> list[dict[str, object]]:
    """The lines in ``stream`` the test wrote, not asyncio's.

    asyncio says which selector it uses (at debug, through the same root
    handler) when the test run's first event loop is made, which is during
    this file's first test when the file runs alone or first on a worker.
    """
    parsed = [json.loads(line) for line in stream.getvalue().splitlines()]
    return [line for line in parsed if line.get("logger") != "asyncio"]


def test_json_lines_with_the_run_key_bound(stream: io.StringIO) -> None:
    log = get_logger("controller.reconcile")
    with bound(run="team-a/iris"):
        log.info("job created", job="inf-iris-1234abcd")
        log.debug("detail")
    log.info("outside")
    first, second, third = lines(stream)
    assert first["msg"] == "job created"
    assert first["run"] == "team-a/iris"
    assert first["level"] == "info"
    assert first["logger"] == "controller.reconcile"
    assert "ts" in first
    assert first["level"] == "info"
    assert second["run"] == "team-a/iris"
    assert "run" not in third


def test_no_credential_reaches_the_stream(stream: io.StringIO) -> None:
    log = get_logger("controller.test")
    log.warning(
        "storage call failed",
        headers={"Authorization": "Bearer s3cr3t-value"},
        url="https://admin:s3cr3t-value@storage/x",
        detail="password=s3cr3t-value",
    )
    logging.getLogger("aiohttp.client").error("sent Authorization: Bearer s3cr3t-value")
    try:
        raise RuntimeError("token=s3cr3t-value")
    except RuntimeError:
        log.exception("failed")
    output = stream.getvalue()
    assert "s3cr3t-value" not in output
    records = lines(stream)
    assert len(records) == 3
    assert records[1]["logger"] == "aiohttp.client"  # stdlib loggers are JSON too
    assert "RuntimeError" in str(records[2]["exception"])


def test_level_filters_lines() -> None:
    buffer = io.StringIO()
    configure_logging("WARNING", "json", buffer)
    try:
        log = get_logger("controller.test")
        log.info("quiet")
        log.warning("loud")
        assert [line["msg"] for line in lines(buffer)] == ["loud"]
    finally:
        unconfigure(buffer)


def test_console_format_is_redacted_too() -> None:
    buffer = io.StringIO()
    configure_logging("INFO", "console", buffer)
    try:
        get_logger("controller.test").info("hello", token="abc", run="ns/r")
        output = buffer.getvalue()
        assert "hello" in output
        assert "run=ns/r" in output
        assert "abc" not in output
    finally:
        unconfigure(buffer)
