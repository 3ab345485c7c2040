"""Observed state -> an InferenceRun's status. Pure: no I/O, the clock passed in.

The outcome of a Job is read from its **conditions**, never guessed from its
pod counters (the upstream Go controller counted pods and called a Job that was
still retrying failed):

=====================================  ===========  ==================================
Job condition (status True)            run phase    reason
=====================================  ===========  ==================================
``Complete`` / ``SuccessCriteriaMet``  Succeeded    ``Completed``
``Failed`` / ``FailureTarget``         Failed       ``DeadlineExceeded`` from the Job;
                                                    else the runner's exit (e.g.
                                                    ``InferenceFailed``); else the
                                                    Job's (``BackoffLimitExceeded``)
none, a runner pod failed and the Job  Failed       the runner's exit, as above
fails for it (:func:`job_will_fail`)
``Failed`` (``DeadlineExceeded``) on   Failed       why the pod could not start
a Job the controller ended for a pod                (``ErrImagePull``...)
that could not start in time
``Suspended``                          Suspended    ``Suspended``
``Suspended``, Job in a Kueue queue,   Pending      ``Queued`` (message names the
the run not suspended                               queue)
none, a runner pod its node or an     Running      ``NodeLost``, ``NodeNotReady``, or
eviction takes away (see                            the pod's ``DisruptionTarget``
:func:`pod_disruption`)                             reason; not Ready
none, a runner pod running (or one    Running      ``Running``
that exited 0, or one that failed and
the Job will retry)                                 (``Retrying``, the failure's words)
none, a pod that cannot start          Pending      its waiting reason
                                                    (``ErrImagePull``…), the
                                                    scheduler's, or the Job's
                                                    ``FailedCreate``
none                                   Pending      ``Pending``
=====================================  ===========  ==================================

``FailureTarget`` counts as failed: the Job controller has decided, it is only
waiting for pods to terminate. A runner the kernel killed for its memory is
``OOMKilled`` (the message names the container's memory limit), and a deadline
that ends a Pending run keeps why it was Pending in the message. The runner's
own words come from its pod's termination message (``runner/termination.py``
writes a one-line reason on failure and ``{"rows", "predictions",
"durationSeconds"}`` on success, plus ``resumedRows``, ``pages``, ``chunks``
and ``duplicates`` for a streaming run; ``status.result`` carries them all,
summed over the shards of an Indexed Job, and ``attempts``: the runner pods
the Job ran to an end). A run whose output is not keyed and that succeeded
after a failed attempt carries the Warning ``OutputMayHoldDuplicates``: that
attempt started again from row 0 (:func:`duplicate_output_warning`).

A scheduled run is ``Scheduled`` (``Running`` while an execution runs,
reason ``Queued`` while every execution under way waits for Kueue,
``Suspended`` when suspended); its ``lastExecution`` and ``recentExecutions``
describe the newest Jobs the CronJob started, ``nextScheduleTime`` its next
tick. Conditions: ``Ready`` (a one-shot run: True once it succeeded, False
with its reason while on its way; a scheduled run: upstream's, True once its
CronJob exists and the config is usable, False for Error and a pod that cannot
start), ``Reconciling`` and ``Stalled`` (kstatus': see
:func:`kstatus_conditions`), ``Complete`` and ``Failed`` (one-shot runs only,
as on a Job, both False in every other phase: see :func:`outcome_conditions`)
and ``Warning`` (something the controller does differently than written).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from contract.exitcodes import REASONS, ExitCode
from contract.termination import RunResult, parse_success, total
from controller.api import (
    CONDITION_COMPLETE,
    CONDITION_FAILED,
    CONDITION_READY,
    CONDITION_RECONCILING,
    CONDITION_STALLED,
    MAX_MESSAGE_LENGTH,
    Condition,
    ConditionStatus,
    Execution,
    InferenceRun,
    InferenceRunStatus,
    ObjectReference,
    Phase,
    Progress,
    RunOutcome,
    condition,
    keyed_output,
    set_condition,
)
from controller.cron import next_schedule_time
from controller.naming import KUEUE_QUEUE_LABEL, POD_START_FAILED_ANNOTATION
from controller.render import CONTAINER_NAME
from kubeclient.objects import JOB_FAILED, finished_condition, job_outcome, parse_time

CONDITION_WARNING = "Warning"
# The Warning of a run whose output, not keyed, was written by more than one attempt.
REASON_DUPLICATES = "OutputMayHoldDuplicates"
# The pod condition an eviction, a preemption or the taint manager sets first.
DISRUPTION_TARGET = "DisruptionTarget"
REASON_OOM_KILLED = "OOMKilled"
# A runner pod on a node that stopped reporting: being deleted (lost), or not yet.
REASON_NODE_LOST = "NodeLost"
REASON_NODE_NOT_READY = "NodeNotReady"
# The taint that lets Kubernetes delete the pods of a node known to be down.
OUT_OF_SERVICE_TAINT = "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute"
# How long past its grace period a deleted pod may wait for its kubelet's word.
KUBELET_SLACK = timedelta(seconds=30)
# The DisruptionTarget reason of the taint manager's eviction: on a node that
# stopped reporting, the one of its ``unreachable``/``not-ready`` NoExecute taints.
REASON_TAINT_MANAGER = "DeletionByTaintManager"
# A Job in a Kueue queue, suspended until Kueue admits it.
REASON_QUEUED = "Queued"

# The runner's exit codes (contract/exitcodes.py, their one definition) -> the
# reason a run shows; 137 is the kernel's, not the runner's.
EXIT_REASONS = {int(code): reason for code, reason in REASONS.items() if code != ExitCode.DONE}
EXIT_REASONS[137] = "RunnerKilled"
# A condition message is at most this long (controller.api, its one definition).
MAX_MESSAGE = MAX_MESSAGE_LENGTH

Json = dict[str, Any]


@dataclass(frozen=True)
class Observed:
    """Everything the status depends on, read from the cache by the reconciler."""

    run: InferenceRun
    now: datetime
    # (reason, message) when the config is missing or unusable; None when fine.
    config_problem: tuple[str, str] | None = None
    warnings: Sequence[tuple[str, str]] = ()
    contract: Json | None = None
    job: Json | None = None  # one-shot: the run's Job
    cronjob: Json | None = None  # scheduled: the run's CronJob
    executions: Sequence[Json] = ()  # scheduled: Jobs the CronJob started
    pods: Sequence[Json] = field(default_factory=list)  # pods of the job / newest execution
    progress: Progress | None = None  # from the running runner's log
    # (reason, message) of the Job's newest FailedCreate Events: why it has no pod.
    job_events: Sequence[tuple[str, str]] = ()


def _conditions_of(obj: Json | None) -> dict[str, Json]:
    if not obj:
        return {}
    return {
        c["type"]: c
        for c in (obj.get("status") or {}).get("conditions") or []
        if c.get("status") == "True"
    }


def _runner_state(pod: Json) -> Json | None:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == CONTAINER_NAME:
            return status.get("state") or {}
    return None


def _terminated(pod: Json) -> Json | None:
    state = _runner_state(pod)
    return (state or {}).get("terminated")


def one_line(text: str) -> str:
    """``text`` on one line, cut to :data:`MAX_MESSAGE` characters with an ellipsis."""
    line = " ".join(text.split())
    return line if len(line) <= MAX_MESSAGE else line[: MAX_MESSAGE - 1] + "…"


def _newest(pods: Sequence[Json], predicate: Any) -> Json | None:
    chosen = [p for p in pods if predicate(p)]
    if not chosen:
        return None
    return max(chosen, key=lambda p: (_terminated(p) or {}).get("finishedAt") or "")


def memory_limit(pod: Json) -> str | None:
    """The runner container's memory limit in the pod's spec (e.g. ``512Mi``), or None."""
    for container in (pod.get("spec") or {}).get("containers") or []:
        if container.get("name") == CONTAINER_NAME:
            limit = ((container.get("resources") or {}).get("limits") or {}).get("memory")
            return str(limit) if limit is not None else None
    return None


def runner_failure(pods: Sequence[Json]) -> tuple[str, str] | None:
    """``(reason, message)`` from the newest runner pod that exited non-zero.

    A runner the kernel killed for its memory (the runtime's ``OOMKilled``) is
    ``OOMKilled``, and the message names the container's memory limit.
    """
    pod = _newest(pods, lambda p: (_terminated(p) or {}).get("exitCode", 0) != 0)
    if pod is None:
        return None
    term = _terminated(pod) or {}
    code = int(term.get("exitCode", 1))
    text = " ".join((term.get("message") or "").split())
    if term.get("reason") == REASON_OOM_KILLED:
        limit = memory_limit(pod)
        cause = (
            f"runner killed for exceeding its memory limit of {limit}"
            if limit is not None
            else "runner killed for lack of memory (it has no memory limit: the node ran out)"
        )
        return REASON_OOM_KILLED, one_line(
            f"{cause} (exit code {code}); raise spec.resources.limits.memory of the config, "
            "or lower batching.batchSize or use paging" + (f"; last output: {text}" if text else "")
        )
    reason = EXIT_REASONS.get(code, "RunnerFailed")
    return reason, one_line(f"runner exited with code {code}" + (f": {text}" if text else ""))


def _condition(pod: Json, type_: str) -> Json | None:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return dict(cond)
    return None


def _overdue(pod: Json, now: datetime) -> bool:
    """Whether a pod being deleted is past its grace period plus :data:`KUBELET_SLACK`."""
    deadline = parse_time((pod.get("metadata") or {}).get("deletionTimestamp"))
    return deadline is not None and now > deadline + KUBELET_SLACK


def out_of_service_taint(node: str) -> str:
    """The command that tells Kubernetes a node is down for good (its pods then go)."""
    return f"kubectl taint node {node} {OUT_OF_SERVICE_TAINT}"


def pod_disruption(pods: Sequence[Json], now: datetime) -> tuple[str, str] | None:
    """``(reason, message)`` of a runner pod that its node or an eviction is taking away.

    Read from the pod alone (no Node read, no Node watch): the node lifecycle
    controller marks the pods of a node that stopped reporting ``Ready=False``
    and leaves the reason as it was (a kubelet always gives one, e.g.
    ``ContainersNotReady``), so a runner reported running whose pod is not Ready
    without a reason is on a node that is not ready. Then:

    - being deleted (the taint manager's eviction, a drain, a delete) on such a
      node, or evicted by the taint manager (``DisruptionTarget``
      ``DeletionByTaintManager``: how the pods of an ``unreachable`` node go,
      the only sign left when the pod was not Ready yet) and past its grace
      period plus :data:`KUBELET_SLACK` with the runner not reported ended (no
      kubelet confirms the deletion): ``NodeLost``. The pod stays Terminating
      until the node comes back or is tainted out of service, and the Job
      makes no replacement meanwhile; the message names the node and the taint.
      A pod merely slow to terminate, on a node whose kubelet reports (Ready,
      or not Ready with the kubelet's reason) and without the taint manager's
      eviction, is not ``NodeLost``, however long it takes: the kubelet is
      there to finish it, and the taint would be bad advice;
    - not being deleted: ``NodeNotReady`` (the node may come back; its pods
      are evicted after their toleration, 300 s by default);
    - a ``DisruptionTarget`` condition otherwise: its reason
      (``EvictionByEvictionAPI``, ``PreemptionByScheduler``,
      ``DeletionByTaintManager``, ``TerminationByKubelet``...).
    """
    for pod in pods:
        if _terminated(pod) is not None:
            continue
        name = (pod.get("metadata") or {}).get("name") or "?"
        node = (pod.get("spec") or {}).get("nodeName") or ""
        deleting = bool((pod.get("metadata") or {}).get("deletionTimestamp"))
        ready = _condition(pod, "Ready") or {}
        running = "running" in (_runner_state(pod) or {})
        node_not_ready = running and ready.get("status") == "False" and not ready.get("reason")
        disruption = _condition(pod, DISRUPTION_TARGET)
        if disruption is not None and disruption.get("status") != "True":
            disruption = None
        why = ""
        if disruption is not None:
            why = f" ({disruption.get('reason') or DISRUPTION_TARGET}: "
            why += f"{disruption.get('message') or 'disrupted'})"
        taint_evicted = (disruption or {}).get("reason") == REASON_TAINT_MANAGER
        if node and deleting and (node_not_ready or (taint_evicted and _overdue(pod, now))):
            return REASON_NODE_LOST, one_line(
                f"runner pod {name} is being deleted{why} on node {node}, which does not "
                "answer: the pod stays Terminating and the Job starts no other until the "
                "node comes back or, once it is known to be down, is marked out of service: "
                f"{out_of_service_taint(node)}"
            )
        if node and node_not_ready and not deleting:
            return REASON_NODE_NOT_READY, one_line(
                f"node {node} of runner pod {name} is not ready (its kubelet stopped "
                "reporting); if it does not come back, its pods are evicted after their "
                "toleration (300 s by default)"
            )
        if disruption is not None:
            reason = str(disruption.get("reason") or DISRUPTION_TARGET)
            where = f" on node {node}" if node else ""
            return reason, one_line(
                f"runner pod {name}{where} is being taken away: "
                f"{disruption.get('message') or reason}; the Job starts another when it ends"
            )
    return None


def runner_result(pods: Sequence[Json]) -> RunResult | None:
    """The result the runner reported; shards of an Indexed Job are added up."""
    parts = []
    for pod in pods:
        term = _terminated(pod)
        if not term or term.get("exitCode") != 0:
            continue
        part = parse_success(term.get("message") or "")
        if part is not None:
            parts.append(part)
    return total(parts)


def _ended(job: Json, kind: str) -> int:
    """The pods of ``job`` that ended ``kind`` (failed, succeeded): counted or not yet.

    The Job controller first lists a pod that ended in
    ``uncountedTerminatedPods`` and adds it to the counter in a later update;
    ``Complete`` may come before that.
    """
    job_status = job.get("status") or {}
    uncounted = (job_status.get("uncountedTerminatedPods") or {}).get(kind) or []
    return int(job_status.get(kind) or 0) + len(uncounted)


def attempts(job: Json) -> int:
    """The runner pods ``job`` ran to an end (failed or succeeded).

    The Job counts every pod that ended, but one a ``podFailurePolicy`` rule
    ignores (the controller renders that rule only for keyed output, where an
    attempt that starts again is harmless).
    """
    return _ended(job, "failed") + _ended(job, "succeeded")


def outcome(result: RunResult, job: Json) -> RunOutcome:
    """The run's ``status.result``: the runner's ``result`` and the attempts of ``job``."""
    return RunOutcome(
        rows=result.rows,
        predictions=result.predictions,
        duration_seconds=result.duration_seconds,
        resumed_rows=result.resumed_rows,
        pages=result.pages,
        chunks=result.chunks,
        duplicates=result.duplicates,
        attempts=attempts(job) or None,
    )


def _succeeded(job: Json) -> bool:
    return job_outcome(job) == "Succeeded"


def duplicate_output_warning(
    run: InferenceRun,
    contract: Json | None,
    job: Json | None,
    executions: Sequence[Json] = (),
) -> tuple[str, str] | None:
    """``(reason, message)`` when the run's output may hold rows twice, else None.

    That is: the run (a scheduled run: its newest execution that succeeded)
    succeeded after failed attempts, and its output is not keyed (no ``paging``
    on ``contract``'s input, no postgres output): each attempt started again from row 0, and rows a
    failed attempt stored are stored again. A one-shot run whose Job is gone
    since it succeeded is told from the ``attempts`` its status recorded.
    """
    if contract is None or keyed_output(contract.get("input"), contract.get("output")):
        return None
    if run.spec.scheduled:
        done = [j for j in executions if _succeeded(j)]
        job = max(done, key=_created, default=None)
    shards = run.spec.parallelism
    if job is not None:
        if not _succeeded(job):
            return None
        failed = _ended(job, "failed")
    elif not run.spec.scheduled and run.status.phase == "Succeeded" and run.status.result:
        failed = (run.status.result.attempts or 0) - shards
    else:
        return None
    if failed <= 0:
        return None
    if shards > 1:
        which = f"{failed} failed attempt{'s' if failed > 1 else ''} of its {shards} shards"
        again = "the shard's retry restarted from its row 0"
    else:
        which = f"attempt{'s' if failed > 1 else ''} " + (
            "2" if failed == 1 else f"2 to {failed + 1}"
        )
        again = "restarted from row 0"
    where = f" ({job['metadata']['name']})" if run.spec.scheduled and job is not None else ""
    return REASON_DUPLICATES, one_line(
        f"output may hold rows twice: {which} {again}{where}; the output is not keyed. "
        "Keyed output (paging on the input) stores each row once; "
        "unkeyedOutputRetries: Never on the config fails the run instead of retrying"
    )


def _created(job: Json) -> tuple[str, str]:
    return (job["metadata"].get("creationTimestamp") or "", job["metadata"]["name"])


def queue_of(job: Json) -> str | None:
    """The Kueue LocalQueue a Job is in (its ``kueue.x-k8s.io/queue-name`` label), or None."""
    queue = ((job.get("metadata") or {}).get("labels") or {}).get(KUEUE_QUEUE_LABEL)
    return str(queue) if queue else None


def _job_outcome(
    job: Json,
    pods: Sequence[Json],
    job_events: Sequence[tuple[str, str]] = (),
    *,
    now: datetime,
    suspend_asked: bool = False,
    pending_cause: tuple[str, str] | None = None,
) -> tuple[Phase, str, str]:
    """``(phase, reason, message)`` of one Job, from its conditions and pods.

    ``suspend_asked``: the run asks for its Job to be suspended. A suspended
    Job in a Kueue queue that the run did not suspend is waiting for Kueue.
    ``pending_cause``: why the run was Pending when last looked at (a deadline
    that ends it keeps the cause, as the Job deletes the pod that said it).
    """
    ended = finished_condition(job)
    if ended is not None and ended.get("type") in JOB_FAILED:
        job_reason = ended.get("reason") or "JobFailed"
        job_message = ended.get("message") or ""
        cut = pod_start_failed(job)
        if cut is not None and job_reason == "DeadlineExceeded":
            # The controller ended the Job: its pod could not start in time.
            return "Failed", cut[0], one_line(cut[1])
        failure = runner_failure(pods)
        if job_reason == "DeadlineExceeded" or failure is None:
            message = job_message
            if failure is not None:
                message = f"{job_message}; last runner: {failure[1]}".strip("; ")
            else:
                stuck = pod_waiting(pods) or pod_disruption(pods, now) or pending_cause
                if stuck is not None:
                    message = f"{job_message}; it was pending: {stuck[0]}: {stuck[1]}"
            return "Failed", job_reason, one_line(message.strip("; "))
        return "Failed", failure[0], failure[1]
    if ended is not None:
        return "Succeeded", "Completed", ""
    if "Suspended" in _conditions_of(job) or (job.get("spec") or {}).get("suspend"):
        queue = queue_of(job)
        if queue is not None and not suspend_asked:
            return "Pending", REASON_QUEUED, f"waiting for Kueue to admit it to queue {queue}"
        return "Suspended", "Suspended", "the Job is suspended"
    running = any("running" in (_runner_state(p) or {}) for p in pods)
    disrupted = pod_disruption(pods, now)
    if disrupted is not None:
        # Under way, but a runner is going or gone with its node: not Ready, and why.
        return ("Running" if running else "Pending"), disrupted[0], disrupted[1]
    # A runner that exited 0 before the Job says Complete (the Job controller
    # batches pod updates for up to a second), or one shard of several that is
    # done: the run is under way, not back to Pending.
    succeeded = any((_terminated(p) or {}).get("exitCode") == 0 for p in pods)
    if running or succeeded:
        return "Running", "Running", ""
    retrying = runner_failure(pods)
    if retrying is not None:
        if job_will_fail(job, pods):
            # The Job controller has yet to say it (it batches pod updates), but
            # no attempt follows: a failure its podFailurePolicy ends the Job on
            # (the runner's exit codes that retrying cannot help), or the last
            # retry spent. Never "Retrying" before "Failed".
            return "Failed", retrying[0], retrying[1]
        # A pod failed and the Job will try again: the run is under way (no
        # Running -> Pending -> Running flap between attempts); say why.
        return "Running", "Retrying", retrying[1]
    stuck = pod_waiting(pods) or (job_events[0] if job_events else None)
    if stuck is not None:
        return "Pending", stuck[0], stuck[1]
    return "Pending", "Pending", ""


# The Job API's default backoffLimit.
DEFAULT_BACKOFF_LIMIT = 6


def _matches(rule: Json, pod: Json) -> bool:
    """Whether one ``podFailurePolicy`` rule matches a failed pod, as the Job controller reads it.

    ``onExitCodes``: a container (``containerName``'s, else any) that ended with
    a non-zero code ``In`` (or ``NotIn``) the values; ``onPodConditions``: a pod
    condition of that type with that status (``True`` when unset).
    """
    codes = rule.get("onExitCodes")
    if codes:
        name, values = codes.get("containerName"), set(codes.get("values") or [])
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            if name and status.get("name") != name:
                continue
            code = ((status.get("state") or {}).get("terminated") or {}).get("exitCode")
            if not code:
                continue
            if (code in values) == (codes.get("operator") == "In"):
                return True
        return False
    for wanted in rule.get("onPodConditions") or []:
        found = _condition(pod, str(wanted.get("type")))
        if found is not None and found.get("status") == (wanted.get("status") or "True"):
            return True
    return False


def _policy_action(job: Json, pod: Json) -> str | None:
    """The action of the first rule of ``job``'s podFailurePolicy that matches ``pod``."""
    policy = (job.get("spec") or {}).get("podFailurePolicy") or {}
    for rule in policy.get("rules") or []:
        if _matches(rule, pod):
            return str(rule.get("action"))
    return None


def job_will_fail(job: Json, pods: Sequence[Json]) -> bool:
    """Whether the Job fails for a pod that failed, before its controller says so.

    The Job controller batches pod updates (up to a second) before it sets
    ``FailureTarget``/``Failed``; meanwhile the failed pod is already seen. The
    Job fails when a failed pod matches a ``FailJob`` rule of its
    ``podFailurePolicy`` (the runner's permanent exit codes), or when its
    failed pods (those no ``Ignore`` rule matches) exceed ``backoffLimit``.
    Failures are never over-counted: when in doubt, the Job retries.
    """
    failed = [p for p in pods if (p.get("status") or {}).get("phase") == "Failed"]
    counted = 0
    for pod in failed:
        action = _policy_action(job, pod)
        if action == "FailJob":
            return True
        if action != "Ignore":
            counted += 1
    spec = job.get("spec") or {}
    if spec.get("backoffLimitPerIndex") is not None:
        return False  # per index: the index fails, not necessarily the Job
    limit = spec.get("backoffLimit")
    limit = DEFAULT_BACKOFF_LIMIT if limit is None else int(limit)
    return max(counted, _ended(job, "failed")) > limit


# Waiting reasons that are a normal step of a pod's start, not a problem.
_STARTING = frozenset({"ContainerCreating", "PodInitializing"})
# Waiting reasons of a container that does not start by itself: its image cannot
# be pulled, or what it is made from (a Secret, a ConfigMap key) is missing.
CANNOT_START = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CreateContainerConfigError",
    }
)


REASON_UNSCHEDULABLE = "Unschedulable"


def pod_start_failure(
    pods: Sequence[Json], now: datetime, timeout: float
) -> tuple[str, str, str] | None:
    """``(pod, reason, message)`` of a runner pod not started ``timeout`` s after its creation.

    Only a pod that waits for what does not come by itself counts: a container
    waiting for a :data:`CANNOT_START` reason (an image that cannot be pulled,
    a missing Secret or ConfigMap key), or a pod the scheduler finds no node
    for (``Unschedulable``). A pod pulling a large image (``ContainerCreating``)
    is on its way, however long it takes.
    """
    for pod in pods:
        meta = pod.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            continue
        state = _runner_state(pod) or {}
        if "running" in state or "terminated" in state:
            continue
        created = parse_time(meta.get("creationTimestamp"))
        if created is None or now < created + timedelta(seconds=timeout):
            continue
        stuck = container_cannot_start([pod])
        scheduled = _condition(pod, "PodScheduled") or {}
        if (
            stuck is None
            and scheduled.get("status") == "False"
            and (scheduled.get("reason") or REASON_UNSCHEDULABLE) == REASON_UNSCHEDULABLE
        ):
            stuck = REASON_UNSCHEDULABLE, one_line(scheduled.get("message") or "no node fits")
        if stuck is not None:
            return str(meta.get("name") or "?"), stuck[0], stuck[1]
    return None


def pod_start_failed(job: Json) -> tuple[str, str] | None:
    """``(reason, message)`` the controller left on a Job it ended for a pod that cannot start."""
    value = ((job.get("metadata") or {}).get("annotations") or {}).get(POD_START_FAILED_ANNOTATION)
    if not value:
        return None
    reason, _, message = str(value).partition(": ")
    return reason, message or reason


def container_cannot_start(pods: Sequence[Json]) -> tuple[str, str] | None:
    """``(reason, message)`` of a container in ``pods`` waiting for a :data:`CANNOT_START` one."""
    for pod in pods:
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            waiting = (status.get("state") or {}).get("waiting") or {}
            reason = waiting.get("reason")
            if reason in CANNOT_START:
                return str(reason), one_line(waiting.get("message") or str(reason))
    return None


def pod_waiting(pods: Sequence[Json]) -> tuple[str, str] | None:
    """``(reason, message)`` of a runner pod that cannot start: image, config, scheduling."""
    for pod in pods:
        waiting = (_runner_state(pod) or {}).get("waiting") or {}
        reason = waiting.get("reason")
        if reason and reason not in _STARTING:
            return reason, one_line(waiting.get("message") or reason)
        for cond in (pod.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                reason = cond.get("reason") or "Unschedulable"
                return reason, one_line(cond.get("message") or reason)
    return None


def _reference(obj: Json) -> ObjectReference:
    meta = obj["metadata"]
    return ObjectReference(
        kind=obj.get("kind"),
        api_version=obj.get("apiVersion"),
        namespace=meta.get("namespace"),
        name=meta["name"],
        uid=meta.get("uid"),
    )


def _cond(
    conditions: list[Condition],
    type_: str,
    status: ConditionStatus,
    reason: str,
    message: str,
    observed: Observed,
) -> list[Condition]:
    new = Condition(
        type=type_,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=observed.now,
        observed_generation=observed.run.metadata.generation or None,
    )
    return set_condition(conditions, new)


def _drop(conditions: list[Condition], type_: str) -> list[Condition]:
    return [c for c in conditions if c.type != type_]


def derive_status(observed: Observed) -> InferenceRunStatus:
    """The status the run should have, given what the cluster shows."""
    run = observed.run
    old = run.status
    status = InferenceRunStatus(
        observed_generation=run.metadata.generation or None,
        conditions=list(old.conditions),
        contract=observed.contract if observed.contract is not None else old.contract,
        # Kept when the child is gone (deleted out of band, or finished and collected).
        job_status=old.job_status,
        start_time=old.start_time,
        completion_time=old.completion_time,
        last_schedule_time=old.last_schedule_time,
        progress=old.progress,
        result=old.result,
        last_execution=old.last_execution,
        recent_executions=old.recent_executions,
        next_schedule_time=old.next_schedule_time,
    )
    conditions = status.conditions

    if observed.warnings:
        reasons = ",".join(dict.fromkeys(r for r, _ in observed.warnings))
        text = "; ".join(m for _, m in observed.warnings)
        conditions = _cond(conditions, CONDITION_WARNING, "True", reasons, text, observed)
    else:
        conditions = _drop(conditions, CONDITION_WARNING)

    child = observed.cronjob if run.spec.scheduled else observed.job
    if child is not None:
        status.job_status = _reference(child)

    if observed.config_problem is not None and child is None:
        reason, message = observed.config_problem
        status.phase, status.reason, status.message = "Error", reason, message
        conditions = _cond(conditions, CONDITION_READY, "False", reason, message, observed)
        return _closed(status, conditions, observed)

    if run.spec.scheduled:
        _scheduled(status, observed)
    else:
        _one_shot(status, observed)

    if observed.config_problem is not None:
        reason, message = observed.config_problem
        conditions = _cond(conditions, CONDITION_READY, "False", reason, message, observed)
    elif child is None:
        conditions = _cond(
            conditions,
            CONDITION_READY,
            "False",
            "Creating",
            "creating the run's children",
            observed,
        )
    elif status.phase == "Failed":
        conditions = _cond(
            conditions, CONDITION_READY, "False", status.reason or "Failed", "", observed
        )
    elif not run.spec.scheduled:
        # A one-shot run is Ready once it has done what it was made for, as
        # kstatus reads Ready (Flux: "the desired state is reached"): a Job that
        # exists, or a runner that runs, is not that yet.
        done = status.phase == "Succeeded"
        conditions = _cond(
            conditions,
            CONDITION_READY,
            "True" if done else "False",
            "Completed" if done else (status.reason or status.phase or "Pending"),
            "" if done else (status.message or NOT_READY_YET),
            observed,
        )
    elif (status.phase == "Pending" and status.reason not in (None, "Pending", "Creating")) or (
        status.phase == "Running" and status.reason not in (None, "Running", "Retrying")
    ):
        # A pod that cannot start (ErrImagePull, FailedCreate, Unschedulable) or
        # one its node or an eviction takes away (NodeLost...): not Ready, with
        # the reason; still Reconciling, as it may resolve.
        conditions = _cond(
            conditions,
            CONDITION_READY,
            "False",
            status.reason or "Pending",
            status.message or "",
            observed,
        )
    else:
        conditions = _cond(conditions, CONDITION_READY, "True", "Available", "", observed)

    return _closed(status, conditions, observed)


def _closed(
    status: InferenceRunStatus, conditions: list[Condition], observed: Observed
) -> InferenceRunStatus:
    """``status`` with ``conditions`` and the outcome and kstatus conditions that follow."""
    run = observed.run
    status.conditions = run_conditions(
        conditions,
        status,
        observed.now,
        run.metadata.generation or None,
        scheduled=run.spec.scheduled,
    )
    return status


# The message of a one-shot run's Ready=False while it is on its way.
NOT_READY_YET = "the run is under way: Ready once it has succeeded"


def outcome_conditions(
    conditions: list[Condition],
    status: InferenceRunStatus,
    now: datetime,
    generation: int | None,
    *,
    scheduled: bool,
) -> list[Condition]:
    """``Complete`` and ``Failed`` of a one-shot run, as on a Job; none on a scheduled run.

    Each is True only for its outcome (``Succeeded``, ``Failed``), and both are
    there, False, in every other phase, ``Error`` included whatever its cause:
    an Error run has not run and starts by itself once its cause is fixed, so
    a terminal condition would be wrong. What stopped moving, either way, is
    ``Reconciling=False`` (:func:`kstatus_conditions`).
    """
    if scheduled:
        return [c for c in conditions if c.type not in (CONDITION_COMPLETE, CONDITION_FAILED)]
    done, failed = status.phase == "Succeeded", status.phase == "Failed"
    why = status.reason or status.phase or "Pending"
    for type_, on, reason, message in (
        (CONDITION_COMPLETE, done, "Completed" if done else why, ""),
        (
            CONDITION_FAILED,
            failed,
            why if failed else "NotFailed",
            (status.message or "") if failed else "",
        ),
    ):
        conditions = set_condition(
            conditions, condition(type_, on, reason, message, now, generation)
        )
    return conditions


def run_conditions(
    conditions: list[Condition],
    status: InferenceRunStatus,
    now: datetime,
    generation: int | None,
    *,
    scheduled: bool,
) -> list[Condition]:
    """``conditions`` with ``Complete``/``Failed`` and ``Reconciling``/``Stalled`` of ``status``."""
    conditions = outcome_conditions(conditions, status, now, generation, scheduled=scheduled)
    return kstatus_conditions(conditions, status, now, generation)


# Phases in which a one-shot run is still on its way (kstatus: InProgress).
_UNDER_WAY = ("Pending", "Running")
# Phases that need someone to act (kstatus: Failed).
_STALLED = ("Error", "Failed")


def kstatus_conditions(
    conditions: list[Condition],
    status: InferenceRunStatus,
    now: datetime,
    generation: int | None,
) -> list[Condition]:
    """``Reconciling`` and ``Stalled`` as kstatus (Flux, kpt, cli-utils) reads them.

    kstatus calls a resource InProgress while ``Reconciling`` is True or
    ``observedGeneration`` lags, Failed while ``Stalled`` is True, else
    Current. A one-shot run is Reconciling while Pending or Running; a
    scheduled run is Current once its CronJob exists (its executions come and
    go); an Error or Failed run is Stalled until an edit or a new run.
    """
    phase = status.phase
    reconciling = phase in _UNDER_WAY and (status.last_execution is None or phase == "Pending")
    stalled = phase in _STALLED
    reason = status.reason or phase or "Unknown"
    message = status.message or ""
    for type_, on in ((CONDITION_RECONCILING, reconciling), (CONDITION_STALLED, stalled)):
        why = reason if on else ("Stalled" if stalled else "Reconciled")
        new = condition(type_, on, why, message if on else "", now, generation)
        conditions = set_condition(conditions, new)
    return conditions


# Pending reasons that say nothing of why: not kept as a cause.
_NO_CAUSE = (None, "Pending", "Creating", REASON_QUEUED)


def _one_shot(status: InferenceRunStatus, observed: Observed) -> None:
    job, old = observed.job, observed.run.status
    if job is None:
        if old.phase in ("Succeeded", "Failed"):
            # Finished, and the Job is gone since: the outcome stands.
            status.phase, status.reason, status.message = old.phase, old.reason, old.message
        else:
            status.phase, status.reason, status.message = "Pending", "Creating", None
        return
    pending_cause = None
    if old.phase == "Pending" and old.reason not in _NO_CAUSE:
        pending_cause = (old.reason or "Pending", old.message or old.reason or "")
    phase, reason, message = _job_outcome(
        job,
        observed.pods,
        observed.job_events,
        now=observed.now,
        suspend_asked=observed.run.spec.suspend,
        pending_cause=pending_cause,
    )
    if phase == old.phase and phase in ("Succeeded", "Failed"):
        # A finished run's outcome stands. The Job is seen again as it settles
        # (FailureTarget, then Failed once its pods are gone), and with the pod
        # that told why gone, it says less: the words written first are kept.
        reason, message = old.reason or reason, old.message or message
    elif phase == "Pending" and reason in _NO_CAUSE and pending_cause is not None:
        # Nothing says why now, but something did: the pod that said it is gone
        # (the Job controller deletes it when the deadline passes, and the pod's
        # deletion may reach this cache before the Job's Failed condition) or
        # between two pulls. The last cause stands until the run moves on, so a
        # deadline that ends the run can still tell it.
        reason, message = pending_cause
    status.phase, status.reason, status.message = phase, reason, message or None
    job_status = job.get("status") or {}
    if phase != "Pending":
        # The Job controller stamps startTime before any pod runs; taking it only
        # once the run leaves Pending saves a status write per run.
        status.start_time = parse_time(job_status.get("startTime")) or status.start_time
    if phase == "Succeeded":
        status.completion_time = parse_time(job_status.get("completionTime")) or observed.now
        result = runner_result(observed.pods)
        if result is not None:
            status.result = outcome(result, job)
            status.progress = Progress(rows_done=result.rows, rows_total=result.rows)
    elif phase == "Failed":
        failed = finished_condition(job) or {}
        status.completion_time = (
            parse_time(failed.get("lastTransitionTime")) or status.completion_time or observed.now
        )
    elif phase == "Running" and observed.progress is not None:
        status.progress = observed.progress


# How many of a scheduled run's newest executions its status lists.
RECENT_EXECUTIONS = 5


def _execution(job: Json, all_pods: Sequence[Json], now: datetime) -> tuple[Execution, list[Json]]:
    """One execution of a scheduled run (a Job its CronJob started) and its pods."""
    pods = [
        p
        for p in all_pods
        if (p["metadata"].get("labels") or {}).get("job-name") == job["metadata"]["name"]
    ]
    phase, reason, message = _job_outcome(job, pods, now=now)
    if phase == "Suspended":
        phase = "Pending"
    job_status = job.get("status") or {}
    completion = None
    if phase in ("Succeeded", "Failed"):
        completion = parse_time(job_status.get("completionTime"))
        ended = finished_condition(job)
        if completion is None and ended is not None and ended.get("type") in JOB_FAILED:
            completion = parse_time(ended.get("lastTransitionTime"))
    execution = Execution(
        name=job["metadata"]["name"],
        phase=phase,  # type: ignore[arg-type]
        # A running execution has a reason only when its node or an eviction takes
        # its runner away (NodeLost...).
        reason=None if phase == "Succeeded" or reason in ("Running", "Retrying") else reason,
        message=message or None,
        start_time=parse_time(job_status.get("startTime")),
        completion_time=completion,
    )
    return execution, pods


def _scheduled(status: InferenceRunStatus, observed: Observed) -> None:
    cron = observed.cronjob
    run = observed.run
    if cron is None:
        status.phase, status.reason, status.message = "Pending", "Creating", None
        return
    cron_status = cron.get("status") or {}
    status.last_schedule_time = (
        parse_time(cron_status.get("lastScheduleTime")) or status.last_schedule_time
    )
    assert run.spec.schedule is not None
    status.next_schedule_time = (
        None
        if run.spec.suspend
        else next_schedule_time(run.spec.schedule, run.spec.time_zone, observed.now)
    )
    if observed.executions:
        newest_first = sorted(observed.executions, key=_created, reverse=True)
        recent = [
            _execution(job, observed.pods, observed.now) for job in newest_first[:RECENT_EXECUTIONS]
        ]
        status.recent_executions = [execution for execution, _ in recent]
        status.last_execution, pods = recent[0]
        phase = status.last_execution.phase
        if phase == "Succeeded":
            result = runner_result(pods)
            if result is not None:
                status.result = outcome(result, newest_first[0])
        if phase == "Running" and observed.progress is not None:
            status.progress = observed.progress
    active = {ref.get("name") for ref in cron_status.get("active") or []}
    queued = (
        {e.name for e in status.recent_executions or [] if e.reason == REASON_QUEUED}
        if observed.executions
        else set()
    )
    if run.spec.suspend:
        status.phase, status.reason, status.message = "Suspended", "Suspended", None
    elif active and active <= queued:
        # Every execution under way waits for Kueue: nothing runs.
        waiting = next(e for e in status.recent_executions or [] if e.name in active)
        status.phase, status.reason, status.message = "Scheduled", REASON_QUEUED, waiting.message
    elif active:
        status.phase, status.reason, status.message = "Running", "Running", None
    else:
        status.phase, status.reason, status.message = "Scheduled", "Scheduled", None
