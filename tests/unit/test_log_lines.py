"""Which log line a run's status change or a config's probe is worth (pure logic)."""

from __future__ import annotations

import logging

import pytest

from controller.probe import plan_config
from controller.reconcile import status_change_line
from tests.unit.test_probe import probe_job, probe_pod, stored_config, view

pytestmark = [pytest.mark.unit]


@pytest.mark.parametrize(
    ("before", "after", "said"),
    [
        ((None, None), ("Pending", "JobCreated"), (logging.INFO, "phase changed")),
        (("Pending", "JobCreated"), ("Running", "Running"), (logging.INFO, "phase changed")),
        (("Running", "Running"), ("Failed", "InferenceFailed"), (logging.WARNING, "phase changed")),
        ((None, None), ("Error", "ConfigNotFound"), (logging.WARNING, "phase changed")),
        (("Running", "Running"), ("Succeeded", "Succeeded"), (logging.INFO, "phase changed")),
        # The same phase with a new reason is not a phase change.
        (
            ("Error", "ConfigNotFound"),
            ("Error", "MissingModelUrl"),
            (logging.INFO, "reason changed"),
        ),
        (("Running", "Running"), ("Running", "NodeLost"), (logging.INFO, "reason changed")),
        # Nothing changed: no line.
        (("Running", "Running"), ("Running", "Running"), None),
        (("Failed", "InferenceFailed"), ("Failed", "InferenceFailed"), None),
    ],
)
def test_status_change_line(
    before: tuple[str | None, str | None],
    after: tuple[str | None, str | None],
    said: tuple[int, str] | None,
) -> None:
    assert status_change_line(before, after) == said


def test_a_finished_probe_is_handed_to_the_log_once_read() -> None:
    passed = plan_config(
        view(stored_config(), probe_jobs=[probe_job("Complete")], probe_pods=[probe_pod(0, "ok")])
    )
    assert passed.probed == ("probe-1", True, "ProbeSucceeded", "ok")
    failed = plan_config(
        view(
            stored_config(),
            probe_jobs=[probe_job("Failed")],
            probe_pods=[probe_pod(4, "inference: model answered 503")],
        )
    )
    assert failed.probed is not None
    assert failed.probed[:3] == ("probe-1", False, "InferenceFailed")
    # No probe finished: nothing to log.
    assert plan_config(view(stored_config())).probed is None
