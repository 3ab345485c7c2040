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

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

CONTRACT_KEYS = ("jobId", "jobName", "kserve", "input", "output", "parameters")


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class KServe(_Model):
    """Where and how to call the model (upstream ``spec.kserve``)."""

    model_name: str | None = None
    model_url: str | None = None
    model_version: str | None = None
    model_input_name: str | None = None


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
