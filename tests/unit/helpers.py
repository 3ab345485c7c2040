"""Objects the unit tests build the same way: a minimal valid config and run.

One set of builders: ``config_raw``/``run_raw`` give the dict an informer would hand over,
``make_config``/``make_run`` the parsed model of the same. Keyword-only arguments set the
metadata and status (``None`` leaves a field out); any other keyword adds to or overrides
the spec.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from controller.api import InferenceConfig, InferenceRun

# The upstream controller's own worked example: its child names end in -5be07ada.
UID = "5be07ada-5fe0-4c9e-a8bc-aaae67d8d344"
CONFIG_UID = "0f1e2d3c-aaaa-bbbb-cccc-000000000000"
# "Now" for the pure planning tests: status derivation and planning take it as an argument.
NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def _raw(
    kind: str | None,
    spec: dict[str, Any],
    status: dict[str, Any] | None,
    **meta: Any,
) -> dict[str, Any]:
    """The object dict: ``meta`` (``None`` values left out) as its metadata."""
    raw: dict[str, Any] = {}
    if kind is not None:
        raw |= {"apiVersion": "ai.krateo.io/v1", "kind": kind}
    raw |= {"metadata": {k: v for k, v in meta.items() if v is not None}, "spec": spec}
    if status is not None:
        raw["status"] = status
    return raw


def config_raw(
    *,
    name: str = "cfg",
    namespace: str = "ns",
    uid: str = "cfg-uid",
    generation: int | None = None,
    resource_version: str | None = None,
    status: dict[str, Any] | None = None,
    typed: bool = False,
    **spec: Any,
) -> dict[str, Any]:
    """Config ``ns/cfg``: an image, a model URL, an HTTP input; ``spec`` adds or overrides.

    ``typed`` adds ``apiVersion`` and ``kind``, as the API server returns them.
    """
    base: dict[str, Any] = {
        "image": "runner:1",
        "kserve": {"modelUrl": "127.0.0.1:1/v2/models/m/infer"},
        "storage": {"input": {"http": {"url": "http://in"}}},
    }
    return _raw(
        "InferenceConfig" if typed else None,
        base | spec,
        status,
        name=name,
        namespace=namespace,
        uid=uid,
        generation=generation,
        resourceVersion=resource_version,
    )


def make_config(**kw: Any) -> InferenceConfig:
    """The parsed :func:`config_raw`, with the same arguments."""
    return InferenceConfig.model_validate(config_raw(**kw))


def run_raw(
    *,
    name: str = "r",
    namespace: str = "ns",
    uid: str = UID,
    generation: int | None = 1,
    resource_version: str | None = None,
    status: dict[str, Any] | None = None,
    typed: bool = False,
    **spec: Any,
) -> dict[str, Any]:
    """Run ``ns/r`` (uid :data:`UID`, generation 1) of config ``cfg``; ``spec`` adds to it.

    ``typed`` adds ``apiVersion`` and ``kind``, as the API server returns them.
    """
    base: dict[str, Any] = {"configRef": {"name": "cfg"}}
    return _raw(
        "InferenceRun" if typed else None,
        base | spec,
        status,
        name=name,
        namespace=namespace,
        uid=uid,
        generation=generation,
        resourceVersion=resource_version,
    )


def make_run(**kw: Any) -> InferenceRun:
    """The parsed :func:`run_raw`, with the same arguments."""
    return InferenceRun.model_validate(run_raw(**kw))
