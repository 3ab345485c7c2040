"""The level-triggered reconcile of one InferenceRun: observe, plan, apply.

``Reconciler.reconcile(key)``:

1. **Observe** (:meth:`Reconciler._observe`): the run, its config and its
   children from the informers' caches (children by the run's uid label and
   controller owner reference, not by name), plus two throttled live reads
   the caches cannot answer: the tail of a running runner's log (progress)
   and, for a Job that has had no pod for a while, its FailedCreate Events
   (backed off to every 5 minutes while they say the same).
2. **Plan** (``controller.plan.plan``, pure): the child writes, the status,
   the Events, whether to delete the run (``autoDeletePolicy``) and when to
   look again.
3. **Apply**: the writes, in order; whatever is written is put into the
   cache at once, so the next pass does not act on what it has just changed.
   Then observe and plan again (at most a few rounds) so that the status
   describes the children as they now are; then the status (only when it
   differs), the Events, and the run's deletion.

A cache may lag the cluster (after an API server restart, the runs informer
can come back seconds after the Jobs informer). A plan that would create a
child, the first time or again, asks first for a **live read of the run**: a
run that is gone, being deleted or replaced by a new one of the same name
gets nothing, and an edited one gets children of its current spec. The same
step reads the run's **config live** (one GET): if its resourceVersion is not
the cached one, the live copy goes into the cache and the plan is made again
from it; if it is gone, the run is planned as one whose config is missing.
The ConfigMap's annotations and the run's status record the config version
the contract was rendered from. A status write answered NotFound ends the key
the same way.

An AlreadyExists on create is looked at live: the run's own child that the
cache has not shown yet is taken as it is, and one without our labels (left
by the upstream controller, which names children the same way) is adopted.

Errors follow one policy, controller-runtime's ``Result`` + error
(:func:`on_api_error`, shared with the config reconciler). Races are normal
(AlreadyExists, Conflict, NotFound): the key comes back, rate-limited, to
look at fresher state; no stack trace, no error counted. No answer, a
throttle or a server error is raised: the worker counts it and retries the
key with backoff. A write the API server **refuses** (invalid, forbidden, too
large) or a name taken by an object that is not the run's becomes the run's
status with the API's own message and a Warning Event, and is tried again
after a ``requeue_after`` from a per-run exponential backoff (the work
queue's rate limiter, 5 s doubling to 5 minutes). Except a create refused
because the namespace is being deleted (403, cause ``NamespaceTerminating``):
nothing can be created there any more, so the run gets nothing more (no
retry, no status write, no Event) until it is gone. A run whose spec the
controller cannot use gets ``Error`` and a Warning Event once, and that pass
ends in a ``TerminalError`` (not retried: only an edit helps).

A deleted run's children are not the reconciler's business: the controller
deletes its Jobs and CronJobs at once (``controller.cleanup``) and the garbage
collector the rest.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol, Unpack

import structlog
from pydantic import ValidationError

from contract.progress import last_progress
from controller.api import (
    CONDITION_READY,
    Condition,
    InferenceConfig,
    InferenceRun,
    InferenceRunStatus,
    Progress,
    RunnerPodDefaults,
    set_condition,
)
from controller.caches import BY_RUN_UID, Caches
from controller.invalid import describe_invalid
from controller.isvc import Access, AccessState, Resolution, resolve, service_key
from controller.isvc_watch import ModelWatch
from controller.logging import bound
from controller.modelcache import ModelCache
from kubeclient.errors import ApiError
from kubeclient.events import EventRecorder
from kubeclient.informer import Informer
from kubeclient.objects import controller_of, is_controlled_by
from kubeclient.ratelimit import ExponentialBackoff
from kubeclient.resources import CONFIGMAPS, CONFIGS, EVENTS, RUNS, Obj, Resource
from kubeclient.workers import Result, TerminalError

if TYPE_CHECKING:
    from kubeclient.client import ListOptions
from controller.metrics import NO_RUN_METRICS, RunMetrics
from controller.naming import COMPLETION_INDEX_LABEL, child_labels
from controller.plan import Create, Plan, Refusal, View, Write, plan, wants_job_events
from controller.render import CONTAINER_NAME
from controller.status import run_conditions

log = structlog.stdlib.get_logger(__name__)

PROGRESS_TAIL_LINES = 20
# Observe -> plan -> apply rounds in one reconcile: children, then the status
# that describes them. More would only mean the plan does not converge.
MAX_ROUNDS = 4
REFUSAL_BACKOFF = (5.0, 300.0)
# A podless Job's FailedCreate Events are read again after 10 s, doubling to 5
# minutes while the answer stays the same (the Job controller retries a failing
# pod create with a backoff of its own, and the Event says the same until the
# cause changes); a new answer or a new Job starts again at 10 s.
JOB_EVENTS_BACKOFF = (10.0, 300.0)
# Parsed models kept (controller.modelcache.ModelCache): the runs of the passes now
# running and of the last few (a parsed run is ~13 KB, four times the cached
# run: 256 of them were ~3 MB), and every config in use (a parsed config is
# ~4.4 KB; with 64, runs over 100 namespaces reconciled in turn parsed their
# config on every pass: each was dropped just before its next use).
RUN_MODELS = 32
CONFIG_MODELS = 1024


class _Requeue(Exception):
    """A normal race: look again soon (rate-limited), not an error worth a stack trace."""


class ReconcileClient(Protocol):
    """What the reconcilers and the cleanup ask of the API server (``KubeClient`` is one)."""

    async def get(self, resource: Resource, namespace: str | None, name: str) -> Obj: ...

    async def list(
        self, resource: Resource, namespace: str | None = None, **options: Unpack[ListOptions]
    ) -> Obj: ...

    async def create(
        self, resource: Resource, namespace: str | None, body: Mapping[str, Any]
    ) -> Obj: ...

    async def patch(
        self, resource: Resource, namespace: str | None, name: str, patch: Mapping[str, Any]
    ) -> Obj: ...

    async def update_status(
        self, resource: Resource, namespace: str | None, name: str, body: Mapping[str, Any]
    ) -> Obj: ...

    async def delete(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        *,
        uid: str | None = None,
        resource_version: str | None = None,
    ) -> Obj: ...

    async def read_pod_log(
        self, namespace: str, name: str, *, container: str, tail_lines: int | None
    ) -> str: ...


def on_api_error(exc: ApiError) -> Result:
    """What follows an ApiError that ended a reconcile pass: the one mapping, for both reconcilers.

    As controller-runtime's ``Result`` + error:

    - a race (NotFound, Conflict, AlreadyExists: the cache was behind, or
      someone wrote first): ``Result(requeue=True)``, the key comes back
      rate-limited with no error counted and no stack trace;
    - anything else (no answer, throttled, a server error, a read refused):
      raised, so the worker counts an error and retries the key with backoff.

    A write the API server refuses does not end the pass: it becomes the
    run's status and a ``requeue_after`` (:func:`_refusal`); a create refused
    because the namespace is being deleted ends the run's passes for good.
    """
    if exc.is_not_found or exc.is_conflict:
        log.debug("looking again", why=str(exc))
        return Result(requeue=True)
    raise exc


# The phases a run ends up in when it needs someone's attention: logged at warning.
WARNING_PHASES = frozenset({"Failed", "Error"})


def status_change_line(
    before: tuple[str | None, str | None], after: tuple[str | None, str | None]
) -> tuple[int, str] | None:
    """The log line a run's new ``(phase, reason)`` is worth: ``(level, msg)``, or None.

    ``phase changed`` only when the phase did, at warning when the run turned
    Failed or Error (someone has to act), else at info; a new reason within
    the same phase is ``reason changed`` at info; no change, no line.
    """
    (old_phase, old_reason), (phase, reason) = before, after
    if phase != old_phase:
        return (logging.WARNING if phase in WARNING_PHASES else logging.INFO), "phase changed"
    if reason != old_reason:
        return logging.INFO, "reason changed"
    return None


@dataclass
class Reconciler:
    client: ReconcileClient
    caches: Caches
    events: EventRecorder
    runner_service_account: str | None = None
    pod_defaults: RunnerPodDefaults | None = None
    progress_interval: float = 10.0
    # POD_START_TIMEOUT (controller.plan.View.pod_start_timeout); 0: no limit.
    pod_start_timeout: float = 0.0
    # The namespaces the controller watches (empty: all); a config elsewhere is out of reach.
    watch_namespaces: tuple[str, ...] = ()
    metrics: RunMetrics = NO_RUN_METRICS
    # InferenceServices (controller.isvc_watch), for configs that reference one.
    models: ModelWatch | None = None
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    # Seconds for intervals and backoffs (never goes back; tests drive it).
    monotonic: Callable[[], float] = field(default=time.monotonic)
    # Per run: when the logs were last read, and the furthest progress per shard.
    _progress_seen: dict[str, tuple[float, dict[str, Progress]]] = field(default_factory=dict)
    # Per run: when its Job's Events are next read, that Job's uid, the last answer.
    _job_events_seen: dict[str, tuple[float, str, list[tuple[str, str]]]] = field(
        default_factory=dict
    )
    _job_events_backoff: ExponentialBackoff[str] = field(
        default_factory=lambda: ExponentialBackoff(*JOB_EVENTS_BACKOFF)
    )
    # A refused write is tried again after 5 s doubling to 5 minutes, per run:
    # the work queue's per-key rate limiter, with numbers of its own.
    _refusal_backoff: ExponentialBackoff[str] = field(
        default_factory=lambda: ExponentialBackoff(*REFUSAL_BACKOFF)
    )
    # Runs (key -> uid) whose namespace is being deleted: left alone until they are gone.
    _terminating: dict[str, str] = field(default_factory=dict)
    # Parsed runs and configs, reused while their resourceVersion is the same.
    _run_models: ModelCache[InferenceRun] = field(
        default_factory=lambda: ModelCache(InferenceRun, size=RUN_MODELS)
    )
    _config_models: ModelCache[InferenceConfig] = field(
        default_factory=lambda: ModelCache(InferenceConfig, size=CONFIG_MODELS)
    )

    def forget(self, key: str) -> None:
        for state in (
            self._progress_seen,
            self._job_events_seen,
            self._terminating,
        ):
            state.pop(key, None)
        self._refusal_backoff.forget(key)
        self._job_events_backoff.forget(key)
        self._run_models.forget(key)

    async def reconcile(self, key: str) -> Result:
        """One pass over the run ``key``; raises what the worker retries with backoff."""
        raw = self.caches.runs.get_by_key(key)
        if raw is None or raw["metadata"].get("deletionTimestamp"):
            # Deleted: controller.cleanup deletes its workloads, the garbage collector the rest.
            self.forget(key)
            return Result()
        meta = raw["metadata"]
        if self._terminating.get(key) == meta.get("uid"):
            return Result()  # its namespace is being deleted: nothing more for it
        # Every line of this pass says which run (uid, generation) and which pass.
        with bound(
            uid=meta.get("uid"),
            generation=meta.get("generation"),
            reconcile=secrets.token_hex(4),
        ):
            try:
                return await self._reconcile(key, raw)
            except _Requeue as exc:
                log.debug("looking again", why=str(exc))
                return Result(requeue=True)
            except ApiError as exc:
                if not exc.is_namespace_terminating:
                    return on_api_error(exc)
                log.info(
                    "namespace is being deleted: nothing more for this run",
                    namespace=meta.get("namespace"),
                    refused=str(exc),
                )
                self.forget(key)
                self._terminating[key] = str(meta.get("uid"))
                return Result()

    async def _reconcile(self, key: str, raw: Obj) -> Result:
        try:
            run = self._run_models.parse(key, raw)
        except ValidationError as exc:
            if await self._invalid_run(key, raw, exc):
                # Said once, in the run's status and a Warning Event: only an edit helps.
                raise TerminalError(f"the run is invalid: {describe_invalid(exc)[1]}") from exc
            return Result()
        return await self._reconcile_run(key, raw, run)

    async def _reconcile_run(self, key: str, raw: Obj, run: InferenceRun) -> Result:
        confirmed = False
        refusal: Refusal | None = None
        current = Plan()
        for _ in range(MAX_ROUNDS):
            view = await self._observe(key, run, confirmed=confirmed, refusal=refusal)
            current = plan(view)
            log.debug(
                "plan",
                writes=[f"{type(w).__name__.lower()} {w.resource.kind}" for w in current.writes],
                confirm=current.confirm,
                phase=current.status.phase if current.status else None,
                status_changed=current.status_changed,
                events=[e.reason for e in current.events],
                requeue_after=current.requeue_after,
            )
            if current.confirm:
                if run.status.job_status is not None:
                    log.info("a child the run had is missing: reading the run live first")
                else:
                    log.debug("reading the run live before creating its children")
                live = await self._confirm(key, raw)
                if live is None:
                    self.forget(key)
                    return Result()
                try:
                    run = self._run_models.parse(key, live)
                except ValidationError as exc:
                    raise _Requeue("the run was edited meanwhile") from exc
                await self._confirm_config(run)
                await self._confirm_model(run)
                raw, confirmed = live, True
                continue
            if not current.writes:
                break
            refusal = await self._apply_writes(run, current.writes)
        else:
            log.warning("plan did not settle", rounds=MAX_ROUNDS)

        status = current.status
        assert status is not None
        if status.phase in ("Succeeded", "Failed") and not run.spec.scheduled:
            self._progress_seen.pop(key, None)
        if current.status_changed and not await self._write_status(key, raw, status):
            self.forget(key)
            return Result()
        if (
            status.phase in ("Succeeded", "Failed")
            and status.phase != run.status.phase
            and not run.spec.scheduled
        ):
            self._count_finished(run, status)
        said = status_change_line(
            (run.status.phase, run.status.reason), (status.phase, status.reason)
        )
        if said is not None:
            level, line = said
            log.log(
                level,
                line,
                phase=status.phase,
                reason=status.reason,
                previous=run.status.phase,
                previous_reason=run.status.reason,
                message=status.message,
            )
        for event in current.events:
            self.events.record(_run_ref(run), event.type, event.reason, event.message)
        if current.delete_run:
            await self._delete_run(run, status.phase)
            return Result()
        if refusal is not None:
            delay = self._refusal_backoff.when(key, self.monotonic())
            log.info("trying the refused write again later", retry_in=delay, reason=refusal.reason)
            return Result(requeue_after=delay)
        self._refusal_backoff.forget(key)
        return Result(requeue_after=current.requeue_after)

    def _count_finished(self, run: InferenceRun, status: InferenceRunStatus) -> None:
        result = status.result
        duration = result.duration_seconds if result is not None else None
        if duration is None and status.start_time and status.completion_time:
            duration = (status.completion_time - status.start_time).total_seconds()
        self.metrics.run_finished(
            run.metadata.namespace,
            run.spec.config_ref.name,
            str(status.phase),
            duration_seconds=duration,
            rows=result.rows if result is not None else None,
            predictions=result.predictions if result is not None else None,
        )

    # ---------------------------------------------------------------- observe

    async def _observe(
        self, key: str, run: InferenceRun, *, confirmed: bool, refusal: Refusal | None
    ) -> View:
        config, problem = self._config(run)
        uid = run.metadata.uid

        def owned(informer: Informer) -> list[Obj]:
            return [o for o in informer.by_index(BY_RUN_UID, uid) if is_controlled_by(o, uid)]

        cronjobs = owned(self.caches.cronjobs)
        cron_uids = {c["metadata"].get("uid") for c in cronjobs}
        all_jobs = self.caches.jobs.by_index(BY_RUN_UID, uid)
        executions = [
            j
            for j in all_jobs
            if (owner := controller_of(j)) is not None and owner.get("uid") in cron_uids
        ]
        jobs = [j for j in all_jobs if is_controlled_by(j, uid)]
        pods = self.caches.pods.by_index(BY_RUN_UID, uid)
        now = self.clock()
        job_events: list[tuple[str, str]] = []
        if not run.spec.scheduled and jobs:
            job = jobs[0]
            if wants_job_events(job, pods, now):
                job_events = await self._job_events(key, job)
        return View(
            run=run,
            now=now,
            config=config,
            config_problem=problem,
            model=model_of(config, self.models, self.watch_namespaces),
            configmaps=owned(self.caches.configmaps),
            jobs=jobs,
            cronjobs=cronjobs,
            executions=executions,
            pods=pods,
            progress=await self._progress(key, pods),
            job_events=job_events,
            refusal=refusal,
            confirmed=confirmed,
            runner_service_account=self.runner_service_account,
            pod_defaults=self.pod_defaults,
            progress_interval=self.progress_interval,
            pod_start_timeout=self.pod_start_timeout,
        )

    def _config(self, run: InferenceRun) -> tuple[InferenceConfig | None, tuple[str, str] | None]:
        namespace, name = run.config_key
        if self.watch_namespaces and namespace not in self.watch_namespaces:
            return None, (
                "ConfigOutOfReach",
                f"InferenceConfig {namespace}/{name} is in a namespace the controller does not "
                f"watch (it watches {', '.join(self.watch_namespaces)}): use a config in one of "
                "those namespaces, or add the namespace to the controller's watchNamespaces",
            )
        raw = self.caches.configs.get(namespace, name)
        if raw is None:
            return None, (
                "ConfigNotFound",
                f"InferenceConfig {namespace}/{name} not found; the run starts when it exists",
            )
        try:
            return self._config_models.parse(f"{namespace}/{name}", raw), None
        except ValidationError as exc:
            reason, message = describe_invalid(exc)
            return None, (reason, f"InferenceConfig {namespace}/{name}: {message}")

    async def _progress(self, key: str, pods: list[Obj]) -> Progress | None:
        """Rows done so far, read from running runners' log tails at most every interval.

        Each shard (completion index) counts with the furthest any of its
        attempts got, so a retried pod starting over, or a shard that has
        finished and stopped logging, never makes the run's progress go back.
        """
        running = [p for p in pods if _runner_running(p)]
        seen = self._progress_seen.get(key)
        if not running:
            if seen is None:
                return None
            return _total(seen[1])
        now = self.monotonic()
        if seen is not None and now - seen[0] < self.progress_interval:
            return _total(seen[1])
        shards: dict[str, Progress] = dict(seen[1]) if seen else {}
        for pod in running:
            meta = pod["metadata"]
            try:
                tail = await self.client.read_pod_log(
                    meta["namespace"],
                    meta["name"],
                    container=CONTAINER_NAME,
                    tail_lines=PROGRESS_TAIL_LINES,
                )
            except ApiError as exc:
                log.debug("progress unavailable", pod=meta["name"], error=str(exc))
                continue
            progress = last_progress(tail)
            if progress is None:
                continue
            index = (meta.get("labels") or {}).get(COMPLETION_INDEX_LABEL, "0")
            best = shards.get(index)
            if best is None or progress.rows_done >= best.rows_done:
                shards[index] = Progress(
                    rows_done=progress.rows_done, rows_total=progress.rows_total
                )
        self._progress_seen[key] = (now, shards)
        return _total(shards)

    async def _job_events(self, key: str, job: Obj) -> list[tuple[str, str]]:
        """The Job's newest FailedCreate Events (why it has no pod), read with a backoff.

        One list request, then again after 10 s, 20 s, 40 s ... up to every 5
        minutes while the answer stays the same: a Job stuck for an hour costs
        about 16 reads, not 360. A new Job (uid) or a new answer (another
        message: the cause changed) starts again at 10 s. A failed read keeps
        the last answer and backs off the same way.
        """
        uid = str(job["metadata"].get("uid"))
        now = self.monotonic()
        seen = self._job_events_seen.get(key)
        if seen is not None and seen[1] == uid and now < seen[0]:
            return seen[2]
        if seen is None or seen[1] != uid:
            self._job_events_backoff.forget(key)
        try:
            answer = await self.client.list(
                EVENTS,
                job["metadata"]["namespace"],
                field_selector=f"involvedObject.uid={uid},reason=FailedCreate",
            )
        except ApiError as exc:
            log.debug("job events unavailable", job=job["metadata"]["name"], error=str(exc))
            found = seen[2] if seen else []
        else:
            items = sorted(
                answer.get("items") or [],
                key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "",
                reverse=True,
            )
            found = [("FailedCreate", str(e.get("message") or "")) for e in items[:1]]
            if seen is not None and seen[1] == uid and found != seen[2]:
                self._job_events_backoff.forget(key)
        delay = self._job_events_backoff.when(key, now)
        self._job_events_seen[key] = (now + delay, uid, found)
        return found

    # ------------------------------------------------------------------ apply

    async def _confirm(self, key: str, raw: Obj) -> Obj | None:
        """The run as the API server has it now, or None when it is gone or going."""
        meta = raw["metadata"]
        try:
            live: Obj = await self.client.get(RUNS, meta["namespace"], meta["name"])
        except ApiError as exc:
            if not exc.is_not_found:
                raise
            log.info("run is gone: nothing recreated", uid=meta.get("uid"))
            # With the delete handlers: the cleanup must hear of it even if no
            # DELETED event comes (a relist finds it gone from the cache already).
            self.caches.runs.refresh_deleted(key)
            return None
        live_meta = live["metadata"]
        if live_meta.get("uid") != meta.get("uid") or live_meta.get("deletionTimestamp"):
            # Replaced or being deleted: the handlers (the cleanup's) hear of it now.
            self.caches.runs.refresh(live)
        else:
            self.caches.runs.assume(live)
        if live["metadata"].get("uid") != meta.get("uid"):
            # Deleted and created again under the same name: a new run, planned afresh.
            log.info("run was replaced", old_uid=meta.get("uid"), uid=live["metadata"].get("uid"))
            raise _Requeue("the run was replaced by a new one of the same name")
        if live["metadata"].get("deletionTimestamp"):
            return None
        return live

    async def _confirm_config(self, run: InferenceRun) -> None:
        """Bring the cache's copy of the run's config up to the API server's (one GET).

        A create is built from the config as much as from the run, and the
        configs cache may lag (after a partition, the runs informer can come
        back before the configs one). A config that moved is put into the
        cache (its handlers called, so its other runs follow too) and the
        plan is made again from it; one that is gone is a missing config.
        """
        namespace, name = run.config_key
        if self.watch_namespaces and namespace not in self.watch_namespaces:
            return  # out of reach: the plan says so, and nothing is created
        key = f"{namespace}/{name}"
        cached = self.caches.configs.get(namespace, name)
        cached_rv = cached["metadata"].get("resourceVersion") if cached else None
        try:
            live: Obj = await self.client.get(CONFIGS, namespace, name)
        except ApiError as exc:
            if not exc.is_not_found:
                raise
            if cached is not None:
                log.info("config is gone: the cache was behind", config=key, cached=cached_rv)
                self.caches.configs.refresh_deleted(key)
            return
        live_rv = live["metadata"].get("resourceVersion")
        if live_rv != cached_rv:
            log.info(
                "config moved: planning from the live one",
                config=key,
                cached=cached_rv,
                live=live_rv,
            )
            self.caches.configs.refresh(live)

    async def _confirm_model(self, run: InferenceRun) -> None:
        """Bring the cache's copy of the config's InferenceService up to the API server's.

        A new run's contract gets the service's URL as it is now: the
        InferenceServices cache may not have seen the latest change yet.
        """
        config, _ = self._config(run)
        key = service_key(config) if config is not None else None
        if key is not None and self.models is not None:
            await self.models.read_live(key)

    async def _apply_writes(self, run: InferenceRun, writes: list[Write]) -> Refusal | None:
        """Make the writes in order; the refusal that stopped them, if any."""
        for write in writes:
            if isinstance(write, Create):
                meta = write.obj["metadata"]
                kind, name = write.obj["kind"], meta["name"]
                try:
                    done = await self.client.create(write.resource, meta["namespace"], write.obj)
                except ApiError as exc:
                    if exc.is_already_exists:
                        return await self._name_taken(run, write.resource, meta["namespace"], name)
                    return _refused(exc, kind, name, "create")
                log.info("created child", kind=kind, name=name)
                if write.resource is not CONFIGMAPS:
                    self.events.normal(_run_ref(run), "Created", f"created {kind} {name}")
            else:
                kind, name = write.resource.kind, write.name
                try:
                    done = await self.client.patch(
                        write.resource, write.namespace, write.name, write.patch
                    )
                except ApiError as exc:
                    return _refused(exc, kind, name, "update")
                log.info("updated child", kind=kind, name=name)
            self.caches.of(write.resource).assume(done)
        return None

    async def _name_taken(
        self, run: InferenceRun, resource: Resource, namespace: str, name: str
    ) -> Refusal | None:
        """AlreadyExists: our own child the cache has not shown yet, or someone else's object."""
        # Gone again (NotFound): a race, the pass ends and the key comes back (on_api_error).
        existing: Obj = await self.client.get(resource, namespace, name)
        if is_controlled_by(existing, run.metadata.uid):
            labels = existing["metadata"].get("labels") or {}
            wanted = child_labels(run.metadata.name, run.metadata.uid, run.spec.config_ref.name)
            if any(labels.get(k) != v for k, v in wanted.items()):
                # The run's own child without our labels: left by the upstream
                # controller, which names children the same way. Adopt it, so the
                # label-selected caches see it from now on.
                patch = {
                    "metadata": {
                        "labels": wanted,
                        "resourceVersion": existing["metadata"]["resourceVersion"],
                    }
                }
                existing = await self.client.patch(resource, namespace, name, patch)
                log.info("adopted child", kind=resource.kind, name=name)
            self.caches.of(resource).assume(existing)
            return None
        owner = controller_of(existing)
        whose = (
            f"it belongs to {owner.get('kind')} {owner.get('name')}"
            if owner is not None
            else "it has no controlling owner"
        )
        return Refusal(
            kind=resource.kind,
            name=name,
            reason="NameConflict",
            message=(
                f"{resource.kind} {namespace}/{name} exists and is not this run's ({whose}; "
                "for example left by the upstream controller): delete it, or create the run "
                "under another name"
            ),
        )

    async def _write_status(self, key: str, raw: Obj, status: InferenceRunStatus) -> bool:
        """PUT the status (cached resourceVersion as precondition); False when the run is gone."""
        meta = raw["metadata"]
        body = status.to_api()
        for attempt in ("full", "small"):
            try:
                updated = await self.client.update_status(
                    RUNS, meta["namespace"], meta["name"], {**raw, "status": body}
                )
            except ApiError as exc:
                if exc.is_not_found:
                    log.info("run is gone: status not written", uid=meta.get("uid"))
                    self.caches.runs.refresh_deleted(key)
                    return False
                if exc.is_conflict or attempt == "small" or not _too_large(exc):
                    raise
                # Whatever the spec holds, the status must be written: drop the
                # copies (the ConfigMap keeps the contract) and say so.
                log.warning("status too large, writing it without the contract", error=str(exc))
                body = status.model_copy(update={"contract": None}).to_api()
                continue
            self.caches.runs.assume(updated)
            return True
        return True  # not reached

    async def _delete_run(self, run: InferenceRun, phase: str | None) -> None:
        try:
            await self.client.delete(
                RUNS, run.metadata.namespace, run.metadata.name, uid=run.metadata.uid
            )
        except ApiError as exc:
            if not (exc.is_not_found or exc.is_conflict):
                raise
        log.info("deleted the run by its config's autoDeletePolicy", phase=phase)

    async def _invalid_run(self, key: str, raw: Obj, exc: ValidationError) -> bool:
        """A run the controller cannot use: say why once, wait for an edit; whether it said so."""
        reason, message = describe_invalid(exc)
        generation = raw["metadata"].get("generation") or None
        try:
            old = InferenceRunStatus.model_validate(raw.get("status") or {})
        except ValidationError:
            old = InferenceRunStatus()
        ready = Condition(
            type=CONDITION_READY,
            status="False",
            reason=reason,
            message=message,
            last_transition_time=self.clock(),
            observed_generation=generation,
        )
        new = old.model_copy(
            update={
                "phase": "Error",
                "reason": reason,
                "message": message,
                "observed_generation": generation,
                "conditions": set_condition(old.conditions, ready),
            }
        )
        # Complete and Failed as for any Error, whatever its cause.
        scheduled = bool((raw.get("spec") or {}).get("schedule"))
        new.conditions = run_conditions(
            new.conditions, new, self.clock(), generation, scheduled=scheduled
        )
        if new.to_api() == old.to_api():
            return False
        if not await self._write_status(key, raw, new):
            return False
        self.events.warning(raw, reason, message)
        return True


