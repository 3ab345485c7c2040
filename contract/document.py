"""The contract: the JSON document the controller hands to the runner.

Upstream's shape, keys in this order: ``jobId, jobName, kserve, input, output,
parameters``. Upstream runners ignore unknown keys, so the additions below are
optional and only ever appended after those six:

- ``batching``: how the runner sends rows to the model (batch size,
  concurrency, per-request timeout, retry budget).
- ``sharding``: ``{"count": N}`` when one run is spread over the N pods of an
  Indexed Job; each pod learns its own index from ``JOB_COMPLETION_INDEX``.

Paging, keyed (exactly-once) output and resume are not contract keys: they are
settings of the storage entries (``input.<provider>.paging``,
``output.<provider>.resumePath``), which reach the runner unmodified; see
:mod:`runner.streaming` and the provider modules.

This module is the one definition both sides use: the controller renders it,
the runner validates it. It must never carry a credential: storage entries only
*reference* Secrets (``endpointRef``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


OpenAIEndpoint = Literal["chat/completions", "completions", "embeddings"]
# The request fields the runner fills itself from each row (or refuses).
OPENAI_ROW_FIELDS: dict[str, str] = {
    "chat/completions": "messages",
    "completions": "prompt",
    "embeddings": "input",
}


class OpenAIOutputColumns(_Model):
    """The output columns that receive each answer's parts; ``null`` leaves one out."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )

    text: str | None = Field(default="prediction", min_length=1, max_length=256)
    finish_reason: str | None = Field(default="finish_reason", min_length=1, max_length=256)
    usage: str | None = Field(default="usage", min_length=1, max_length=256)
    error: str | None = Field(default="error", min_length=1, max_length=256)

    def names(self) -> list[str]:
        return [n for n in (self.text, self.finish_reason, self.usage, self.error) if n]

    @model_validator(mode="after")
    def _distinct(self) -> OpenAIOutputColumns:
        names = self.names()
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"outputColumns name {repeated} more than once")
        return self


class OpenAI(_Model):
    """``kserve.openai``: how rows become OpenAI-compatible requests (``modelVersion: openai``).

    ``format: rows`` (the default): each input row's ``inputColumn`` is a prompt
    (a string) or a chat's messages (a list), sent as one request built from the
    ``request`` template; the answer's text, finish reason and token usage go to
    the ``outputColumns``. ``format: batch``: each input row is a line of an
    OpenAI Batch API file (``custom_id``, ``method``, ``url``, ``body``) and each
    output row the matching output line. ``onRowError``: ``fail`` stops the run at
    the first row the model refuses; ``record`` writes that row's error and goes
    on (the default for ``format: batch``, as the Batch API does).
    """

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )

    endpoint: OpenAIEndpoint = "chat/completions"
    format: Literal["rows", "batch"] = "rows"
    request: dict[str, Any] = Field(default_factory=dict)
    input_column: str = Field(default="prompt", min_length=1, max_length=256)
    output_columns: OpenAIOutputColumns = Field(default_factory=OpenAIOutputColumns)
    on_row_error: Literal["fail", "record"] | None = None

    @field_validator("request")
    @classmethod
    def _request(cls, request: dict[str, Any]) -> dict[str, Any]:
        if request.get("stream"):
            raise ValueError("stream: true is not supported: the runner stores whole answers")
        return request

    @model_validator(mode="after")
    def _template(self) -> OpenAI:
        field = OPENAI_ROW_FIELDS[self.endpoint]
        if self.format == "rows" and field != "messages" and field in self.request:
            raise ValueError(
                f"request.{field} comes from each row's {self.input_column!r} column: "
                "leave it out of the template"
            )
        messages = self.request.get("messages")
        if messages is not None and not isinstance(messages, list):
            raise ValueError("request.messages must be a list (messages sent before each row's)")
        return self

    @property
    def row_errors(self) -> Literal["fail", "record"]:
        if self.on_row_error is not None:
            return self.on_row_error
        return "record" if self.format == "batch" else "fail"


