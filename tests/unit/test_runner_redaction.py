"""Secret redaction, the log pipeline and pod paths."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator, Mapping
from pathlib import Path

import orjson
import pytest
import structlog

from contract import paths
from contract.credentials import REDACTED
from runner import logs
from runner.redact import Redactor
from runner.secrets import PUBLIC_KEYS, RedactingSecretReader, decode_data, pod_namespace

pytestmark = pytest.mark.unit


def test_registered_values_are_replaced_everywhere() -> None:
    redactor = Redactor(["s3cr3t-value"])
    assert redactor.redact("a s3cr3t-value b s3cr3t-value") == f"a {REDACTED} b {REDACTED}"


def test_longer_secrets_win_over_their_parts() -> None:
    redactor = Redactor(["abcd", "abcdefgh"])
    assert redactor.redact("xabcdefghx") == f"x{REDACTED}x"


def test_values_too_short_to_be_secrets_are_not_registered() -> None:
    redactor = Redactor(["1", "ab", "  "])
    assert redactor.redact("1 ab") == "1 ab"


def test_sensitive_keys_hide_whole_values_in_nested_structures() -> None:
    redactor = Redactor()
    event = {
        "event": "storage request",
        "headers": {"Authorization": "anything", "Accept": "application/json"},
        "password": 1234,
        "items": [{"api_key": "k"}, "plain"],
    }
    assert redactor.redact_obj(event) == {
        "event": "storage request",
        "headers": {"Authorization": REDACTED, "Accept": "application/json"},
        "password": REDACTED,
        "items": [{"api_key": REDACTED}, "plain"],
    }


@pytest.fixture
def log_buffer() -> Iterator[io.StringIO]:
    buffer = io.StringIO()
    yield buffer
    structlog.reset_defaults()


def test_log_lines_are_json_and_redacted(log_buffer: io.StringIO) -> None:
    redactor = Redactor(["pa55word-xyz"])
    logs.configure("info", stream=log_buffer, redactor=redactor)
    log = logs.get_logger(jobId="j")
    log.info("calling", url="https://u:pa55word-xyz@h", note="pa55word-xyz")
    log.debug("hidden at info")
    try:
        raise ValueError("failed with pa55word-xyz")
    except ValueError:
        log.exception("boom")

    lines = [orjson.loads(line) for line in log_buffer.getvalue().splitlines()]
    assert [line["event"] for line in lines] == ["calling", "boom"]
    assert lines[0]["jobId"] == "j"
    assert lines[0]["level"] == "info"
    assert "timestamp" in lines[0]
    assert "pa55word-xyz" not in log_buffer.getvalue()
    assert "ValueError: failed with [REDACTED]" in lines[1]["exception"]


def test_unknown_log_level_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown log level 'loud'"):
        logs.configure("loud")


class DictSecrets:
    def __init__(self, data: Mapping[str, str]) -> None:
        self.data = data

    async def read(self, namespace: str, name: str) -> Mapping[str, str]:
        return self.data


async def test_secret_values_are_registered_except_public_keys() -> None:
    redactor = Redactor()
    reader = RedactingSecretReader(
        DictSecrets(
            {
                "server-url": "http://storage.example:8080",
                "username": "finops-user",
                "password": "pw-0001",
                "token": "tok-0002",
                "client-key-data": "key-0003",
            }
        ),
        redactor,
    )
    data = await reader.read("ns", "name")
    assert data["password"] == "pw-0001"
    text = "http://storage.example:8080 finops-user pw-0001 tok-0002 key-0003"
    assert redactor.redact(text) == (
        f"http://storage.example:8080 finops-user {REDACTED} {REDACTED} {REDACTED}"
    )
    assert {"server-url", "username", "url", "ca"} <= PUBLIC_KEYS


def test_decode_data() -> None:
    encoded = {"a": base64.b64encode(b"one").decode(), "b": base64.b64encode(b"\xff").decode()}
    assert decode_data(encoded) == {"a": "one", "b": "\ufffd"}
    assert decode_data(None) == {}


def test_pod_paths_move_under_the_node_agent_root(tmp_path: Path) -> None:
    root = {"NODE_AGENT_ROOT": str(tmp_path)}
    assert paths.pod_path(paths.CONTRACT, {}) == Path("/tmp/contract.json")
    assert paths.pod_path(paths.CONTRACT, root) == tmp_path / "tmp/contract.json"
    assert paths.pod_path(paths.SERVICE_ACCOUNT_TOKEN, root) == (
        tmp_path / "var/run/secrets/kubernetes.io/serviceaccount/token"
    )
    with pytest.raises(ValueError, match="pod paths are absolute"):
        paths.pod_path("tmp/x", root)


def test_explicit_overrides_are_used_as_given(tmp_path: Path) -> None:
    environ = {
        "NODE_AGENT_ROOT": str(tmp_path),
        "CONTRACT_PATH": "/elsewhere/c.json",
        "TERMINATION_LOG_PATH": "/elsewhere/t",
    }
    assert paths.contract_path(environ) == Path("/elsewhere/c.json")
    assert paths.termination_log_path(environ) == Path("/elsewhere/t")
    assert paths.termination_log_path({}) == Path("/dev/termination-log")


def test_pod_namespace_sources(tmp_path: Path) -> None:
    assert pod_namespace({"POD_NAMESPACE": "a", "NODE_AGENT_ROOT": str(tmp_path)}) == "a"
    assert pod_namespace({"NODE_AGENT_ROOT": str(tmp_path)}) == "default"
    file = tmp_path / "var/run/secrets/kubernetes.io/serviceaccount/namespace"
    file.parent.mkdir(parents=True)
    file.write_text("b\n")
    assert pod_namespace({"NODE_AGENT_ROOT": str(tmp_path)}) == "b"
