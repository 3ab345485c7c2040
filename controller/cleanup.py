"""A deleted run's Jobs and CronJobs are deleted at once, not when the garbage collector gets there.

Every child carries an owner reference to its run, so the garbage collector
would delete them all in the end; but it lags (seconds after an API server
restart, while its own caches come back), and meanwhile a Job whose run is
gone goes on creating pods and a CronJob goes on firing. So the controller
deletes the run's workloads (``controller.orphans``: label *and* controlling
owner reference) itself, with background propagation: the Job's pods and the
ConfigMap are left to the garbage collector, but no new pod is created for a
Job that no longer exists. No finalizer is involved: a run stays deletable
while the controller is down.

When:

- **the run is deleted**: its watch ``DELETED`` event, a relist that no
  longer has it, or a relist that has a new run of the same name
  (``RunDeleted``);
- **the run is being deleted** (``deletionTimestamp``, e.g. a foreground
  deletion: ``RunDeleting``), unless it was deleted with
  ``propagationPolicy=Orphan`` (the ``orphan`` finalizer): then the user
  asked for the children to stay, and they do;
- **the sweep**, when this replica starts leading (its caches have synced by
  then) and every ``sweep_interval`` after that: any workload of ours whose
  run is not in the runs cache, or is there being deleted, is a suspect; a
  live read of the run decides (caches lag), and only a run that is gone,
  replaced by another of the same name, or being deleted has its workloads
  deleted (``RunGone``). This catches what happened while no replica was
  leading;
- a workload that appears for a run already handled (a create that raced the
  delete) goes the same way: seen by a watch event, or by more looks
  ``RECHECKS_AFTER`` (1, 2, 4, 8 and 16 s) after the run's workloads were
  deleted, for this controller's own create, which enters its cache without
  an event and, on a loaded API server, may be answered seconds late;
- a Job of ours controlled by a CronJob that neither this cache nor the API
  server has (read live), for a run not alive in the cache: an execution a
  lagging CronJob controller created late, for a CronJob deleted before
  this replica could see it (the garbage collector would delete it, later).

Each delete names the object's uid and the resourceVersion the cache saw as
preconditions: an object that changed meanwhile (the garbage collector
orphaning it, say) is read again and deleted only if it is still the run's.
Deletes are work-queue items (keyed by run uid) drained by the leader's
``workloadcleanup`` workers, so a failed one is retried with backoff. Every
delete is logged ("deleted a deleted run's workload", with kind, name, run and
reason) and counted in ``kserve_inference_run_workloads_deleted_total{kind,reason}``.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from controller.caches import BY_RUN_UID, Caches
from controller.metrics import NO_RUN_METRICS, RunMetrics, labelled
from controller.naming import RUN_UID_LABEL
from controller.orphans import (
    CRONJOB_KIND,
    RunRef,
    is_being_deleted,
    keeps_children,
    orphans,
    owner_cronjob,
    owning_run,
    workloads_of,
)
from controller.reconcile import ReconcileClient
from kubeclient.errors import ApiError
from kubeclient.objects import controller_of, object_key
from kubeclient.resources import CRONJOBS, JOBS, RUNS, Obj, Resource
from kubeclient.workers import Result, Workers
from kubeclient.workqueue import WorkQueue

log = structlog.stdlib.get_logger(__name__)

RUN_DELETED = "RunDeleted"
RUN_DELETING = "RunDeleting"
RUN_GONE = "RunGone"
REASONS = (RUN_DELETED, RUN_DELETING, RUN_GONE)
KINDS = ("Job", "CronJob")
# Runs remembered as gone (or as keeping their children), so that a workload
# seen after its run's deletion is handled too; the oldest are forgotten first.
REMEMBERED = 4096
# A delete answered Conflict is read again and retried this many times.
ATTEMPTS = 3
WORKERS = 2
# A run's workloads are looked at again these long after they were deleted
# (each after the one before): a create that raced the delete (decided on a
# live read just before it) lands in this controller's cache without a watch
# event, when its answer comes, which a loaded API server may send seconds
# later. Only the cache is read; 31 s in all.
RECHECKS_AFTER = (1.0, 2.0, 4.0, 8.0, 16.0)
# Queue keys of a stray execution Job to check (namespace/name after it); others are run uids.
EXECUTION = "execution:"


@dataclass(eq=False)
class Gone:
    """A run whose workloads must go, why, and the uids of its CronJobs deleted so far."""

    run: RunRef
    reason: str
    # A Job such a CronJob creates late (its controller's cache lagging) is the run's too.
    crons: set[str] = field(default_factory=set)
    rechecks: int = 0


def _resource(obj: Obj) -> Resource:
    return CRONJOBS if obj.get("kind") == CRONJOB_KIND else JOBS


def _run_ref(run: Obj) -> RunRef | None:
    meta = run.get("metadata") or {}
    uid, name, namespace = meta.get("uid"), meta.get("name"), meta.get("namespace")
    if not (uid and name and namespace):
        return None
    return RunRef(str(namespace), str(name), str(uid))


class Cleanup:
    """Deletes the workloads of deleted runs: event handlers, a work queue, and the sweep."""

    def __init__(
        self,
        client: ReconcileClient,
        caches: Caches,
        runs_by_uid: Callable[[str], list[Obj]],
        *,
        metrics: RunMetrics = NO_RUN_METRICS,
        sweep_interval: float | None = None,
        workers: int = WORKERS,
    ) -> None:
        self.client = client
        self.caches = caches
        self.runs_by_uid = runs_by_uid
        self.metrics = metrics
        self.sweep_interval = sweep_interval
        self.queue: WorkQueue[str] = WorkQueue("workloadcleanup", metrics=metrics)
        self.workers = Workers(
            self.queue,
            self.clean,
            workers=workers,
            name="workloadcleanup",
            metrics=metrics,
            log_key="run_uid",
        )
        self._gone: OrderedDict[str, Gone] = OrderedDict()
        self._kept: OrderedDict[str, None] = OrderedDict()
        for kind in KINDS:
            for reason in REASONS:
                metrics.inference_run_workloads_deleted_total.labels(kind=kind, reason=reason)

    # --------------------------------------------------------------- handlers

    def run_changed(self, run: Obj) -> None:
        """A run added or updated: one being deleted loses its workloads now."""
        if is_being_deleted(run):
            self._mark(run, RUN_DELETING)

    def run_replaced(self, old: Obj, new: Obj) -> None:
        """A run updated; a new uid under the same name means the old run was deleted."""
        if (old.get("metadata") or {}).get("uid") != (new.get("metadata") or {}).get("uid"):
            self._mark(old, RUN_DELETED)

    def run_deleted(self, run: Obj) -> None:
        """A run deleted (watch event, or a relist without it): its workloads go now."""
        self._mark(run, RUN_DELETED)

    def workload_changed(self, obj: Obj) -> None:
        """A Job or CronJob added or updated: one of a run already gone goes too."""
        uid = ((obj.get("metadata") or {}).get("labels") or {}).get(RUN_UID_LABEL)
        if not uid:
            return
        if uid in self._gone:
            self.queue.add(uid)
        elif self._stray_execution(obj, uid):
            self.queue.add(EXECUTION + object_key(obj))

    def _stray_execution(self, job: Obj, uid: str) -> bool:
        """A Job of a CronJob this cache does not have, for a run it does not have alive.

        A CronJob controller whose cache lags (after an API server restart) can
        create an execution for a CronJob already deleted, of a run this
        replica never saw: such a Job is checked live (:meth:`_clean_execution`).
        """
        ref = owner_cronjob(job)
        if job.get("kind") == CRONJOB_KIND or ref is None or self._alive(uid):
            return False
        namespace = job["metadata"].get("namespace")
        return self.caches.cronjobs.get(namespace, str(ref.get("name"))) is None

    def _mark(self, run: Obj, reason: str) -> None:
        ref = _run_ref(run)
        if ref is None:
            return
        if keeps_children(run) or ref.uid in self._kept:
            # Deleted with propagationPolicy=Orphan: the children stay.
            if ref.uid not in self._kept:
                log.info("run deleted with its children orphaned: they stay", run=str(ref))
            _remember(self._kept, ref.uid, None)
            return
        known = self._gone.get(ref.uid)
        if known is None:
            _remember(self._gone, ref.uid, Gone(ref, reason))
        elif reason == RUN_DELETED:
            known.reason = reason
        self.queue.add(ref.uid)

    # ------------------------------------------------------------------ work

    async def run(self) -> None:
        """The leader's part: sweep now (and every ``sweep_interval``), and drain the queue."""
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self.workers.run(), name="workloadcleanup workers")
            tasks.create_task(self._sweep_forever(), name="workloadcleanup sweep")

    def shut_down(self) -> None:
        self.queue.shut_down()

    async def _sweep_forever(self) -> None:
        while True:
            try:
                await self.sweep()
            except ApiError as exc:
                log.warning("sweep failed, trying again later", error=str(exc))
            if self.sweep_interval is None:
                return
            await asyncio.sleep(self.sweep_interval)

    def _alive(self, uid: str) -> bool:
        """Whether the runs cache has run ``uid`` not being deleted (or keeping its children)."""
        return any(
            not is_being_deleted(run) or keeps_children(run) for run in self.runs_by_uid(uid)
        )

    async def sweep(self) -> int:
        """Queue the runs that are gone (confirmed live) but left workloads; how many."""
        caches = (self.caches.runs, self.caches.jobs, self.caches.cronjobs)
        if not all(informer.has_synced() for informer in caches):
            log.info("sweep skipped: the caches have not synced")
            return 0
        suspects = orphans([*self.caches.cronjobs.list(), *self.caches.jobs.list()], self._alive)
        found = 0
        for job in self.caches.jobs.list():
            uid = ((job["metadata"].get("labels") or {}).get(RUN_UID_LABEL)) or ""
            if uid and uid not in self._gone and self._stray_execution(job, uid):
                found += 1
                self.queue.add(EXECUTION + object_key(job))
        for run, workloads in suspects.items():
            if run.uid in self._kept:
                continue
            if run.uid not in self._gone:
                reason = await self._gone_live(run)
                if reason is None:
                    continue
                log.info(
                    "sweep: a run that is gone left workloads",
                    run=str(run),
                    why=reason,
                    workloads=[f"{o.get('kind')} {o['metadata'].get('name')}" for o in workloads],
                )
                _remember(self._gone, run.uid, Gone(run, RUN_GONE))
            found += 1
            self.queue.add(run.uid)
        return found

    async def _gone_live(self, run: RunRef) -> str | None:
        """Why ``run`` is gone, read live (None: it is not, the cache lags)."""
        try:
            live: Obj = await self.client.get(RUNS, run.namespace, run.name)
        except ApiError as exc:
            if exc.is_not_found:
                return "not found"
            raise
        if live["metadata"].get("uid") != run.uid:
            return "replaced by a new run of the same name"
        if keeps_children(live):
            _remember(self._kept, run.uid, None)
            return None
        if is_being_deleted(live):
            return "being deleted"
        return None

    async def clean(self, uid: str) -> Result:
        """Delete the workloads of the run ``uid``, known to be gone (queue item)."""
        if uid.startswith(EXECUTION):
            await self._clean_execution(uid.removeprefix(EXECUTION))
            return Result()
        gone = self._gone.get(uid)
        if gone is None or uid in self._kept:
            return Result()
        if self._alive(uid):
            # Back in the runs cache, alive: the event that said otherwise was stale.
            log.info("run is alive after all: nothing deleted", run=str(gone.run))
            self._gone.pop(uid, None)
            return Result()
        labelled_jobs = self.caches.jobs.by_index(BY_RUN_UID, uid)
        crons, jobs = [], []
        for obj in workloads_of(uid, labelled_jobs, self.caches.cronjobs.by_index(BY_RUN_UID, uid)):
            if obj.get("kind") == CRONJOB_KIND:
                crons.append(obj)
            elif owning_run(obj) is not None:
                jobs.append(obj)
        for cron in crons:
            if await self._delete(cron, gone):
                gone.crons.add(str(cron["metadata"].get("uid")))
        for job in labelled_jobs:
            # Only under a CronJob deleted here (one left alone keeps its Jobs
            # too), or one that is gone, read live.
            if owning_run(job) is not None:
                continue
            if (owner := controller_of(job)) is not None and owner.get("uid") in gone.crons:
                await self._delete(job, gone, execution=True)
            elif self._stray_execution(job, uid):
                await self._delete_if_cron_gone(job, uid)
        for job in jobs:
            await self._delete(job, gone)
        if gone.rechecks < len(RECHECKS_AFTER):
            gone.rechecks += 1
            return Result(requeue_after=RECHECKS_AFTER[gone.rechecks - 1])
        return Result()

    async def _clean_execution(self, key: str) -> None:
        """Delete a stray execution (:meth:`_stray_execution`) whose CronJob is gone, read live."""
        namespace, _, name = key.partition("/")
        job = self.caches.jobs.get(namespace, name)
        uid = ((job or {}).get("metadata", {}).get("labels") or {}).get(RUN_UID_LABEL)
        if job is None or not uid or not self._stray_execution(job, uid):
            return
        await self._delete_if_cron_gone(job, uid)

    async def _delete_if_cron_gone(self, job: Obj, uid: str) -> None:
        namespace = job["metadata"]["namespace"]
        ref = owner_cronjob(job)
        assert ref is not None
        try:
            cron: Obj = await self.client.get(CRONJOBS, namespace, str(ref.get("name")))
        except ApiError as exc:
            if not exc.is_not_found:
                raise
        else:
            if cron["metadata"].get("uid") == ref.get("uid"):
                return  # its CronJob is there: the cache lags
        # Its CronJob is gone: the garbage collector would delete it, later.
        gone = Gone(RunRef(namespace, str(ref.get("name")), uid), RUN_GONE, {str(ref.get("uid"))})
        await self._delete(job, gone, execution=True)

    async def _delete(self, obj: Obj, gone: Gone, *, execution: bool = False) -> bool:
        """Delete one workload if it is still the run's; whether this call deleted it."""
        resource = _resource(obj)
        meta = obj["metadata"]
        namespace, name, uid = meta["namespace"], meta["name"], meta.get("uid")
        version = meta.get("resourceVersion")
        for _ in range(ATTEMPTS):
            try:
                await self.client.delete(
                    resource, namespace, name, uid=uid, resource_version=version
                )
            except ApiError as exc:
                if exc.is_not_found:
                    return False
                if not exc.is_conflict:
                    raise
                # Changed since the cache saw it (or replaced): judge it as it is now.
                try:
                    live: Obj = await self.client.get(resource, namespace, name)
                except ApiError as again:
                    if again.is_not_found:
                        return False
                    raise
                if live["metadata"].get("uid") != uid or not _still_the_runs(
                    live, gone.run.uid, execution=execution
                ):
                    log.info(
                        "workload no longer the deleted run's: left alone",
                        kind=resource.kind,
                        name=name,
                        run=str(gone.run),
                    )
                    return False
                version = live["metadata"].get("resourceVersion")
                continue
            self.caches.of(resource).assume_deleted(object_key(obj))
            log.info(
                "deleted a deleted run's workload",
                kind=resource.kind,
                name=name,
                run=str(gone.run),
                reason=gone.reason,
            )
            labelled(
                self.metrics.inference_run_workloads_deleted_total,
                kind=resource.kind,
                reason=gone.reason,
            ).inc()
            return True
        raise ApiError(409, "Conflict", f"{resource.kind} {name} kept changing", verb="delete")


def _still_the_runs(obj: Obj, run_uid: str, *, execution: bool) -> bool:
    labels = obj["metadata"].get("labels") or {}
    if labels.get(RUN_UID_LABEL) != run_uid:
        return False
    if execution:
        return (controller_of(obj) or {}).get("kind") == CRONJOB_KIND
    owner = owning_run(obj)
    return owner is not None and owner.uid == run_uid


def _remember(memory: OrderedDict[str, Any], key: str, value: Any) -> None:
    memory[key] = value
    memory.move_to_end(key)
    while len(memory) > REMEMBERED:
        memory.popitem(last=False)
