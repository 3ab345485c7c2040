"""What one reconcile of an InferenceRun should do, decided from what was seen. Pure.

``plan(view)`` takes everything the reconciler observed about one run (the
run, its config, its children from the caches, its pods, what the API server
refused in this pass, whether the run was just confirmed by a live read) and
returns a :class:`Plan`: the child writes to make, in order, the status the
run should show, the Events to record and when to look again. It never calls
the API server; ``controller.reconcile`` observes, asks for a plan and
applies it.

The rules that keep a stale or partial view from doing harm:

- **A child's identity is decided once.** Children are found by the run's uid
  label and their controller owner reference, never by recomputing a name: a
  one-shot run's Job, once it exists, is never deleted, replaced or renamed
  by an edit, whatever the run's name length. A new child takes the name the
  run's status recorded (``status.jobStatus.name``) when there is one.
- **Creating needs a confirmed view.** Before any child is created (the
  first time, or again when the cache no longer shows one: deleted out of
  band, or a cache lagging behind a run the user deleted or edited) the plan
  asks for a live read of the run (``confirm``); only a run that still exists
  with the same uid and no deletionTimestamp gets children, made from its
  current spec. One GET per run created; updates need no confirmation.
- **So does everything a create is built from.** The same live read covers
  the run's config: when it moved since the cache saw it, the plan is made
  again from the live one (a config gone is a missing config). The ConfigMap
  says which config version its contract was rendered from (annotations), and
  the run's status repeats it.
- **A scheduled run follows its config.** Its CronJob is suspended while the
  config is missing (the run is ``Error``, reason ``ConfigNotFound``) or
  unusable (invalid, out of the controller's reach: the reason says which),
  since its last contract was rendered from a config that no longer stands,
  and resumed with a new contract when the config is usable again, unless the
  run asks to be suspended. Likewise while the InferenceService its config names
  is not Ready (or cannot be resolved: missing, out of reach): the CronJob is
  suspended (the run is ``Pending``, reason ``ModelNotReady`` or the service's
  own, with KServe's words) and resumed, with the service's URL as it is then,
  once the model is Ready. Suspending and resuming are decided on a confirmed view too.
- **Nothing is deleted by an edit.** Adding or removing ``spec.schedule`` on a
  run whose Job or CronJob exists is not applied (the CRD refuses it; older
  objects get an ``Error`` saying so). Other edits to a one-shot run whose Job
  exists only update ``suspend``; the rest is reported in a Warning condition.
- **A refusal stops the writes of this pass** and shows in the status with the
  API server's own words; the key comes back with backoff.
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

import orjson

from controller.api import (
    CONDITION_READY,
    CONDITION_RECONCILING,
    CONDITION_STALLED,
    Condition,
    InferenceConfig,
    InferenceRun,
    InferenceRunStatus,
    Progress,
    RunnerPodDefaults,
    run_config_warnings,
    set_condition,
)
from controller.isvc import ModelProblem, Resolution, ResolvedModel, contract_model
from controller.naming import (
    CONFIG_GENERATION_ANNOTATION,
    CONFIG_RESOURCE_VERSION_ANNOTATION,
    DESIRED_HASH_ANNOTATION,
    POD_START_FAILED_ANNOTATION,
    RUN_SPEC_HASH_ANNOTATION,
)
from controller.render import (
    child_name,
    contract_document,
    desired_configmap,
    desired_workload,
)
from controller.status import (
    CONDITION_WARNING,
    REASON_QUEUED,
    Observed,
    derive_status,
    duplicate_output_warning,
    kstatus_conditions,
    one_line,
    outcome_conditions,
    pod_start_failure,
    queue_of,
)
from kubeclient.objects import job_finished, parse_time
from kubeclient.resources import CONFIGMAPS, CRONJOBS, JOBS, Obj, Resource

FINISHED = ("Succeeded", "Failed")
# A Job that has had no pod for this long may be unable to create one: its
# FailedCreate events are read (throttled) so the run can say why.
JOB_EVENTS_AFTER = timedelta(seconds=3)
# While a run waits on something that changes without an event reaching us
# (the Job's FailedCreate events), look again after this long.
PENDING_RECHECK = 10.0
# Strings in status.contract longer than this are cut: the status must stay
# small whatever the spec holds (etcd's request limit is 1.5 MiB, and every
# watcher of runs receives the whole object). The ConfigMap keeps the whole.
MAX_STATUS_STRING = 1024

REASON_SCHEDULE_CHANGE = "ScheduleChangeNotApplied"
REASON_SPEC_CHANGE = "SpecChangeNotApplied"
# A run applied in one file with its config is often seen first: its config is
# missing for a moment. For this long after the run's creation that is
# "waiting", not an error with a Warning Event.
CONFIG_GRACE = timedelta(seconds=10)
WAITING = "WaitingForConfig"
CONFIG_NOT_FOUND = "ConfigNotFound"
# While a run waits for its InferenceService (events of the service bring it
# back sooner), look again after this long.
MODEL_RECHECK = 30.0


@dataclass(frozen=True)
class Refusal:
    """The API server said no to a write of this pass (or a name is taken by another object)."""

    kind: str
    name: str
    reason: str  # the run's status reason, e.g. JobRefused or NameConflict
    message: str


@dataclass(frozen=True)
class Create:
    resource: Resource
    obj: Obj


@dataclass(frozen=True)
class Patch:
    resource: Resource
    namespace: str
    name: str
    patch: Obj


Write = Create | Patch


@dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass(frozen=True)
class View:
    """What the reconciler observed about one run."""

    run: InferenceRun
    now: datetime
    config: InferenceConfig | None = None
    # (reason, message) when the config is missing, unusable or out of reach.
    config_problem: tuple[str, str] | None = None
    # The run's own children (controller owner reference = the run), from the caches.
    configmaps: Sequence[Obj] = ()
    jobs: Sequence[Obj] = ()
    cronjobs: Sequence[Obj] = ()
    # Scheduled runs: the Jobs the run's CronJob started.
    executions: Sequence[Obj] = ()
    pods: Sequence[Obj] = ()
    progress: Progress | None = None
    # (reason, message) of the newest FailedCreate Events of the run's Job.
    job_events: Sequence[tuple[str, str]] = ()
    refusal: Refusal | None = None
    # The run was read live in this reconcile (same uid, not being deleted).
    confirmed: bool = False
    runner_service_account: str | None = None
    # The controller's RUNNER_POD_DEFAULTS (a config's runnerPod wins).
    pod_defaults: RunnerPodDefaults | None = None
    # How often a running run's progress is looked at again.
    progress_interval: float = 10.0
    # POD_START_TIMEOUT: how long a runner pod may fail to start before its run
    # fails (a run's spec.podStartTimeoutSeconds wins); 0: no limit.
    pod_start_timeout: float = 0.0
    # The model of a config that names an InferenceService (controller.isvc.resolve):
    # what it resolved to, or why it cannot be used now. None for a config with a modelUrl.
    model: Resolution | None = None


def resolved_model(view: View) -> ResolvedModel | None:
    return view.model if isinstance(view.model, ResolvedModel) else None


def model_problem(view: View) -> ModelProblem | None:
    return view.model if isinstance(view.model, ModelProblem) else None


@dataclass
class Plan:
    writes: list[Write] = field(default_factory=list)
    # The run must be confirmed by a live read before anything else is done.
    confirm: bool = False
    status: InferenceRunStatus | None = None
    status_changed: bool = False
    events: list[Event] = field(default_factory=list)
    delete_run: bool = False
    requeue_after: float | None = None


# ------------------------------------------------------------------------- memos


class _Memo:
    """Results of a pure function of parsed models, by the models' identity.

    The reconciler reuses a parsed run or config while its resourceVersion is
    the same (``controller.modelcache.ModelCache``), so the next pass over an
    unchanged run finds what this one computed from it. Entries hold their
    models, so an id is never reused while its entry lives; at most ``size``
    are kept. Results are shared: callers must not change them.
    """

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self._items: OrderedDict[tuple[Any, ...], tuple[tuple[object, ...], Any]] = OrderedDict()

    def get(self, models: tuple[object, ...], extra: tuple[Any, ...], make: Any) -> Any:
        key = (*map(id, models), *extra)
        found = self._items.get(key)
        if found is not None and all(a is b for a, b in zip(found[0], models, strict=True)):
            self._items.move_to_end(key)
            return found[1]
        value = make()
        self._items[key] = (models, value)
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            self._items.popitem(last=False)
        return value


_CONTRACTS = _Memo()
_STATUSES = _Memo()
_SPEC_HASHES = _Memo()


def status_contract(
    run: InferenceRun, config: InferenceConfig, name: str, model: ResolvedModel | None = None
) -> Any:
    """The contract as the run's status shows it (long strings cut)."""
    key = (name,) if model is None else (name, model.url, model.protocol, model.model_name)
    return _CONTRACTS.get(
        (run, config),
        key,
        lambda: cap_strings(
            contract_document(run, config, name=name, kserve=contract_model(config, model))
        ),
    )


