"""Batches, order, sharding and retries (runner/batching.py, runner/retry.py), no real waiting."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from runner.batching import batch_ranges, map_ordered, shard
from runner.retry import Deadline, GaveUp, RetryPolicy, Transient, call_with_retries

pytestmark = pytest.mark.unit


class FakeTime:
    """A clock that only moves when the code under test sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    async def retry(
        self,
        call: Callable[[float], Awaitable[str]],
        policy: RetryPolicy,
        *,
        deadline: Deadline | None = None,
        request_timeout: float = 5.0,
        **options: Any,
    ) -> str:
        """``call_with_retries`` on this clock and sleep (no deadline unless given)."""
        return await call_with_retries(
            call,
            policy=policy,
            deadline=deadline or Deadline(None, self.clock),
            request_timeout=request_timeout,
            sleep=self.sleep,
            **options,
        )


def scripted(
    answers: list[Exception | str], timeouts: list[float] | None = None
) -> Callable[[float], Awaitable[str]]:
    """A call that answers ``answers`` in turn, raising the exceptions; notes its time limits."""

    async def call(time_limit: float) -> str:
        if timeouts is not None:
            timeouts.append(time_limit)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    return call


def test_batch_ranges_cover_every_row_once_in_order() -> None:
    ranges = batch_ranges(10, 4)
    assert ranges == [range(0, 4), range(4, 8), range(8, 10)]
    assert batch_ranges(0, 4) == []
    assert batch_ranges(4, 4) == [range(0, 4)]
    with pytest.raises(ValueError, match="batch size must be at least 1"):
        batch_ranges(3, 0)


def test_shard_takes_rows_whose_position_modulo_count_is_the_index() -> None:
    rows = list(range(10))
    assert shard(rows, 3, 0) == [0, 3, 6, 9]
    assert shard(rows, 3, 1) == [1, 4, 7]
    assert shard(rows, 3, 2) == [2, 5, 8]
    assert sorted(shard(rows, 3, 0) + shard(rows, 3, 1) + shard(rows, 3, 2)) == rows
    assert shard(rows, 1, 0) == rows
    with pytest.raises(ValueError, match=r"shard index 3 is not in \[0, 3\)"):
        shard(rows, 3, 3)


async def test_map_ordered_keeps_input_order_when_answers_arrive_reversed() -> None:
    items = list(range(6))
    released = {i: asyncio.Event() for i in items}
    finished: list[int] = []

    async def call(item: int) -> str:
        await released[item].wait()
        finished.append(item)
        # Finishing lets the previous item go: answers complete last-to-first.
        if item > 0:
            released[item - 1].set()
        return f"answer-{item}"

    released[5].set()
    results = await map_ordered(items, call, concurrency=6)

    assert finished == [5, 4, 3, 2, 1, 0]
    assert results == [f"answer-{i}" for i in items]


async def test_map_ordered_never_exceeds_its_concurrency() -> None:
    in_flight = 0
    peak = 0

    async def call(item: int) -> int:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        for _ in range(item % 3 + 1):
            await asyncio.sleep(0)
        in_flight -= 1
        return item * 2

    results = await map_ordered(list(range(50)), call, concurrency=4)

    assert results == [i * 2 for i in range(50)]
    assert peak == 4


async def test_map_ordered_raises_the_first_failure_itself_and_stops_the_rest() -> None:
    started: list[int] = []

    async def call(item: int) -> int:
        started.append(item)
        await asyncio.sleep(0)
        if item == 2:
            raise LookupError("batch 2 refused")
        await asyncio.Event().wait()  # the others would never finish on their own
        return item

    with pytest.raises(LookupError, match="batch 2 refused"):
        await map_ordered(list(range(100)), call, concurrency=3)
    assert started == [0, 1, 2]


def test_backoff_grows_exponentially_with_jitter_and_a_ceiling() -> None:
    policy = RetryPolicy(initial_backoff=0.2, max_backoff=10.0)
    rng = random.Random(1)
    for retry, ceiling in [(1, 0.2), (2, 0.4), (3, 0.8), (6, 6.4), (7, 10.0), (30, 10.0)]:
        waits = [policy.backoff(retry, rng) for _ in range(200)]
        assert all(ceiling / 2 <= w <= ceiling for w in waits)
        assert len(set(waits)) > 100  # jittered, not fixed


async def test_transient_failures_are_retried_until_success() -> None:
    fake = FakeTime()
    timeouts: list[float] = []
    call = scripted([Transient("503"), Transient("reset"), "ok"], timeouts)

    retried: list[tuple[int, str]] = []
    result = await fake.retry(
        call,
        RetryPolicy(max_retries=5),
        request_timeout=30.0,
        rng=random.Random(3),
        on_retry=lambda n, error, _wait: retried.append((n, error.message)),
    )

    assert result == "ok"
    assert timeouts == [30.0, 30.0, 30.0]
    assert retried == [(1, "503"), (2, "reset")]
    assert 0.1 <= fake.sleeps[0] <= 0.2
    assert 0.2 <= fake.sleeps[1] <= 0.4