def model_of(
    config: InferenceConfig | None,
    models: ModelWatch | None,
    watch_namespaces: tuple[str, ...] = (),
) -> Resolution | None:
    """The model a config's InferenceService resolves to now; None for a config without one."""
    key = service_key(config) if config is not None else None
    if config is None or key is None:
        return None
    if models is None:
        return resolve(config, None, AccessState(Access.DISABLED), watch_namespaces)
    state = models.state()
    if state.access is Access.CRD_MISSING:
        models.recheck()  # someone wants KServe now: discovery looks again soon
    return resolve(config, models.get(key), state, watch_namespaces)


def _refusal(exc: ApiError, kind: str, name: str, verb: str) -> Refusal | None:
    """A refused write as the run's status shows it; None for what is not a refusal.

    Not a refusal: a race (NotFound, Conflict), no answer or a server error,
    and a create in a namespace being deleted. Pure: it never raises.
    """
    if exc.is_not_found or exc.is_conflict or exc.is_transient or exc.is_namespace_terminating:
        return None
    if exc.is_forbidden and "cannot" in exc.message:
        reason, what = "PermissionDenied", "the controller is not allowed to"
    else:
        reason, what = f"{kind}Refused", f"the API server refused to {verb} {kind} {name}"
    return Refusal(kind=kind, name=name, reason=reason, message=f"{what}: {exc.message}")


