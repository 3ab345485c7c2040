"""One credential rule, tested from one corpus.

Every positive case is a storage setting written the way people write it
(cloud SDK keys, connection strings, DSNs, headers, tokens in URLs, key files
pasted inline) with the secret part in it. For each, the admission scan
(``find_inline_credentials``, so ``InferenceConfig`` validation) refuses it,
and every redaction (a structure in a log line, the same structure printed as
text or JSON) leaves nothing of the secret. Every negative case is a look-alike
that must stay legal and readable: references, names, URLs and model
parameters whose keys contain ``secret``, ``token`` or ``key``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from contract.credentials import (
    find_inline_credentials,
    is_credential_env,
    redact_structure,
    redact_text,
)
from controller import api, validation
from controller.api import EnvVar, InferenceConfig
from controller.invalid import describe_invalid
from runner.redact import Redactor

pytestmark = pytest.mark.unit

PEM = (
    "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7\n"
    "-----END PRIVATE KEY-----\n"
)
RSA_PEM = "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEAzQ3vVq9\n-----END RSA PRIVATE KEY-----"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJqb2JzIn0.c2lnbmF0dXJlc2lnbmF0dXJl"
S = "Zr9Qw7Lk2Xp4"  # a secret value, recognisable in any output

# (settings, the secret part that must never be repeated)
POSITIVE: list[tuple[dict[str, Any], str]] = [
    # AWS, every spelling
    ({"awsSecretAccessKey": S}, S),
    ({"aws_secret_access_key": S}, S),
    ({"AWS_SECRET_ACCESS_KEY": S}, S),
    ({"secretAccessKey": S}, S),
    ({"SecretAccessKey": S}, S),
    ({"secret-access-key": S}, S),
    ({"aws.secret.access.key": S}, S),
    ({"secretaccesskey": S}, S),
    ({"sessionToken": S}, S),
    ({"aws_session_token": S}, S),
    ({"X-Amz-Security-Token": S}, S),
    ({"accessKeyId": "AKIAIOSFODNN7EXAMPLE"}, "AKIAIOSFODNN7EXAMPLE"),
    ({"note": "keys ASIAY34FZKBOKMUTVV7A and more"}, "ASIAY34FZKBOKMUTVV7A"),
    ({"url": f"https://b.s3.amazonaws.com/k?X-Amz-Signature={S}&X-Amz-Date=1"}, S),
    # GCP
    ({"private_key": PEM}, "MIIEvQIBADAN"),
    ({"privateKey": RSA_PEM}, "MIIEpAIBAAKC"),
    ({"privateKeyPem": S}, S),
    ({"private-key-data": S}, S),
    ({"serviceAccountKey": S}, S),
    ({"serviceAccountJson": json.dumps({"type": "service_account", "private_key": PEM})}, "MIIE"),
    ({"gcs": {"credentials": {"type": "service_account", "private_key": PEM}}}, "MIIE"),
    ({"key": "AIzaSyA1b2C3d4E5f6G7h8I9j0KLMNOPQRSTUVW"}, "AIzaSyA1b2C3d4E5f6G7h8I9j0KLMNOPQRSTUVW"),
    ({"credentials": S}, S),
    ({"credential": S}, S),
    # Azure
    ({"accountKey": S}, S),
    ({"account_key": S}, S),
    ({"AZURE_STORAGE_ACCOUNT_KEY": S}, S),
    ({"connectionString": f"DefaultEndpointsProtocol=https;AccountName=a;AccountKey={S};"}, S),
    ({"conn": f"Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKey={S}"}, S),
    ({"conn": f"BlobEndpoint=https://a.blob.core.windows.net/;SharedAccessSignature={S}"}, S),
    ({"sasUrl": f"https://a.blob.core.windows.net/c?sv=2022-11-02&sp=r&sig={S}"}, S),
    ({"sasToken": S}, S),
    ({"sas_token": f"sv=2022-11-02&ss=b&sig={S}"}, S),
    ({"sharedKey": S}, S),
    ({"clientSecret": S}, S),
    ({"client_secret": S}, S),
    # Passwords, in any case and separator style
    ({"password": S}, S),
    ({"Password": S}, S),
    ({"PASSWORD": S}, S),
    ({"pwd": S}, S),
    ({"PWD": S}, S),
    ({"passwd": S}, S),
    ({"passphrase": S}, S),
    ({"dbPassword": S}, S),
    ({"db_password": S}, S),
    ({"PGPASSWORD": S}, S),
    ({"keystore.password": S}, S),
    ({"password": 12345678}, "12345678"),
    ({"password": [S]}, S),
    # Database DSNs and URLs with passwords
    ({"dsn": f"postgresql://app:{S}@db:5432/x"}, S),
    ({"url": f"mysql://root:{S}@127.0.0.1/db"}, S),
    ({"uri": f"mongodb+srv://u:{S}@cluster0.example.net/"}, S),
    ({"dsn": f"host=db port=5432 dbname=x user=app password={S}"}, S),
    ({"conn": f"Server=db;Database=x;User Id=app;Pwd={S};"}, S),
    ({"url": f"redis://:{S}@cache:6379/0"}, S),
    ({"url": f"https://user:{S}@example.com/data.csv"}, S),
    # Tokens and API keys
    ({"token": S}, S),
    ({"Token": S}, S),
    ({"accessToken": S}, S),
    ({"refresh_token": S}, S),
    ({"id-token": S}, S),
    ({"bearerToken": S}, S),
    ({"authToken": S}, S),
    ({"HF_TOKEN": S}, S),
    ({"apiKey": S}, S),
    ({"api_key": S}, S),
    ({"API-KEY": S}, S),
    ({"apikey": S}, S),
    ({"APIKey": S}, S),
    ({"apiKeyValue": S}, S),
    ({"x-api-key": S}, S),
    ({"secret": S}, S),
    ({"webhookSecret": S}, S),
    ({"secretKey": S}, S),
    ({"secret_key_base64": S}, S),
    ({"masterKey": S}, S),
    ({"signingKey": S}, S),
    ({"Cookie": f"session={S}"}, S),
    ({"authorization": f"Basic {S}"}, S),
    ({"headers": [f"Authorization: Bearer {S}"]}, S),
    ({"headers": [f"X-Api-Key: {S}"]}, S),
    ({"headers": [f"X-Auth-Token: {S}"]}, S),
    ({"headers": {"Authorization": f"Bearer {S}"}}, S),
    ({"id": JWT}, JWT),
    ({"url": f"https://api.example.com/v1?access_token={S}"}, S),
    ({"url": f"https://api.example.com/v1?limit=5&api_key={S}"}, S),
    ({"url": f"https://api.example.com/v1#token={S}"}, S),
    ({"repo": "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"}, "ghp_a1B2c3D4e5F6g7H8i9J0k1L2m3N4"),
    ({"repo": "glpat-" + "x1Y2z3A4b5C6d7E8f9G0"}, "glpat-x1Y2z3A4b5C6d7E8f9G0"),
    ({"hook": "xoxb-" + "1234567890-abcdefghij"}, "xoxb-1234567890-abcdefghij"),
    ({"openai": "sk-" + "proj-Ab12Cd34Ef56Gh78Ij90Kl"}, "Ab12Cd34Ef56Gh78Ij90Kl"),
    # Deeper inside a provider's settings
    ({"api": {"auth": {"basic": {"username": "u", "password": S}}}}, S),
    ({"s3": {"bucket": "b", "credentials": {"accessKeyId": "x", "secretAccessKey": S}}}, S),
    ({"sources": [{"name": "a"}, {"name": "b", "token": S}]}, S),
]

# Look-alikes that must be accepted and left readable.
NEGATIVE: list[dict[str, Any]] = [
    {"secretName": "bucket-credentials"},
    {"secret_name": "db"},
    {"secretRef": {"name": "s3-creds", "namespace": "data"}},
    {"secretKeyRef": {"name": "s", "key": "password"}},
    {"passwordRef": "x"},
    {"passwordFile": "/var/run/secrets/db/password"},
    {"password_secret_name": "db-password"},
    {"tokenUrl": "https://login.example.com/oauth2/token"},
    {"token_url": "https://idp/token"},
    {"tokenEndpoint": "https://idp/oauth/token"},
    {"tokenPath": "/var/run/secrets/tokens/t"},
    {"token_type": "Bearer"},
    {"tokenExpirySeconds": 3600},
    {"tokens_used": 10},
    {"maxTokens": 256},
    {"max_new_tokens": 128},
    {"tokenizer": "bert-base-uncased"},
    {"signatureVersion": "v4"},
    {"accessKeyId": "my-access-key-id"},
    {"access_key_id_ref": "x"},
    {"keyId": "k1"},
    {"private_key_id": "abc123"},
    {"publicKey": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI user@host"},
    {"key": "predictions/2024/part-0001.parquet"},
    {"keys": ["a.csv", "b.csv"]},
    {"username": "app"},
    {"user": "postgres"},
    {"password": ""},
    {"token": None},
    {"token": {"secretKeyRef": {"name": "s", "key": "token"}}},
    {"credentials": {"secretName": "gcs"}},
    {"secretNamespace": "krateo-system"},
    {"passThrough": True},
    {"bypass": "none"},
    {"url": "https://example.com:8443/data?limit=10&offset=0"},
    {"url": "https://user@example.com/data"},
    {"dsn": "host=db port=5432 dbname=x user=app sslmode=require"},
    {"query": "SELECT id FROM users WHERE password = $1"},
    {"headers": ["Accept: application/json", "Content-Type: text/csv"]},
    {"path": "/api/token: x"},
    {"note": "the secret is in the Secret named db"},
    {"caBundle": "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----"},
    {"endpointRef": {"name": "endpoint", "namespace": "krateo-system"}},
    {"model": "sk-learn-classifier"},
    {"description": "a token bucket rate limiter"},
]


def _config(storage: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": "cfg", "namespace": "ns", "uid": "u1"},
        "spec": {
            "image": "runner:1",
            "kserve": {"modelUrl": "http://model/v2/models/m/infer"},
            "storage": {"input": {"p": storage}},
        },
    }


def test_the_corpus_is_large_enough() -> None:
    assert len(POSITIVE) >= 60
    assert len(NEGATIVE) >= 30


@pytest.mark.parametrize(("settings", "secret"), POSITIVE, ids=lambda v: str(v)[:60])
def test_credentials_are_refused(settings: dict[str, Any], secret: str) -> None:
    assert find_inline_credentials(settings), settings
    with pytest.raises(ValidationError) as caught:
        InferenceConfig.model_validate(_config(settings))
    reason, message = describe_invalid(caught.value)
    assert reason == "InlineCredentials"
    assert secret not in message


@pytest.mark.parametrize(("settings", "secret"), POSITIVE, ids=lambda v: str(v)[:60])
def test_credentials_are_never_repeated(settings: dict[str, Any], secret: str) -> None:
    # As a structure (a log line's fields), as JSON and as Python's repr
    # (how contracts and errors reach text), through either redaction.
    outputs = [
        json.dumps(redact_structure(settings)),
        redact_text(json.dumps(settings)),
        redact_text(str(settings)),
        json.dumps(Redactor().redact_obj(settings)),
    ]
    for output in outputs:
        assert secret not in output, output
    assert any(secret in text for text in (json.dumps(settings), str(settings)))


# Logs hide more than admission refuses, on purpose: a whole value under a
# credential key even when it is a reference, a URL's userinfo even without a
# password, and `password = ...` in prose. These look-alikes are
# legal settings, but their log lines are redacted anyway.
HIDDEN_IN_LOGS_ONLY = [
    {"token": {"secretKeyRef": {"name": "s", "key": "token"}}},
    {"credentials": {"secretName": "gcs"}},
    {"url": "https://user@example.com/data"},
    {"query": "SELECT id FROM users WHERE password = $1"},
    {"path": "/api/token: x"},
    {"token": None},
]


@pytest.mark.parametrize("settings", NEGATIVE, ids=lambda v: str(v)[:60])
def test_look_alikes_are_accepted(settings: dict[str, Any]) -> None:
    assert find_inline_credentials(settings) == []
    InferenceConfig.model_validate(_config(settings))
    if settings not in HIDDEN_IN_LOGS_ONLY:
        assert redact_structure(settings) == settings
        assert redact_text(json.dumps(settings)) == json.dumps(settings)


def test_logs_hide_what_admission_allows_only_where_listed() -> None:
    assert all(s in NEGATIVE for s in HIDDEN_IN_LOGS_ONLY)
    for settings in HIDDEN_IN_LOGS_ONLY:
        hidden = redact_structure(settings) != settings
        assert hidden or redact_text(json.dumps(settings)) != json.dumps(settings)


CREDENTIAL_ENV = [
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AZURE_STORAGE_ACCOUNT_KEY",
    "AZURE_CLIENT_SECRET",
    "HF_TOKEN",
    "PGPASSWORD",
    "OPENAI_API_KEY",
    "API_KEY_B64",
    "GOOGLE_PRIVATE_KEY",
    "db.password",
    "client-secret",
    "MY_CREDENTIALS",
]
PLAIN_ENV = [
    "PWD",
    "OLDPWD",
    "SECRET_NAME",
    "TOKEN_URL",
    "TOKENIZERS_PARALLELISM",
    "MAX_TOKENS",
    "AWS_ACCESS_KEY_ID",
    "AWS_REGION",
    "HTTPS_PROXY",
    "PASSWORD_FILE",
    "GOOGLE_APPLICATION_CREDENTIALS_PATH",
    "LOG_LEVEL",
]


@pytest.mark.parametrize("name", CREDENTIAL_ENV)
def test_credential_env_needs_a_secret(name: str) -> None:
    assert is_credential_env(name)
    assert re.match(validation.ENV_CREDENTIAL_PATTERN, name), "the CRD's CEL rule refuses it too"
    with pytest.raises(ValidationError) as caught:
        EnvVar.model_validate({"name": name, "value": S})
    assert describe_invalid(caught.value)[0] == "InlineCredentials"
    EnvVar.model_validate({"name": name, "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}})


@pytest.mark.parametrize("name", PLAIN_ENV)
def test_plain_env_is_accepted(name: str) -> None:
    assert not is_credential_env(name)
    assert not re.match(validation.ENV_CREDENTIAL_PATTERN, name)
    EnvVar.model_validate({"name": name, "value": "x"})


@pytest.mark.parametrize("value", [f"postgresql://u:{S}@db/x", JWT, PEM, f"AccountKey={S}"])
def test_env_values_shaped_like_credentials_are_refused(value: str) -> None:
    with pytest.raises(ValidationError) as caught:
        EnvVar.model_validate({"name": "SETTINGS", "value": value})
    assert describe_invalid(caught.value)[0] == "InlineCredentials"


def test_what_the_crd_refuses_the_controller_refuses() -> None:
    # Every key of the corpus (and its env spellings): the CEL pattern is a
    # subset of the controller's rule, so the API server never refuses a
    # name the controller would take.
    keys = [k for settings, _ in POSITIVE for k in settings] + [k for s in NEGATIVE for k in s]
    names = keys + [k.upper() for k in keys] + CREDENTIAL_ENV + PLAIN_ENV
    matched = [n for n in names if re.match(validation.ENV_CREDENTIAL_PATTERN, n)]
    assert len(matched) >= 30
    for name in matched:
        assert is_credential_env(name), name


def test_the_crd_has_the_env_rule() -> None:
    crd = Path(api.__file__).resolve().parents[1] / "crds"
    text = (crd / "inferenceconfigs.ai.krateo.io.yaml").read_text()
    assert f"self.name.matches('{validation.ENV_CREDENTIAL_PATTERN}')" in text
    assert "\\" not in validation.ENV_CREDENTIAL_PATTERN
    assert "'" not in validation.ENV_CREDENTIAL_PATTERN


@pytest.mark.parametrize(
    "url",
    [
        f"http://model/v2/models/m/infer?api_key={S}",
        f"http://model/v2/models/m/infer?token={JWT}",
        f"https://u:{S}@model/v2/models/m/infer",
    ],
)
def test_model_urls_with_credentials_are_refused(url: str) -> None:
    raw = _config({"x": "y"})
    raw["spec"]["kserve"]["modelUrl"] = url
    with pytest.raises(ValidationError) as caught:
        InferenceConfig.model_validate(raw)
    reason, message = describe_invalid(caught.value)
    assert reason == "InlineCredentials"
    assert S not in message
    assert JWT not in message
