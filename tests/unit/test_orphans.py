"""Which workloads a deleted run leaves behind (controller/orphans.py)."""

from __future__ import annotations

from typing import Any

from controller.naming import RUN_UID_LABEL
from controller.orphans import (
    RunRef,
    is_being_deleted,
    keeps_children,
    orphans,
    owner_cronjob,
    owning_run,
    workloads_of,
)
from controller.projection import project_custom

Obj = dict[str, Any]
RUN, OTHER = "run-uid-1", "run-uid-2"


def ref(kind: str, name: str, uid: str, *, controller: bool = True, api: str = "") -> Obj:
    version = api or ("ai.krateo.io/v1" if kind == "InferenceRun" else "batch/v1")
    return {"apiVersion": version, "kind": kind, "name": name, "uid": uid, "controller": controller}


def workload(
    kind: str, name: str, *, label: str | None, owners: list[Obj], uid: str | None = None
) -> Obj:
    meta: Obj = {"name": name, "namespace": "ns", "uid": uid or f"{name}-uid"}
    if label is not None:
        meta["labels"] = {RUN_UID_LABEL: label}
    if owners:
        meta["ownerReferences"] = owners
    return {"apiVersion": "batch/v1", "kind": kind, "metadata": meta}


def job_of(run_uid: str, name: str = "inf-r-job") -> Obj:
    return workload("Job", name, label=run_uid, owners=[ref("InferenceRun", "r", run_uid)])


def test_a_workload_is_the_runs_by_label_and_controlling_owner_together() -> None:
    assert owning_run(job_of(RUN)) == RunRef("ns", "r", RUN)
    not_ours = [
        # the label alone
        workload("Job", "a", label=RUN, owners=[]),
        # the owner alone
        workload("Job", "b", label=None, owners=[ref("InferenceRun", "r", RUN)]),
        # label and owner disagree
        workload("Job", "c", label=OTHER, owners=[ref("InferenceRun", "r", RUN)]),
        # an owner that does not control it
        workload("Job", "d", label=RUN, owners=[ref("InferenceRun", "r", RUN, controller=False)]),
        # an InferenceRun of another API group
        workload("Job", "e", label=RUN, owners=[ref("InferenceRun", "r", RUN, api="x.io/v1")]),
        # controlled by something else
        workload("Job", "f", label=RUN, owners=[ref("CronJob", "cj", RUN)]),
    ]
    assert [owning_run(o) for o in not_ours] == [None] * len(not_ours)


def test_workloads_of_a_run_crons_first_then_their_executions_then_its_jobs() -> None:
    cron = workload("CronJob", "inf-s", label=RUN, owners=[ref("InferenceRun", "s", RUN)])
    execution = workload(
        "Job", "inf-s-29000000", label=RUN, owners=[ref("CronJob", "inf-s", "inf-s-uid")]
    )
    stray = workload("Job", "inf-x-1", label=RUN, owners=[ref("CronJob", "inf-x", "x-uid")])
    job = job_of(RUN)
    others = [job_of(OTHER, "inf-other"), workload("Job", "plain", label=None, owners=[])]
    found = workloads_of(RUN, [execution, job, stray, *others], [cron])
    # A Job of a CronJob that is not the run's is not the run's, whatever its label says.
    assert [o["metadata"]["name"] for o in found] == ["inf-s", "inf-s-29000000", "inf-r-job"]
    assert workloads_of("no-such-run", [execution, job, *others], [cron]) == []


def test_orphans_are_the_workloads_of_runs_not_alive_grouped_by_run() -> None:
    gone, alive = job_of(RUN, "inf-gone"), job_of(OTHER, "inf-alive")
    gone_cron = workload("CronJob", "inf-g", label=RUN, owners=[ref("InferenceRun", "r", RUN)])
    unowned = workload("Job", "inf-unowned", label=RUN, owners=[])
    found = orphans([gone_cron, gone, alive, unowned], alive=lambda uid: uid == OTHER)
    assert list(found) == [RunRef("ns", "r", RUN)]
    assert [o["metadata"]["name"] for o in found[RunRef("ns", "r", RUN)]] == ["inf-g", "inf-gone"]
    assert orphans([gone, alive], alive=lambda uid: True) == {}


def test_a_run_deleted_with_orphan_propagation_keeps_its_children_in_the_cache_too() -> None:
    run: Obj = {
        "apiVersion": "ai.krateo.io/v1",
        "kind": "InferenceRun",
        "metadata": {"name": "r", "namespace": "ns", "uid": RUN, "finalizers": ["orphan"]},
        "spec": {},
    }
    # Not being deleted: finalizers are not cached (nobody reads them).
    assert not is_being_deleted(run)
    assert "finalizers" not in project_custom(run)["metadata"]
    run["metadata"]["deletionTimestamp"] = "2026-11-26T00:00:00Z"
    cached = project_custom(run)
    assert is_being_deleted(cached)
    assert keeps_children(cached)
    run["metadata"]["finalizers"] = ["foregroundDeletion"]
    assert not keeps_children(project_custom(run))


def test_an_executions_owner_is_its_controlling_cronjob() -> None:
    execution = workload("Job", "inf-s-1", label=RUN, owners=[ref("CronJob", "inf-s", "c-uid")])
    assert owner_cronjob(execution) == ref("CronJob", "inf-s", "c-uid")
    assert owner_cronjob(job_of(RUN)) is None
    loose = workload("Job", "x", label=RUN, owners=[ref("CronJob", "s", "c", controller=False)])
    assert owner_cronjob(loose) is None
