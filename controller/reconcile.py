"""The level-triggered reconcile of one InferenceRun.

``Reconciler.reconcile(key)`` reads **only the informers' caches**, works out
what the cluster should hold (``controller.render``) and what the run's status
should say (``controller.status``), and then makes the few writes that close
the gap, none when nothing differs:

1. The run, its config (a missing or unusable one becomes a condition, a
   Warning event and a bounded retry: the config informer brings the run back
   as soon as the config appears), and its children found by the
   ``ai.krateo.io/run-uid`` label.
2. Children. A one-shot run gets its ConfigMap and then its Job; once the Job
   exists the contract is fixed and neither is touched again. A Job deleted out
   of band is recreated only while the run has not finished. A scheduled run
   gets its ConfigMap and CronJob and keeps both in line with edits to the run
   or its config (compared by the ``ai.krateo.io/desired-hash`` annotation, so
   server-side defaults never look like drift). Children of the wrong name or
   kind (the schedule was added or removed) are deleted.
3. Live progress: while a one-shot run's runner pod runs, the tail of its log
   (``runner.progress``), at most every ``progress_interval``.
4. Status: derived, compared with the cached status, written with the cached
   ``resourceVersion`` as precondition only when different.
5. Events on phase changes; ``autoDeletePolicy`` for finished one-shot runs
   (the run is deleted and the garbage collector removes Job, pods and
   ConfigMap; never a re-run).

Races are normal: AlreadyExists, Conflict and NotFound end the reconcile and
the key comes back (rate-limited) to look again at fresher state. Whatever
the reconciler writes is put into the cache at once, so the next pass does not
act on what it has just changed.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import structlog
from pydantic import ValidationError

from controller.api import (
    CONDITION_READY,
    Condition,
    InferenceConfig,
    InferenceRun,
    InferenceRunStatus,
    Progress,
    describe_invalid,
    run_config_warnings,
    set_condition,
)
from controller.kube.client import (
    CONFIGMAPS,
    CRONJOBS,
    JOBS,
    ApiError,
    Forbidden,
    Obj,
    Resource,
)
from controller.kube.events import EventRecorder
from controller.kube.informer import Informer
from controller.kube.workers import Result
from controller.naming import DESIRED_HASH_ANNOTATION, RUN_UID_LABEL
from controller.render import (
    CONTAINER_NAME,
    child_name,
    contract_document,
    desired_configmap,
    desired_workload,
)
from controller.status import CONDITION_WARNING, Observed, derive_status
from runner.progress import last_progress

log = structlog.stdlib.get_logger(__name__)

RUNS = Resource("ai.krateo.io", "v1", "inferenceruns", "InferenceRun")
CONFIGS = Resource("ai.krateo.io", "v1", "inferenceconfigs", "InferenceConfig")

# Index names shared with controller.controller, which registers them.
BY_RUN_UID = "run-uid"
BY_CONFIG = "config"

ReadLog = Callable[[str, str, str, int], Awaitable[str]]

# Terminal phases of a one-shot run: its children are never recreated.
FINISHED = ("Succeeded", "Failed")
PROGRESS_TAIL_LINES = 20


@dataclass
class Caches:
    runs: Informer
    configs: Informer
    jobs: Informer
    cronjobs: Informer
    configmaps: Informer
    pods: Informer


@dataclass
class Reconciler:
    client: Any  # controller.kube.client.KubeClient (Any so tests may pass a recording fake)
    caches: Caches
    events: EventRecorder
    read_log: ReadLog
    runner_service_account: str | None = None
    progress_interval: float = 10.0
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    _progress_seen: dict[str, tuple[float, Progress]] = field(default_factory=dict)

    async def reconcile(self, key: str) -> Result:
        raw = self.caches.runs.get_by_key(key)
        if raw is None:
            # Deleted: the garbage collector removes the children (owner references).
            self._progress_seen.pop(key, None)
            return Result()
        if raw["metadata"].get("deletionTimestamp"):
            return Result()
        try:
            run = InferenceRun.model_validate(raw)
        except ValidationError as exc:
            await self._invalid_run(raw, exc)
            return Result()

        config, problem = self._config(run)
        warnings = run_config_warnings(run, config) if config is not None else []
        children = self._children(run)

        contract = None
        if config is not None:
            contract = contract_document(run, config)
            try:
                await self._ensure_children(run, config, children)
            except Forbidden as exc:
                # RBAC is missing a rule: say so on the run and wait for the next
                # resync (or an edit) instead of hammering the API server.
                problem = ("PermissionDenied", f"the controller is not allowed to: {exc.message}")
            children = self._children(run)

        workload = children.get("CronJob" if run.spec.scheduled else "Job")
        executions: list[Obj] = []
        if run.spec.scheduled and workload is not None:
            uid = workload["metadata"].get("uid")
            executions = [
                j
                for j in self.caches.jobs.by_index(BY_RUN_UID, run.metadata.uid)
                if any(o.get("uid") == uid for o in j["metadata"].get("ownerReferences") or [])
            ]
        pods = self.caches.pods.by_index(BY_RUN_UID, run.metadata.uid)
        progress = await self._progress(key, run, pods)

        observed = Observed(
            run=run,
            now=self.clock(),
            config_problem=problem,
            warnings=warnings,
            contract=contract,
            job=None if run.spec.scheduled else workload,
            cronjob=workload if run.spec.scheduled else None,
            executions=executions,
            pods=pods,
            progress=progress,
        )
        status = derive_status(observed)
        await self._write_status(raw, run, status)
        self._phase_events(raw, run.status, status, warnings)

        if config is not None and await self._auto_delete(raw, run, config, status):
            return Result()
        running = status.phase == "Running" or (
            status.last_execution is not None and status.last_execution.phase == "Running"
        )
        return Result(requeue_after=self.progress_interval if running else None)

    # ------------------------------------------------------------------ reads

    def _config(self, run: InferenceRun) -> tuple[InferenceConfig | None, tuple[str, str] | None]:
        namespace, name = run.config_key
        raw = self.caches.configs.get(namespace, name)
        if raw is None:
            return None, (
                "ConfigNotFound",
                f"InferenceConfig {namespace}/{name} not found; the run starts when it exists",
            )
        try:
            return InferenceConfig.model_validate(raw), None
        except ValidationError as exc:
            reason, message = describe_invalid(exc)
            return None, (reason, f"InferenceConfig {namespace}/{name}: {message}")

    def _children(self, run: InferenceRun) -> dict[str, Obj]:
        """The run's current ConfigMap and Job or CronJob (by desired name) from the caches."""
        name = child_name(run)
        found: dict[str, Obj] = {}
        for kind, informer in (
            ("ConfigMap", self.caches.configmaps),
            ("Job", self.caches.jobs),
            ("CronJob", self.caches.cronjobs),
        ):
            obj = informer.get(run.metadata.namespace, name)
            if obj is not None and _owned_by(obj, run):
                found[kind] = obj
        return found

    async def _progress(self, key: str, run: InferenceRun, pods: list[Obj]) -> Progress | None:
        """The newest progress line of a running runner pod, read at most every interval."""
        running = [p for p in pods if _runner_running(p)]
        if not running:
            self._progress_seen.pop(key, None)
            return None
        now = time.monotonic()
        seen = self._progress_seen.get(key)
        if seen is not None and now - seen[0] < self.progress_interval:
            return seen[1]
        done = total = 0
        found = False
        for pod in running:  # every shard of an Indexed Job adds its share
            meta = pod["metadata"]
            try:
                tail = await self.read_log(
                    meta["namespace"], meta["name"], CONTAINER_NAME, PROGRESS_TAIL_LINES
                )
            except ApiError as exc:
                log.debug("progress unavailable", pod=meta["name"], error=str(exc))
                continue
            progress = last_progress(tail)
            if progress is not None:
                found = True
                done += progress.rows_done
                total += progress.rows_total
        if not found:
            return seen[1] if seen else None
        result = Progress(rows_done=done, rows_total=total)
        self._progress_seen[key] = (now, result)
        return result

    # ----------------------------------------------------------------- writes

    async def _ensure_children(
        self, run: InferenceRun, config: InferenceConfig, children: dict[str, Obj]
    ) -> None:
        await self._delete_strays(run)
        wanted_kind = "CronJob" if run.spec.scheduled else "Job"
        workload = children.get(wanted_kind)
        if not run.spec.scheduled and workload is not None:
            return  # a one-shot run's contract is fixed once its Job exists
        if not run.spec.scheduled and run.status.phase in FINISHED:
            return  # finished: the Job was collected or deleted; never run again
        desired_cm = desired_configmap(run, config)
        await self._apply(CONFIGMAPS, self.caches.configmaps, children.get("ConfigMap"), desired_cm)
        desired = desired_workload(run, config, runner_service_account=self.runner_service_account)
        resource = CRONJOBS if run.spec.scheduled else JOBS
        informer = self.caches.cronjobs if run.spec.scheduled else self.caches.jobs
        created = await self._apply(resource, informer, workload, desired)
        if created:
            self.events.normal(
                _run_ref(run), "Created", f"created {wanted_kind} {desired['metadata']['name']}"
            )

    async def _apply(
        self, resource: Resource, informer: Informer, current: Obj | None, desired: Obj
    ) -> bool:
        """Create ``desired`` or bring ``current`` in line; True when it was created."""
        meta = desired["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        if current is None:
            try:
                created = await self.client.create(resource, namespace, desired)
            except ApiError as exc:
                if exc.is_already_exists:
                    raise _Retry(f"{resource.kind} {name} appeared meanwhile") from exc
                raise
            informer.assume(created)
            return True
        want = meta["annotations"][DESIRED_HASH_ANNOTATION]
        have = (current["metadata"].get("annotations") or {}).get(DESIRED_HASH_ANNOTATION)
        if want == have:
            return False
        patch: dict[str, Any] = {
            "metadata": {
                "annotations": meta["annotations"],
                "labels": meta["labels"],
                "resourceVersion": current["metadata"]["resourceVersion"],
            }
        }
        for part in ("data", "spec"):
            if part in desired:
                patch[part] = desired[part]
        updated = await self.client.patch(resource, namespace, name, patch)
        informer.assume(updated)
        log.info("updated child", kind=resource.kind, name=name)
        return False

    async def _delete_strays(self, run: InferenceRun) -> None:
        """Children left from an earlier shape of the run (name or kind changed)."""
        name = child_name(run)
        uid = run.metadata.uid
        kinds: list[tuple[Resource, Informer]] = [
            (CONFIGMAPS, self.caches.configmaps),
            (CRONJOBS, self.caches.cronjobs),
            (JOBS, self.caches.jobs),
        ]
        for resource, informer in kinds:
            for obj in informer.by_index(BY_RUN_UID, uid):
                meta = obj["metadata"]
                if not _owned_by(obj, run):
                    continue  # e.g. a Job owned by the run's CronJob
                wrong_kind = (resource is CRONJOBS and not run.spec.scheduled) or (
                    resource is JOBS and run.spec.scheduled
                )
                if meta["name"] == name and not wrong_kind:
                    continue
                try:
                    await self.client.delete(
                        resource, meta["namespace"], meta["name"], uid=meta.get("uid")
                    )
                except ApiError as exc:
                    if not exc.is_not_found:
                        raise
                informer.assume_deleted(f"{meta['namespace']}/{meta['name']}")
                log.info("deleted stale child", kind=resource.kind, name=meta["name"])

    async def _write_status(self, raw: Obj, run: InferenceRun, status: InferenceRunStatus) -> None:
        new = status.to_api()
        if new != run.status.to_api():
            await self._put_status(raw, new)

    async def _put_status(self, raw: Obj, status: Obj) -> None:
        """PUT ``status`` with the cached resourceVersion as precondition; cache the answer."""
        meta = raw["metadata"]
        try:
            updated = await self.client.update_status(
                RUNS, meta["namespace"], meta["name"], {**raw, "status": status}
            )
        except ApiError as exc:
            if exc.is_conflict or exc.is_not_found:
                raise _Retry(f"status of {meta['name']}: {exc.reason}") from exc
            raise
        self.caches.runs.assume(updated)

    async def _invalid_run(self, raw: Obj, exc: ValidationError) -> None:
        """A run the controller cannot use: say why once, wait for an edit."""
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
        if new.to_api() == old.to_api():
            return
        await self._put_status(raw, new.to_api())
        self.events.warning(raw, reason, message)

    def _phase_events(
        self,
        raw: Obj,
        old: InferenceRunStatus,
        new: InferenceRunStatus,
        warnings: list[tuple[str, str]],
    ) -> None:
        if new.phase != old.phase or new.reason != old.reason:
            message = new.message or f"run is {new.phase}"
            if new.phase in ("Failed", "Error"):
                self.events.warning(raw, new.reason or new.phase or "Failed", message)
            elif new.phase == "Succeeded" and new.result is not None:
                r = new.result
                self.events.normal(
                    raw,
                    "Succeeded",
                    f"{r.predictions} predictions for {r.rows} rows in {r.duration_seconds:.1f}s",
                )
            elif new.reason == "Retrying":
                self.events.warning(raw, "Retrying", message)
            elif new.phase not in (None, "Pending"):  # "Created" already said it
                self.events.normal(raw, new.phase, message)
        old_last = old.last_execution
        last = new.last_execution
        if last is not None and (
            old_last is None or (old_last.name, old_last.phase) != (last.name, last.phase)
        ):
            if last.phase == "Failed":
                self.events.warning(
                    raw, last.reason or "ExecutionFailed", f"{last.name}: {last.message or ''}"
                )
            elif last.phase == "Succeeded":
                self.events.normal(raw, "ExecutionSucceeded", f"{last.name} succeeded")
        # A warning is announced once, when it first appears on the run's Warning condition.
        previous = next((c for c in old.conditions if c.type == CONDITION_WARNING), None)
        known = set(previous.reason.split(",")) if previous is not None else set()
        for reason, message in warnings:
            if reason not in known:
                self.events.warning(raw, reason, message)

    async def _auto_delete(
        self, raw: Obj, run: InferenceRun, config: InferenceConfig, status: InferenceRunStatus
    ) -> bool:
        """Delete a finished one-shot run when its config says so; True when deleted."""
        if run.spec.scheduled:
            return False
        policy = config.spec.auto_delete_policy
        delete = (
            status.phase == "Succeeded" and policy in ("DeleteOnSuccess", "DeleteOnCompletion")
        ) or (status.phase == "Failed" and policy == "DeleteOnCompletion")
        if not delete:
            return False
        self.events.normal(raw, "AutoDelete", f"run {status.phase}: deleting it ({policy})")
        try:
            await self.client.delete(
                RUNS, run.metadata.namespace, run.metadata.name, uid=run.metadata.uid
            )
        except ApiError as exc:
            if not exc.is_not_found:
                raise
        return True


class _Retry(Exception):
    """A normal race: look again soon (rate-limited), not an error worth a stack trace."""


def _owned_by(obj: Obj, run: InferenceRun) -> bool:
    return any(
        ref.get("uid") == run.metadata.uid and ref.get("controller")
        for ref in obj["metadata"].get("ownerReferences") or []
    )


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


def _runner_running(pod: Obj) -> bool:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == CONTAINER_NAME and "running" in (status.get("state") or {}):
            return True
    return False


def run_uid_index(obj: Obj) -> list[str]:
    """Index function: the run a child belongs to (its ``ai.krateo.io/run-uid`` label)."""
    uid = (obj["metadata"].get("labels") or {}).get(RUN_UID_LABEL)
    return [uid] if uid else []


def config_index(obj: Obj) -> list[str]:
    """Index function for runs: ``namespace/name`` of the config they use."""
    spec = obj.get("spec") or {}
    ref = spec.get("configRef") or {}
    name = ref.get("name")
    if not name:
        return []
    return [f"{ref.get('namespace') or obj['metadata'].get('namespace')}/{name}"]