async def test_retry_after_is_honoured_instead_of_the_backoff() -> None:
    fake = FakeTime()
    await fake.retry(scripted([Transient("429", retry_after=7.0), "ok"]), RetryPolicy())

    assert fake.sleeps == [7.0]


async def test_an_absurd_retry_after_is_capped() -> None:
    fake = FakeTime()
    call = scripted([Transient("429", retry_after=1e9), "ok"])
    await fake.retry(call, RetryPolicy(max_retry_after=60.0))

    assert fake.sleeps == [60.0]


async def test_retries_stop_after_the_budget_with_the_last_error() -> None:
    fake = FakeTime()
    calls = 0

    async def call(_timeout: float) -> str:
        nonlocal calls
        calls += 1
        raise Transient(f"model answered 500: boom {calls}")

    with pytest.raises(GaveUp) as failure:
        await fake.retry(call, RetryPolicy(max_retries=2))

    assert calls == 3
    assert failure.value.attempts == 3
    assert failure.value.message == "model answered 500: boom 3 (gave up after 3 attempts)"


async def test_the_deadline_stops_retries_and_caps_each_request() -> None:
    fake = FakeTime()
    timeouts: list[float] = []

    async def call(time_limit: float) -> str:
        timeouts.append(time_limit)
        fake.now += 4.0  # each attempt takes 4 s
        raise Transient("slow 503", retry_after=1.0)

    with pytest.raises(GaveUp) as failure:
        await fake.retry(call, RetryPolicy(max_retries=100), deadline=Deadline(12.0, fake.clock))

    # 0 s: attempt (5 s cap) -> 4 s, wait 1 -> 5 s: attempt -> 9 s, wait 1 -> 10 s:
    # attempt capped at the 2 s left -> 14 s: no time for another wait.
    assert timeouts == [5.0, 5.0, 2.0]
    assert failure.value.message == (
        "slow 503 (the run's deadline stopped retries after 3 attempt(s))"
    )


async def test_a_non_transient_error_is_not_retried() -> None:
    fake = FakeTime()
    calls = 0

    async def call(_timeout: float) -> str:
        nonlocal calls
        calls += 1
        raise PermissionError("model answered 403: no")

    with pytest.raises(PermissionError, match="403"):
        await fake.retry(call, RetryPolicy(max_retries=5))
    assert calls == 1
    assert fake.sleeps == []


async def test_a_passed_deadline_sends_nothing() -> None:
    fake = FakeTime()
    deadline = Deadline(1.0, fake.clock)
    fake.now += 2.0

    async def call(_timeout: float) -> str:
        raise AssertionError("must not be called")

    with pytest.raises(GaveUp, match="the run's deadline passed"):
        await fake.retry(call, RetryPolicy(), deadline=deadline)


def test_deadline_without_seconds_never_expires() -> None:
    fake = FakeTime()
    deadline = Deadline(None, fake.clock)
    fake.now += 1e9
    assert deadline.remaining() == float("inf")
    assert deadline.cap(3.0) == 3.0


async def test_rate_limits_do_not_count_against_max_retries_when_the_policy_says_so() -> None:
    fake = FakeTime()
    limited = [Transient("429", retry_after=1.0, rate_limited=True) for _ in range(20)]
    call = scripted([*limited, Transient("503"), Transient("503"), "ok"])
    policy = RetryPolicy(max_retries=2, rate_limit_retries=50)

    assert await fake.retry(call, policy, rng=random.Random(2)) == "ok"
    assert fake.sleeps[:20] == [1.0] * 20


async def test_rate_limit_retries_have_their_own_bound() -> None:
    fake = FakeTime()
    call = scripted([Transient("429", rate_limited=True) for _ in range(5)])

    with pytest.raises(GaveUp) as failure:
        await fake.retry(call, RetryPolicy(max_retries=0, rate_limit_retries=3))

    assert failure.value.attempts == 4
    assert "gave up after 4 attempts" in failure.value.message


async def test_without_a_rate_limit_bound_a_429_counts_like_any_failure() -> None:
    fake = FakeTime()
    call = scripted([Transient("429", rate_limited=True) for _ in range(5)])

    with pytest.raises(GaveUp) as failure:
        await fake.retry(call, RetryPolicy(max_retries=2))

    assert failure.value.attempts == 3


async def test_a_rate_limited_run_still_stops_at_the_deadline() -> None:
    fake = FakeTime()
    call = scripted([Transient("429", retry_after=10.0, rate_limited=True) for _ in range(50)])
    policy = RetryPolicy(max_retries=0, rate_limit_retries=1000)

    with pytest.raises(GaveUp) as failure:
        await fake.retry(call, policy, deadline=Deadline(35.0, fake.clock))

    assert failure.value.attempts == 4
    assert "deadline stopped retries" in failure.value.message