# Where a runner pod finds its model credentials (the controller mounts them there):
# the bearer token (a Secret's key, or a projected ServiceAccount token) and the CA bundle.
MODEL_TOKEN_DIR = "/var/run/secrets/kserve-inference/model-token"
MODEL_TOKEN_FILE = f"{MODEL_TOKEN_DIR}/token"
MODEL_CA_DIR = "/var/run/secrets/kserve-inference/model-ca"
MODEL_CA_FILE = f"{MODEL_CA_DIR}/ca.crt"

# How the runner gets the Secrets its storage entries reference (the config's
# ``secretSource``). ``API``: it reads them through the Kubernetes API with its
# ServiceAccount token, the only reason its pod mounts one. ``Volumes``: the
# kubelet mounts each one, by name, under STORAGE_SECRETS_DIR, and the pod has no
# token. The runner is told by the STORAGE_SECRETS_DIR_ENV variable.
SecretSource = Literal["API", "Volumes"]
STORAGE_SECRETS_DIR = "/var/run/secrets/kserve-inference/storage"
STORAGE_SECRETS_DIR_ENV = "RUNNER_SECRETS_DIR"
# The keys under which a storage entry, of any provider, references a Secret
# ({name, namespace}): krateo's ``api.endpointRef``, the others' ``secretRef``.
SECRET_REFERENCE_KEYS = frozenset({"endpointRef", "secretRef"})


def secret_references(*sections: Any) -> list[tuple[str | None, str]]:
    """Every Secret the storage ``sections`` reference, ``(namespace or None, name)``, once each.

    A reference is a mapping with a ``name`` under a key of
    :data:`SECRET_REFERENCE_KEYS`, at any depth; the order is the first mention's.
    """
    found: list[tuple[str | None, str]] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                if key in SECRET_REFERENCE_KEYS and isinstance(inner, dict):
                    name, namespace = inner.get("name"), inner.get("namespace")
                    if isinstance(name, str) and name:
                        where = namespace if isinstance(namespace, str) and namespace else None
                        ref = (where, name)
                        if ref not in found:
                            found.append(ref)
                        continue
                walk(inner)
        elif isinstance(value, list):
            for inner in value:
                walk(inner)

    for section in sections:
        walk(section)
    return found


class ModelTransport(_Model):
    """``kserve.transport``: how the runner reaches the model (``runner.transport``).

    Only file paths and header values: the credentials themselves stay in the
    files the pod mounts (a Secret's token, a projected ServiceAccount token,
    a CA bundle), never in the contract.
    """

    # Extra request headers (e.g. Host for an ingress); never a credential.
    headers: dict[str, str] | None = None
    # A file holding a bearer token, read again whenever it changes (it rotates).
    token_file: str | None = None
    # A PEM bundle of the CAs the model's certificate is checked against.
    ca_file: str | None = None
    # Do not check the model's certificate at all.
    insecure_skip_verify: bool | None = None


class KServe(_Model):
    """Where and how to call the model (upstream ``spec.kserve``)."""

    model_name: str | None = None
    model_url: str | None = None
    model_version: str | None = None
    model_input_name: str | None = None
    # With modelVersion "openai": the OpenAI-compatible request and answer (runner.openai).
    openai: OpenAI | None = None
    transport: ModelTransport | None = None


class Batching(_Model):
    """How the runner feeds rows to the model. Defaults suit KServe's server."""

    batch_size: int = Field(default=256, ge=1, le=100_000)
    concurrency: int = Field(default=4, ge=1, le=64)
    request_timeout_seconds: float = Field(default=60.0, gt=0)
    max_retries: int = Field(default=5, ge=0, le=100)


class Sharding(_Model):
    count: int = Field(default=1, ge=1, le=10_000)


class Contract(_Model):
    job_id: str = Field(min_length=1)
    job_name: str = Field(min_length=1)
    kserve: KServe = Field(default_factory=KServe)
    # Provider key -> provider settings, passed through unmodified.
    input: dict[str, dict[str, Any]] = Field(default_factory=dict)
    output: dict[str, dict[str, Any]] = Field(default_factory=dict)
    parameters: dict[str, str] | None = None
    batching: Batching | None = None
    sharding: Sharding | None = None
