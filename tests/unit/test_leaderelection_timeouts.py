"""Lease requests on a stalled connection: bounded, and the renew deadline counted from sending.

Driven in virtual time (looptime) against the in-memory API of
test_leaderelection_owner.py, with requests that never get an answer (a
connection that stalled without closing) or get one late.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, cast

import pytest

from kubeclient.leaderelection import LeaderElector, LeadershipLost
from kubeclient.resources import Resource
from tests.unit.test_leaderelection_owner import FakeApi

pytestmark = pytest.mark.unit

DEFAULTS = {"lease_duration": 15.0, "renew_deadline": 10.0, "retry_period": 2.0}


class StallingApi(FakeApi):
    """The fake API, with the next ``stall`` requests never answered and writes answered late."""

    def __init__(self) -> None:
        super().__init__()
        self.stall = 0
        self.stalled = 0  # requests that got no answer
        self.late = 0.0  # a write is applied at once, its answer comes this late
        self.applied: list[float] = []  # when each write was applied (loop time)

    async def _gate(self) -> None:
        if self.stall > 0:
            self.stall -= 1
            self.stalled += 1
            await asyncio.Future()  # no answer, ever

    async def _answer_late(self) -> None:
        self.applied.append(asyncio.get_running_loop().time())
        await asyncio.sleep(self.late)

    async def get(self, resource: Resource, namespace: str | None, name: str) -> dict[str, Any]:
        await self._gate()
        return await super().get(resource, namespace, name)

    async def create(
        self, resource: Resource, namespace: str | None, body: Mapping[str, Any]
    ) -> dict[str, Any]:
        await self._gate()
        created = await super().create(resource, namespace, body)
        await self._answer_late()
        return created

    async def replace(
        self, resource: Resource, namespace: str | None, name: str, body: Mapping[str, Any]
    ) -> dict[str, Any]:
        await self._gate()
        replaced = await super().replace(resource, namespace, name, body)
        await self._answer_late()
        return replaced


def candidate(api: StallingApi) -> LeaderElector:
    return LeaderElector(cast(Any, api), name="lock", namespace="ns", identity="me", **DEFAULTS)


class Leading:
    """``lead()`` for :meth:`LeaderElector.run`: leads until cancelled, noting when."""

    def __init__(self) -> None:
        self.stopped_at: float | None = None

    async def __call__(self) -> None:
        try:
            await asyncio.Future()
        except asyncio.CancelledError:
            self.stopped_at = asyncio.get_running_loop().time()
            raise


@pytest.mark.looptime
async def test_a_renewal_stuck_on_a_stalled_connection_leaves_time_for_another() -> None:
    api = StallingApi()
    elector = candidate(api)
    lead = Leading()
    running = asyncio.create_task(elector.run(lead))
    await asyncio.sleep(1)
    assert elector.is_leader
    api.stall = 1  # the next renewal's request is never answered
    await asyncio.sleep(60)
    assert api.stalled == 1
    assert elector.is_leader, "the leader gave up the lease over one stalled request"
    assert not running.done()
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running


@pytest.mark.looptime
async def test_acquiring_goes_on_past_a_request_that_is_never_answered() -> None:
    api = StallingApi()
    api.stall = 2
    elector = candidate(api)
    await asyncio.wait_for(elector.acquire(), 60)
    assert api.stalled == 2
    assert elector.is_leader


@pytest.mark.looptime
async def test_the_renew_deadline_counts_from_when_the_renewal_was_sent() -> None:
    # The API server applies each write at once but its answer comes 3 s late
    # (within the request timeout): the other candidates time the lease from
    # the write, so the leader must too.
    api = StallingApi()
    api.late = 3.0
    elector = candidate(api)
    lead = Leading()
    running = asyncio.create_task(elector.run(lead))
    await asyncio.sleep(30)
    assert elector.is_leader
    api.stall = 10**6  # then nothing is answered any more
    with pytest.raises(LeadershipLost):
        await asyncio.wait_for(running, 60)
    assert len(api.applied) > 3, api.applied  # it renewed meanwhile
    assert lead.stopped_at is not None
    led_past_write = lead.stopped_at - api.applied[-1]
    assert led_past_write <= DEFAULTS["renew_deadline"] + 0.01, (led_past_write, api.applied)


@pytest.mark.parametrize("timeout", [0.0, -1.0, 10.0, 12.0])
def test_the_request_timeout_is_shorter_than_the_renew_deadline(timeout: float) -> None:
    with pytest.raises(ValueError, match="request_timeout"):
        LeaderElector(
            cast(Any, StallingApi()),
            name="lock",
            namespace="ns",
            identity="me",
            request_timeout=timeout,
            **DEFAULTS,
        )


def test_the_request_timeout_is_half_the_renew_deadline_by_default() -> None:
    assert candidate(StallingApi()).request_timeout == 5.0
