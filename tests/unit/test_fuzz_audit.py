"""The fuzz test's hot-loop audit: requests about no case are held to a rate.

Some of the controller's requests are about no fuzzed case and come back on a
clock (watch renewals, KServe's discovery every 10 s while a config names an
InferenceService). A fixed budget for them failed a run that took 6.6 minutes
on a loaded machine with 42 such requests, none of them a loop.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from hack.fuzz import Api, FuzzEngine

USER = "system:serviceaccount:ns:controller"
DISCOVERY = "/apis/serving.kserve.io/v1beta1"


def engine_with_audit(tmp_path: Path, minutes: float, requests: int) -> FuzzEngine:
    """An engine started ``minutes`` ago whose audit log holds ``requests`` discovery GETs."""
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
    line = json.dumps(event, separators=(",", ":")) + "\n"
    log.write_text(line * requests)
    return engine


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
