"""The fault tier's audit reader and its empty-record rule, on synthetic audit log files.

kube-apiserver rotates its audit log (lumberjack) by renaming the file to
``audit-<UTC timestamp>.log`` beside it and starting a new ``audit.log``; an
offset-based reader then read the new file from an offset past its end and saw
nothing, and every invariant held over nothing.
"""

from __future__ import annotations

import inspect
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from hack import invariants
from hack.invariants import (
    CHECKS,
    AuditGap,
    AuditLog,
    EmptyAuditRecord,
    Ledger,
    children_per_run,
    duplicate_creates,
)

NS = "ns-a"
USER = "system:serviceaccount:ns-a:controller"
T0 = datetime(2026, 11, 26, 3, 0, tzinfo=UTC)


def event(
    n: int,
    *,
    name: str = "",
    verb: str = "get",
    namespace: str = NS,
    user: str = USER,
    code: int | None = None,
) -> bytes:
    at = (T0 + timedelta(seconds=n)).isoformat().replace("+00:00", "Z")
    return (
        json.dumps(
            {
                "kind": "Event",
                "stage": "ResponseComplete",
                "requestReceivedTimestamp": at,
                "stageTimestamp": at,
                "verb": verb,
                "user": {"username": user},
                "objectRef": {
                    "resource": "jobs",
                    "namespace": namespace,
                    "name": name or f"job-{n}",
                },
                "responseStatus": {"code": code or (201 if verb == "create" else 200)},
            }
        ).encode()
        + b"\n"
    )


def append(path: Path, *lines: bytes) -> None:
    with path.open("ab") as f:
        f.writelines(lines)


def rotate(path: Path, stamp: str) -> Path:
    """What lumberjack does: rename the file beside itself, then a new, empty one."""
    rotated = path.with_name(f"{path.stem}-{stamp}{path.suffix}")
    path.rename(rotated)
    path.touch()
    return rotated


def names(log: AuditLog) -> list[str]:
    return [r.name for r in log.requests()]


def test_reader_follows_a_rotation_in_the_middle_of_a_test(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    append(path, *(event(i) for i in range(50)))  # before the test: not its events
    log = AuditLog(path, NS)
    append(path, event(100), event(101, namespace="other"), event(102))
    rotate(path, "2026-11-26T03-10-00.000")
    append(path, event(103))
    assert names(log) == ["job-100", "job-102", "job-103"]


def test_reader_follows_several_rotations_and_a_log_that_did_not_exist(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    log = AuditLog(path, NS)  # marked before the API server wrote anything
    append(path, event(1))
    rotate(path, "2026-11-26T03-10-00.000")
    append(path, event(2))
    rotate(path, "2026-11-26T03-20-00.000")
    append(path, event(3))
    assert names(log) == ["job-1", "job-2", "job-3"]
    later = AuditLog(path, NS)
    append(path, event(4))
    rotate(path, "2026-11-26T03-30-00.000")
    assert names(later) == ["job-4"]


def test_a_marked_file_removed_or_truncated_is_an_error_not_an_empty_record(
    tmp_path: Path,
) -> None:
    path = tmp_path / "audit.log"
    append(path, event(1), event(2))
    log = AuditLog(path, NS)
    rotated = rotate(path, "2026-11-26T03-10-00.000")
    append(path, event(3))
    rotated.unlink()
    with pytest.raises(AuditGap, match="gone"):
        log.requests()

    fresh = AuditLog(path, NS)
    path.write_bytes(b"")
    with pytest.raises(AuditGap, match="shorter"):
        fresh.requests()


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_every_check_refuses_an_empty_record(name: str) -> None:
    check = CHECKS[name]
    with pytest.raises(EmptyAuditRecord, match="no audit events seen"):
        check([], USER)


def test_every_check_refuses_a_record_without_the_user_it_checks(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    log = AuditLog(path, NS)
    append(path, event(1, user="admin", verb="create"))
    someone_else = log.requests()
    assert len(someone_else) == 1
    for check in CHECKS.values():
        with pytest.raises(EmptyAuditRecord, match=f"no audit events seen of {USER}"):
            check(someone_else, USER)


# Functions of (requests, user, ...) that are not checks: they extract or describe.
NOT_CHECKS = {"delete_times", "informers_back", "refused_creates", "count_by_verb"}


def test_every_check_goes_through_the_empty_rule() -> None:
    """A function of (requests, user, ...) is a check, and is registered by ``invariant``."""
    found = []
    for fname, fn in vars(invariants).items():
        if fname.startswith("_") or not inspect.isfunction(fn) or fname in NOT_CHECKS:
            continue
        params = list(inspect.signature(inspect.unwrap(fn)).parameters)
        if params[:2] == ["requests", "user"]:
            found.append(fname)
    assert found, "no check found: the scan is broken"
    assert sorted(found) == sorted(CHECKS), "a check that does not go through invariant()"


def test_checks_still_find_violations_in_a_real_record(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    log = AuditLog(path, NS)
    append(path, event(1, name="job-x", verb="create"), event(2, name="job-x", verb="create"))
    requests = log.requests()
    found = duplicate_creates(requests, USER, resources=("jobs",))
    assert found
    assert "created again" in found[0]
    assert duplicate_creates(requests[:1], USER, resources=("jobs",)) == []
    assert children_per_run(requests, USER, Ledger()), "jobs of no run are reported"


def test_a_create_answered_504_may_be_the_runs_one_create(tmp_path: Path) -> None:
    """A 504 create may have stored the Job: with no 2xx create it counts as the one."""
    path = tmp_path / "audit.log"
    log = AuditLog(path, NS)
    runs = Ledger()
    run = runs.add({"metadata": {"name": "once", "uid": "0123456789abcdef"}}, "Succeeded")
    append(path, event(1, name="unrelated", verb="get"))
    found = children_per_run(log.requests(), USER, runs)
    assert found[:1] == [f"one-shot run once: its Job {run.child} created 0 times"]
    append(path, event(2, name=run.child, verb="create", code=504))
    assert children_per_run(log.requests(), USER, runs) == []
    append(path, event(3, name=run.child, verb="create", code=201))
    assert children_per_run(log.requests(), USER, runs) == [], "504 then 201 is one create"
    append(path, event(4, name=run.child, verb="create", code=201))
    found = children_per_run(log.requests(), USER, runs)
    assert found
    assert "created 2 times" in found[0]
