"""A deleted run's Jobs and CronJobs deleted by the controller (controller/cleanup.py), for real.

The cleanup is driven on the controller's own caches against the real API
server. The runs are held by a finalizer of the test's, so that the garbage
collector (which acts only once an owner is gone) cannot get there first:
whatever goes, the cleanup deleted. What must not go stays: a Job that only
carries the run's label, a run's children deleted with
``propagationPolicy=Orphan``, the Job of a live run the runs cache has not
seen.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from controller.caches import BY_UID
from controller.cleanup import Cleanup
from controller.controller import _with_new
from controller.metrics import Metrics
from controller.naming import MANAGED_BY_LABEL, MANAGED_BY_VALUE, RUN_UID_LABEL
from controller.reconcile import Reconciler
from kubeclient.client import KubeClient
from kubeclient.errors import NotFound
from kubeclient.events import EventRecorder
from kubeclient.resources import CRONJOBS, JOBS, RUNS, Resource
from tests.caches import NamespaceCaches
from tests.kubehelpers import controller_ref, eventually, job_manifest
from tests.runs import inference_run

pytestmark = pytest.mark.usefixtures("crds")

Obj = dict[str, Any]
HOLD = "test.local/hold"
CONTAINER = [{"name": "c", "image": "test.local/fake-ok:1"}]


class Harness(NamespaceCaches):
    """The caches, and a cleanup wired to them as the controller wires it."""

    def __init__(self, kube: KubeClient, namespace: str) -> None:
        super().__init__(kube, namespace)
        self.kube, self.namespace = kube, namespace
        self.metrics = Metrics()
        c = self.caches
        self.cleanup = Cleanup(
            kube, c, lambda uid: c.runs.by_index(BY_UID, uid), metrics=self.metrics
        )
        c.runs.add_event_handler(
            on_add=self.cleanup.run_changed,
            on_update=_with_new(self.cleanup.run_changed),
            on_delete=self.cleanup.run_deleted,
        )
        c.runs.add_event_handler(on_update=self.cleanup.run_replaced)
        for informer in (c.jobs, c.cronjobs):
            informer.add_event_handler(
                on_add=self.cleanup.workload_changed,
                on_update=_with_new(self.cleanup.workload_changed),
            )
        self.leading: asyncio.Task[None] | None = None

    def lead(self) -> None:
        """Start the cleanup's leader part: the sweep, then the queue."""
        self.leading = asyncio.create_task(self.cleanup.run())

    async def close(self) -> None:
        self.cleanup.shut_down()
        if self.leading is not None:
            self.leading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.leading
        await self.stop()

    def deleted(self, kind: str, reason: str) -> float:
        """``kserve_inference_run_workloads_deleted_total{kind, reason}`` as a scrape shows it."""
        value = self.metrics.registry.get_sample_value(
            "kserve_inference_run_workloads_deleted_total", {"kind": kind, "reason": reason}
        )
        assert value is not None, "the series exists from the start"
        return value

    async def run(self, name: str, *, schedule: str | None = None) -> Obj:
        body = inference_run(name, "cfg", **({"schedule": schedule} if schedule else {}))
        body["metadata"]["finalizers"] = [HOLD]
        created: Obj = await self.kube.create(RUNS, self.namespace, body)
        return created

    async def child(
        self,
        resource: Resource,
        name: str,
        owner: Obj | None,
        *,
        label: str | None,
        finalizers: list[str] | None = None,
    ) -> Obj:
        """A suspended Job or CronJob as the controller makes them (or with parts missing)."""
        if resource is JOBS:
            body: Obj = job_manifest(name, CONTAINER)
            body["spec"]["suspend"] = True
        else:
            body = {
                "apiVersion": "batch/v1",
                "kind": "CronJob",
                "metadata": {"name": name},
                "spec": {
                    "schedule": "0 0 1 1 *",
                    "suspend": True,
                    "jobTemplate": {
                        "spec": {
                            "template": {
                                "spec": {"restartPolicy": "Never", "containers": CONTAINER}
                            }
                        }
                    },
                },
            }
        labels = {MANAGED_BY_LABEL: MANAGED_BY_VALUE}
        if label is not None:
            labels[RUN_UID_LABEL] = label
        body["metadata"]["labels"] = labels
        if owner is not None:
            body["metadata"]["ownerReferences"] = [controller_ref(owner)]
        if finalizers:
            body["metadata"]["finalizers"] = finalizers
        created: Obj = await self.kube.create(resource, self.namespace, body)
        return created

    async def exists(self, resource: Resource, name: str) -> bool:
        try:
            await self.kube.get(resource, self.namespace, name)
        except NotFound:
            return False
        return True

    async def wait_gone(self, resource: Resource, name: str) -> None:
        async def gone() -> bool:
            return not await self.exists(resource, name)

        await eventually(gone, within=30, what=f"{resource.kind} {name} deleted")

    async def release(self, *runs: Obj) -> None:
        """Take the test's finalizer off ``runs`` (deleted or not)."""
        for run in runs:
            with contextlib.suppress(NotFound):
                await self.kube.patch(
                    RUNS, self.namespace, run["metadata"]["name"], {"metadata": {"finalizers": []}}
                )