def _refused(exc: ApiError, kind: str, name: str, verb: str) -> Refusal:
    """The refusal ``exc`` is, logged; what is not one is raised on, to :func:`on_api_error`."""
    refusal = _refusal(exc, kind, name, verb)
    if refusal is None:
        raise exc
    log.warning("write refused", kind=kind, name=name, status=exc.status, error=exc.message)
    return refusal


def _too_large(exc: ApiError) -> bool:
    text = exc.message.lower()
    return exc.status == 413 or "too large" in text or "exceeds the maximum" in text


def _run_ref(run: InferenceRun) -> Obj:
    return {
        "apiVersion": run.api_version,
        "kind": run.kind,
        "metadata": {
            "name": run.metadata.name,
            "namespace": run.metadata.namespace,
            "uid": run.metadata.uid,
            "resourceVersion": run.metadata.resource_version,
        },
    }


def _total(shards: dict[str, Progress]) -> Progress | None:
    if not shards:
        return None
    totals = [p.rows_total for p in shards.values()]
    return Progress(
        rows_done=sum(p.rows_done for p in shards.values()),
        rows_total=None if any(t is None for t in totals) else sum(t or 0 for t in totals),
    )


def _runner_running(pod: Obj) -> bool:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == CONTAINER_NAME and "running" in (status.get("state") or {}):
            return True
    return False
