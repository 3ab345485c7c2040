"""Kueue: the queue label on the run's Jobs, suspend only ever set towards true, Queued status."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from controller.api import InferenceConfig, InferenceRun
from controller.invalid import describe_invalid
from controller.naming import KUEUE_QUEUE_LABEL, RUN_SPEC_HASH_ANNOTATION
from controller.plan import Patch, View, plan, run_spec_hash
from controller.render import desired_configmap, desired_cronjob, desired_job, desired_workload
from controller.status import Observed, derive_status
from tests.unit.helpers import NOW, make_config, make_run


def existing(obj: dict[str, Any], *, suspend: bool | None = None, **status: Any) -> dict[str, Any]:
    """A rendered child as the API server returns it (``suspend`` as Kueue left it)."""
    meta = {**obj["metadata"], "uid": "job-uid", "resourceVersion": "7"}
    meta["creationTimestamp"] = "2026-11-23T11:59:00Z"
    out = {**obj, "metadata": meta, "status": status}
    if suspend is not None:
        out["spec"] = {**obj["spec"], "suspend": suspend}
    return out


def queued_job(run: InferenceRun, config: InferenceConfig, *, suspend: bool) -> dict[str, Any]:
    job = desired_job(run, config)
    job["metadata"]["annotations"][RUN_SPEC_HASH_ANNOTATION] = run_spec_hash(run)
    conditions = []
    if suspend:
        conditions = [{"type": "Suspended", "status": "True", "reason": "JobSuspended"}]
    return existing(job, suspend=suspend, conditions=conditions)


def view(run: InferenceRun, config: InferenceConfig, job: dict[str, Any]) -> View:
    cm = existing(desired_configmap(run, config))
    return View(run=run, now=NOW, config=config, configmaps=[cm], jobs=[job])


# ---------------------------------------------------------------------- the API


def test_queue_name_must_be_a_dns_label() -> None:
    assert make_config(queueName="team-a").spec.queue_name == "team-a"
    for bad in ("Team-A", "team_a", "-a", "a" * 64, ""):
        with pytest.raises(ValidationError) as err:
            make_config(queueName=bad)
        reason, message = describe_invalid(err.value)
        assert reason == "InvalidSpec"
        assert message.startswith("spec.queueName: ")


# ------------------------------------------------------------------- rendering


def test_the_queue_label_is_on_the_job_not_on_its_pods() -> None:
    job = desired_job(make_run(), make_config(queueName="team-a"))
    assert job["metadata"]["labels"][KUEUE_QUEUE_LABEL] == "team-a"
    assert KUEUE_QUEUE_LABEL not in job["spec"]["template"]["metadata"]["labels"]
    # The controller creates the Job as the run asks: Kueue's webhook suspends it.
    assert job["spec"]["suspend"] is False
    plain = desired_job(make_run(), make_config())
    assert KUEUE_QUEUE_LABEL not in plain["metadata"]["labels"]


def test_a_scheduled_run_puts_the_queue_label_on_its_job_template() -> None:
    run = make_run(schedule="0 * * * *")
    cron = desired_cronjob(run, make_config(queueName="team-a"))
    assert cron["spec"]["jobTemplate"]["metadata"]["labels"][KUEUE_QUEUE_LABEL] == "team-a"
    assert KUEUE_QUEUE_LABEL not in cron["metadata"]["labels"]  # the CronJob itself is not queued
    template = cron["spec"]["jobTemplate"]["spec"]["template"]
    assert KUEUE_QUEUE_LABEL not in template["metadata"]["labels"]
    # A queue added to the config is a change of the CronJob: it is updated.
    plain = desired_cronjob(run, make_config())
    assert KUEUE_QUEUE_LABEL not in plain["spec"]["jobTemplate"]["metadata"]["labels"]
    annotation = "ai.krateo.io/desired-hash"
    assert (
        cron["metadata"]["annotations"][annotation] != plain["metadata"]["annotations"][annotation]
    )


# -------------------------------------------------------------------- suspend


def test_a_queued_job_is_never_unsuspended_by_the_controller() -> None:
    config = make_config(queueName="team-a")
    run = make_run()
    out = plan(view(run, config, queued_job(run, config, suspend=True)))
    assert out.writes == []
    assert out.requeue_after is None  # Kueue's admission (a Job event) brings the run back


def test_a_suspended_run_still_suspends_its_admitted_queued_job() -> None:
    config = make_config(queueName="team-a")
    run = make_run(suspend=True)
    (write,) = plan(view(run, config, queued_job(run, config, suspend=False))).writes
    assert isinstance(write, Patch)
    assert write.patch["spec"] == {"suspend": True}
    # Already suspended: nothing to do, and it stays so once the run is resumed.
    assert plan(view(run, config, queued_job(run, config, suspend=True))).writes == []
    resumed = make_run()
    assert plan(view(resumed, config, queued_job(resumed, config, suspend=True))).writes == []


def test_without_a_queue_label_suspend_follows_the_run_both_ways() -> None:
    config = make_config()
    run = make_run()
    job = desired_workload(run, config)
    job["metadata"]["annotations"][RUN_SPEC_HASH_ANNOTATION] = run_spec_hash(run)
    (write,) = plan(view(run, config, existing(job, suspend=True))).writes
    assert isinstance(write, Patch)
    assert write.patch["spec"] == {"suspend": False}


# --------------------------------------------------------------------- status


def test_a_job_waiting_for_kueue_is_pending_queued_and_in_progress() -> None:
    config = make_config(queueName="team-a")
    run = make_run()
    out = plan(view(run, config, queued_job(run, config, suspend=True)))
    status = out.status
    assert status is not None
    assert (status.phase, status.reason) == ("Pending", "Queued")
    assert status.message == "waiting for Kueue to admit it to queue team-a"
    conditions = {c.type: c for c in status.conditions}
    assert (conditions["Ready"].status, conditions["Ready"].reason) == ("False", "Queued")
    assert "queue team-a" in conditions["Ready"].message
    assert (conditions["Reconciling"].status, conditions["Reconciling"].reason) == (
        "True",
        "Queued",
    )
    assert conditions["Stalled"].status == "False"
    assert conditions["Complete"].status == "False"
    assert conditions["Failed"].status == "False"
    assert [(e.type, e.reason) for e in out.events] == [("Normal", "Queued")]


def test_an_admitted_job_goes_on_as_usual() -> None:
    config = make_config(queueName="team-a")
    # The old builder took no status: this one went into the spec and was dropped, so the
    # run has no status. Kept as it was; recording the Queued status is a separate change.
    run = make_run()
    job = queued_job(run, config, suspend=False)
    pod = {
        "metadata": {"name": "p", "labels": {"job-name": job["metadata"]["name"]}},
        "status": {"containerStatuses": [{"name": "inference", "state": {"running": {}}}]},
    }
    status = derive_status(Observed(run=run, now=NOW, job=job, pods=[pod]))
    assert (status.phase, status.reason) == ("Running", "Running")
    job["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    status = derive_status(Observed(run=run, now=NOW, job=job))
    assert status.phase == "Succeeded"


def test_a_suspended_run_in_a_queue_shows_suspended() -> None:
    config = make_config(queueName="team-a")
    run = make_run(suspend=True)
    status = derive_status(Observed(run=run, now=NOW, job=queued_job(run, config, suspend=True)))
    assert (status.phase, status.reason) == ("Suspended", "Suspended")


def test_a_scheduled_execution_waiting_for_kueue_is_queued() -> None:
    config = make_config(queueName="team-a")
    run = make_run(schedule="0 * * * *")
    cron = existing(desired_cronjob(run, config))
    execution = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "inf-r-5be07ada-29000000",
            "labels": cron["spec"]["jobTemplate"]["metadata"]["labels"],
            "creationTimestamp": "2026-11-23T11:00:00Z",
        },
        "spec": {"suspend": True},
        "status": {},
    }
    status = derive_status(Observed(run=run, now=NOW, cronjob=cron, executions=[execution]))
    assert status.last_execution is not None
    assert (status.last_execution.phase, status.last_execution.reason) == ("Pending", "Queued")
    assert status.last_execution.message == "waiting for Kueue to admit it to queue team-a"


def test_a_scheduled_run_whose_only_execution_waits_for_kueue_is_not_running() -> None:
    config = make_config(queueName="team-a")
    run = make_run(schedule="0 * * * *")
    name = "inf-r-5be07ada-29000000"
    cron = existing(desired_cronjob(run, config), active=[{"kind": "Job", "name": name}])
    execution = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "labels": cron["spec"]["jobTemplate"]["metadata"]["labels"],
            "creationTimestamp": "2026-11-23T11:00:00Z",
        },
        "spec": {"suspend": True},
        "status": {},
    }
    status = derive_status(Observed(run=run, now=NOW, cronjob=cron, executions=[execution]))
    assert (status.phase, status.reason) == ("Scheduled", "Queued")
    assert status.message == "waiting for Kueue to admit it to queue team-a"
    # Admitted: running as usual.
    execution["spec"] = {"suspend": False}
    status = derive_status(Observed(run=run, now=NOW, cronjob=cron, executions=[execution]))
    assert (status.phase, status.reason) == ("Running", "Running")