@pytest.fixture
async def harness(kube: KubeClient, namespace: str) -> AsyncIterator[Harness]:
    h = Harness(kube, namespace)
    try:
        yield h
    finally:
        await h.close()
        listed = await kube.list(RUNS, namespace)
        await h.release(*listed.get("items") or [])


def uid(obj: Obj) -> str:
    return str(obj["metadata"]["uid"])


async def test_a_run_being_deleted_loses_its_workloads_and_only_them(harness: Harness) -> None:
    await harness.start()
    harness.lead()
    once = await harness.run("once")
    job = await harness.child(JOBS, "inf-once", once, label=uid(once))
    label_only = await harness.child(JOBS, "label-only", None, label=uid(once))
    cron_run = await harness.run("cron", schedule="* * * * *")
    cron = await harness.child(CRONJOBS, "inf-cron", cron_run, label=uid(cron_run))
    execution = await harness.child(JOBS, "inf-cron-29000000", cron, label=uid(cron_run))
    alive = await harness.run("alive")
    alive_job = await harness.child(JOBS, "inf-alive", alive, label=uid(alive))

    for run in (once, cron_run):
        await harness.kube.delete(RUNS, harness.namespace, run["metadata"]["name"])
    for resource, obj in ((JOBS, job), (CRONJOBS, cron), (JOBS, execution)):
        await harness.wait_gone(resource, obj["metadata"]["name"])
    # The runs are still there (held), so it was not the garbage collector.
    assert await harness.exists(RUNS, "once")
    assert await harness.exists(JOBS, label_only["metadata"]["name"])
    assert await harness.exists(JOBS, alive_job["metadata"]["name"])
    # The execution's delete may find it gone: the garbage collector follows its CronJob.
    assert harness.deleted("Job", "RunDeleting") in (1, 2)
    assert harness.deleted("CronJob", "RunDeleting") == 1


async def test_a_create_that_raced_the_delete_is_deleted_too(harness: Harness) -> None:
    await harness.start()
    run = await harness.run("raced")
    await harness.child(JOBS, "inf-raced", run, label=uid(run))

    async def cached() -> bool:
        return harness.caches.jobs.get(harness.namespace, "inf-raced") is not None

    await eventually(cached, within=30, what="the Job in the Jobs cache")
    await harness.kube.delete(RUNS, harness.namespace, "raced")
    workers = harness.cleanup.workers
    await asyncio.wait_for(workers.process_next_item(), 30)
    assert not await harness.exists(JOBS, "inf-raced")
    # The reconciler's own create that landed after the delete enters the cache
    # by assume(), which calls no handler; no watch event either (stopped here).
    await harness.stop(harness.caches.jobs)
    late = await harness.child(JOBS, "inf-raced-late", run, label=uid(run))
    harness.caches.jobs.assume(late)
    # The next look, a second later, finds it.
    await asyncio.wait_for(workers.process_next_item(), 30)
    assert not await harness.exists(JOBS, "inf-raced-late")
    # A create answered after that look (a loaded API server) is found by a later one.
    later = await harness.child(JOBS, "inf-raced-later", run, label=uid(run))
    harness.caches.jobs.assume(later)
    await asyncio.wait_for(workers.process_next_item(), 30)
    assert not await harness.exists(JOBS, "inf-raced-later")
    assert await harness.exists(RUNS, "raced"), "held: not the garbage collector's doing"


async def test_a_late_execution_of_a_cronjob_already_gone_is_deleted(harness: Harness) -> None:
    """A lagging CronJob controller's Job for a CronJob deleted before this replica saw it."""
    await harness.start()
    # The runs and CronJobs caches lag: they see nothing below.
    await harness.stop(harness.caches.runs, harness.caches.cronjobs)
    run = await harness.run("late")
    there = await harness.child(CRONJOBS, "inf-there", run, label=uid(run))
    # An execution of a CronJob that is gone (a finalizer of the test's keeps the
    # garbage collector from removing it before it is looked at), and one of a
    # CronJob that is there.
    gone_cron = {**there, "metadata": {**there["metadata"], "name": "inf-gone", "uid": "gone-uid"}}
    stray = await harness.child(
        JOBS, "inf-gone-29000000", gone_cron, label=uid(run), finalizers=[HOLD]
    )
    kept = await harness.child(JOBS, "inf-there-29000000", there, label=uid(run))
    for _ in range(2):
        await asyncio.wait_for(harness.cleanup.workers.process_next_item(), 30)
    assert harness.deleted("Job", "RunGone") == 1
    found = await harness.kube.get(JOBS, harness.namespace, stray["metadata"]["name"])
    assert found["metadata"].get("deletionTimestamp")
    release: Obj = {"metadata": {"finalizers": []}}
    await harness.kube.patch(JOBS, harness.namespace, stray["metadata"]["name"], release)
    kept_now = await harness.kube.get(JOBS, harness.namespace, kept["metadata"]["name"])
    assert not kept_now["metadata"].get("deletionTimestamp")


