"""What one reconcile of an InferenceConfig should do. Pure: the clock is passed in.

A config's status answers "can runs use this config?" twice:

- ``Ready``: static validity, at once (a model URL, no inline credentials,
  known field values: what ``controller.api`` checks), with
  ``observedGeneration``;
- ``Probed``: a live check. On create, on every change (generation) and every
  probe interval (``PROBE_INTERVAL``; 0 disables it), a short Job with the
  config's own runner image, ServiceAccount and pull Secret runs
  ``python -m runner --check`` against a contract made from the config: its
  Secrets are readable, the storage answers, the model's metadata answers and
  fits. The runner's exit code and one-line message become the condition
  (``ProbeSucceeded``, or the reason of the exit code, e.g.
  ``InferenceRejected``). The probe Job and its ConfigMap are owned by the
  config and deleted once read.

Runs of a config whose probe failed say so in a ``Warning`` condition
(``controller.api.run_config_warnings``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from controller.api import (
    CONDITION_PROBED,
    CONDITION_READY,
    CONDITION_RECONCILING,
    CONDITION_STALLED,
    INSECURE_WARNING,
    InferenceConfig,
    InferenceConfigStatus,
    RunnerPodDefaults,
    condition,
    find_condition,
    insecure_skip_verify,
    set_condition,
)
from controller.isvc import ModelProblem, Resolution, ResolvedModel, contract_model
from controller.naming import PROBE_GENERATION_ANNOTATION, probe_name
from controller.plan import Event
from controller.render import CONTAINER_NAME, desired_probe
from controller.status import (
    CONDITION_WARNING,
    EXIT_REASONS,
    container_cannot_start,
    one_line,
)
from kubeclient.objects import finished_condition, job_finished, job_outcome, parse_time
from kubeclient.resources import Obj

# While a probe runs, look again at least this often (its pod's events also bring the config back).
PROBE_RECHECK = 15.0


@dataclass(frozen=True)
class ConfigView:
    raw: Obj
    now: datetime
    config: InferenceConfig | None = None
    # (reason, message) when the config cannot be used as written.
    invalid: tuple[str, str] | None = None
    probe_interval: float = 0.0
    probe_jobs: Sequence[Obj] = ()
    probe_pods: Sequence[Obj] = ()
    runner_service_account: str | None = None
    pod_defaults: RunnerPodDefaults | None = None
    # The model of a config that names an InferenceService (controller.isvc.resolve).
    model: Resolution | None = None


@dataclass
class ConfigPlan:
    status: InferenceConfigStatus
    status_changed: bool = False
    # (ConfigMap, Job) of a probe to start.
    create: tuple[Obj, Obj] | None = None
    # Probe Jobs (and the ConfigMaps of the same name) whose result has been read.
    delete: list[Obj] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None
    # The outcome of the finished probe read this pass, for the log:
    # (probe Job name, passed, reason, message).
    probed: tuple[str, bool, str, str] | None = None


def _age_order(obj: Obj) -> tuple[str, str]:
    return obj["metadata"].get("creationTimestamp") or "", obj["metadata"]["name"]


def _generation(job: Obj) -> int | None:
    value = (job["metadata"].get("annotations") or {}).get(PROBE_GENERATION_ANNOTATION)
    return int(value) if value and value.isdigit() else None


def probe_outcome(job: Obj, pods: Sequence[Obj]) -> tuple[bool, str, str]:
    """``(passed, reason, message)`` of a finished probe Job."""
    name = job["metadata"]["name"]
    for pod in pods:
        if (pod["metadata"].get("labels") or {}).get("job-name") != name:
            continue
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            term = (status.get("state") or {}).get("terminated")
            if status.get("name") != CONTAINER_NAME or not term:
                continue
            code = int(term.get("exitCode", 1))
            text = one_line(term.get("message") or "")
            if code == 0:
                return True, "ProbeSucceeded", text
            reason = EXIT_REASONS.get(code, "ProbeFailed")
            return False, reason, one_line(f"probe exited with code {code}: {text}")
    for pod in pods:
        if (pod["metadata"].get("labels") or {}).get("job-name") != name:
            continue
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            waiting = (status.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") and waiting["reason"] != "ContainerCreating":
                text = one_line(waiting.get("message") or waiting["reason"])
                return False, str(waiting["reason"]), f"probe pod could not start: {text}"
    cond = finished_condition(job) or {}
    if job_outcome(job) == "Succeeded":
        return True, "ProbeSucceeded", ""
    reason = "ProbeTimedOut" if cond.get("reason") == "DeadlineExceeded" else "ProbeFailed"
    return False, reason, one_line(f"probe Job {name}: {cond.get('message') or 'failed'}")


def probe_stuck(job: Obj, pods: Sequence[Obj]) -> tuple[str, str] | None:
    """``(reason, message)`` of a running probe whose pod cannot start (``ErrImagePull``...).

    Said at once, not as ``ProbeTimedOut`` when the Job's deadline ends it (the
    Job then deletes the pod that said why).
    """
    name = job["metadata"]["name"]
    mine = [p for p in pods if (p["metadata"].get("labels") or {}).get("job-name") == name]
    stuck = container_cannot_start(mine)
    if stuck is None:
        return None
    return stuck[0], one_line(f"probe pod could not start: {stuck[1]}")


def plan_config(view: ConfigView) -> ConfigPlan:
    meta = view.raw["metadata"]
    generation = meta.get("generation") or None
    try:
        old = InferenceConfigStatus.model_validate(view.raw.get("status") or {})
    except ValueError:
        old = InferenceConfigStatus()
    conditions = list(old.conditions)
    waiting = view.model if isinstance(view.model, ModelProblem) else None
    resolved = view.model if isinstance(view.model, ResolvedModel) else None
    if view.invalid is not None:
        reason, message = view.invalid
        conditions = set_condition(
            conditions, condition(CONDITION_READY, False, reason, message, view.now, generation)
        )
    elif waiting is not None:
        # The config's Ready follows its InferenceService's.
        conditions = set_condition(
            conditions,
            condition(
                CONDITION_READY, False, waiting.reason, waiting.message, view.now, generation
            ),
        )
    else:
        conditions = set_condition(
            conditions, condition(CONDITION_READY, True, "Valid", "", view.now, generation)
        )
    # kstatus (Flux, kpt) reads Stalled, not Ready: a config runs cannot use
    # is Failed for it, not forever InProgress.
    stalled = view.invalid is not None
    conditions = set_condition(
        conditions,
        condition(
            CONDITION_STALLED,
            stalled,
            view.invalid[0] if view.invalid is not None else "Valid",
            view.invalid[1] if view.invalid is not None else "",
            view.now,
            generation,
        ),
    )
    # Waiting for the model is kstatus' InProgress: it may resolve without an edit.
    conditions = set_condition(
        conditions,
        condition(
            CONDITION_RECONCILING,
            waiting is not None and view.invalid is None,
            waiting.reason if waiting is not None and view.invalid is None else "Reconciled",
            waiting.message if waiting is not None and view.invalid is None else "",
            view.now,
            generation,
        ),
    )
    # A config that turns a safety off says so for as long as it does.
    if view.config is not None and insecure_skip_verify(view.config):
        reason, message = INSECURE_WARNING
        conditions = set_condition(
            conditions, condition(CONDITION_WARNING, True, reason, message, view.now, generation)
        )
    else:
        conditions = [c for c in conditions if c.type != CONDITION_WARNING]
    status = InferenceConfigStatus(
        conditions=conditions,
        observed_generation=generation,
        last_probe_time=old.last_probe_time,
        model=resolved.status() if resolved is not None and view.invalid is None else None,
    )
    out = ConfigPlan(status=status)

    jobs = sorted(view.probe_jobs, key=_age_order)
    finished = [j for j in jobs if job_finished(j)]
    running = [j for j in jobs if not job_finished(j)]
    # A probe whose pod cannot start is over: its outcome is that pod's reason.
    stuck = {j["metadata"]["name"]: probe_stuck(j, view.probe_pods) for j in running}
    stuck_jobs = [j for j in running if stuck[j["metadata"]["name"]] is not None]
    running = [j for j in running if stuck[j["metadata"]["name"]] is None]
    out.delete = finished + stuck_jobs
    probing = (
        view.config is not None
        and view.invalid is None
        and waiting is None
        and view.probe_interval > 0
    )
    if not probing:
        status.conditions = [c for c in status.conditions if c.type != CONDITION_PROBED]
        status.last_probe_time = None
        out.delete = list(jobs)
    elif finished or stuck_jobs:
        newest = max(finished + stuck_jobs, key=_age_order)
        cannot_start = stuck.get(newest["metadata"]["name"])
        if cannot_start is not None:
            passed, (reason, message) = False, cannot_start
            # When the probe started: the same on every pass until its Job is gone.
            done_at = parse_time(newest["metadata"].get("creationTimestamp")) or view.now
        else:
            passed, reason, message = probe_outcome(newest, view.probe_pods)
            ended = finished_condition(newest) or {}
            done_at = parse_time(ended.get("lastTransitionTime")) or view.now
        out.probed = (newest["metadata"]["name"], passed, reason, message)
        status.conditions = set_condition(
            status.conditions,
            condition(CONDITION_PROBED, passed, reason, message, view.now, _generation(newest)),
        )
        status.last_probe_time = done_at

    if probing and not running:
        probed = find_condition(status.conditions, CONDITION_PROBED)
        last = status.last_probe_time
        due_at = (
            view.now
            if probed is None or last is None or probed.observed_generation != generation
            else last + timedelta(seconds=view.probe_interval)
        )
        if due_at <= view.now:
            assert view.config is not None
            name = probe_name(meta["name"], meta["uid"], int(view.now.timestamp()))
            configmap, job = desired_probe(
                view.config,
                name,
                runner_service_account=view.runner_service_account,
                pod_defaults=view.pod_defaults,
                model=contract_model(view.config, resolved),
            )
            job["metadata"] = {
                **job["metadata"],
                "annotations": {PROBE_GENERATION_ANNOTATION: str(generation or 0)},
            }
            out.create = (configmap, job)
            out.requeue_after = PROBE_RECHECK
        else:
            out.requeue_after = (due_at - view.now).total_seconds()
    elif probing:
        out.requeue_after = PROBE_RECHECK

    out.status_changed = status.to_api() != old.to_api()
    out.events = _events(old, status)
    return out


def _events(old: InferenceConfigStatus, new: InferenceConfigStatus) -> list[Event]:
    events: list[Event] = []
    for type_ in (CONDITION_READY, CONDITION_PROBED):
        before, after = find_condition(old.conditions, type_), find_condition(new.conditions, type_)
        if after is None:
            continue
        if before is not None and (before.status, before.reason, before.message) == (
            after.status,
            after.reason,
            after.message,
        ):
            continue
        if after.status == "False":
            events.append(Event("Warning", after.reason, after.message or after.reason))
        elif type_ == CONDITION_PROBED and (before is None or before.status != "True"):
            events.append(Event("Normal", after.reason, after.message or "probe passed"))
    return events
