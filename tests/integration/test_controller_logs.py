"""What the controller's log says about runs and config probes, read from a real process.

Operators read these lines (or alert on them in their log pipeline): a run
that needs someone's attention is a warning, a phase change is logged once and
only when the phase changes, and every probe outcome has a line.
"""

from __future__ import annotations

import json
from typing import Any

from hack.controllerproc import ControllerProcess
from tests.kubehelpers import eventually
from tests.runs import (
    MODEL_URL_PATCH,
    Runs,
    inference_config,
    inference_run,
    without_model_url,
)

OK, FAIL = "test.local/fake-ok:1", "test.local/fake-fail:1"
CONFIGS = "inferenceconfigs"
Line = dict[str, Any]


def lines(proc: ControllerProcess, **match: str) -> list[Line]:
    """The controller's JSON log lines whose fields include ``match``."""
    found = []
    for text in proc.output().splitlines():
        try:
            line = json.loads(text)
        except ValueError:
            continue
        if isinstance(line, dict) and all(line.get(k) == v for k, v in match.items()):
            found.append(line)
    return found


async def test_a_phase_change_is_logged_once_and_only_when_the_phase_changes(
    runs: Runs, namespace: str, controller: ControllerProcess
) -> None:
    key = f"{namespace}/r"
    # Error (no config) -> Error with another reason (a config runs cannot use) -> Succeeded.
    await runs.create(inference_run("r", "cfg"))
    await runs.wait("r", lambda r: _reason(r) == "ConfigNotFound", what="ConfigNotFound")
    await runs.create(without_model_url(inference_config("cfg", OK)))
    await runs.wait(
        "r",
        lambda r: _phase(r) == "Error" and _reason(r) not in (None, "ConfigNotFound"),
        what="Error with the unusable config's reason",
    )
    await runs.patch("cfg", MODEL_URL_PATCH, plural=CONFIGS)
    await runs.wait_phase("r", "Succeeded")

    async def told() -> list[Line] | None:
        said = lines(controller, run=key)
        # The change's own line: other lines of the same pass (the plan, at
        # debug) carry the new phase before it is written.
        done = any(s["msg"] == "phase changed" and s.get("phase") == "Succeeded" for s in said)
        return said if done else None

    said = await eventually(told, within=30, what="the run's change to Succeeded")
    changes = [s for s in said if s["msg"] == "phase changed"]
    assert changes, said
    for change in changes:
        assert change["phase"] != change["previous"], change
    # One line per change: each starts where the one before ended (a change logged
    # twice would start from the same phase again).
    phases = [c["phase"] for c in changes]
    assert [c["previous"] for c in changes] == [None, *phases[:-1]], changes
    assert "Error" in phases, phases
    assert phases[-1] == "Succeeded", phases
    (errored,) = [c for c in changes if c["phase"] == "Error"]
    assert (errored["level"], errored["reason"]) == ("warning", "ConfigNotFound"), errored
    assert all(c["level"] == "info" for c in changes if c["phase"] != "Error"), changes
    # The new reason within phase Error has its own line, at info.
    (renamed,) = [s for s in said if s["msg"] == "reason changed" and s["phase"] == "Error"]
    assert (renamed["phase"], renamed["previous"]) == ("Error", "Error"), renamed
    assert renamed["previous_reason"] == "ConfigNotFound", renamed
    assert renamed["level"] == "info", renamed


async def test_a_failed_run_is_a_warning(
    runs: Runs, namespace: str, controller: ControllerProcess
) -> None:
    await runs.create(inference_config("cfg", FAIL))
    await runs.create_and_wait(inference_run("r", "cfg", backoffLimit=0), "Failed")

    async def failed() -> list[Line] | None:
        found = lines(controller, run=f"{namespace}/r", msg="phase changed", phase="Failed")
        return found or None

    (line,) = await eventually(failed, within=30, what="the run's Failed line")
    assert line["level"] == "warning", line
    assert line["reason"] == "InferenceFailed", line
    assert "model answered 503" in line["message"], line


async def test_probe_outcomes_are_logged(
    runs: Runs, namespace: str, probing_controller: ControllerProcess
) -> None:
    await runs.create(inference_config("good", OK))
    await runs.create(inference_config("bad", FAIL))
    for name in ("good", "bad"):
        await runs.wait_condition(name, "Probed", plural=CONFIGS, what=f"{name} probed")

    async def outcome(name: str, msg: str) -> Line | None:
        found = lines(probing_controller, config=f"{namespace}/{name}", msg=msg)
        return found[-1] if found else None

    passed = await eventually(lambda: outcome("good", "probe passed"), within=30, what="pass")
    assert (passed["level"], passed["reason"]) == ("info", "ProbeSucceeded"), passed
    assert passed["job"], passed
    failed = await eventually(lambda: outcome("bad", "probe failed"), within=30, what="failure")
    assert (failed["level"], failed["reason"]) == ("warning", "InferenceFailed"), failed
    assert "model answered 503" in failed["message"], failed
    assert not lines(probing_controller, config=f"{namespace}/good", msg="probe failed")


def _phase(run: Line) -> str | None:
    return (run.get("status") or {}).get("phase")


def _reason(run: Line) -> str | None:
    return (run.get("status") or {}).get("reason")