async def test_a_run_the_reconciler_finds_gone_live_is_cleaned_up(harness: Harness) -> None:
    """No DELETED event needed: the reconciler's live read tells the cleanup."""
    reconciler = Reconciler(
        client=harness.kube, caches=harness.caches, events=EventRecorder(harness.kube)
    )
    await harness.start()
    body = inference_run("stale", "no-such-config")
    run: Obj = await harness.kube.create(RUNS, harness.namespace, body)
    # Held by a finalizer so that the garbage collector cannot remove it first.
    await harness.child(JOBS, "inf-stale", run, label=uid(run), finalizers=[HOLD])

    async def cached() -> bool:
        c = harness.caches
        return bool(
            c.runs.get(harness.namespace, "stale") and c.jobs.get(harness.namespace, "inf-stale")
        )

    await eventually(cached, within=30, what="the run and its Job cached")
    # The runs cache lags: it never hears of the delete.
    await harness.stop(harness.caches.runs)
    await harness.kube.delete(RUNS, harness.namespace, "stale")
    # Its status write is answered 404: the run is gone.
    await reconciler.reconcile(f"{harness.namespace}/stale")
    await asyncio.wait_for(harness.cleanup.workers.process_next_item(), 30)
    assert harness.deleted("Job", "RunDeleted") == 1
    found = await harness.kube.get(JOBS, harness.namespace, "inf-stale")
    assert found["metadata"].get("deletionTimestamp")
    release: Obj = {"metadata": {"finalizers": []}}
    await harness.kube.patch(JOBS, harness.namespace, "inf-stale", release)


async def test_the_sweep_deletes_what_was_missed_and_reads_the_run_live_first(
    harness: Harness,
) -> None:
    await harness.start()
    # The runs cache stops here (it lags): it sees neither run below.
    await harness.stop(harness.caches.runs)
    # Deleted unseen (held, so it stays Terminating and the garbage collector waits).
    missed = await harness.run("missed")
    missed_job = await harness.child(JOBS, "inf-missed", missed, label=uid(missed))
    await harness.kube.delete(RUNS, harness.namespace, "missed")
    # Alive, unseen: its Job must stay.
    unseen = await harness.run("unseen")
    unseen_job = await harness.child(JOBS, "inf-unseen", unseen, label=uid(unseen))

    async def cached() -> bool:
        jobs = harness.caches.jobs
        return all(jobs.get(harness.namespace, n) for n in ("inf-missed", "inf-unseen"))

    await eventually(cached, within=30, what="both Jobs in the Jobs cache")
    assert await harness.cleanup.sweep() == 1
    await harness.cleanup.workers.process_next_item()
    assert not await harness.exists(JOBS, missed_job["metadata"]["name"])
    assert await harness.exists(JOBS, unseen_job["metadata"]["name"])
    assert harness.deleted("Job", "RunGone") == 1


async def test_a_run_deleted_with_orphan_propagation_keeps_its_children(
    harness: Harness,
) -> None:
    await harness.start()
    harness.lead()
    kept = await harness.run("kept")
    job = await harness.child(JOBS, "inf-kept", kept, label=uid(kept))
    await harness.kube.delete(RUNS, harness.namespace, "kept", propagation_policy="Orphan")

    async def orphaned() -> bool:
        found = await harness.kube.get(JOBS, harness.namespace, "inf-kept")
        return not found["metadata"].get("ownerReferences")

    await eventually(orphaned, within=30, what="the garbage collector orphaning the Job")
    await harness.release(kept)

    async def run_gone() -> bool:
        return not await harness.exists(RUNS, "kept")

    await eventually(run_gone, within=30, what="the run gone")
    await asyncio.sleep(1.0)  # the cleanup has seen the run go (it acts in milliseconds)
    assert await harness.exists(JOBS, job["metadata"]["name"])
    reasons = ("RunDeleted", "RunDeleting", "RunGone")
    assert [harness.deleted(k, r) for k in ("Job", "CronJob") for r in reasons] == [0.0] * 6
