"""The pure reconcile plan: which writes, which status, which Events, from what was seen.

Each test is one row of the decision table in ``controller/plan.py``: the
cases an operator met on a live cluster (stale caches after an API server
restart, edits of running and finished runs, refusals, pods that cannot
start) decided without a cluster.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from controller.api import InferenceConfig, InferenceRun
from controller.naming import (
    CONFIG_GENERATION_ANNOTATION,
    CONFIG_RESOURCE_VERSION_ANNOTATION,
    DESIRED_HASH_ANNOTATION,
    POD_START_FAILED_ANNOTATION,
    RUN_SPEC_HASH_ANNOTATION,
)
from controller.plan import (
    MAX_STATUS_STRING,
    Create,
    Patch,
    Refusal,
    View,
    cap_strings,
    plan,
    run_spec_hash,
    wants_job_events,
)
from controller.projection import project_configmap
from controller.render import child_name, desired_configmap, desired_workload
from kubeclient.resources import CONFIGMAPS, CRONJOBS, JOBS
from tests.unit.helpers import NOW, make_config, make_run


def existing(obj: dict[str, Any], **status: Any) -> dict[str, Any]:
    """A rendered child as the API server would return it."""
    meta = {
        **obj["metadata"],
        "uid": f"{obj['kind']}-uid",
        "resourceVersion": "7",
        "creationTimestamp": "2026-11-23T11:59:00Z",
    }
    return {**obj, "metadata": meta, "status": status}


def children_of(run: InferenceRun, config: InferenceConfig) -> tuple[Any, Any]:
    cm = existing(desired_configmap(run, config))
    workload = desired_workload(run, config)
    if not run.spec.scheduled:
        workload["metadata"]["annotations"][RUN_SPEC_HASH_ANNOTATION] = run_spec_hash(run)
    return cm, existing(workload)


def view(run: InferenceRun, **kw: Any) -> View:
    kw.setdefault("config", make_config())
    return View(run=run, now=NOW, **kw)


def recorded(name: str, phase: str = "Running") -> dict[str, Any]:
    return {"phase": phase, "jobStatus": {"kind": "Job", "name": name, "uid": "Job-uid"}}


def complete(job: dict[str, Any]) -> dict[str, Any]:
    job["status"] = {
        "conditions": [{"type": "Complete", "status": "True", "reason": "Completed"}],
        "completionTime": "2026-11-23T11:59:30Z",
    }
    return job


# ------------------------------------------------------------------- creating


def test_a_new_one_shot_run_gets_its_configmap_then_its_job() -> None:
    run = make_run()
    first = plan(view(run))
    assert first.confirm  # nothing is created from a view that may lag
    assert first.writes == []
    out = plan(view(run, confirmed=True))
    assert not out.confirm
    assert [(type(w), w.resource) for w in out.writes] == [(Create, CONFIGMAPS), (Create, JOBS)]
    job = out.writes[1].obj  # type: ignore[union-attr]
    assert job["metadata"]["name"] == child_name(run)
    assert job["metadata"]["annotations"][RUN_SPEC_HASH_ANNOTATION] == run_spec_hash(run)
    assert out.status is not None
    assert out.status.phase == "Pending"


def test_a_new_scheduled_run_gets_a_cronjob() -> None:
    out = plan(view(make_run(schedule="0 * * * *"), confirmed=True))
    assert [w.resource for w in out.writes] == [CONFIGMAPS, CRONJOBS]


def test_without_its_config_a_run_gets_nothing_and_says_why() -> None:
    out = plan(view(make_run(), config=None, config_problem=("ConfigNotFound", "no cfg")))
    assert out.writes == []
    assert out.status is not None
    assert (out.status.phase, out.status.reason) == ("Error", "ConfigNotFound")


# ------------------------------------------------- stale views: confirm first


@pytest.mark.parametrize("scheduled", [False, True])
def test_a_child_that_existed_is_recreated_only_after_a_live_read(scheduled: bool) -> None:
    """Defect 1: a deleted run read from a lagging cache had its Job recreated 70 times."""
    spec = {"schedule": "0 * * * *"} if scheduled else {}
    run = make_run(status=recorded("inf-r-5be07ada"), **spec)
    out = plan(view(run))
    assert out.confirm
    assert out.writes == []
    assert out.status is None  # nothing at all is written from the unconfirmed view

    confirmed = plan(view(run, confirmed=True))
    assert not confirmed.confirm
    assert [w.resource for w in confirmed.writes] == [
        CONFIGMAPS,
        CRONJOBS if scheduled else JOBS,
    ]


def test_a_missing_configmap_of_a_scheduled_run_is_recreated_only_after_a_live_read() -> None:
    run = make_run(schedule="0 * * * *", status=recorded("inf-r-5be07ada", "Scheduled"))
    _, cron = children_of(run, make_config())
    out = plan(view(run, cronjobs=[cron]))
    assert out.confirm
    assert out.writes == []
    assert [w.resource for w in plan(view(run, cronjobs=[cron], confirmed=True)).writes] == [
        CONFIGMAPS
    ]


def test_a_recreated_child_keeps_the_name_the_status_recorded() -> None:
    run = make_run(status=recorded("inf-old-name-5be07ada"), parallelism=3)
    out = plan(view(run, confirmed=True))
    assert {w.obj["metadata"]["name"] for w in out.writes} == {  # type: ignore[union-attr]
        "inf-old-name-5be07ada"
    }
    assert out.writes[0].obj["data"]["contract.json"].count("inf-old-name-5be07ada") == 1  # type: ignore[union-attr]


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_a_finished_run_whose_job_is_gone_is_never_run_again(phase: str) -> None:
    run = make_run(status=recorded("inf-r-5be07ada", phase))
    out = plan(view(run, confirmed=True))
    assert out.writes == []
    assert not out.confirm


# ----------------------------------------------------------------------- edits


LONG = "a-run-name-that-is-long-enough-to-be-cut-by-parallelism"


@pytest.mark.parametrize("phase", ["Running", "Succeeded"])
def test_editing_parallelism_never_replaces_a_one_shot_job(phase: str) -> None:
    """Defect 3: a parallelism edit renamed the child, deleted the Job and ran it twice."""
    config = make_config()
    before = make_run(name=LONG)
    cm, job = children_of(before, config)
    if phase == "Succeeded":
        complete(job)
    after = make_run(name=LONG, status=recorded(job["metadata"]["name"], phase), parallelism=2)
    assert child_name(after) != job["metadata"]["name"]  # the name the spec alone would give
    out = plan(view(after, configmaps=[cm], jobs=[job]))
    assert out.writes == []
    assert out.status is not None
    assert out.status.job_status is not None
    assert out.status.job_status.name == job["metadata"]["name"]
    assert out.status.phase == ("Succeeded" if phase == "Succeeded" else "Pending")
    warning = next(c for c in out.status.conditions if c.type == "Warning")
    assert warning.reason == "SpecChangeNotApplied"
    assert ("Warning", "SpecChangeNotApplied") in {(e.type, e.reason) for e in out.events}


def test_suspend_follows_the_run_on_an_unfinished_job_only() -> None:
    config = make_config()
    run = make_run()
    cm, job = children_of(run, config)
    suspended = make_run(suspend=True)
    (write,) = plan(view(suspended, configmaps=[cm], jobs=[job])).writes
    assert isinstance(write, Patch)
    assert write.patch["spec"] == {"suspend": True}
    assert write.patch["metadata"]["resourceVersion"] == "7"
    assert plan(view(suspended, configmaps=[cm], jobs=[complete(job)])).writes == []
    warning = [c for c in plan(view(suspended, configmaps=[cm], jobs=[job])).status.conditions]  # type: ignore[union-attr]
    assert all(c.type != "Warning" for c in warning)


def test_adding_a_schedule_to_a_run_with_a_job_deletes_nothing_and_says_so() -> None:
    config = make_config()
    run = make_run()
    cm, job = children_of(run, config)
    edited = make_run(schedule="0 * * * *", status=recorded(job["metadata"]["name"]))
    out = plan(view(edited, configmaps=[cm], jobs=[job]))
    assert out.writes == []
    assert not out.confirm
    assert out.status is not None
    assert (out.status.phase, out.status.reason) == ("Error", "ScheduleChangeNotApplied")


def test_a_scheduled_run_follows_config_edits_under_its_existing_names() -> None:
    run = make_run(name=LONG, schedule="0 * * * *")
    cm, cron = children_of(run, make_config())
    edited = make_run(name=LONG, schedule="*/5 * * * *", parallelism=2)
    out = plan(view(edited, configmaps=[cm], cronjobs=[cron]))
    assert [(type(w), w.resource) for w in out.writes] == [(Patch, CONFIGMAPS), (Patch, CRONJOBS)]
    assert {w.name for w in out.writes} == {cron["metadata"]["name"]}  # type: ignore[union-attr]
    assert out.writes[1].patch["spec"]["schedule"] == "*/5 * * * *"  # type: ignore[union-attr]


def test_nothing_to_do_writes_nothing() -> None:
    run = make_run()
    cm, job = children_of(run, make_config())
    first = plan(view(run, configmaps=[cm], jobs=[job]))
    assert first.writes == []
    settled = make_run(status=first.status.to_api())  # type: ignore[union-attr]
    again = plan(view(settled, configmaps=[cm], jobs=[job]))
    assert again.writes == []
    assert not again.status_changed
    assert again.events == []


# -------------------------------------------------------------------- refusals


def test_a_refused_write_shows_with_the_api_servers_words_and_stops_the_writes() -> None:
    """Defect 4: refusals by the API server left runs silent."""
    run = make_run()
    refusal = Refusal("Job", "inf-r", "JobRefused", "the API server refused: spec.x: Invalid")
    out = plan(view(run, refusal=refusal))
    assert out.writes == []
    assert out.status is not None
    assert (out.status.phase, out.status.reason) == ("Error", "JobRefused")
    assert out.status.message == refusal.message
    ready = next(c for c in out.status.conditions if c.type == "Ready")
    assert (ready.status, ready.reason) == ("False", "JobRefused")
    assert ("Warning", "JobRefused") in {(e.type, e.reason) for e in out.events}


def test_a_name_conflict_is_a_refusal_too() -> None:
    refusal = Refusal("ConfigMap", "inf-r", "NameConflict", "ConfigMap ns/inf-r exists")
    out = plan(view(make_run(), refusal=refusal))
    assert out.status is not None
    assert out.status.reason == "NameConflict"


def test_status_repeats_at_most_a_bounded_part_of_huge_parameters() -> None:
    big = "x" * 4000  # the CRD bounds a value; status repeats a quarter of the bound
    out = plan(view(make_run(parameters={"blob": big, "small": "ok"}), confirmed=True))
    assert out.status is not None
    assert out.status.contract is not None
    params = out.status.contract["parameters"]
    assert params["small"] == "ok"
    assert len(params["blob"]) <= MAX_STATUS_STRING
    assert "4000 bytes" in params["blob"]
    # The ConfigMap carries the whole contract for the runner.
    assert big in out.writes[0].obj["data"]["contract.json"]  # type: ignore[union-attr]


def test_cap_strings_leaves_short_values_alone() -> None:
    value = {"a": ["b", {"c": 1}], "d": None}
    assert cap_strings(value) == value


# ----------------------------------------------------- pods that cannot start


def waiting_pod(reason: str, message: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "labels": {"job-name": "inf-r-5be07ada"}},
        "status": {
            "containerStatuses": [
                {"name": "inference", "state": {"waiting": {"reason": reason, "message": message}}}
            ]
        },
    }


@pytest.mark.parametrize(
    "reason", ["ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError"]
)
def test_a_runner_pod_that_cannot_start_says_why(reason: str) -> None:
    """Defect 6: stuck in Pending with no reason."""
    run = make_run()
    cm, job = children_of(run, make_config())
    out = plan(view(run, configmaps=[cm], jobs=[job], pods=[waiting_pod(reason, "no such image")]))
    assert out.status is not None
    assert (out.status.phase, out.status.reason, out.status.message) == (
        "Pending",
        reason,
        "no such image",
    )
    assert ("Warning", reason) in {(e.type, e.reason) for e in out.events}


def test_a_container_that_is_merely_being_created_is_plain_pending() -> None:
    run = make_run()
    cm, job = children_of(run, make_config())
    pod = waiting_pod("ContainerCreating", "")
    out = plan(view(run, configmaps=[cm], jobs=[job], pods=[pod]))
    assert out.status is not None
    assert out.status.reason == "Pending"


def test_an_unschedulable_pod_says_why() -> None:
    run = make_run()
    cm, job = children_of(run, make_config())
    pod = {
        "metadata": {"name": "p"},
        "status": {
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/3 nodes are available",
                }
            ]
        },
    }
    out = plan(view(run, configmaps=[cm], jobs=[job], pods=[pod]))
    assert out.status is not None
    assert (out.status.reason, out.status.message) == ("Unschedulable", "0/3 nodes are available")


def test_a_job_that_cannot_create_pods_says_why_and_is_looked_at_again() -> None:
    run = make_run()
    cm, job = children_of(run, make_config())
    events = [("FailedCreate", 'serviceaccount "nope" not found')]
    out = plan(view(run, configmaps=[cm], jobs=[job], job_events=events))
    assert out.status is not None
    assert (out.status.phase, out.status.reason) == ("Pending", "FailedCreate")
    assert out.requeue_after is not None


def test_job_events_are_read_only_for_a_podless_unfinished_job_after_a_while() -> None:
    run = make_run()
    _, job = children_of(run, make_config())
    created = datetime(2026, 11, 23, 11, 59, tzinfo=UTC)
    assert wants_job_events(job, [], created + timedelta(seconds=5))
    assert not wants_job_events(job, [], created + timedelta(seconds=1))
    assert not wants_job_events(job, [{"metadata": {"name": "p"}}], created + timedelta(seconds=5))
    assert not wants_job_events(complete(job), [], created + timedelta(seconds=5))
    assert not wants_job_events(None, [], created)


# ----------------------------------------------------------------- auto-delete


@pytest.mark.parametrize(
    ("policy", "outcome", "deleted"),
    [
        ("None", "Complete", False),
        ("DeleteOnSuccess", "Complete", True),
        ("DeleteOnSuccess", "Failed", False),
        ("DeleteOnCompletion", "Failed", True),
        ("DeleteOnCompletion", "Complete", True),
    ],
)
def test_auto_delete_policy(policy: str, outcome: str, deleted: bool) -> None:
    config = make_config(autoDeletePolicy=policy)
    run = make_run()
    cm, job = children_of(run, config)
    job["status"] = {
        "conditions": [{"type": outcome, "status": "True", "reason": "X"}],
    }
    out = plan(view(run, config=config, configmaps=[cm], jobs=[job]))
    assert out.delete_run is deleted
    assert (("Normal", "AutoDelete") in {(e.type, e.reason) for e in out.events}) is deleted


def test_scheduled_runs_are_never_auto_deleted() -> None:
    config = make_config(autoDeletePolicy="DeleteOnCompletion")
    run = make_run(schedule="0 * * * *")
    cm, cron = children_of(run, config)
    out = plan(view(run, config=config, configmaps=[cm], cronjobs=[cron]))
    assert not out.delete_run


def test_the_run_spec_hash_ignores_suspend_and_unset_defaults() -> None:
    assert run_spec_hash(make_run()) == run_spec_hash(make_run(suspend=True))
    assert run_spec_hash(make_run()) == run_spec_hash(make_run(parallelism=1, backoffLimit=2))
    assert run_spec_hash(make_run()) != run_spec_hash(make_run(parallelism=2))


def test_an_adopted_upstream_configmap_loses_its_binary_data() -> None:
    run = make_run(schedule="0 * * * *")
    cm, cron = children_of(run, make_config())
    upstream = {**cm, "binaryData": {"contract.json": "e30="}, "data": None}
    upstream["metadata"] = {**cm["metadata"], "annotations": {}}
    (write, *_) = plan(view(run, configmaps=[upstream], cronjobs=[cron])).writes
    assert isinstance(write, Patch)
    assert write.patch["binaryData"] is None
    assert "contract.json" in write.patch["data"]


def test_a_new_run_waits_a_grace_for_its_config_before_warning() -> None:
    """Applied in one file, a run is often seen before its config: no false alarm."""
    problem = ("ConfigNotFound", "InferenceConfig ns/cfg not found")
    created = NOW - timedelta(seconds=2)
    run = make_run()
    run.metadata.creation_timestamp = created
    out = plan(view(run, config=None, config_problem=problem))
    assert out.status is not None
    assert (out.status.phase, out.status.reason) == ("Pending", "WaitingForConfig")
    assert out.events == []
    assert out.requeue_after == pytest.approx(8.0)
    stalled = next(c for c in out.status.conditions if c.type == "Stalled")
    assert stalled.status == "False"

    later = make_run()
    later.metadata.creation_timestamp = NOW - timedelta(seconds=11)
    late = plan(view(later, config=None, config_problem=problem))
    assert late.status is not None
    assert (late.status.phase, late.status.reason) == ("Error", "ConfigNotFound")
    assert ("Warning", "ConfigNotFound") in {(e.type, e.reason) for e in late.events}


def test_a_retry_between_attempts_keeps_the_run_running_and_warns_once() -> None:
    run = make_run(status={"phase": "Running", "reason": "Running"})
    cm, job = children_of(run, make_config())
    job["status"] = {"failed": 1}
    failed_pod = {
        "metadata": {"name": "p1"},
        "status": {
            "containerStatuses": [
                {
                    "name": "inference",
                    "state": {"terminated": {"exitCode": 4, "message": "inference: 503"}},
                }
            ]
        },
    }
    out = plan(view(run, configmaps=[cm], jobs=[job], pods=[failed_pod]))
    assert out.status is not None
    assert (out.status.phase, out.status.reason) == ("Running", "Retrying")
    assert [(e.type, e.reason) for e in out.events] == [("Warning", "Retrying")]


# --------------------------------------------- the config a contract came from


def versioned_config(rv: str, generation: int, image: str = "runner:1") -> InferenceConfig:
    config = make_config()
    config.metadata.resource_version, config.metadata.generation = rv, generation
    config.spec.image = image
    return config


def test_the_configmap_and_the_status_say_which_config_version_the_contract_came_from() -> None:
    run = make_run()
    config = versioned_config("41", 3)
    created = plan(view(run, config=config, confirmed=True))
    cm = created.writes[0].obj  # type: ignore[union-attr]
    assert cm["metadata"]["annotations"][CONFIG_RESOURCE_VERSION_ANNOTATION] == "41"
    assert cm["metadata"]["annotations"][CONFIG_GENERATION_ANNOTATION] == "3"
    # The contract's bytes are upstream's: the version is beside them, not in them.
    assert "41" not in cm["data"]["contract.json"]

    configmap, job = existing(cm), existing(created.writes[1].obj)  # type: ignore[union-attr]
    out = plan(view(run, config=config, configmaps=[configmap], jobs=[job]))
    assert out.status is not None
    assert (out.status.config_resource_version, out.status.config_generation) == ("41", 3)
    api = out.status.to_api()
    assert (api["configResourceVersion"], api["configGeneration"]) == ("41", 3)
    # The controller's cache keeps the annotations (its ConfigMap projection).
    cached = plan(view(run, config=config, configmaps=[project_configmap(configmap)], jobs=[job]))
    assert cached.status is not None
    assert (cached.status.config_resource_version, cached.status.config_generation) == ("41", 3)

    # The config is edited afterwards: the Job keeps its contract, and so does the status.
    ran = make_run(status=out.status.to_api())
    edited = versioned_config("57", 4)
    edited.spec.kserve.model_name = "edited"  # type: ignore[union-attr]
    later = plan(view(ran, config=edited, configmaps=[configmap], jobs=[job]))
    assert later.writes == []
    assert later.status is not None
    assert later.status.contract == out.status.contract
    assert (later.status.config_resource_version, later.status.config_generation) == ("41", 3)


def test_a_configmap_without_the_annotations_keeps_what_the_status_had() -> None:
    run = make_run(status={"configResourceVersion": "9", "configGeneration": 2})
    cm, job = children_of(run, make_config())  # no resourceVersion: no annotations
    out = plan(view(run, configmaps=[cm], jobs=[job]))
    assert out.status is not None
    assert (out.status.config_resource_version, out.status.config_generation) == ("9", 2)


# ----------------------------------------- a scheduled run follows its config

GONE = ("ConfigNotFound", "InferenceConfig ns/cfg not found; the run starts when it exists")


def scheduled_with_children(**spec: Any) -> tuple[InferenceRun, Any, Any]:
    run = make_run(schedule="* * * * *", status=recorded("x", "Scheduled"), **spec)
    cm, cron = children_of(run, versioned_config("41", 3))
    return run, cm, cron


def test_a_scheduled_run_whose_config_is_gone_has_its_cronjob_suspended() -> None:
    run, cm, cron = scheduled_with_children()
    seen = {"config": None, "config_problem": GONE, "configmaps": [cm], "cronjobs": [cron]}
    first = plan(view(run, **seen))
    assert first.confirm  # the config may only be missing from a lagging cache
    assert first.writes == []

    out = plan(view(run, confirmed=True, **seen))
    (patch,) = out.writes
    assert isinstance(patch, Patch)
    assert (patch.resource, patch.name) == (CRONJOBS, cron["metadata"]["name"])
    assert patch.patch["spec"] == {"suspend": True}
    assert patch.patch["metadata"]["annotations"] == {DESIRED_HASH_ANNOTATION: None}
    assert patch.patch["metadata"]["resourceVersion"] == "7"
    assert out.status is not None
    assert (out.status.phase, out.status.reason) == ("Error", "ConfigNotFound")
    assert out.status.message is not None
    assert f"CronJob {cron['metadata']['name']} is suspended" in out.status.message
    assert "starts when" not in out.status.message
    assert out.status.next_schedule_time is None
    ready = next(c for c in out.status.conditions if c.type == "Ready")
    assert (ready.status, ready.reason) == ("False", "ConfigNotFound")
    assert ("Warning", "ConfigNotFound") in {(e.type, e.reason) for e in out.events}


INVALID = ("MissingModelUrl", "InferenceConfig ns/cfg: spec.kserve.modelUrl: Field required")
OUT_OF_REACH = ("ConfigOutOfReach", "InferenceConfig ns/cfg is in a namespace not watched")


@pytest.mark.parametrize("problem", [INVALID, OUT_OF_REACH], ids=["invalid", "out-of-reach"])
def test_a_scheduled_run_whose_config_is_unusable_has_its_cronjob_suspended(
    problem: tuple[str, str],
) -> None:
    # Its last contract came from a config that no longer stands: firing it
    # would run what the user has since changed.
    run, cm, cron = scheduled_with_children()
    seen = {"config": None, "config_problem": problem, "configmaps": [cm], "cronjobs": [cron]}
    assert plan(view(run, **seen)).confirm
    out = plan(view(run, confirmed=True, **seen))
    (patch,) = out.writes
    assert isinstance(patch, Patch)
    assert patch.patch["spec"] == {"suspend": True}
    assert out.status is not None
    assert (out.status.phase, out.status.reason) == ("Error", problem[0])
    assert out.status.message is not None
    assert out.status.message.startswith(problem[1])
    assert f"CronJob {cron['metadata']['name']} is suspended until the config is usable" in (
        out.status.message
    )
    ready = next(c for c in out.status.conditions if c.type == "Ready")
    assert (ready.status, ready.reason) == ("False", problem[0])


def test_a_suspended_cronjob_of_a_missing_config_is_left_alone() -> None:
    run, cm, cron = scheduled_with_children()
    cron["spec"]["suspend"] = True
    del cron["metadata"]["annotations"][DESIRED_HASH_ANNOTATION]
    out = plan(view(run, config=None, config_problem=GONE, configmaps=[cm], cronjobs=[cron]))
    assert not out.confirm
    assert out.writes == []
    assert out.status is not None
    assert (out.status.phase, out.status.reason) == ("Error", "ConfigNotFound")


def test_a_returning_config_resumes_the_cronjob_with_a_new_contract() -> None:
    run, cm, cron = scheduled_with_children()
    cron["spec"]["suspend"] = True
    del cron["metadata"]["annotations"][DESIRED_HASH_ANNOTATION]
    back = versioned_config("90", 1, image="runner:2")
    back.spec.kserve.model_name = "returned"  # type: ignore[union-attr]
    seen = {"config": back, "configmaps": [cm], "cronjobs": [cron]}
    first = plan(view(run, **seen))
    assert first.confirm  # starting to fire again needs the fresh view a create has
    assert first.writes == []

    out = plan(view(run, confirmed=True, **seen))
    assert [(type(w), w.resource) for w in out.writes] == [(Patch, CONFIGMAPS), (Patch, CRONJOBS)]
    configmap, cronjob = (w.patch for w in out.writes)  # type: ignore[union-attr]
    assert '"modelName":"returned"' in configmap["data"]["contract.json"]
    assert configmap["metadata"]["annotations"][CONFIG_RESOURCE_VERSION_ANNOTATION] == "90"
    assert cronjob["spec"]["suspend"] is False
    assert cronjob["metadata"]["annotations"][DESIRED_HASH_ANNOTATION]


def test_a_run_the_user_suspended_stays_suspended_when_its_config_returns() -> None:
    run, cm, cron = scheduled_with_children(suspend=True)
    assert cron["spec"]["suspend"] is True
    # Gone: already suspended, nothing to write.
    gone = plan(view(run, config=None, config_problem=GONE, configmaps=[cm], cronjobs=[cron]))
    assert gone.writes == []
    # Back, edited: updated as the run asks, still suspended, no live read needed.
    back = versioned_config("90", 4, image="runner:2")
    out = plan(view(run, config=back, configmaps=[cm], cronjobs=[cron]))
    assert not out.confirm
    assert [w.resource for w in out.writes] == [CRONJOBS]
    assert out.writes[0].patch["spec"]["suspend"] is True  # type: ignore[union-attr]
    assert out.status is not None
    assert out.status.phase == "Suspended"


# ------------------------------------------------------------- a pod that cannot start


def stuck_pod(created: datetime, reason: str = "ErrImagePull") -> dict[str, Any]:
    state = {"waiting": {"reason": reason, "message": f"{reason}: no such image"}}
    return {
        "metadata": {
            "name": "inf-r-p1",
            "creationTimestamp": created.strftime("%Y-%m-%dT%H:%M:%SZ"),
        },
        "status": {
            "phase": "Pending",
            "containerStatuses": [{"name": "inference", "state": state}],
        },
    }


def unschedulable_pod(created: datetime) -> dict[str, Any]:
    pod = stuck_pod(created, "ContainerCreating")
    pod["status"]["conditions"] = [
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": "0/3 nodes are available: 3 Insufficient memory",
        }
    ]
    return pod


def pending_run_view(
    pod: dict[str, Any], default: float = 600.0, **spec: Any
) -> tuple[View, dict[str, Any]]:
    run = make_run(status={"phase": "Pending", "reason": "ErrImagePull"}, **spec)
    cm, job = children_of(run, make_config())
    job["status"] = {"startTime": "2026-11-23T11:49:00Z", "active": 1}
    return view(run, configmaps=[cm], jobs=[job], pods=[pod], pod_start_timeout=default), job


@pytest.mark.parametrize(
    ("make_pod", "reason"),
    [(stuck_pod, "ErrImagePull"), (unschedulable_pod, "Unschedulable")],
)
def test_a_pod_that_cannot_start_past_the_timeout_ends_the_job(make_pod: Any, reason: str) -> None:
    # No timeoutSeconds: without the pod-start timeout the run would wait for ever.
    seen, job = pending_run_view(make_pod(NOW - timedelta(seconds=601)))
    out = plan(seen)
    assert out.status is not None
    assert (out.status.phase, out.status.reason) == ("Pending", reason)
    (cut,) = out.writes
    assert isinstance(cut, Patch)
    assert cut.resource is JOBS
    assert cut.patch["metadata"]["resourceVersion"] == job["metadata"]["resourceVersion"]
    # The Job's age (started 11 minutes ago): the Job controller fails it at once.
    assert cut.patch["spec"] == {"activeDeadlineSeconds": 660}
    said = cut.patch["metadata"]["annotations"][POD_START_FAILED_ANNOTATION]
    assert said.startswith(f"{reason}: runner pod inf-r-p1 could not start within 600s")
    # The Job controller did: Failed, with the pod's reason, not DeadlineExceeded.
    job["metadata"]["annotations"][POD_START_FAILED_ANNOTATION] = said
    job["status"] = {
        "conditions": [
            {"type": "Failed", "status": "True", "reason": "DeadlineExceeded", "message": "x"}
        ]
    }
    failed = plan(replace(seen, jobs=[job], pods=[]))
    assert failed.status is not None
    assert (failed.status.phase, failed.status.reason) == ("Failed", reason)
    assert "could not start within 600s" in (failed.status.message or "")
    assert failed.writes == []
    assert [(e.type, e.reason) for e in failed.events] == [("Warning", reason)]
    fc = next(c for c in failed.status.conditions if c.type == "Failed")
    assert (fc.status, fc.reason) == ("True", reason)


def test_a_pod_that_cannot_start_is_waited_for_until_the_timeout() -> None:
    out = plan(pending_run_view(stuck_pod(NOW - timedelta(seconds=599)))[0])
    assert out.writes == []
    assert out.requeue_after is not None


def test_the_runs_own_pod_start_timeout_wins_and_zero_waits_for_ever() -> None:
    old = stuck_pod(NOW - timedelta(days=3))
    assert plan(pending_run_view(old, podStartTimeoutSeconds=0)[0]).writes == []
    assert plan(pending_run_view(old, default=0)[0]).writes == []
    short = plan(
        pending_run_view(stuck_pod(NOW - timedelta(seconds=6)), podStartTimeoutSeconds=5)[0]
    )
    assert len(short.writes) == 1
    # The field is read on every pass: editing it is no spec change of the Job.
    assert run_spec_hash(make_run(podStartTimeoutSeconds=5)) == run_spec_hash(make_run())


def test_a_pod_on_its_way_is_not_cut_however_long_it_takes() -> None:
    slow = stuck_pod(NOW - timedelta(hours=2), "ContainerCreating")
    assert plan(pending_run_view(slow)[0]).writes == []
