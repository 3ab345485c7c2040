"""The fault tier's deleted-run invariants (hack/invariants.py) on hand-made audit records:
they find what they claim to, and an empty record fails them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from hack.invariants import (
    EmptyAuditRecord,
    Ledger,
    Request,
    controller_deleted,
    delete_seen,
    late_executions,
)

T0 = datetime(2026, 11, 26, 3, 0, 0, tzinfo=UTC)
USER = "system:serviceaccount:ns:controller"
RUN_UID = "5be07ada-0000-4000-8000-000000000001"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def req(
    seconds: float,
    verb: str,
    resource: str,
    name: str = "",
    *,
    user: str = USER,
    code: int = 200,
    credential: str = "a",
    stage: str = "ResponseComplete",
    took: float = 0.01,
) -> Request:
    return Request(
        received=at(seconds),
        completed=at(seconds + took),
        user=user,
        credential=credential,
        verb=verb,
        resource=resource,
        namespace="ns",
        name=name,
        code=code,
        stage=stage,
    )


def ledger() -> Ledger:
    runs = Ledger()
    run = runs.add({"metadata": {"name": "r", "uid": RUN_UID}, "spec": {}}, None)
    run.deleted = True
    return runs


JOB = "inf-r-5be07ada"


def record(*late: Request) -> list[Request]:
    return [
        req(0, "create", "jobs", JOB),
        req(0.5, "create", "pods/binding", f"{JOB}-abcde", user="admin"),
        req(10, "delete", "inferenceruns", "r", user="admin"),
        *late,
    ]


def test_a_job_deleted_at_once_and_no_pod_after_passes() -> None:
    requests = record(req(10.2, "delete", "jobs", JOB))
    assert late_executions(requests, USER, ledger(), {"r": at(10.01)}) == []


def test_a_job_never_deleted_by_the_controller_fails() -> None:
    found = late_executions(record(), USER, ledger(), {"r": at(10.01)})
    assert any("never deleted" in line for line in found)


def test_a_job_the_garbage_collector_deleted_first_needs_no_delete_of_the_controller() -> None:
    gc = "system:serviceaccount:kube-system:generic-garbage-collector"
    requests = record(req(9.5, "delete", "jobs", JOB, user=gc))
    assert late_executions(requests, USER, ledger(), {"r": at(12)}) == []
    late_gc = record(req(14, "delete", "jobs", JOB, user=gc))
    assert any("+2.0 s later" in v for v in late_executions(late_gc, USER, ledger(), {"r": at(12)}))


def test_a_job_deleted_late_or_a_runner_started_late_fails() -> None:
    late_delete = record(req(13, "delete", "jobs", JOB))
    assert any(
        "+3.0 s later" in v for v in late_executions(late_delete, USER, ledger(), {"r": at(10)})
    )
    started = record(
        req(10.1, "delete", "jobs", JOB, code=404),
        req(12, "create", "pods/binding", f"{JOB}-fghij", user="admin"),
    )
    found = late_executions(started, USER, ledger(), {"r": at(10)})
    assert any("runner pods" in v for v in found), found


def test_an_empty_record_or_nothing_to_check_fails() -> None:
    with pytest.raises(EmptyAuditRecord):
        late_executions([], USER, ledger(), {"r": at(10)})
    with pytest.raises(EmptyAuditRecord):
        delete_seen([], USER, {"r": at(10)})
    # Requests, but no workload created for the deleted run: nothing was checked.
    nothing = [
        req(10, "delete", "inferenceruns", "r", user="admin"),
        req(10.1, "get", "inferenceruns", "r"),
    ]
    found = late_executions(nothing, USER, ledger(), {"r": at(10)})
    assert any("nothing was checked" in v for v in found)


def test_a_delete_is_seen_once_a_leader_leads_and_its_runs_cache_is_fresh() -> None:
    start = at(5)
    deleted = {"r": at(6)}
    requests = [
        # replica b leads after the restart, and relists runs at 7.5
        req(6.5, "update", "leases", "lease", credential="b"),
        req(7.0, "watch", "inferenceruns", credential="a", stage="ResponseStarted"),
        req(7.5, "list", "inferenceruns", credential="b"),
    ]
    seen = delete_seen(requests, USER, deleted, starts=[start])
    assert seen == {"r": at(7.51)}
    # No restart before the delete: it is seen when it is done.
    assert delete_seen(requests, USER, deleted, starts=[]) == deleted
    # Leading and fresh before the delete: seen when done.
    assert delete_seen(requests, USER, {"r": at(9)}, starts=[start]) == {"r": at(9)}


def test_a_deleted_runs_job_deleted_by_the_controller_is_not_a_violation_there() -> None:
    requests = record(req(10.2, "delete", "jobs", JOB))
    assert controller_deleted(requests, USER, ledger()) == []
    alive = ledger()
    alive.by_name["r"].deleted = False
    assert controller_deleted(requests, USER, alive)
