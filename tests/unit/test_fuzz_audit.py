"""The fuzz test's hot-loop audit: requests about no case are held to a rate.

Some of the controller's requests are about no fuzzed case and come back on a
clock (watch renewals, KServe's discovery every 10 s while a config names an
InferenceService). A fixed budget for them failed a run that took 6.6 minutes
on a loaded machine with 42 such requests, none of them a loop.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest

from hack.cluster import Api
from hack.fuzz import FuzzEngine

USER = "system:serviceaccount:ns:controller"
DISCOVERY = "/apis/serving.kserve.io/v1beta1"


def engine_with_audit(
    tmp_path: Path, minutes: float, requests: int, uris: Sequence[tuple[str, str, str]] = ()
) -> FuzzEngine:
    """An engine started ``minutes`` ago whose audit log holds ``requests`` discovery GETs.

    ``uris`` adds one request per (verb, resource, request URI).
    """
    api = Api.__new__(Api)  # the audit reads a file; it never calls the API server
    log = tmp_path / "audit.log"
    engine = FuzzEngine(
        api,
        "ns",
        alive=lambda: True,
        log=lambda: "",
        audit_log=log,
        controller_user=USER,
    )
    engine.started = time.time() - minutes * 60
    at = datetime.fromtimestamp(engine.started + 1, UTC).isoformat().replace("+00:00", "Z")
    event = {
        "stage": "ResponseComplete",
        "verb": "get",
        "requestURI": DISCOVERY,
        "user": {"username": USER},
        "stageTimestamp": at,
    }
    lines = [event] * requests
    for verb, resource, uri in uris:
        ref = {"resource": resource, "namespace": "ns", "apiVersion": "v1"}
        # A watch is counted when it starts (it completes minutes later).
        stage = "ResponseStarted" if verb == "watch" else "ResponseComplete"
        lines.append({**event, "verb": verb, "stage": stage, "requestURI": uri, "objectRef": ref})
    log.write_text("".join(json.dumps(e, separators=(",", ":")) + "\n" for e in lines))
    return engine


def failed_create_read(uid: str) -> tuple[str, str, str]:
    """The controller's list of a Job's FailedCreate Events, as the audit log has it."""
    selector = f"involvedObject.uid%3D{uid}%2Creason%3DFailedCreate"
    return ("list", "events", f"/api/v1/namespaces/ns/events?fieldSelector={selector}")


@pytest.mark.parametrize(("minutes", "requests"), [(6.6, 42), (10, 110)])
def test_periodic_requests_of_a_slow_run_are_within_budget(
    tmp_path: Path, minutes: float, requests: int
) -> None:
    audit = engine_with_audit(tmp_path, minutes, requests).audit(40, 40, 8)
    assert audit.unattributed == requests  # the log was read
    assert audit.over_budget == []


def test_a_loop_of_requests_about_no_case_is_named(tmp_path: Path) -> None:
    audit = engine_with_audit(tmp_path, 1, 300).audit(40, 40, 8)
    assert audit.unattributed == 300
    [line] = audit.over_budget
    assert "300 requests about no case" in line
    assert f"get {DISCOVERY}" in line  # says what was asked, for the next reader


def test_failed_create_reads_are_held_to_a_budget_per_job(tmp_path: Path) -> None:
    # A loaded CI run: 30 Jobs without a pod for minutes, each read on its
    # backoff (3 s, then 10, 20, 40... s) about 6 times, beside 34 watches of
    # pods that the API server closed while the controller was slow to read.
    reads = [failed_create_read(f"job-{i}") for i in range(30) for _ in range(6)]
    watches = [("watch", "pods", "/api/v1/namespaces/ns/pods?watch=true")] * 34
    audit = engine_with_audit(tmp_path, 6.3, 0, [*reads, *watches]).audit(40, 40, 8)
    assert audit.by_verb["list events"] == 180  # the log was read
    assert audit.unattributed == 34  # the reads are the Jobs', not "about no case"
    assert audit.over_budget == []


def test_a_loop_of_failed_create_reads_is_named(tmp_path: Path) -> None:
    reads = [failed_create_read("job-1")] * 41 + [failed_create_read("job-2")] * 6
    audit = engine_with_audit(tmp_path, 2, 0, reads).audit(40, 40, 8)
    assert audit.over_budget == ["Events of object job-1 listed 41 times (budget 40)"]
