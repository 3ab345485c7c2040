"""Status derivation: every Job condition, runner termination messages, scheduled runs."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from controller.api import InferenceRun, InferenceRunStatus, Progress
from controller.plan import phase_events
from controller.status import (
    Observed,
    derive_status,
    duplicate_output_warning,
    runner_failure,
    runner_result,
)
from tests.unit.helpers import make_run

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


# The run these tests derive from: generation 3, a 60 s timeout, uid ``u-1``.
RUN: dict[str, Any] = {"uid": "u-1", "generation": 3, "timeoutSeconds": 60}


def job(*conditions: tuple[str, str, str], suspend: bool = False, **status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "inf-r-u1000000", "namespace": "ns", "uid": "job-uid"},
        "spec": {"suspend": suspend},
        "status": {
            "conditions": [
                {
                    "type": t,
                    "status": s,
                    "reason": reason,
                    "message": f"{reason} message",
                    "lastTransitionTime": "2026-11-22T11:59:00Z",
                }
                for t, s, reason in conditions
            ],
            **status,
        },
    }


def pod(state: dict[str, Any], job_name: str = "inf-r-u1000000") -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "labels": {"job-name": job_name}},
        "status": {"containerStatuses": [{"name": "inference", "state": state}]},
    }


def terminated(
    code: int, message: str = "", finished: str = "2026-11-22T11:58:00Z"
) -> dict[str, Any]:
    return {"terminated": {"exitCode": code, "message": message, "finishedAt": finished}}


def cond(status: Any, type_: str) -> Any:
    return next(c for c in status.conditions if c.type == type_)


def derive(**kwargs: Any) -> Any:
    run = kwargs.pop("run", None) or make_run(**RUN)
    return derive_status(Observed(run=run, now=NOW, **kwargs))


@pytest.mark.parametrize(
    ("conditions", "phase", "reason"),
    [
        ((), "Pending", "Pending"),
        ((("Complete", "True", "CompletionsReached"),), "Succeeded", "Completed"),
        ((("SuccessCriteriaMet", "True", "CompletionsReached"),), "Succeeded", "Completed"),
        (
            (
                ("SuccessCriteriaMet", "True", "CompletionsReached"),
                ("Complete", "True", "CompletionsReached"),
            ),
            "Succeeded",
            "Completed",
        ),
        ((("Failed", "True", "BackoffLimitExceeded"),), "Failed", "BackoffLimitExceeded"),
        ((("FailureTarget", "True", "BackoffLimitExceeded"),), "Failed", "BackoffLimitExceeded"),
        ((("Failed", "True", "DeadlineExceeded"),), "Failed", "DeadlineExceeded"),
        ((("Failed", "True", "PodFailurePolicy"),), "Failed", "PodFailurePolicy"),
        ((("Suspended", "True", "JobSuspended"),), "Suspended", "Suspended"),
        # Conditions that are False say nothing.
        ((("Failed", "False", "X"), ("Complete", "False", "Y")), "Pending", "Pending"),
        ((("Suspended", "False", "JobResumed"),), "Pending", "Pending"),
    ],
)
def test_one_shot_phase_from_job_conditions(
    conditions: tuple[tuple[str, str, str], ...], phase: str, reason: str
) -> None:
    status = derive(job=job(*conditions))
    assert status.phase == phase
    assert status.reason == reason
    assert cond(status, "Complete").status == ("True" if phase == "Succeeded" else "False")
    assert cond(status, "Failed").status == ("True" if phase == "Failed" else "False")
    # A one-shot run is Ready once it has succeeded, not while on its way.
    assert cond(status, "Ready").status == ("True" if phase == "Succeeded" else "False")
    assert cond(status, "Stalled").status == ("True" if phase == "Failed" else "False")
    assert cond(status, "Reconciling").status == ("True" if phase == "Pending" else "False")
    assert status.job_status.name == "inf-r-u1000000"
    assert status.job_status.kind == "Job"
    assert status.observed_generation == 3


def test_running_pod_makes_the_run_running_and_shows_progress() -> None:
    status = derive(
        job=job(startTime="2026-11-22T11:50:00Z", active=1),
        pods=[pod({"running": {"startedAt": "x"}})],
        progress=Progress(rows_done=5, rows_total=10),
    )
    assert status.phase == "Running"
    assert status.progress.summary == "5/10 (50%)"
    assert status.start_time == datetime(2026, 11, 22, 11, 50, tzinfo=UTC)


def test_failed_job_reports_the_runner_exit_reason_and_message() -> None:
    status = derive(
        job=job(("Failed", "True", "BackoffLimitExceeded")),
        pods=[
            pod(terminated(4, "model answered 400: bad shape", "2026-11-22T11:57:00Z")),
            pod(terminated(3, "input: storage down", "2026-11-22T11:58:00Z")),
        ],
    )
    assert status.phase == "Failed"
    assert status.reason == "InputFailed"  # the newest pod
    assert status.message == "runner exited with code 3: input: storage down"
    assert cond(status, "Failed").reason == "InputFailed"
    assert cond(status, "Complete").status == "False"
    assert status.completion_time == datetime(2026, 11, 22, 11, 59, tzinfo=UTC)


def test_deadline_exceeded_wins_over_the_runner_reason() -> None:
    status = derive(
        job=job(("Failed", "True", "DeadlineExceeded")),
        pods=[pod(terminated(143, "terminated by SIGTERM"))],
    )
    assert status.reason == "DeadlineExceeded"
    assert "DeadlineExceeded message" in status.message
    assert "runner exited with code 143" in status.message


def test_pod_failure_policy_on_bad_contract_names_the_contract() -> None:
    status = derive(
        job=job(("Failed", "True", "PodFailurePolicy")),
        pods=[pod(terminated(2, "contract: jobId missing"))],
    )
    assert status.reason == "InvalidContract"
    assert status.message == "runner exited with code 2: contract: jobId missing"


def test_failed_pod_before_retry_keeps_the_run_running_with_the_reason() -> None:
    status = derive(job=job(failed=1), pods=[pod(terminated(5, "output: 200 with error"))])
    assert status.phase == "Running"
    assert status.reason == "Retrying"
    assert "output: 200 with error" in status.message


PERMANENT_RULE = {
    "action": "FailJob",
    "onExitCodes": {"containerName": "inference", "operator": "In", "values": [2, 6, 7, 8, 9]},
}
IGNORE_DISRUPTION = {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}


def failed_pod(code: int, message: str = "", **extra: Any) -> dict[str, Any]:
    failed = pod(terminated(code, message))
    failed["status"]["phase"] = "Failed"
    failed["status"].update(extra)
    return failed


def policy_job(backoff: int | None = 3, **status: Any) -> dict[str, Any]:
    made = job(**status)
    made["spec"]["podFailurePolicy"] = {"rules": [PERMANENT_RULE, IGNORE_DISRUPTION]}
    if backoff is not None:
        made["spec"]["backoffLimit"] = backoff
    return made


def test_a_failure_the_job_fails_on_is_failed_before_the_job_says_so() -> None:
    # Exit 7: the podFailurePolicy fails the Job; its controller has not said it yet.
    status = derive(job=policy_job(active=1), pods=[failed_pod(7, "inference: model answered 422")])
    assert (status.phase, status.reason) == ("Failed", "InferenceRejected")
    assert "422" in status.message
    assert cond(status, "Failed").status == "True"
    # Then the Job says it: the same words, so no second Event.
    later = derive(
        job=policy_job(("Failed", "True", "PodFailurePolicy"), failed=1),
        pods=[failed_pod(7, "inference: model answered 422")],
    )
    assert (later.phase, later.reason, later.message) == (
        status.phase,
        status.reason,
        status.message,
    )
    old = InferenceRunStatus(phase="Running", reason="Running")
    assert [(e.type, e.reason) for e in phase_events(old, status, [])] == [
        ("Warning", "InferenceRejected")
    ]
    assert phase_events(status, later, []) == []


@pytest.mark.parametrize(
    ("backoff", "counted", "pods", "phase"),
    [
        # The last retry spent: fails (backoffLimit 0, the first failure).
        (0, 0, [failed_pod(4)], "Failed"),
        (1, 2, [failed_pod(4)], "Failed"),  # the Job counted earlier ones
        (1, 1, [failed_pod(4)], "Running"),  # the one counted may be this one
        (1, 0, [failed_pod(4), failed_pod(4)], "Failed"),
        # Retries left: Retrying.
        (1, 0, [failed_pod(4)], "Running"),
        (None, 5, [failed_pod(4)], "Running"),  # the API's default backoffLimit is 6
        (None, 0, [failed_pod(4)] * 7, "Failed"),
        # An evicted pod the policy ignores costs no retry.
        (0, 0, [failed_pod(4, conditions=[{"type": "DisruptionTarget", "status": "True"}])],
         "Running"),
        # Exit 7 matches FailJob whatever the retries left.
        (6, 0, [failed_pod(7)], "Failed"),
        # A container that is not the runner's does not match the rule.
        (6, 0, [{"metadata": {"name": "p"}, "status": {"phase": "Failed", "containerStatuses": [
            {"name": "inference", "state": terminated(4)},
            {"name": "sidecar", "state": terminated(7)},
        ]}}], "Running"),
    ],
)  # fmt: skip
def test_a_failed_pod_fails_the_run_only_when_the_job_fails_for_it(
    backoff: int | None, counted: int, pods: list[dict[str, Any]], phase: str
) -> None:
    status = derive(job=policy_job(backoff, active=0, failed=counted), pods=pods)
    assert status.phase == phase
    why = runner_failure(pods)
    assert why is not None
    assert status.reason == ("Retrying" if phase == "Running" else why[0])
    assert status.message == why[1]


def test_success_reads_the_runner_result() -> None:
    message = '{"rows":150,"predictions":150,"durationSeconds":1.5}'
    status = derive(
        job=job(("Complete", "True", "X"), completionTime="2026-11-22T11:59:30Z"),
        pods=[pod(terminated(0, message))],
    )
    assert status.result.rows == 150
    assert status.result.predictions == 150
    assert status.progress.summary == "150/150 (100%)"
    assert status.completion_time == datetime(2026, 11, 22, 11, 59, 30, tzinfo=UTC)


def test_runner_result_adds_up_shards_and_ignores_garbage() -> None:
    pods = [
        pod(terminated(0, '{"rows":10,"predictions":10,"durationSeconds":2}')),
        pod(terminated(0, '{"rows":5,"predictions":5,"durationSeconds":3}')),
        pod(terminated(0, "not json")),
        pod(terminated(1, '{"rows":99,"predictions":99,"durationSeconds":9}')),
    ]
    result = runner_result(pods)
    assert result is not None
    assert (result.rows, result.predictions, result.duration_seconds) == (15, 15, 3.0)
    assert runner_result([pod(terminated(0, ""))]) is None


def test_runner_result_carries_the_streaming_counts_summed_over_shards() -> None:
    streaming = '{"rows":10,"predictions":9,"durationSeconds":2,"resumedRows":%d,'
    streaming += '"pages":2,"chunks":1,"duplicates":%d}'
    pods = [pod(terminated(0, streaming % (4, 1))), pod(terminated(0, streaming % (0, 0)))]
    result = runner_result(pods)
    assert result is not None
    assert (result.rows, result.predictions, result.duration_seconds) == (20, 18, 2.0)
    assert (result.resumed_rows, result.pages, result.chunks, result.duplicates) == (4, 4, 2, 1)
    status = derive(job=job(("Complete", "True", "X")), pods=pods)
    assert status.to_api()["result"] == {
        "rows": 20,
        "predictions": 18,
        "durationSeconds": 2.0,
        "resumedRows": 4,
        "pages": 4,
        "chunks": 2,
        "duplicates": 1,
    }


def test_runner_failure_message_is_one_line_and_bounded() -> None:
    failure = runner_failure([pod(terminated(4, "line1\nline2\n" + "x" * 5000))])
    assert failure is not None
    reason, message = failure
    assert reason == "InferenceFailed"
    assert "\n" not in message
    assert len(message) <= 1024
    assert runner_failure([pod(terminated(0, "ok"))]) is None
    assert runner_failure([pod({"running": {}})]) is None
    assert runner_failure([pod(terminated(77, ""))]) == (
        "RunnerFailed",
        "runner exited with code 77",
    )


def test_missing_config_before_any_job_is_an_error_with_reason() -> None:
    status = derive(config_problem=("ConfigNotFound", "InferenceConfig ns/cfg not found"))
    assert status.phase == "Error"
    assert status.reason == "ConfigNotFound"
    ready = cond(status, "Ready")
    assert (ready.status, ready.reason) == ("False", "ConfigNotFound")


def test_missing_config_with_a_job_keeps_tracking_the_job() -> None:
    status = derive(config_problem=("ConfigNotFound", "gone"), job=job(("Complete", "True", "X")))
    assert status.phase == "Succeeded"
    assert cond(status, "Ready").reason == "ConfigNotFound"


def test_finished_run_keeps_its_outcome_when_the_job_is_gone() -> None:
    run = make_run(**RUN, status={"phase": "Succeeded", "reason": "Completed"})
    status = derive(run=run)
    assert status.phase == "Succeeded"
    fresh = derive(run=make_run(**RUN, status={"phase": "Running"}))
    assert (fresh.phase, fresh.reason) == ("Pending", "Creating")
    assert cond(fresh, "Ready").reason == "Creating"


def test_condition_transition_time_is_kept_while_status_is_unchanged() -> None:
    first = derive(job=job())
    run = make_run(**RUN, status=first.to_api())
    later = derive_status(
        Observed(run=run, now=datetime(2026, 11, 22, 13, 0, tzinfo=UTC), job=job())
    )
    assert later.to_api() == first.to_api()  # nothing to write


def test_warnings_become_a_condition_and_disappear_when_fixed() -> None:
    status = derive(job=job(), warnings=[("AutoDeleteIgnored", "does not apply")])
    warning = cond(status, "Warning")
    assert (warning.status, warning.reason) == ("True", "AutoDeleteIgnored")
    cleared = derive(run=make_run(**RUN, status=status.to_api()), job=job())
    assert all(c.type != "Warning" for c in cleared.conditions)


def cronjob(active: bool = False, last: str | None = "2026-11-22T11:59:00Z") -> dict[str, Any]:
    status: dict[str, Any] = {}
    if last:
        status["lastScheduleTime"] = last
    if active:
        status["active"] = [{"name": "inf-r-u1000000-29000"}]
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": "inf-r-u1000000", "namespace": "ns", "uid": "cj"},
        "status": status,
    }


def execution(name: str, created: str, *conditions: tuple[str, str, str]) -> dict[str, Any]:
    j = job(*conditions, startTime=created, completionTime="2026-11-22T11:59:40Z")
    j["metadata"] = {"name": name, "creationTimestamp": created}
    return j


def test_scheduled_run_reports_schedule_and_last_execution() -> None:
    run = make_run(**RUN, schedule="* * * * *")
    status = derive(
        run=run,
        cronjob=cronjob(),
        executions=[
            execution("a", "2026-11-22T11:58:00Z", ("Failed", "True", "BackoffLimitExceeded")),
            execution("b", "2026-11-22T11:59:00Z", ("Complete", "True", "X")),
        ],
        pods=[pod(terminated(0, '{"rows":3,"predictions":3,"durationSeconds":0.1}'), "b")],
    )
    assert status.phase == "Scheduled"
    assert status.last_schedule_time == datetime(2026, 11, 22, 11, 59, tzinfo=UTC)
    assert status.last_execution.name == "b"
    assert status.last_execution.phase == "Succeeded"
    assert status.result.rows == 3
    assert status.job_status.kind == "CronJob"
    assert {c.type for c in status.conditions} == {"Ready", "Reconciling", "Stalled"}


def test_scheduled_run_last_execution_failure_and_states() -> None:
    run = make_run(**RUN, schedule="@hourly")
    failed = derive(
        run=run,
        cronjob=cronjob(),
        executions=[
            execution("a", "2026-11-22T11:58:00Z", ("Failed", "True", "BackoffLimitExceeded"))
        ],
        pods=[pod(terminated(4, "model down"), "a")],
    )
    assert failed.last_execution.phase == "Failed"
    assert failed.last_execution.reason == "InferenceFailed"
    assert failed.phase == "Scheduled"
    assert derive(run=run, cronjob=cronjob(active=True)).phase == "Running"
    suspended = derive(run=make_run(**RUN, schedule="@hourly", suspend=True), cronjob=cronjob())
    assert suspended.phase == "Suspended"
    assert derive(run=run).phase == "Pending"


def test_start_time_is_taken_once_the_run_leaves_pending() -> None:
    pending = derive(job=job(startTime="2026-11-22T11:50:00Z"))
    assert pending.phase == "Pending"
    assert pending.start_time is None  # one status write fewer per run
    running = derive(
        job=job(startTime="2026-11-22T11:50:00Z"), pods=[pod({"running": {"startedAt": "x"}})]
    )
    assert running.start_time == datetime(2026, 11, 22, 11, 50, tzinfo=UTC)


def test_a_runner_done_before_the_job_says_complete_keeps_the_run_running() -> None:
    # The Job controller marks Complete about a second after the pod ends.
    status = derive(
        job=job(startTime="2026-11-22T11:50:00Z", active=0),
        pods=[pod(terminated(0, '{"rows":3,"predictions":3,"durationSeconds":0.1}'))],
    )
    assert status.phase == "Running"
    shard_done_other_pending = derive(
        job=job(active=1),
        pods=[pod(terminated(0, "")), pod({"waiting": {"reason": "ContainerCreating"}})],
    )
    assert shard_done_other_pending.phase == "Running"


@pytest.mark.parametrize(
    ("observed", "ready", "reconciling", "stalled"),
    [
        # kstatus: InProgress while Reconciling, Failed while Stalled, else Current.
        ({}, "False", "True", "False"),  # creating the children
        ({"job": job()}, "False", "True", "False"),  # Pending
        ({"job": job(), "pods": [pod({"running": {}})]}, "False", "True", "False"),
        ({"job": job(("Complete", "True", "X"))}, "True", "False", "False"),
        ({"job": job(("Failed", "True", "BackoffLimitExceeded"))}, "False", "False", "True"),
        ({"config_problem": ("ConfigNotFound", "no")}, "False", "False", "True"),
        ({"job": job(suspend=True)}, "False", "False", "False"),
    ],
)
def test_kstatus_conditions_of_a_one_shot_run(
    observed: dict[str, Any], ready: str, reconciling: str, stalled: str
) -> None:
    status = derive(**observed)
    assert cond(status, "Ready").status == ready
    assert cond(status, "Reconciling").status == reconciling
    assert cond(status, "Stalled").status == stalled
    assert cond(status, "Stalled").observed_generation == 3
    if stalled == "True":
        assert cond(status, "Stalled").reason == status.reason


@pytest.mark.parametrize(
    ("observed", "ready", "reason"),
    [
        ({}, "False", "Creating"),
        ({"job": job()}, "False", "Pending"),
        ({"job": job(), "pods": [pod({"running": {}})]}, "False", "Running"),
        (
            {"job": job(active=0, failed=1), "pods": [pod(terminated(4, "503"))]},
            "False",
            "Retrying",
        ),
        ({"job": job(("Complete", "True", "X"))}, "True", "Completed"),
        ({"job": job(("Failed", "True", "BackoffLimitExceeded"))}, "False", "BackoffLimitExceeded"),
        ({"job": job(suspend=True)}, "False", "Suspended"),
    ],
)
def test_a_one_shot_run_is_ready_once_it_has_succeeded(
    observed: dict[str, Any], ready: str, reason: str
) -> None:
    # kubectl wait --for=condition=Ready returns once the run is done, not while it runs.
    ready_cond = cond(derive(**observed), "Ready")
    assert (ready_cond.status, ready_cond.reason) == (ready, reason)
    if ready == "False" and reason in ("Pending", "Running", "Creating"):
        assert ready_cond.message


ERRORS = [
    # Before any child: the config is missing, unusable, out of reach; a refusal.
    {"config_problem": ("ConfigNotFound", "InferenceConfig ns/cfg not found")},
    {"config_problem": ("MissingModelUrl", "no model URL")},
    {"config_problem": ("JobRefused", "admission webhook denied the request")},
]


@pytest.mark.parametrize("observed", ERRORS, ids=lambda o: o["config_problem"][0])
@pytest.mark.parametrize("before", [None, "Pending", "Running"])
def test_an_error_run_has_complete_and_failed_false_whatever_its_cause(
    observed: dict[str, Any], before: str | None
) -> None:
    # The same conditions whether the run was first seen in Error or got there.
    old = None
    if before is not None:
        old = derive(job=job(), pods=[pod({"running": {}})] if before == "Running" else [])
        assert old.phase == before
    run = make_run(**RUN, status=old.to_api() if old is not None else None)
    status = derive(run=run, **observed)
    reason, message = observed["config_problem"]
    assert (status.phase, status.reason, status.message) == ("Error", reason, message)
    complete, failed = cond(status, "Complete"), cond(status, "Failed")
    assert (complete.status, complete.reason) == ("False", reason)
    assert (failed.status, failed.reason) == ("False", "NotFailed")
    assert (cond(status, "Stalled").status, cond(status, "Reconciling").status) == ("True", "False")
    assert cond(status, "Ready").status == "False"
    for c in status.conditions:
        assert c.observed_generation == 3


def test_a_scheduled_error_run_has_no_complete_or_failed() -> None:
    status = derive(run=make_run(**RUN, schedule="0 * * * *"), **ERRORS[0])
    assert status.phase == "Error"
    assert {c.type for c in status.conditions} == {"Ready", "Reconciling", "Stalled"}


def test_a_scheduled_run_with_a_running_execution_is_current_for_kstatus() -> None:
    cron = {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": "inf-r-u1000000", "namespace": "ns", "uid": "cron-uid"},
        "status": {"active": [{"name": "a"}]},
    }
    execution = job()
    execution["metadata"] = {**execution["metadata"], "name": "a"}
    status = derive(
        run=make_run(**RUN, schedule="@hourly"),
        cronjob=cron,
        executions=[execution],
        pods=[pod({"running": {}}, "a")],
    )
    assert status.phase == "Running"
    assert cond(status, "Reconciling").status == "False"
    assert cond(status, "Stalled").status == "False"


def test_a_scheduled_run_lists_its_newest_executions_and_its_next_tick() -> None:
    run = make_run(**RUN, schedule="0 * * * *")
    executions = [
        execution(f"e{i}", f"2026-11-22T0{i}:00:00Z", ("Complete", "True", "X")) for i in range(7)
    ]
    executions[6] = execution(
        "e6", "2026-11-22T06:00:00Z", ("Failed", "True", "BackoffLimitExceeded")
    )
    status = derive(run=run, cronjob=cronjob(), executions=executions)
    assert [e.name for e in status.recent_executions] == ["e6", "e5", "e4", "e3", "e2"]
    assert status.recent_executions[0].phase == "Failed"
    assert status.recent_executions[0].reason == "BackoffLimitExceeded"
    assert status.last_execution == status.recent_executions[0]
    # NOW is 12:00 UTC: the next "0 * * * *" is 13:00.
    assert status.next_schedule_time == datetime(2026, 11, 22, 13, 0, tzinfo=UTC)


def test_the_next_tick_follows_the_time_zone_and_stops_while_suspended() -> None:
    # 09:30 in Rome is 08:30 UTC on 22 November (CET, UTC+1).
    rome = make_run(**RUN, schedule="30 9 * * *")
    rome.spec.time_zone = "Europe/Rome"
    status = derive(run=rome, cronjob=cronjob())
    assert status.next_schedule_time == datetime(2026, 11, 23, 8, 30, tzinfo=UTC)
    suspended = derive(run=make_run(**RUN, schedule="30 9 * * *", suspend=True), cronjob=cronjob())
    assert suspended.next_schedule_time is None


def test_a_one_shot_run_has_no_schedule_fields() -> None:
    status = derive(job=job(("Complete", "True", "X")))
    api = status.to_api()
    assert "recentExecutions" not in api
    assert "nextScheduleTime" not in api


# ------------------------------------------------- lost nodes, evictions, OOM kills


def on_node(
    state: dict[str, Any],
    *conditions: dict[str, Any],
    node: str = "worker-3",
    deleting: str | None = None,
    memory: str | None = None,
) -> dict[str, Any]:
    """A runner pod bound to ``node``; ``deleting``: its deletionTimestamp."""
    p = pod(state)
    p["metadata"]["name"] = "inf-r-u1000000-abcde"
    if deleting is not None:
        p["metadata"]["deletionTimestamp"] = deleting
    p["spec"] = {"nodeName": node}
    if memory is not None:
        p["spec"]["containers"] = [
            {"name": "inference", "resources": {"limits": {"memory": memory}}}
        ]
    p["status"]["conditions"] = list(conditions)
    return p


# What the node lifecycle controller leaves on the pods of a node that stopped
# reporting: Ready False, the reason as it was (none, for a Ready pod).
NODE_NOT_READY = {"type": "Ready", "status": "False"}
KUBELET_NOT_READY = {"type": "Ready", "status": "False", "reason": "ContainersNotReady"}
RUNNING = {"running": {"startedAt": "2026-11-22T11:50:00Z"}}


def disruption_target(reason: str, message: str = "") -> dict[str, Any]:
    return {"type": "DisruptionTarget", "status": "True", "reason": reason, "message": message}


def test_a_runner_pod_terminating_on_a_node_that_stopped_reporting_is_node_lost() -> None:
    # The taint manager evicted it after the not-ready toleration: no kubelet confirms.
    lost = on_node(
        RUNNING,
        NODE_NOT_READY,
        disruption_target("DeletionByTaintManager", "Taint manager: deleting due to NoExecute"),
        deleting="2026-11-22T12:00:30Z",
    )
    status = derive(job=job(active=1), pods=[lost])
    assert (status.phase, status.reason) == ("Running", "NodeLost")
    assert "worker-3" in status.message
    assert "inf-r-u1000000-abcde" in status.message
    assert "DeletionByTaintManager" in status.message
    assert (
        "kubectl taint node worker-3 node.kubernetes.io/out-of-service=nodeshutdown:NoExecute"
        in status.message
    )
    ready = cond(status, "Ready")
    assert (ready.status, ready.reason, ready.message) == ("False", "NodeLost", status.message)
    assert cond(status, "Reconciling").status == "True"
    assert cond(status, "Stalled").status == "False"


READY = {"type": "Ready", "status": "True"}
# Deleted with a 30 s grace period at 11:58:30: past it, and past the 30 s slack, at NOW.
LONG_OVERDUE = "2026-11-22T11:59:00Z"


def test_a_taint_manager_eviction_past_its_grace_period_is_node_lost_without_a_ready_mark() -> None:
    # A runner not Ready yet (still starting) when its node stopped reporting: the
    # node lifecycle controller has no Ready mark to leave. The taint manager's
    # eviction that no kubelet confirms, past the grace period and a slack, tells.
    taint_manager = disruption_target("DeletionByTaintManager", "Taint manager: deleting")
    stuck = on_node(RUNNING, KUBELET_NOT_READY, taint_manager, deleting=LONG_OVERDUE)
    status = derive(job=job(active=1), pods=[stuck])
    assert status.reason == "NodeLost"
    assert "worker-3" in status.message
    # Within the slack, the kubelet may still be at it: the eviction's own reason.
    fresh = on_node(RUNNING, KUBELET_NOT_READY, taint_manager, deleting="2026-11-22T11:59:50Z")
    assert derive(job=job(active=1), pods=[fresh]).reason == "DeletionByTaintManager"


@pytest.mark.parametrize(
    ("conditions", "reason"),
    [
        # Deleted by hand, the kubelet slow to confirm: the node reports Ready pods.
        ((READY,), "Running"),
        ((KUBELET_NOT_READY,), "Running"),
        ((), "Running"),
        # Drained (the Eviction API), the kubelet slow to confirm: the drain's reason.
        ((READY, disruption_target("EvictionByEvictionAPI")), "EvictionByEvictionAPI"),
        ((READY, disruption_target("PreemptionByScheduler")), "PreemptionByScheduler"),
    ],
)
def test_a_pod_terminating_long_on_a_healthy_node_is_not_node_lost(
    conditions: tuple[dict[str, Any], ...], reason: str
) -> None:
    # Past its grace period and the slack, but nothing says the node stopped
    # reporting: no Ready mark of the node lifecycle controller, no taint
    # manager eviction. Not NodeLost, and no out-of-service taint to advise.
    stuck = on_node(RUNNING, *conditions, deleting=LONG_OVERDUE)
    status = derive(job=job(active=1), pods=[stuck])
    assert (status.phase, status.reason) == ("Running", reason)
    assert "out-of-service" not in (status.message or "")


def test_a_runner_on_a_node_that_stopped_reporting_is_node_not_ready() -> None:
    status = derive(job=job(active=1), pods=[on_node(RUNNING, NODE_NOT_READY)])
    assert (status.phase, status.reason) == ("Running", "NodeNotReady")
    assert "node worker-3" in status.message
    assert cond(status, "Ready").status == "False"
    # The kubelet's own not-ready (with its reason) is not the node's.
    status = derive(job=job(active=1), pods=[on_node(RUNNING, KUBELET_NOT_READY)])
    assert (status.reason, cond(status, "Ready").reason) == ("Running", "Running")


@pytest.mark.parametrize(
    "reason",
    ["EvictionByEvictionAPI", "PreemptionByScheduler", "DeletionByTaintManager"],
)
def test_a_disruption_target_gives_its_own_reason(reason: str) -> None:
    evicted = on_node(
        RUNNING, disruption_target(reason, "details of it"), deleting="2026-11-22T12:00:30Z"
    )
    status = derive(job=job(active=1), pods=[evicted])
    assert (status.phase, status.reason) == ("Running", reason)
    assert "inf-r-u1000000-abcde" in status.message
    assert "worker-3" in status.message
    assert "details of it" in status.message
    assert cond(status, "Ready").status == "False"


def test_a_disruption_condition_that_is_false_or_on_an_ended_pod_says_nothing() -> None:
    not_true = on_node(RUNNING, {**disruption_target("EvictionByEvictionAPI"), "status": "False"})
    assert derive(job=job(active=1), pods=[not_true]).reason == "Running"
    ended = on_node(terminated(0, ""), disruption_target("EvictionByEvictionAPI"))
    assert derive(job=job(active=1), pods=[ended]).reason == "Running"


def oom(code: int = 137) -> dict[str, Any]:
    state = terminated(code, "")
    state["terminated"]["reason"] = "OOMKilled"
    return state


def test_an_oom_killed_runner_is_oom_killed_with_its_memory_limit() -> None:
    status = derive(
        job=job(("Failed", "True", "BackoffLimitExceeded")),
        pods=[on_node(oom(), memory="512Mi")],
    )
    assert (status.phase, status.reason) == ("Failed", "OOMKilled")
    assert "memory limit of 512Mi" in status.message
    assert "exit code 137" in status.message
    assert cond(status, "Failed").reason == "OOMKilled"
    # Between attempts: Retrying, with the same words.
    status = derive(job=job(active=0, failed=1), pods=[on_node(oom(), memory="1Gi")])
    assert (status.phase, status.reason) == ("Running", "Retrying")
    assert "memory limit of 1Gi" in status.message


def test_an_oom_killed_runner_without_a_limit_says_the_node_ran_out() -> None:
    reason, message = runner_failure([on_node(oom())]) or ("", "")
    assert reason == "OOMKilled"
    assert "no memory limit" in message


def test_a_deadline_that_ends_a_pending_run_keeps_the_pending_cause() -> None:
    failed = job(("Failed", "True", "DeadlineExceeded"))
    # The pod that said it is still listed (being deleted by the Job controller).
    stuck = pod({"waiting": {"reason": "ErrImagePull", "message": "pull access denied"}})
    status = derive(job=failed, pods=[stuck])
    assert (status.phase, status.reason) == ("Failed", "DeadlineExceeded")
    assert "DeadlineExceeded message" in status.message
    assert "ErrImagePull: pull access denied" in status.message
    # The pod is gone already: the run's last Pending cause is kept.
    pending = make_run(
        **RUN,
        status={
            "phase": "Pending",
            "reason": "Unschedulable",
            "message": "0/3 nodes are available: 3 Insufficient memory",
        },
    )
    # Its pod deleted before the Job says Failed (two watches, either first): the
    # cause is kept, so the deadline's message can still tell it.
    status = derive(run=pending, job=job(active=1), pods=[])
    assert (status.phase, status.reason) == ("Pending", "Unschedulable")
    assert status.message == "0/3 nodes are available: 3 Insufficient memory"
    status = derive(run=pending, job=failed, pods=[])
    assert status.reason == "DeadlineExceeded"
    assert "Unschedulable: 0/3 nodes are available: 3 Insufficient memory" in status.message
    assert "Unschedulable" in cond(status, "Failed").message
    # Seen again as the Job settles (FailureTarget, then Failed, its pods gone):
    # the words written first stand.
    settled = derive(
        run=make_run(
            **RUN, status={"phase": "Failed", "reason": status.reason, "message": status.message}
        ),
        job=job(("Failed", "True", "DeadlineExceeded")),
        pods=[],
    )
    assert (settled.reason, settled.message) == (status.reason, status.message)
    # A run that was running (or only Pending, no cause) gets the Job's words alone.
    for old in (
        {"phase": "Running", "reason": "Running"},
        {"phase": "Pending", "reason": "Pending"},
    ):
        status = derive(run=make_run(**RUN, status=old), job=failed, pods=[])
        assert status.message == "DeadlineExceeded message"


def test_a_scheduled_runs_execution_tells_a_lost_node() -> None:
    lost = on_node(RUNNING, NODE_NOT_READY, deleting="2026-11-22T12:00:30Z")
    lost["metadata"]["labels"]["job-name"] = "a"
    status = derive(
        run=make_run(**RUN, schedule="@hourly"),
        cronjob=cronjob(active=True),
        executions=[execution("a", "2026-11-22T11:58:00Z")],
        pods=[lost],
    )
    assert status.last_execution.phase == "Running"
    assert status.last_execution.reason == "NodeLost"
    assert "worker-3" in status.last_execution.message
    # An ordinary running or retrying execution has no reason.
    running = derive(
        run=make_run(**RUN, schedule="@hourly"),
        cronjob=cronjob(active=True),
        executions=[execution("a", "2026-11-22T11:58:00Z")],
        pods=[pod(RUNNING, "a")],
    )
    assert running.last_execution.reason is None


def test_a_lost_node_or_an_eviction_is_announced_with_a_warning_event_once() -> None:
    running = InferenceRunStatus(phase="Running", reason="Running")
    lost = InferenceRunStatus(phase="Running", reason="NodeLost", message="node worker-3 ...")
    events = phase_events(running, lost, [])
    assert [(e.type, e.reason, e.message) for e in events] == [
        ("Warning", "NodeLost", "node worker-3 ...")
    ]
    assert phase_events(lost, lost, []) == []
    assert [e.type for e in phase_events(lost, running, [])] == ["Normal"]


# ------------------------------------------------------------ output of several attempts

PLAIN = {"input": {"krateo": {"path": "/in"}}, "output": {"krateo": {"path": "/out"}}}
KEYED = {"input": {"krateo": {"path": "/in", "paging": {"pageSize": 10}}}, **{"output": {}}}
DONE = ("Complete", "True", "CompletionsReached")


def test_output_written_by_several_attempts_is_told_unless_keyed() -> None:
    r = make_run(**RUN)
    reason, message = duplicate_output_warning(r, PLAIN, job(DONE, failed=1, succeeded=1)) or (
        "",
        "",
    )
    assert reason == "OutputMayHoldDuplicates"
    assert message.startswith("output may hold rows twice: attempt 2 restarted from row 0")
    assert "unkeyedOutputRetries: Never" in message
    _, message = duplicate_output_warning(r, PLAIN, job(DONE, failed=2, succeeded=1)) or ("", "")
    assert message.startswith("output may hold rows twice: attempts 2 to 3 restarted from row 0")
    # Keyed output stores each row once; one attempt writes nothing twice; a run
    # not (yet) succeeded says so otherwise; no contract, nothing known.
    assert duplicate_output_warning(r, KEYED, job(DONE, failed=1, succeeded=1)) is None
    postgres = {"input": PLAIN["input"], "output": {"postgres": {"table": "predictions"}}}
    assert duplicate_output_warning(r, postgres, job(DONE, failed=1, succeeded=1)) is None
    assert duplicate_output_warning(r, PLAIN, job(DONE, succeeded=1)) is None
    assert duplicate_output_warning(r, PLAIN, job(failed=1)) is None
    assert duplicate_output_warning(r, None, job(DONE, failed=1, succeeded=1)) is None


def test_a_run_whose_job_is_gone_is_told_from_the_attempts_it_recorded() -> None:
    result = {"rows": 3, "predictions": 3, "durationSeconds": 1}
    done = {"phase": "Succeeded", "reason": "Completed"}
    retried = make_run(**RUN, status={**done, "result": {**result, "attempts": 2}})
    found = duplicate_output_warning(retried, PLAIN, None)
    assert found is not None
    assert "attempt 2 restarted from row 0" in found[1]
    for attempts in (1, None):
        once = make_run(**RUN, status={**done, "result": {**result, "attempts": attempts}})
        assert duplicate_output_warning(once, PLAIN, None) is None
    running = make_run(**RUN, status={"phase": "Running", "result": {**result, "attempts": 2}})
    assert duplicate_output_warning(running, PLAIN, None) is None


def test_a_sharded_run_says_how_many_shard_attempts_started_again() -> None:
    r = InferenceRun.model_validate(
        {
            "metadata": {"name": "r", "namespace": "ns", "uid": "u-1"},
            "spec": {"configRef": {"name": "cfg"}, "parallelism": 4},
        }
    )
    _, message = duplicate_output_warning(r, PLAIN, job(DONE, failed=2, succeeded=4)) or ("", "")
    assert "2 failed attempts of its 4 shards" in message


def test_a_scheduled_run_is_told_of_its_newest_execution_that_succeeded() -> None:
    r = make_run(**RUN, schedule="*/5 * * * *")
    retried = execution("inf-r-1", "2026-11-22T11:00:00Z", DONE)
    retried["status"]["failed"] = 1
    clean = execution("inf-r-2", "2026-11-22T11:05:00Z", DONE)
    running = execution("inf-r-3", "2026-11-22T11:10:00Z")
    found = duplicate_output_warning(r, PLAIN, None, [retried, running])
    assert found is not None
    assert "(inf-r-1)" in found[1]
    assert duplicate_output_warning(r, PLAIN, None, [retried, clean, running]) is None


def test_attempts_count_the_pods_the_job_has_not_counted_yet() -> None:
    # The Job controller may say Complete while the last pod is still uncounted.
    message = '{"rows":5,"predictions":5,"durationSeconds":1}'
    uncounted = {"succeeded": ["pod-2"], "failed": []}
    status = derive(
        job=job(DONE, failed=1, succeeded=0, uncountedTerminatedPods=uncounted),
        pods=[pod(terminated(0, message))],
    )
    assert status.result.attempts == 2
    failing = {"failed": ["pod-1"], "succeeded": ["pod-2"]}
    found = duplicate_output_warning(
        make_run(**RUN), PLAIN, job(DONE, uncountedTerminatedPods=failing)
    )
    assert found is not None
    assert "attempt 2 restarted from row 0" in found[1]


def test_the_result_counts_the_attempts_of_every_shard() -> None:
    message = '{"rows":5,"predictions":5,"durationSeconds":1}'
    status = derive(
        job=job(DONE, failed=2, succeeded=2),
        pods=[pod(terminated(0, message)), pod(terminated(0, message))],
    )
    assert status.result.rows == 10
    assert status.result.attempts == 4
    assert status.to_api()["result"]["attempts"] == 4
