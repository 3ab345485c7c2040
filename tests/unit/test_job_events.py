"""How often a run whose Job cannot create pods reads the Job's FailedCreate Events.

The reconciler is driven over simulated time through the fake API server of
``test_reconcile_errors``: the reads back off while the answer stays the same,
and a new answer or a new Job is looked at again soon.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from kubeclient.errors import api_error
from kubeclient.resources import EVENTS, JOBS, Obj, Resource
from tests.unit.helpers import NOW
from tests.unit.test_reconcile_errors import FakeApi, World

pytestmark = pytest.mark.unit

NO_ACCOUNT = 'pods "inf-r-" is forbidden: error looking up service account ns/runner: not found'
NO_QUOTA = 'pods "inf-r-" is forbidden: exceeded quota: compute, requested: cpu=1'
# The run is requeued this often while it is Pending (controller.plan.PENDING_RECHECK).
PASS_EVERY = 10.0


class EventsApi(FakeApi):
    """The fake API server, answering a list of Events with the Job's current FailedCreate."""

    def __init__(self) -> None:
        super().__init__()
        self.message: str | None = None
        self.event_reads = 0

    async def list(self, resource: Resource, namespace: str | None = None, **options: Any) -> Obj:
        await super().list(resource, namespace, **options)
        if resource != EVENTS or self.message is None:
            return {"items": []}
        self.event_reads += 1
        return {
            "items": [
                {
                    "reason": "FailedCreate",
                    "message": self.message,
                    "lastTimestamp": "2026-11-23T12:00:05Z",
                }
            ]
        }


class StuckJob:
    """A run whose Job exists but has no pod, passed over every 10 simulated seconds."""

    def __init__(self) -> None:
        self.api = EventsApi()
        self.world = World(self.api)
        self.elapsed = 0.0
        self.world.runs.clock = lambda: NOW + timedelta(seconds=self.elapsed)
        self.world.runs.monotonic = lambda: 1000.0 + self.elapsed

    async def start(self) -> None:
        await self.world.runs.reconcile("ns/r")  # creates the ConfigMap and the Job
        [job] = [o for (plural, _, _), o in self.api.objects.items() if plural == JOBS.plural]
        job["metadata"]["creationTimestamp"] = NOW.strftime("%Y-%m-%dT%H:%M:%SZ")
        self.world.caches.jobs.assume(job)
        self.job = job

    async def run_for(self, seconds: float) -> None:
        end = self.elapsed + seconds
        while self.elapsed + PASS_EVERY <= end:
            self.elapsed += PASS_EVERY
            result = await self.world.runs.reconcile("ns/r")
            assert result.requeue_after is not None
            self.world.caches.runs.assume(self.api.objects[("inferenceruns", "ns", "r")])

    def status(self) -> tuple[str, str, str]:
        status = self.world.status()
        return status["phase"], status.get("reason", ""), status.get("message", "")


async def test_a_stuck_jobs_events_are_read_with_a_backoff_and_a_new_answer_is_seen() -> None:
    stuck = StuckJob()
    stuck.api.message = NO_ACCOUNT
    await stuck.start()
    await stuck.run_for(PASS_EVERY)
    assert stuck.api.event_reads == 1  # the first pass after a few seconds reads at once
    assert stuck.status() == ("Pending", "FailedCreate", NO_ACCOUNT)

    await stuck.run_for(15 * 60)
    # 90 passes; at a fixed 10 s these were 90 more reads.
    assert 2 <= stuck.api.event_reads <= 8
    assert stuck.status() == ("Pending", "FailedCreate", NO_ACCOUNT)

    # The cause changes: the next read (at most 5 minutes away) says so...
    stuck.api.message = NO_QUOTA
    before = stuck.api.event_reads
    # The backoff's cap is 5 minutes: that many passes bring the next read.
    for _ in range(int(5 * 60 / PASS_EVERY) + 1):
        if stuck.api.event_reads > before:
            break
        await stuck.run_for(PASS_EVERY)
    assert stuck.api.event_reads == before + 1, "the changed answer was never read"
    assert stuck.status() == ("Pending", "FailedCreate", NO_QUOTA)
    # ...and the one after comes soon again (10 s), then backs off anew.
    await stuck.run_for(PASS_EVERY)
    assert stuck.api.event_reads == before + 2
    await stuck.run_for(15 * 60)
    assert stuck.api.event_reads <= before + 2 + 8


async def test_a_new_job_is_read_at_once_and_forget_starts_over() -> None:
    stuck = StuckJob()
    stuck.api.message = NO_ACCOUNT
    await stuck.start()
    await stuck.run_for(10 * 60)
    runs = stuck.world.runs
    reads = stuck.api.event_reads
    assert runs._job_events_backoff.num_requeues("ns/r") == reads >= 2
    # The Job is replaced (same answer): read at once, and again 10 s later.
    job = dict(stuck.job, metadata={**stuck.job["metadata"], "uid": "another-job"})
    assert await runs._job_events("ns/r", job) == [("FailedCreate", NO_ACCOUNT)]
    assert stuck.api.event_reads == reads + 1
    assert runs._job_events_backoff.num_requeues("ns/r") == 1
    stuck.elapsed += PASS_EVERY
    await runs._job_events("ns/r", job)
    assert stuck.api.event_reads == reads + 2
    runs.forget("ns/r")
    assert runs._job_events_backoff.num_requeues("ns/r") == 0
    await runs._job_events("ns/r", job)
    assert stuck.api.event_reads == reads + 3


async def test_a_failed_read_keeps_the_last_answer_and_backs_off() -> None:
    stuck = StuckJob()
    stuck.api.message = NO_ACCOUNT
    await stuck.start()
    await stuck.run_for(PASS_EVERY)
    assert stuck.api.event_reads == 1
    outage = api_error(503, {"reason": "ServiceUnavailable", "message": "etcd is down"})
    stuck.api.fail("list", *[outage] * 200)
    await stuck.run_for(15 * 60)
    assert stuck.status() == ("Pending", "FailedCreate", NO_ACCOUNT)
    tried = [c for c in stuck.api.calls if c[:2] == ("list", "Event")]
    assert 2 <= len(tried) <= 8
    assert stuck.api.event_reads == 1  # every later read failed
