"""What ``kubectl infer`` builds, prints and decides (kubectl_infer/runview.py)."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
import yaml

from controller.api import InferenceRun
from kubectl_infer import runview
from kubectl_infer.runview import Exit, UsageError
from tests.unit.helpers import NOW


def run(name: str, phase: str | None = None, **status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "ai.krateo.io/v1",
        "kind": "InferenceRun",
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "uid": f"uid-{name}",
            "creationTimestamp": "2026-11-23T11:53:00Z",
            "labels": {"team": "a"},
        },
        "spec": {"configRef": {"name": "iris"}, "parameters": {"table": "t"}},
        "status": {**({"phase": phase} if phase else {}), **status},
    }


def test_parameters_are_key_value_pairs() -> None:
    assert runview.parse_parameters(["a=1", "b=x=y", "c="]) == {"a": "1", "b": "x=y", "c": ""}
    for bad in (["novalue"], ["=v"], ["a=1", "a=2"]):
        with pytest.raises(UsageError):
            runview.parse_parameters(bad)


def test_a_new_run_is_a_valid_inference_run_with_only_what_was_given() -> None:
    body = runview.new_run(config="iris", parameters={"table": "t"}, timeout_seconds=60)
    assert body["metadata"] == {"generateName": "iris-"}
    assert body["spec"] == {
        "configRef": {"name": "iris"},
        "parameters": {"table": "t"},
        "timeoutSeconds": 60,
    }
    named = runview.new_run(
        config="iris", name="r1", config_namespace="shared", schedule="0 * * * *", parallelism=4
    )
    assert named["metadata"] == {"name": "r1"}
    assert named["spec"]["configRef"] == {"name": "iris", "namespace": "shared"}
    # The controller's own model accepts both (the CRD schema is generated from it).
    for made in (body, named):
        InferenceRun.model_validate({**made, "metadata": {"name": "x", "namespace": "ns"}})


def test_a_rerun_copies_the_spec_and_labels_and_says_where_it_came_from() -> None:
    original = run("nightly", "Failed", reason="BackoffLimitExceeded")
    again = runview.rerun_of(original)
    assert again["spec"] == original["spec"]
    assert again["spec"] is not original["spec"]
    assert again["metadata"] == {
        "generateName": "nightly-",
        "labels": {"team": "a"},
        "annotations": {runview.RERUN_OF_ANNOTATION: "nightly"},
    }
    assert "status" not in again
    assert runview.rerun_of(original, "nightly-2")["metadata"]["name"] == "nightly-2"


def test_a_job_from_a_cronjob_is_what_kubectl_create_job_from_makes() -> None:
    cronjob: dict[str, Any] = {
        "metadata": {"name": "inf-hourly-1234abcd", "namespace": "team-a", "uid": "cj-uid"},
        "spec": {
            "schedule": "0 * * * *",
            "jobTemplate": {
                "metadata": {"labels": {"ai.krateo.io/run-uid": "r"}, "annotations": {"a": "b"}},
                "spec": {"backoffLimit": 1, "template": {"spec": {"containers": []}}},
            },
        },
    }
    job = runview.job_from_cronjob(cronjob, "inf-hourly-1234abcd-mabcde")
    assert job["spec"] == cronjob["spec"]["jobTemplate"]["spec"]
    assert job["metadata"]["labels"] == {"ai.krateo.io/run-uid": "r"}
    assert job["metadata"]["annotations"] == {"a": "b", runview.INSTANTIATE_ANNOTATION: "manual"}
    assert job["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "batch/v1",
            "kind": "CronJob",
            "name": "inf-hourly-1234abcd",
            "uid": "cj-uid",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def test_manual_job_names_fit_a_dns_label() -> None:
    assert runview.manual_job_name("inf-a-12345678", "xyz12") == "inf-a-12345678-mxyz12"
    assert len(runview.manual_job_name("c" * 63, "xyz12")) == 63


@pytest.mark.parametrize(
    ("phase", "outcome"),
    [
        (None, None),
        ("Pending", None),
        ("Running", None),
        ("Succeeded", Exit.SUCCEEDED),
        ("Failed", Exit.FAILED),
        ("Error", Exit.ERROR),
    ],
)
def test_the_exit_code_follows_the_runs_outcome(phase: str | None, outcome: Exit | None) -> None:
    assert runview.run_outcome(run("r", phase)) == outcome


def test_a_jobs_outcome_comes_from_its_true_conditions() -> None:
    def job(*conditions: tuple[str, str]) -> dict[str, Any]:
        return {"status": {"conditions": [{"type": t, "status": s} for t, s in conditions]}}

    assert runview.job_outcome(job()) is None
    assert runview.job_outcome(job(("Suspended", "True"))) is None
    assert runview.job_outcome(job(("Failed", "False"))) is None
    assert runview.job_outcome(job(("SuccessCriteriaMet", "True"), ("Complete", "True"))) == (
        Exit.SUCCEEDED
    )
    assert runview.job_outcome(job(("FailureTarget", "True"), ("Failed", "True"))) == Exit.FAILED
    # The Job controller has decided; Complete or Failed follows once its pods are gone.
    assert runview.job_outcome(job(("SuccessCriteriaMet", "True"))) == Exit.SUCCEEDED
    assert runview.job_outcome(job(("FailureTarget", "True"))) == Exit.FAILED


def test_newest_job_is_the_last_created() -> None:
    jobs = [
        {"metadata": {"name": "b", "creationTimestamp": "2026-11-23T10:00:00Z"}},
        {"metadata": {"name": "a", "creationTimestamp": "2026-11-23T11:00:00Z"}},
    ]
    assert runview.newest_job(jobs) == jobs[1]
    assert runview.newest_job([]) is None


def test_status_and_result_lines() -> None:
    running = run("r", "Running", progress={"rowsDone": 30, "rowsTotal": 120})
    assert runview.status_line(running) == "phase=Running progress=30/120"
    assert runview.status_line(run("r")) == "phase=Pending"
    # A reason that only repeats the phase says nothing.
    assert runview.status_line(run("r", "Running", reason="Running")) == "phase=Running"
    pulled = run("r", "Pending", reason="ErrImagePull", message="image x: not found")
    assert runview.status_line(pulled) == "phase=Pending reason=ErrImagePull: image x: not found"
    done = run("r", "Succeeded", result={"rows": 150, "predictions": 150, "durationSeconds": 2.25})
    assert runview.result_line(done) == "succeeded: 150 rows, 150 predictions in 2.2s"
    failed = run("r", "Failed", reason="RunnerFailed", message="model answered 503")
    assert runview.result_line(failed) == "failed: RunnerFailed: model answered 503"


def test_event_lines_read_like_kubectl_describe() -> None:
    event = {"type": "Warning", "reason": "CreateFailed", "message": "quota", "count": 3}
    assert runview.event_line(event) == "event: Warning CreateFailed (x3): quota"
    assert runview.event_line({"reason": "Created", "message": "Job j"}) == (
        "event: Normal  Created: Job j"
    )


def test_the_runs_table_shows_the_last_result_of_each_kind_of_run() -> None:
    scheduled = run("hourly", "Scheduled", lastExecution={"name": "j-1", "phase": "Succeeded"})
    scheduled["spec"]["schedule"] = "0 * * * *"
    fresh = run("fresh", "Scheduled")
    fresh["spec"]["schedule"] = "0 * * * *"
    table = runview.runs_table(
        [
            run("b", "Succeeded", result={"rows": 3, "predictions": 3, "durationSeconds": 1}),
            run("a", "Failed", reason="DeadlineExceeded"),
            scheduled,
            fresh,
            run("c", "Running", progress={"rowsDone": 5, "rowsTotal": 10, "summary": "5/10 (50%)"}),
        ],
        now=NOW,
        all_namespaces=True,
    )
    assert table.splitlines() == [
        "NAMESPACE   NAME     CONFIG   PHASE       PROGRESS     LAST RESULT                   AGE",
        "team-a      a        iris     Failed      -            DeadlineExceeded              7m",
        "team-a      b        iris     Succeeded   -            3 rows, 3 predictions, 1.0s   7m",
        "team-a      c        iris     Running     5/10 (50%)   -                             7m",
        "team-a      fresh    iris     Scheduled   -            no execution yet              7m",
        "team-a      hourly   iris     Scheduled   -            j-1 Succeeded                 7m",
    ]
    one_namespace = runview.runs_table([run("a")], now=NOW, all_namespaces=False)
    assert one_namespace.splitlines()[0].startswith("NAME ")


def test_ages_read_like_kubectl() -> None:
    at = NOW.isoformat().replace("+00:00", "Z")
    ages = [runview._age(at, NOW + dt.timedelta(seconds=s)) for s in (0, 59, 60, 7200, 3 * 86400)]
    assert ages == ["0s", "59s", "1m", "2h", "3d"]
    assert runview._age(None, NOW) == "?"
    assert runview._age("yesterday", NOW) == "?"
    # A time without an offset is UTC, as the controller reads Kubernetes times.
    naive = NOW.replace(tzinfo=None).isoformat()
    assert runview._age(naive, NOW + dt.timedelta(minutes=5)) == "5m"


def pod(name: str, index: int | None, created: str = "2026-11-23T11:53:00Z") -> dict[str, Any]:
    labels = {} if index is None else {"batch.kubernetes.io/job-completion-index": str(index)}
    return {"metadata": {"name": name, "labels": labels, "creationTimestamp": created}}


def test_logs_are_read_by_shard_then_oldest_first_and_a_shard_must_exist() -> None:
    pods = [
        pod("b-retry", 1, "2026-11-23T11:55:00Z"),
        pod("a", 0),
        pod("b", 1),
        pod("plain", None, "2026-11-23T11:52:00Z"),
    ]
    assert [p["metadata"]["name"] for p in runview.log_pods(pods)] == [
        "plain",
        "a",
        "b",
        "b-retry",
    ]
    assert [p["metadata"]["name"] for p in runview.log_pods(pods, shard=1)] == ["b", "b-retry"]
    sharded = run("r")
    sharded["spec"]["parallelism"] = 3
    runview.check_shard(sharded, 2)
    runview.check_shard(run("single"), None)
    for bad, shard, says in ((sharded, 3, "has 3 shards (0 to 2)"), (run("one"), 1, "1 shard ")):
        with pytest.raises(UsageError, match=r"\(0 to"):
            runview.check_shard(bad, shard)
        with pytest.raises(UsageError) as refused:
            runview.check_shard(bad, shard)
        assert says in str(refused.value)
    with pytest.raises(UsageError):
        runview.check_shard(sharded, -1)


def test_runs_print_as_kubectl_get_prints_them() -> None:
    listed = [run("a", "Succeeded"), run("b")]
    for item in listed:  # as a list answer has them: without apiVersion and kind
        del item["apiVersion"], item["kind"]
    assert runview.render(listed, "name", as_list=True) == (
        "inferencerun.ai.krateo.io/a\ninferencerun.ai.krateo.io/b"
    )
    document = json.loads(runview.render(listed, "json", as_list=True))
    assert document["kind"] == "List"
    assert [i["kind"] for i in document["items"]] == ["InferenceRun", "InferenceRun"]
    assert document["items"][0]["apiVersion"] == "ai.krateo.io/v1"
    one = yaml.safe_load(runview.render([run("c")], "yaml", as_list=False))
    assert (one["kind"], one["metadata"]["name"]) == ("InferenceRun", "c")
    empty = json.loads(runview.render([], "json", as_list=True))
    assert empty["items"] == []
    with pytest.raises(UsageError):
        runview.render(listed, "wide", as_list=True)
    with pytest.raises(UsageError, match="leave out --watch"):
        runview.check_output("yaml", following=True)
    runview.check_output("name", following=True)
    runview.check_output(None, following=True)


def test_suspend_and_resume_patch_only_spec_suspend() -> None:
    assert runview.suspend_patch(True) == {"spec": {"suspend": True}}
    assert runview.suspend_patch(False) == {"spec": {"suspend": False}}
    suspended = run("s")
    suspended["spec"]["suspend"] = True
    assert runview.is_suspended(suspended)
    assert not runview.is_suspended(run("t"))
