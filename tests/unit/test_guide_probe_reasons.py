"""docs/configs-and-runs.md's table of probe reasons is exactly what controller/probe.py sets."""

from __future__ import annotations

import re

import pytest

from controller.probe import probe_outcome, probe_stuck
from controller.status import CANNOT_START, EXIT_REASONS
from tests.chart import REPO
from tests.unit.test_probe import probe_job, probe_pod

pytestmark = [pytest.mark.unit]

GUIDE = REPO / "docs" / "configs-and-runs.md"
MARKER = "<!-- probe reasons -->"


def documented() -> set[str]:
    text = GUIDE.read_text()
    assert MARKER in text, f"{GUIDE} has no {MARKER}"
    reasons: set[str] = set()
    for line in text.split(MARKER, 1)[1].strip().splitlines():
        line = line.strip()
        if not line.startswith("|"):
            break
        first = line.strip("|").split("|")[0]
        reasons.update(r for r in re.findall(r"`([A-Za-z]+)`", first) if r != "Probed")
    return reasons


def waiting_pod(reason: str) -> dict[str, object]:
    return {
        "metadata": {"name": "probe-1-x", "labels": {"job-name": "probe-1"}},
        "status": {
            "containerStatuses": [
                {"name": "inference", "state": {"waiting": {"reason": reason, "message": "m"}}}
            ]
        },
    }


def set_by_the_code() -> set[str]:
    """Every reason probe_outcome and probe_stuck can give, found by calling them."""
    reasons = {probe_outcome(probe_job("Complete"), [probe_pod(0, "{}")])[1]}
    for code in [*EXIT_REASONS, 99]:
        reasons.add(probe_outcome(probe_job("Failed"), [probe_pod(code, "x")])[1])
    for reason in CANNOT_START:
        stuck = probe_stuck(probe_job(None), [waiting_pod(reason)])
        assert stuck is not None, reason
        reasons.add(stuck[0])
    # The Job's own end with no container outcome: its deadline, or another failure.
    reasons.add(probe_outcome(probe_job("Failed"), [])[1])
    failed = probe_job("Failed")
    failed["status"]["conditions"][0]["reason"] = "BackoffLimitExceeded"
    reasons.add(probe_outcome(failed, [])[1])
    return reasons


def test_the_guide_lists_exactly_the_probe_reasons_the_controller_sets() -> None:
    code = set_by_the_code()
    assert {"ProbeSucceeded", "ProbeTimedOut", "ProbeFailed", "ErrImagePull"} <= code
    assert documented() == code
