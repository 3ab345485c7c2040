"""The reconciler on a runs cache that lags the cluster, against the real API server.

After an API server restart the runs informer came back seconds after the
Jobs informer; a run the user had deleted meanwhile was still in the cache,
its Job was gone (garbage-collected), and the reconciler took that for a Job
deleted out of band and created it again and again (70 creates in 33 s).
Here the lag is made exact: the runs informer is stopped after its first
list (its cache frozen), the other informers keep watching, and the
reconciler is driven by hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from typing import Any

import pytest

from controller.naming import managed_selector
from controller.reconcile import Reconciler
from hack.cluster import LocalCluster
from kubeclient.client import KubeClient
from kubeclient.errors import NotFound
from kubeclient.events import EventRecorder
from kubeclient.resources import CONFIGMAPS, CONFIGS, CRONJOBS, JOBS, RUNS
from tests.caches import NamespaceCaches
from tests.kubehelpers import eventually
from tests.runs import inference_config, inference_run

# The CRDs, for the runs and configs the tests create through ``kube`` (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("crds")

SLOW = "test.local/fake-slow:1"


class Harness(NamespaceCaches):
    def __init__(self, kube: KubeClient, namespace: str) -> None:
        super().__init__(kube, namespace)
        self.reconciler = Reconciler(
            client=kube, caches=self.caches, events=EventRecorder(kube), progress_interval=1.0
        )

    async def freeze_runs(self) -> None:
        """Stop the runs informer: its cache keeps what it had, as a lagging watch would."""
        await self.stop(self.caches.runs)


def job_creates(cluster: LocalCluster, namespace: str) -> int:
    return sum(
        1
        for e in cluster.audit_events("admin")
        if e.get("verb") == "create"
        and (e.get("objectRef") or {}).get("resource") == "jobs"
        and (e.get("objectRef") or {}).get("namespace") == namespace
        and (e.get("responseStatus") or {}).get("code", 0) < 300
    )


async def audit_caught_up(cluster: LocalCluster, kube: KubeClient, namespace: str) -> None:
    """Wait until the audit log holds a request made now, so it holds every earlier one.

    Used before counting what did NOT happen, instead of sleeping: the
    reconciles are awaited, so their requests came before this marker GET.
    """
    marker = f"audit-marker-{secrets.token_hex(4)}"
    with contextlib.suppress(NotFound):
        await kube.get(CONFIGMAPS, namespace, marker)

    def logged() -> bool:
        return any(
            (e.get("objectRef") or {}).get("name") == marker for e in cluster.audit_events("admin")
        )

    await eventually(lambda: asyncio.to_thread(logged), within=30, what="the audit log's marker")


@pytest.mark.parametrize("schedule", [None, "* * * * *"])
async def test_a_deleted_run_in_a_stale_cache_gets_no_new_children(
    kube: KubeClient, namespace: str, cluster: LocalCluster, schedule: str | None
) -> None:
    harness = Harness(kube, namespace)
    await harness.start()
    try:
        await kube.create(CONFIGS, namespace, inference_config("cfg", SLOW))
        spec: dict[str, Any] = {"timeoutSeconds": 300}
        if schedule:
            spec["schedule"] = schedule
        await kube.create(RUNS, namespace, inference_run("r", "cfg", **spec))
        key = f"{namespace}/r"
        workload = harness.caches.cronjobs if schedule else harness.caches.jobs

        async def children_made() -> bool:
            await harness.reconciler.reconcile(key)
            run = harness.caches.runs.get_by_key(key)
            recorded = ((run or {}).get("status") or {}).get("jobStatus")
            return bool(recorded) and len(workload.list(namespace)) == 1

        await eventually(children_made, within=30, what="the run's children and status")
        assert job_creates(cluster, namespace) == (0 if schedule else 1)

        await harness.freeze_runs()
        await kube.delete(RUNS, namespace, "r")  # background: the GC deletes the children

        async def children_gone() -> bool:
            return not workload.list(namespace) and not harness.caches.configmaps.list(namespace)

        await eventually(children_gone, within=60, what="the GC to delete the run's children")
        assert harness.caches.runs.get_by_key(key) is not None  # the stale view

        for _ in range(5):
            await harness.reconciler.reconcile(key)
        await audit_caught_up(cluster, kube, namespace)
        assert not (await kube.list(JOBS, namespace)).get("items")
        assert not (await kube.list(CRONJOBS, namespace)).get("items")
        assert not (await kube.list(CONFIGMAPS, namespace, label_selector=managed_selector()))[
            "items"
        ]
        assert job_creates(cluster, namespace) == (0 if schedule else 1)
        # The live read found the run gone: the stale entry is dropped.
        assert harness.caches.runs.get_by_key(key) is None
    finally:
        await harness.stop()


async def test_a_job_deleted_out_of_band_is_recreated_for_a_live_run(
    kube: KubeClient, namespace: str, cluster: LocalCluster
) -> None:
    """The other side of the rule: a confirmed, unfinished run gets its Job back, once."""
    harness = Harness(kube, namespace)
    await harness.start()
    try:
        await kube.create(CONFIGS, namespace, inference_config("cfg", SLOW))
        await kube.create(RUNS, namespace, inference_run("r", "cfg", timeoutSeconds=300))
        key = f"{namespace}/r"

        async def job_made() -> str | None:
            await harness.reconciler.reconcile(key)
            run = harness.caches.runs.get_by_key(key) or {}
            jobs = harness.caches.jobs.list(namespace)
            recorded = (run.get("status") or {}).get("jobStatus")
            return jobs[0]["metadata"]["name"] if jobs and recorded else None

        name = await eventually(job_made, within=30, what="the run's Job")
        await kube.delete(JOBS, namespace, name)

        async def job_gone() -> bool:
            return not harness.caches.jobs.list(namespace)

        await eventually(job_gone, within=30, what="the Job's deletion to be seen")
        for _ in range(3):
            await harness.reconciler.reconcile(key)
        jobs = (await kube.list(JOBS, namespace))["items"]
        assert [j["metadata"]["name"] for j in jobs] == [name]
        assert job_creates(cluster, namespace) == 2
    finally:
        await harness.stop()
