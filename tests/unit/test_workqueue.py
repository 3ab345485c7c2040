"""The work queue's contract (kubeclient/workqueue.py docstring), line by line.

Every test runs on looptime's fake loop clock: sleeps and timeouts cost no
real time, and the loop's time is exact, so delays are checked to the tick.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from typing import TypeVar

import pytest
from prometheus_client import generate_latest

from controller.metrics import Metrics
from kubeclient.ratelimit import ExponentialBackoff, MaxOf, TokenBucket, default_rate_limiter
from kubeclient.workqueue import ShutDown, WorkQueue

pytestmark = [pytest.mark.unit, pytest.mark.looptime]

K = TypeVar("K")


def sample(metrics: Metrics, metric: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(metric, labels)
    return 0.0 if value is None else value


async def drain(queue: WorkQueue[str]) -> list[str]:
    """Every key ready now, each marked done at once."""
    keys: list[str] = []
    while len(queue):
        key = await queue.get()
        queue.done(key)
        keys.append(key)
    return keys


async def handed_out(queue: WorkQueue[K]) -> AsyncIterator[K]:
    """The keys one worker gets, each in turn, until the queue is shut down and empty."""
    while True:
        try:
            yield await queue.get()
        except ShutDown:
            return


async def nothing_within(queue: WorkQueue[str], seconds: float) -> bool:
    """True when get() hands out nothing for ``seconds`` of loop time."""
    try:
        key = await asyncio.wait_for(queue.get(), timeout=seconds)
    except TimeoutError:
        return True
    queue.done(key)
    return False


# 1. Fair -------------------------------------------------------------------


async def test_1_fair_keys_come_out_in_the_order_they_were_added() -> None:
    queue: WorkQueue[str] = WorkQueue()
    for key in ["c", "a", "b", "d"]:
        queue.add(key)
    assert await drain(queue) == ["c", "a", "b", "d"]


# 2. Stingy -----------------------------------------------------------------


async def test_2_stingy_repeated_adds_collapse_and_keep_the_first_place() -> None:
    metrics = Metrics()
    queue: WorkQueue[str] = WorkQueue("q", metrics=metrics)
    for key in ["a", "b", "a", "a", "c", "b"]:
        queue.add(key)
    assert len(queue) == 3
    assert await drain(queue) == ["a", "b", "c"]
    assert sample(metrics, "workqueue_adds_total", name="q") == 3


# 3. Exclusive --------------------------------------------------------------


async def test_3_a_key_being_processed_is_not_handed_out_again_before_done() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add("a")
    first = await queue.get()
    queue.add("a")
    assert len(queue) == 0
    assert queue.is_processing("a")
    assert await nothing_within(queue, 60)
    queue.done(first)
    assert await queue.get() == "a"


async def test_3_exclusive_under_concurrent_workers() -> None:
    queue: WorkQueue[str] = WorkQueue()
    active: set[str] = set()
    overlaps: list[str] = []
    processed: list[str] = []
    rng = random.Random(7)

    async def worker() -> None:
        async for key in handed_out(queue):
            if key in active:
                overlaps.append(key)
            active.add(key)
            await asyncio.sleep(rng.uniform(0.01, 0.5))
            active.discard(key)
            processed.append(key)
            queue.done(key)

    workers = [asyncio.create_task(worker()) for _ in range(4)]
    for _ in range(200):
        queue.add(rng.choice("abc"))
        await asyncio.sleep(rng.uniform(0, 0.1))
    await queue.shut_down_with_drain()
    await asyncio.gather(*workers)
    assert overlaps == []
    assert set(processed) == {"a", "b", "c"}


# 4. Re-add while processing -------------------------------------------------


async def test_4_readd_while_processing_is_processed_once_more_after_done() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add("a")
    queue.add("b")
    key = await queue.get()
    assert key == "a"
    for _ in range(3):
        queue.add("a")
    assert len(queue) == 1  # only b is ready
    queue.done("a")
    assert len(queue) == 2
    assert await drain(queue) == ["b", "a"]
    assert len(queue) == 0


async def test_4_done_for_a_key_not_being_processed_is_a_bug() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add("a")
    with pytest.raises(ValueError, match="not being processed"):
        queue.done("a")


# 5. Delayed adds -------------------------------------------------------------


async def test_5_add_after_queues_the_key_when_the_delay_has_passed() -> None:
    loop = asyncio.get_running_loop()
    queue: WorkQueue[str] = WorkQueue()
    start = loop.time()
    queue.add_after("a", 10)
    assert len(queue) == 0
    assert queue.num_waiting() == 1
    assert await queue.get() == "a"
    assert loop.time() - start == pytest.approx(10)


async def test_5_add_after_with_no_delay_is_add() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add_after("a", 0)
    queue.add_after("b", -1)
    assert len(queue) == 2


async def test_5_pending_delayed_adds_of_one_key_collapse_into_the_earliest() -> None:
    metrics = Metrics()
    loop = asyncio.get_running_loop()
    queue: WorkQueue[str] = WorkQueue("q", metrics=metrics)
    start = loop.time()
    queue.add_after("a", 10)
    queue.add_after("a", 5)
    queue.add_after("a", 20)
    assert await queue.get() == "a"
    assert loop.time() - start == pytest.approx(5)
    queue.done("a")
    assert await nothing_within(queue, 100)
    assert sample(metrics, "workqueue_adds_total", name="q") == 1


async def test_5_delayed_adds_come_out_in_due_order() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add_after("late", 3)
    queue.add_after("early", 1)
    queue.add_after("middle", 2)
    got = []
    for _ in range(3):
        key = await queue.get()
        queue.done(key)
        got.append(key)
    assert got == ["early", "middle", "late"]


# 6. Per-key backoff ------------------------------------------------------------


def test_6_per_key_backoff_doubles_from_5ms_caps_at_1000s_and_forget_resets() -> None:
    backoff: ExponentialBackoff[str] = ExponentialBackoff()
    delays = [backoff.when("a", 0.0) for _ in range(20)]
    assert delays[:4] == [0.005, 0.01, 0.02, 0.04]
    assert delays[17] == pytest.approx(0.005 * 2**17)  # 655 s
    assert delays[18] == 1000.0
    assert backoff.when("b", 0.0) == 0.005  # per key
    assert backoff.num_requeues("a") == 20
    backoff.forget("a")
    assert backoff.num_requeues("a") == 0
    assert backoff.when("a", 0.0) == 0.005
    for _ in range(500):  # no overflow far past the cap
        backoff.when("c", 0.0)
    assert backoff.when("c", 0.0) == 1000.0


async def test_6_add_rate_limited_waits_the_key_backoff_and_counts_retries() -> None:
    metrics = Metrics()
    loop = asyncio.get_running_loop()
    queue: WorkQueue[str] = WorkQueue("q", metrics=metrics)
    waits = []
    for _ in range(4):
        start = loop.time()
        queue.add_rate_limited("a")
        key = await queue.get()
        waits.append(loop.time() - start)
        queue.done(key)
    # looptime's clock ticks in microseconds, hence the absolute tolerance.
    assert waits == pytest.approx([0.005, 0.01, 0.02, 0.04], abs=1e-5)
    assert queue.num_requeues("a") == 4
    assert sample(metrics, "workqueue_retries_total", name="q") == 4
    queue.forget("a")
    assert queue.num_requeues("a") == 0
    start = loop.time()
    queue.add_rate_limited("a")
    await queue.get()
    assert loop.time() - start == pytest.approx(0.005, abs=1e-5)


# 7. Global token bucket ----------------------------------------------------------


def test_7_token_bucket_allows_a_burst_then_the_rate() -> None:
    bucket: TokenBucket[str] = TokenBucket(qps=10, burst=100)
    assert [bucket.when(str(i), 0.0) for i in range(100)] == [0.0] * 100
    assert bucket.when("x", 0.0) == pytest.approx(0.1)
    assert bucket.when("y", 0.0) == pytest.approx(0.2)
    # One second later ten tokens came back, two of which were already owed.
    assert [bucket.when(str(i), 1.0) for i in range(8)] == [0.0] * 8
    assert bucket.when("z", 1.0) == pytest.approx(0.1)


def test_7_token_bucket_never_holds_more_than_its_burst() -> None:
    bucket: TokenBucket[str] = TokenBucket(qps=1, burst=2)
    assert bucket.when("a", 0.0) == 0.0
    assert bucket.when("a", 1000.0) == 0.0
    assert bucket.when("a", 1000.0) == 0.0
    assert bucket.when("a", 1000.0) == pytest.approx(1.0)


def test_7_default_limiter_is_the_max_of_backoff_and_bucket() -> None:
    limiter: MaxOf[str] = default_rate_limiter(qps=1, burst=1)
    assert limiter.when("a", 0.0) == 0.005  # token free, backoff 5 ms
    assert limiter.when("b", 0.0) == pytest.approx(1.0)  # bucket empty
    limiter.forget("a")
    assert limiter.num_requeues("a") == 0
    assert limiter.num_requeues("b") == 1


async def test_7_rate_limited_adds_of_different_keys_share_the_bucket() -> None:
    loop = asyncio.get_running_loop()
    queue: WorkQueue[str] = WorkQueue(rate_limiter=default_rate_limiter(qps=1, burst=2))
    start = loop.time()
    for key in ["a", "b", "c", "d"]:
        queue.add_rate_limited(key)
    times = {}
    for _ in range(4):
        key = await queue.get()
        times[key] = loop.time() - start
        queue.done(key)
    assert times == pytest.approx({"a": 0.005, "b": 0.005, "c": 1.0, "d": 2.0}, abs=1e-5)


async def test_7_plain_and_delayed_adds_are_not_rate_limited() -> None:
    queue: WorkQueue[str] = WorkQueue(rate_limiter=default_rate_limiter(qps=1, burst=1))
    queue.add_rate_limited("x")  # empties the bucket
    for i in range(50):
        queue.add(f"k{i}")
    assert len(queue) == 50


def test_rate_limiters_reject_nonsense() -> None:
    with pytest.raises(ValueError, match="qps"):
        TokenBucket(qps=0)
    with pytest.raises(ValueError, match="burst"):
        TokenBucket(burst=0)
    with pytest.raises(ValueError, match="base_delay"):
        ExponentialBackoff(base_delay=0)
    with pytest.raises(ValueError, match="at least one"):
        MaxOf()


# 8. Resync at low priority ---------------------------------------------------------


async def test_8_resync_fires_after_the_delay_and_restarts_its_clock() -> None:
    loop = asyncio.get_running_loop()
    queue: WorkQueue[str] = WorkQueue()
    start = loop.time()
    queue.resync_after("a", 300)
    await asyncio.sleep(100)
    queue.resync_after("a", 300)  # e.g. reconciled again because of a real change
    assert await nothing_within(queue, 299)
    assert await queue.get() == "a"
    assert loop.time() - start == pytest.approx(400)


async def test_8_real_changes_overtake_a_due_resync() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.resync_after("old", 1)
    await asyncio.sleep(2)
    assert len(queue) == 1
    queue.add("x")
    queue.add("y")
    assert await drain(queue) == ["x", "y", "old"]


async def test_8_a_due_resync_of_a_queued_key_is_a_noop() -> None:
    metrics = Metrics()
    queue: WorkQueue[str] = WorkQueue("q", metrics=metrics)
    queue.add("a")
    queue.add("b")
    queue.resync_after("a", 1)
    await asyncio.sleep(2)
    assert len(queue) == 2
    assert await drain(queue) == ["a", "b"]  # a kept its normal place
    assert sample(metrics, "workqueue_adds_total", name="q") == 2


async def test_8_a_normal_add_promotes_a_key_waiting_at_low_priority() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.resync_after("c", 1)
    queue.resync_after("a", 1.5)
    await asyncio.sleep(2)  # low lane: c, a
    queue.add("b")
    queue.add("a")
    assert len(queue) == 3
    assert await drain(queue) == ["b", "a", "c"]


async def test_8_a_normal_readd_while_processing_lifts_a_pending_low_priority_requeue() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add("a")
    key = await queue.get()
    queue.resync_after("c", 1)
    queue.resync_after("a", 1.5)
    await asyncio.sleep(2)  # c queued low, a dirty low while processing
    queue.add("a")  # a real change while processing
    queue.done(key)
    assert await drain(queue) == ["a", "c"]


async def test_8_a_resync_due_while_processing_comes_back_at_low_priority() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add("a")
    key = await queue.get()
    queue.resync_after("a", 1)
    await asyncio.sleep(2)
    queue.add("b")
    queue.done(key)
    assert await drain(queue) == ["b", "a"]


async def test_8_resync_and_a_delayed_add_of_one_key_do_not_replace_each_other() -> None:
    loop = asyncio.get_running_loop()
    queue: WorkQueue[str] = WorkQueue()
    start = loop.time()
    queue.add_after("a", 5)
    queue.resync_after("a", 50)
    times = []
    for _ in range(2):
        key = await queue.get()
        times.append(loop.time() - start)
        queue.done(key)
    assert times == pytest.approx([5, 50])


async def test_8_cancel_resync_drops_the_pending_resync() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.resync_after("a", 1)
    queue.cancel_resync("a")
    assert await nothing_within(queue, 10)
    assert queue.num_waiting() == 0


# 9. Shutdown -------------------------------------------------------------------


async def test_9_after_shutdown_queued_keys_are_served_then_getters_get_shutdown() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add("a")
    queue.add("b")
    queue.add_after("later", 5)
    queue.resync_after("resync", 5)
    queue.shut_down()
    queue.add("c")
    queue.add_after("d", 1)
    queue.add_rate_limited("e")
    queue.resync_after("f", 1)
    assert queue.shutting_down
    assert queue.num_waiting() == 0
    assert await drain(queue) == ["a", "b"]
    await asyncio.sleep(10)
    with pytest.raises(ShutDown):
        await queue.get()


async def test_9_shutdown_wakes_getters_that_are_waiting() -> None:
    queue: WorkQueue[str] = WorkQueue()
    getters = [asyncio.create_task(queue.get()) for _ in range(3)]
    await asyncio.sleep(1)
    queue.shut_down()
    results = await asyncio.gather(*getters, return_exceptions=True)
    assert all(isinstance(r, ShutDown) for r in results)


async def test_9_shutdown_with_drain_waits_for_keys_being_processed() -> None:
    loop = asyncio.get_running_loop()
    queue: WorkQueue[str] = WorkQueue()
    queue.add("a")
    key = await queue.get()
    loop.call_later(7, queue.done, key)
    start = loop.time()
    await queue.shut_down_with_drain()
    assert loop.time() - start == pytest.approx(7)
    assert queue.num_processing() == 0


# 10. Many producers and consumers --------------------------------------------------


async def test_10_many_producers_and_consumers_process_every_key_after_its_last_add() -> None:
    queue: WorkQueue[int] = WorkQueue()
    rng = random.Random(3)
    last_add: dict[int, float] = {}
    last_start: dict[int, float] = {}
    loop = asyncio.get_running_loop()

    async def producer() -> None:
        for _ in range(100):
            key = rng.randrange(20)
            last_add[key] = loop.time()
            if rng.random() < 0.3:
                queue.add_rate_limited(key)
            else:
                queue.add(key)
            await asyncio.sleep(rng.uniform(0, 0.05))

    async def consumer() -> None:
        async for key in handed_out(queue):
            last_start[key] = loop.time()
            await asyncio.sleep(rng.uniform(0, 0.2))
            queue.done(key)

    consumers = [asyncio.create_task(consumer()) for _ in range(3)]
    await asyncio.gather(*(producer() for _ in range(5)))
    await asyncio.sleep(60)  # longer than any backoff reached here
    await queue.shut_down_with_drain()
    await asyncio.gather(*consumers)
    assert last_add.keys() == last_start.keys()
    assert all(last_start[key] >= last_add[key] for key in last_add)


# 11. Batched adds ------------------------------------------------------------------


async def test_11_batched_adds_of_an_idle_key_come_together_after_the_first_delay() -> None:
    queue: WorkQueue[str] = WorkQueue()
    loop = asyncio.get_running_loop()
    start = loop.time()
    queue.add_batched("a", 1.0)
    await asyncio.sleep(0.4)
    queue.add_batched("a", 1.0)  # within the first one's second: the same pass
    await asyncio.sleep(0.4)
    queue.add_batched("a", 1.0)
    assert await queue.get() == "a"
    assert loop.time() - start == pytest.approx(1.0)
    queue.done("a")
    assert await nothing_within(queue, 10)


async def test_11_a_batched_add_of_a_key_waiting_to_be_handed_out_adds_no_pass() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add("a")
    queue.add_batched("a", 1.0)  # the queued pass comes after this change
    assert await drain(queue) == ["a"]
    assert queue.num_waiting() == 0
    assert await nothing_within(queue, 10)


async def test_11_a_batched_add_while_processing_and_re_added_adds_no_pass() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add("a")
    key = await queue.get()
    queue.add(key)  # dirty: a pass after this one is due already
    queue.add_batched(key, 1.0)
    queue.done(key)
    assert await drain(queue) == ["a"]
    assert await nothing_within(queue, 10)


async def test_11_a_batched_add_while_processing_comes_after_its_delay() -> None:
    queue: WorkQueue[str] = WorkQueue()
    loop = asyncio.get_running_loop()
    queue.add("a")
    key = await queue.get()
    start = loop.time()
    queue.add_batched(key, 1.0)  # the running pass may have read the caches before it
    queue.done(key)
    assert await queue.get() == "a"
    assert loop.time() - start == pytest.approx(1.0)
    queue.done("a")


async def test_11_a_key_waiting_only_for_its_resync_still_gets_the_batched_pass() -> None:
    queue: WorkQueue[str] = WorkQueue()
    loop = asyncio.get_running_loop()
    queue.resync_after("a", 0.1)
    await asyncio.sleep(0.2)  # "a" waits in the low lane
    queue.add("b")
    start = loop.time()
    queue.add_batched("a", 1.0)
    assert await queue.get() == "b"
    queue.done("b")
    # "a" was handed out from its resync...
    assert await queue.get() == "a"
    queue.done("a")
    # ...and the change comes once more, a second later: a resync is no pass of it.
    assert await queue.get() == "a"
    assert loop.time() - start == pytest.approx(1.0)
    queue.done("a")


# Metrics ---------------------------------------------------------------------------


async def test_metrics_use_client_go_names_and_fake_time() -> None:
    metrics = Metrics()
    queue: WorkQueue[str] = WorkQueue("runs", metrics=metrics)
    queue.add("a")
    queue.add("b")
    assert sample(metrics, "workqueue_depth", name="runs") == 2
    await asyncio.sleep(3)
    key = await queue.get()
    assert sample(metrics, "workqueue_depth", name="runs") == 1
    assert sample(metrics, "workqueue_queue_duration_seconds_sum", name="runs") == pytest.approx(3)
    await asyncio.sleep(4)
    assert sample(metrics, "workqueue_unfinished_work_seconds", name="runs") == pytest.approx(4)
    other = await queue.get()
    await asyncio.sleep(1)
    assert sample(metrics, "workqueue_unfinished_work_seconds", name="runs") == pytest.approx(6)
    assert sample(
        metrics, "workqueue_longest_running_processor_seconds", name="runs"
    ) == pytest.approx(5)
    queue.done(key)
    queue.done(other)
    assert sample(metrics, "workqueue_work_duration_seconds_count", name="runs") == 2
    assert sample(metrics, "workqueue_work_duration_seconds_sum", name="runs") == pytest.approx(6)
    assert sample(metrics, "workqueue_unfinished_work_seconds", name="runs") == 0
    queue.add_rate_limited("c")
    assert sample(metrics, "workqueue_retries_total", name="runs") == 1
    exported = {
        sample.name
        for family in metrics.registry.collect()
        for sample in family.samples
        if sample.labels.get("name") == "runs"
    }
    assert {
        "workqueue_depth",
        "workqueue_adds_total",
        "workqueue_queue_duration_seconds_bucket",
        "workqueue_work_duration_seconds_bucket",
        "workqueue_retries_total",
        "workqueue_unfinished_work_seconds",
        "workqueue_longest_running_processor_seconds",
    } <= exported
    assert "workqueue_depth" in generate_latest(metrics.registry).decode()