def _api_status(status: InferenceRunStatus) -> Any:
    """``status.to_api()`` of a parsed run's status."""
    return _STATUSES.get((status,), (), status.to_api)


# ------------------------------------------------------------------------ children


def _pick(objs: Sequence[Obj], name: str | None) -> Obj | None:
    """The child named ``name`` if there is one, else the oldest (the first one made)."""
    if not objs:
        return None
    for obj in objs:
        if obj["metadata"]["name"] == name:
            return obj
    return min(
        objs, key=lambda o: (o["metadata"].get("creationTimestamp") or "", o["metadata"]["name"])
    )


def recorded_name(run: InferenceRun) -> str | None:
    ref = run.status.job_status
    return ref.name if ref is not None and ref.name else None


def workload_of(view: View) -> Obj | None:
    """The run's Job (one-shot) or CronJob (scheduled), whatever its name."""
    objs = view.cronjobs if view.run.spec.scheduled else view.jobs
    return _pick(objs, recorded_name(view.run))


def _wrong_kind(view: View) -> Obj | None:
    objs = view.jobs if view.run.spec.scheduled else view.cronjobs
    return objs[0] if objs else None


def names_for(view: View) -> str:
    """The name the run's children have or will have: decided once, then kept."""
    workload = workload_of(view)
    if workload is not None:
        return str(workload["metadata"]["name"])
    return recorded_name(view.run) or child_name(view.run)


