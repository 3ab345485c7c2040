"""What a credential looks like (contract/credentials.py): one definition for the
runner's redaction, the controller's logs and the admission scan."""

from __future__ import annotations

import pytest

from contract.credentials import (
    REDACTED,
    find_inline_credentials,
    is_credential_key,
    redact_structure,
    redact_text,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "key",
    [
        "Authorization",
        "proxy-authorization",
        "token",
        "access_token",
        "serviceAccountToken",
        "password",
        "PASSWORD",
        "client_secret",
        "api-key",
        "x_api_key",
        "Cookie",
        "client-key-data",
        "privateKey",
        "private_key",
        "credentials",
        "secret_access_key",
    ],
)
def test_credential_keys(key: str) -> None:
    assert is_credential_key(key)


# Keys that only name a secret hold names, not credentials: hiding their values
# hides what an operator needs to read (the runner hides every value it read
# from a Secret by value anyway).
@pytest.mark.parametrize(
    "key",
    ["secret_name", "secretName", "secretRef", "tokens_used", "username", "run", "server-url"],
)
def test_keys_that_only_name_a_secret_are_kept(key: str) -> None:
    assert not is_credential_key(key)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Authorization: Bearer eyJhbGciOi.abc.def", "Authorization: Bearer [REDACTED]"),
        ("header Basic dXNlcjpwYXNz end", "header Basic [REDACTED] end"),
        ("Authorization: Basic Ym9iOnB3", "Authorization: Basic [REDACTED]"),
        ("bearer abc.def-ghi", "bearer [REDACTED]"),
        ("token=abc123&x=1", "token=[REDACTED]&x=1"),
        ('{"password": "hunter2"}', '{"password": "[REDACTED]"}'),
        ("api_key: sk-12345", "api_key: [REDACTED]"),
        ("https://user:hunter2@db.example/x", "https://[REDACTED]@db.example/x"),
        ("GET https://bob:pw@h/x failed", "GET https://[REDACTED]@h/x failed"),
        ("https://ghp_token123@github.com/x", "https://[REDACTED]@github.com/x"),
        ("nothing to see here", "nothing to see here"),
        ("tokenizer ready", "tokenizer ready"),
        ("the token is", "the token is"),
        # Prose keeps its words; anything shaped like a generated value goes.
        ("token expired", "token expired"),
        ("the token expired at noon", "the token expired at noon"),
        ("credentials: model answered 401", "credentials: model answered 401"),
        ("password: hunter", "password: [REDACTED]"),
        ("password: hunter2 was refused", "password: [REDACTED] was refused"),
        ('password: "hunter" was refused', 'password: "[REDACTED]" was refused'),
        ("password=hunter was refused", "password=[REDACTED] was refused"),
        ("token abcd1234", "token [REDACTED]"),
        ("token AbCdEfGh", "token [REDACTED]"),
        ("token abcdefghijklmnopqrstuvwxyz", "token [REDACTED]"),
    ],
)
def test_credentials_inside_strings(text: str, expected: str) -> None:
    assert redact_text(text) == expected


def test_nested_structures_are_walked_without_touching_the_original() -> None:
    original = {
        "contract": {
            "input": {"krateo": {"api": {"headers": ["Authorization: Bearer abcdef12"]}}},
            "credentials": {"username": "u", "password": "p"},
        },
        "items": ({"token": "t0k3n"}, "ok"),
        "empty_password": "",
        "error": ValueError("password=hunter2"),
        "body": b"token=abcdef",
    }
    redacted = redact_structure(original)
    assert redacted["contract"]["input"]["krateo"]["api"]["headers"] == [
        "Authorization: Bearer [REDACTED]"
    ]
    assert redacted["contract"]["credentials"] == REDACTED
    assert redacted["items"] == ({"token": REDACTED}, "ok")
    assert redacted["empty_password"] == ""
    assert redacted["error"] == f"password={REDACTED}"
    assert redacted["body"] == f"token={REDACTED}"
    assert original["items"] == ({"token": "t0k3n"}, "ok")


def test_the_text_redaction_is_a_parameter() -> None:
    assert redact_structure({"a": ["x"], "b": "y"}, str.upper) == {"a": ["X"], "b": "Y"}


@pytest.mark.parametrize(
    "value",
    [
        "Authorization: Bearer abc",
        "x-api-key: 123",
        "X-Auth-Token: abc",
        "Cookie:",
        "https://user:pw@example.com/data",
    ],
)
def test_credential_strings_are_found(value: str) -> None:
    assert find_inline_credentials({"h": [value]}) == ["h[0]"]


@pytest.mark.parametrize(
    "value",
    [
        "Accept: application/json",
        "https://user@example.com/data",
        "https://example.com:8443/data",
        "/api/token: x",
        "note: the secret is elsewhere",
    ],
)
def test_other_strings_are_not_credentials(value: str) -> None:
    assert find_inline_credentials({"h": [value]}) == []
