"""Small helpers for tests that talk to the real API server or run its tools."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

if TYPE_CHECKING:
    from hack.cluster import LocalCluster

T = TypeVar("T")

# What every namespace has, whoever installed what in it.
NAMESPACE_DEFAULTS = {"configmap/kube-root-ca.crt", "serviceaccount/default"}


async def eventually(
    probe: Callable[[], Awaitable[T | None]],
    *,
    within: float = 60.0,
    interval: float = 0.25,
    what: str = "condition",
) -> T:
    """Poll ``probe`` until it returns something truthy; fail with ``what`` after ``within``."""
    deadline = time.monotonic() + within
    last: T | None = None
    while True:
        last = await probe()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}; last: {last!r}")
        await asyncio.sleep(interval)


async def delete_admission_policy(admission: client.AdmissionregistrationV1Api, name: str) -> None:
    """The ValidatingAdmissionPolicy ``name`` and its binding of that name, if there."""
    for delete in (
        admission.delete_validating_admission_policy_binding,
        admission.delete_validating_admission_policy,
    ):
        try:
            await delete(name)
        except ApiException as exc:
            if exc.status != 404:
                raise


def namespace_objects(cluster: LocalCluster, namespace: str) -> list[str]:
    """Every object in ``namespace`` but Events and what every namespace has, labelled or not."""
    kinds = cluster.kubectl("api-resources", "--verbs=list", "--namespaced", "-o", "name").stdout
    wanted = [k for k in kinds.split() if not k.startswith("events")]
    got = cluster.kubectl("get", ",".join(wanted), "-n", namespace, "-o", "name").stdout
    return [line for line in got.splitlines() if line.strip() and line not in NAMESPACE_DEFAULTS]


async def event_reasons(api: client.ApiClient, namespace: str, name: str) -> list[str]:
    """The reasons of the Events about the object called ``name`` in ``namespace``."""
    events = await client.CoreV1Api(api).list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name}"
    )
    return [e.reason for e in events.items]


async def wait_for_events(
    api: client.ApiClient, namespace: str, name: str, *reasons: str, what: str
) -> list[str]:
    """Wait until the Events about ``name`` include each of ``reasons``; all their reasons then."""

    async def probe() -> list[str] | None:
        found = await event_reasons(api, namespace, name)
        return found if set(reasons) <= set(found) else None

    return await eventually(probe, what=what)


def job_condition(job: dict[str, Any], kind: str) -> bool:
    conditions = (job.get("status") or {}).get("conditions") or []
    return any(c["type"] == kind and c["status"] == "True" for c in conditions)


def job_manifest(name: str, containers: list[dict[str, Any]], **pod: Any) -> dict[str, Any]:
    """A batch/v1 Job that tries once (``backoffLimit: 0``, ``restartPolicy: Never``).

    ``pod`` adds fields to its pod spec (volumes, nodeName, ...).
    """
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": 0,
            "template": {"spec": {"restartPolicy": "Never", "containers": containers, **pod}},
        },
    }


def required(tool: T | None, message: str) -> T:
    """``tool`` (a binary found or built); without it the test fails with ``message``.

    `make test` builds the tools first (make binaries): missing is a failure, not a skip.
    """
    if tool is None:
        pytest.fail(message)
    return tool


def controller_ref(owner: dict[str, Any]) -> dict[str, Any]:
    """An ownerReference making ``owner`` (as the API server returned it) the controller."""
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
    }