def run_spec_hash(run: InferenceRun) -> str:
    """A hash of what the run asks for, less ``suspend`` (which an existing Job follows)."""
    # Defaults left out, so a field a later version adds does not make every
    # existing run look edited.
    return str(_SPEC_HASHES.get((run.spec,), (), lambda: _spec_hash(run)))


def _spec_hash(run: InferenceRun) -> str:
    # The pod-start timeout is read from the run on every pass, not built into the Job.
    spec = run.spec.model_dump(
        mode="json", exclude={"suspend", "pod_start_timeout_seconds"}, exclude_defaults=True
    )
    return hashlib.sha256(orjson.dumps(spec, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


def wants_job_events(job: Obj | None, pods: Sequence[Obj], now: datetime) -> bool:
    """Whether a one-shot run's Job may be failing to create pods (read its Events)."""
    if job is None or pods:
        return False
    if job_finished(job) or (job.get("spec") or {}).get("suspend"):
        return False
    created = parse_time(job["metadata"].get("creationTimestamp"))
    return created is not None and now - created >= JOB_EVENTS_AFTER


def _differs(current: Obj, desired: Obj) -> bool:
    want = desired["metadata"]["annotations"][DESIRED_HASH_ANNOTATION]
    have = (current["metadata"].get("annotations") or {}).get(DESIRED_HASH_ANNOTATION)
    return bool(want != have)


def _update(resource: Resource, current: Obj, desired: Obj) -> Patch:
    """A merge patch bringing ``current`` to ``desired`` (precondition: its resourceVersion)."""
    meta = desired["metadata"]
    patch: Obj = {
        "metadata": {
            "annotations": meta["annotations"],
            "labels": meta["labels"],
            "resourceVersion": current["metadata"]["resourceVersion"],
        }
    }
    for part in ("data", "spec"):
        if part in desired:
            patch[part] = desired[part]
    if "binaryData" in current:
        # Upstream kept the contract in binaryData; a key may not be in both.
        patch["binaryData"] = None
    return Patch(resource, meta["namespace"], meta["name"], patch)


@dataclass
class _Children:
    writes: list[Write] = field(default_factory=list)
    confirm: bool = False
    # (reason, message) that makes the run Error without touching anything.
    blocked: tuple[str, str] | None = None
    warnings: list[tuple[str, str]] = field(default_factory=list)


def _children(view: View) -> _Children:
    run, config = view.run, view.config
    out = _Children()
    wrong = _wrong_kind(view)
    if wrong is not None:
        had, has = ("a Job", "added") if run.spec.scheduled else ("a CronJob", "removed")
        out.blocked = (
            REASON_SCHEDULE_CHANGE,
            f"spec.schedule was {has} after the run got {had} "
            f"({wrong['metadata']['name']}), which is kept as it is: "
            "create a new InferenceRun for the other kind of run",
        )
        return out
    if config is None or view.refusal is not None:
        if run.spec.scheduled and view.refusal is None and config_unusable(view):
            _suspend_cronjob(view, out)
        return out
    workload = workload_of(view)
    name = names_for(view)
    configmap = _pick(view.configmaps, name)
    if not run.spec.scheduled and workload is not None:
        # A one-shot run's Job is never replaced: only suspend follows the run,
        # and on a Job in a Kueue queue only towards true: Kueue un-suspends it
        # when it admits it, and un-suspending it here would bypass the quota.
        spec = workload.get("spec") or {}
        suspended = bool(spec.get("suspend"))
        wanted = run.spec.suspend or (suspended and queue_of(workload) is not None)
        if not job_finished(workload) and suspended != wanted:
            meta = workload["metadata"]
            out.writes.append(
                Patch(
                    JOBS,
                    meta["namespace"],
                    meta["name"],
                    {
                        "metadata": {"resourceVersion": meta["resourceVersion"]},
                        "spec": {"suspend": run.spec.suspend},
                    },
                )
            )
        created_for = (workload["metadata"].get("annotations") or {}).get(RUN_SPEC_HASH_ANNOTATION)
        if created_for is not None and created_for != run_spec_hash(run):
            out.warnings.append(
                (
                    REASON_SPEC_CHANGE,
                    f"the run's Job {name} was created from an earlier spec and is kept: "
                    "edits other than suspend apply to new runs only",
                )
            )
        return out
    if not run.spec.scheduled and run.status.phase in FINISHED:
        return out  # finished, and its Job collected or deleted since: never run again
    if model_problem(view) is not None:
        # The model's InferenceService is not Ready (or cannot be read): nothing
        # is created, and a scheduled run's CronJob must not fire against it.
        if suspends_for_model(view):
            _suspend_cronjob(view, out)
        return out
    if (configmap is None or workload is None) and not view.confirmed:
        # Creating is irreversible (a Job runs), and the runs cache may lag:
        # the run may be gone (its children deleted by the garbage collector,
        # or never seen) or edited since. Look at it live first (nothing is
        # rendered for a view that may be stale: it is rendered once confirmed).
        out.confirm = True
        return out
    desired_cm = desired_configmap(
        run, config, name=name, kserve=contract_model(config, resolved_model(view))
    )
    if configmap is None:
        out.writes.append(Create(CONFIGMAPS, desired_cm))
    elif _differs(configmap, desired_cm):
        out.writes.append(_update(CONFIGMAPS, configmap, desired_cm))
    desired = desired_workload(
        run,
        config,
        runner_service_account=view.runner_service_account,
        name=name,
        pod_defaults=view.pod_defaults,
    )
    if not run.spec.scheduled:
        desired["metadata"]["annotations"][RUN_SPEC_HASH_ANNOTATION] = run_spec_hash(run)
    resource = CRONJOBS if run.spec.scheduled else JOBS
    if workload is None:
        out.writes.append(Create(resource, desired))
    elif _differs(workload, desired):
        resumes = bool((workload.get("spec") or {}).get("suspend")) and not run.spec.suspend
        if resumes and not view.confirmed:
            # A CronJob that starts firing again (its config is back, or the
            # run is resumed) acts on the contract as a new one would: confirm.
            out.writes, out.confirm = [], True
            return out
        out.writes.append(_update(resource, workload, desired))
    return out


def config_gone(view: View) -> bool:
    """Whether the run's config does not exist (as opposed to unusable or out of reach)."""
    return view.config_problem is not None and view.config_problem[0] == CONFIG_NOT_FOUND


def config_unusable(view: View) -> bool:
    """Whether no contract can be rendered: the config is gone, invalid or out of reach."""
    return view.config is None and view.config_problem is not None


def suspends_for_model(view: View) -> bool:
    """Whether a scheduled run's CronJob is held back by its model (not Ready, not resolvable).

    Not while the controller is still filling its InferenceServices cache (a
    restart must not pause every schedule), nor for a run the user suspended
    (its CronJob is suspended anyway, and the run says so).
    """
    problem = model_problem(view)
    return (
        problem is not None
        and problem.settled
        and view.run.spec.scheduled
        and not view.run.spec.suspend
        and view.config is not None
        and view.refusal is None
    )


def _suspend_cronjob(view: View, out: _Children) -> None:
    """Suspend a scheduled run's CronJob: its config is unusable, or its model not Ready.

    Its drift annotation goes too, so that when the config (or the model) is
    back the CronJob differs from what is rendered and is updated
    (``suspend`` as the run asks, and the ConfigMap with the new contract). A
    CronJob suspended already (the run asks for it, or done before) is left
    as it is.
    """
    cron = workload_of(view)
    if cron is None or (cron.get("spec") or {}).get("suspend"):
        return
    if not view.confirmed:
        # The config (or the service) may only look so from a lagging cache:
        # the live read of a confirm reads both again.
        out.confirm = True
        return
    meta = cron["metadata"]
    out.writes.append(
        Patch(
            CRONJOBS,
            meta["namespace"],
            meta["name"],
            {
                "metadata": {
                    "resourceVersion": meta["resourceVersion"],
                    "annotations": {DESIRED_HASH_ANNOTATION: None},
                },
                "spec": {"suspend": True},
            },
        )
    )


def config_used(configmap: Obj | None) -> tuple[str | None, int | None]:
    """(resourceVersion, generation) of the config a run's ConfigMap was rendered from."""
    annotations = (configmap or {}).get("metadata", {}).get("annotations") or {}
    generation = annotations.get(CONFIG_GENERATION_ANNOTATION)
    try:
        number = int(generation) if generation is not None else None
    except ValueError:
        number = None
    if number is not None and number < 0:
        number = None
    return annotations.get(CONFIG_RESOURCE_VERSION_ANNOTATION), number


# -------------------------------------------------------------------------- status


def cap_strings(value: Any, limit: int = MAX_STATUS_STRING) -> Any:
    """``value`` with every string longer than ``limit`` cut, saying how long it was."""
    if isinstance(value, str):
        if len(value) <= limit:
            return value
        return f"{value[: limit // 4]}… ({len(value.encode('utf-8'))} bytes, cut)"
    if isinstance(value, dict):
        return {k: cap_strings(v, limit) for k, v in value.items()}
    if isinstance(value, list):
        return [cap_strings(v, limit) for v in value]
    return value


def plan(view: View) -> Plan:
    """Writes, status, events and requeue for one run, from what was observed."""
    run = view.run
    out = Plan()
    children = _children(view)
    if children.confirm:
        out.confirm = True
        return out
    out.writes = children.writes

    warnings = run_config_warnings(run, view.config) if view.config is not None else []
    warnings += children.warnings
    workload = workload_of(view)
    contract = None
    fixed = not run.spec.scheduled and workload is not None and run.status.contract is not None
    waiting_for_model = model_problem(view)
    if view.config is not None and not fixed and waiting_for_model is None:
        # A one-shot run's contract is the one its Job was created with: a
        # later config or run edit does not reach it, nor the status.
        contract = status_contract(run, view.config, names_for(view), resolved_model(view))
    duplicates = duplicate_output_warning(
        run,
        contract if contract is not None else run.status.contract,
        None if run.spec.scheduled else workload,
        view.executions,
    )
    if duplicates is not None:
        warnings.append(duplicates)
    held_back = workload is not None and suspends_for_model(view)
    if (
        waiting_for_model is not None
        and workload is not None
        and run.spec.scheduled
        and not held_back
    ):
        # Still reading InferenceServices, or the run is suspended anyway.
        warnings.append(
            (
                waiting_for_model.reason,
                f"{waiting_for_model.message}; the CronJob keeps the model URL last resolved",
            )
        )
    problem = children.blocked or view.config_problem
    waiting = _config_grace_left(view)
    if waiting is not None and problem is view.config_problem:
        problem = None
    if view.refusal is not None:
        problem = (view.refusal.reason, view.refusal.message)
    observed = Observed(
        run=run,
        now=view.now,
        config_problem=problem,
        warnings=warnings,
        contract=contract,
        job=None if run.spec.scheduled else workload,
        cronjob=workload if run.spec.scheduled else None,
        executions=view.executions,
        pods=view.pods,
        progress=view.progress,
        job_events=view.job_events,
    )
    status = derive_status(observed)
    if waiting is not None and view.config_problem is not None and workload is None:
        status.phase, status.reason = "Pending", WAITING
        status.message = view.config_problem[1]
        status.conditions = _waiting_conditions(status, view)
    elif (
        waiting_for_model is not None
        and problem is None
        and workload is None
        and status.phase == "Pending"
    ):
        # A run does not start while its model is not Ready: Pending, with
        # KServe's own words (or why the service cannot be read).
        status.phase, status.reason = "Pending", waiting_for_model.reason
        status.message = waiting_for_model.message
        status.conditions = _waiting_conditions(status, view, waiting_for_model.reason)
    if (
        run.spec.scheduled
        and workload is not None
        and config_unusable(view)
        and problem is view.config_problem
    ):
        _suspended_for_config(status, view, workload)
    elif held_back and problem is None and waiting_for_model is not None:
        assert workload is not None
        _suspended_for_model(status, view, workload, waiting_for_model)
    used = config_used(_pick(view.configmaps, names_for(view)))
    if used[0] is not None or used[1] is not None:
        status.config_resource_version, status.config_generation = used
    else:
        status.config_resource_version = run.status.config_resource_version
        status.config_generation = run.status.config_generation
    out.status = status
    out.status_changed = status.to_api() != _api_status(run.status)
    out.events = phase_events(run.status, status, warnings)

    if view.config is not None and not run.spec.scheduled:
        policy = view.config.spec.auto_delete_policy
        out.delete_run = (
            status.phase == "Succeeded" and policy in ("DeleteOnSuccess", "DeleteOnCompletion")
        ) or (status.phase == "Failed" and policy == "DeleteOnCompletion")
        if out.delete_run:
            out.events.append(
                Event("Normal", "AutoDelete", f"run {status.phase}: deleting it ({policy})")
            )
    cut = pod_start_cut(view, workload, status)
    if cut is not None and not any(isinstance(w, Patch) and w.resource is JOBS for w in out.writes):
        out.writes.append(cut)
    out.requeue_after = _requeue_after(view, status, workload)
    if waiting is not None and view.config_problem is not None:
        out.requeue_after = waiting
    elif problem is None and (
        (waiting_for_model is not None and workload is None)
        or (held_back and out.requeue_after is None)
    ):
        out.requeue_after = MODEL_RECHECK
    return out


def pod_start_timeout(view: View) -> float:
    """Seconds a runner pod of this run may fail to start: the run's own, else the default."""
    own = view.run.spec.pod_start_timeout_seconds
    return float(own) if own is not None else view.pod_start_timeout


def pod_start_cut(view: View, workload: Obj | None, status: InferenceRunStatus) -> Patch | None:
    """The patch that ends a one-shot run's Job whose runner pod cannot start in time.

    A pod waiting on an image that cannot be pulled, a missing Secret or no
    node would wait for ever when the run has no ``timeoutSeconds`` (as
    Tekton's image-pull-backoff timeout, the wait is bounded): past the
    timeout the Job's ``activeDeadlineSeconds`` is cut to its age, so the Job
    controller fails it (``DeadlineExceeded``) and deletes its pods, and the
    annotation says why; the run then shows ``Failed`` with the pod's reason.
    """
    timeout = pod_start_timeout(view)
    if timeout <= 0 or view.run.spec.scheduled or workload is None:
        return None
    if status.phase != "Pending" or job_finished(workload):
        return None
    meta = workload["metadata"]
    if (workload.get("spec") or {}).get("suspend"):
        return None
    if POD_START_FAILED_ANNOTATION in (meta.get("annotations") or {}):
        return None  # cut already; the Job controller has yet to say it
    stuck = pod_start_failure(view.pods, view.now, timeout)
    if stuck is None:
        return None
    pod, reason, message = stuck
    started = parse_time((workload.get("status") or {}).get("startTime")) or parse_time(
        meta.get("creationTimestamp")
    )
    age = (view.now - started).total_seconds() if started is not None else 0.0
    said = one_line(
        f"runner pod {pod} could not start within {timeout:g}s "
        f"(podStartTimeoutSeconds): {reason}: {message}"
    )
    return Patch(
        JOBS,
        meta["namespace"],
        meta["name"],
        {
            "metadata": {
                "resourceVersion": meta["resourceVersion"],
                "annotations": {POD_START_FAILED_ANNOTATION: f"{reason}: {said}"},
            },
            "spec": {"activeDeadlineSeconds": max(1, math.ceil(age))},
        },
    )


def _config_grace_left(view: View) -> float | None:
    """Seconds left of a new run's grace for a missing config, or None."""
    if not config_gone(view):
        return None
    if view.run.status.phase not in (None, "Pending"):
        return None  # it was past that already
    created = view.run.metadata.creation_timestamp
    if created is None:
        return None
    left = (created + CONFIG_GRACE - view.now).total_seconds()
    return left if left > 0 else None


def _suspended_for_config(status: InferenceRunStatus, view: View, cron: Obj) -> None:
    """A scheduled run whose config is unusable: Error, its CronJob suspended until it is usable."""
    assert view.config_problem is not None
    reason, problem = view.config_problem
    namespace, name = view.run.config_key
    cron_name = cron["metadata"]["name"]
    status.phase, status.reason = "Error", reason
    if reason == CONFIG_NOT_FOUND:
        status.message = (
            f"InferenceConfig {namespace}/{name} not found: CronJob {cron_name} "
            "is suspended until it exists (an execution under way goes on)"
        )
    else:
        status.message = (
            f"{problem}; CronJob {cron_name} is suspended until the config is usable "
            "(an execution under way goes on)"
        )
    status.next_schedule_time = None
    generation = view.run.metadata.generation or None
    ready = Condition(
        type=CONDITION_READY,
        status="False",
        reason=reason,
        message=status.message,
        last_transition_time=view.now,
        observed_generation=generation,
    )
    status.conditions = kstatus_conditions(
        set_condition(status.conditions, ready), status, view.now, generation
    )


def _suspended_for_model(
    status: InferenceRunStatus, view: View, cron: Obj, problem: ModelProblem
) -> None:
    """A scheduled run whose model is not Ready: Pending, its CronJob suspended until it is."""
    status.phase, status.reason = "Pending", problem.reason
    status.message = (
        f"{problem.message}; CronJob {cron['metadata']['name']} is suspended until the "
        "model is Ready (an execution under way goes on)"
    )
    status.next_schedule_time = None
    status.conditions = _waiting_conditions(status, view, problem.reason)


def _waiting_conditions(
    status: InferenceRunStatus, view: View, why: str = WAITING
) -> list[Condition]:
    generation = view.run.metadata.generation or None
    conditions = status.conditions
    for type_, value, reason in (
        (CONDITION_READY, "False", why),
        (CONDITION_RECONCILING, "True", why),
        (CONDITION_STALLED, "False", "Reconciled"),
    ):
        conditions = set_condition(
            conditions,
            Condition(
                type=type_,
                status=value,  # type: ignore[arg-type]
                reason=reason,
                message="" if type_ == CONDITION_STALLED else (status.message or ""),
                last_transition_time=view.now,
                observed_generation=generation,
            ),
        )
    return outcome_conditions(
        conditions, status, view.now, generation, scheduled=view.run.spec.scheduled
    )


def _requeue_after(view: View, status: InferenceRunStatus, workload: Obj | None) -> float | None:
    running = status.phase == "Running" or (
        status.last_execution is not None and status.last_execution.phase == "Running"
    )
    if running:
        return view.progress_interval
    if status.phase == "Pending" and status.reason == REASON_QUEUED:
        return None  # Kueue's admission un-suspends the Job: its event brings the run back
    if status.phase == "Pending" and not view.run.spec.scheduled and workload is not None:
        # Pod creation failures reach us only through Events we do not watch.
        return PENDING_RECHECK
    return None


def phase_events(
    old: InferenceRunStatus, new: InferenceRunStatus, warnings: Sequence[tuple[str, str]]
) -> list[Event]:
    """The Events a status change deserves: each one said once, when it happens."""
    events: list[Event] = []
    if new.phase != old.phase or new.reason != old.reason:
        message = new.message or f"run is {new.phase}"
        if new.phase in ("Failed", "Error"):
            events.append(Event("Warning", new.reason or new.phase or "Failed", message))
        elif new.phase == "Succeeded" and new.result is not None:
            r = new.result
            events.append(
                Event(
                    "Normal",
                    "Succeeded",
                    f"{r.predictions} predictions for {r.rows} rows in {r.duration_seconds:.1f}s",
                )
            )
        elif new.phase == "Pending" and new.reason == REASON_QUEUED:
            events.append(Event("Normal", REASON_QUEUED, message))
        elif new.reason == "Retrying" or (
            new.phase in ("Pending", "Running")
            and new.reason not in (None, "Pending", "Creating", WAITING, "Running")
        ):
            # A retry, a pod that cannot start (ErrImagePull, FailedCreate, …) or
            # one its node or an eviction takes away (NodeLost, EvictionByEvictionAPI…).
            events.append(Event("Warning", new.reason or "Pending", message))
        elif new.phase == "Pending":
            pass  # "Created" already said it
        elif new.phase is not None:
            events.append(Event("Normal", new.phase, message))
    old_last, last = old.last_execution, new.last_execution
    if last is not None and (
        old_last is None or (old_last.name, old_last.phase) != (last.name, last.phase)
    ):
        if last.phase == "Failed":
            events.append(
                Event(
                    "Warning",
                    last.reason or "ExecutionFailed",
                    f"{last.name}: {last.message or ''}",
                )
            )
        elif last.phase == "Succeeded":
            events.append(Event("Normal", "ExecutionSucceeded", f"{last.name} succeeded"))
    # A warning is announced once, when it first appears on the run's Warning condition.
    previous = next((c for c in old.conditions if c.type == CONDITION_WARNING), None)
    known = set(previous.reason.split(",")) if previous is not None else set()
    for reason, message in warnings:
        if reason not in known:
            events.append(Event("Warning", reason, message))
    return events
