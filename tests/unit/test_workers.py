"""The worker loop (kubeclient/workers.py) on fake loop time."""

from __future__ import annotations

import asyncio

import pytest
import structlog

from controller.metrics import Metrics
from kubeclient.errors import ApiError
from kubeclient.workers import Result, TerminalError, Workers
from kubeclient.workqueue import WorkQueue

pytestmark = [pytest.mark.unit, pytest.mark.looptime]


def sample(metrics: Metrics, metric: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(metric, labels) or 0.0


class Script:
    """A reconcile function that answers from a per-key script and records its calls."""

    def __init__(self, *answers: object) -> None:
        self.answers = list(answers)
        self.calls: list[tuple[str, float, dict[str, object]]] = []

    async def __call__(self, key: str) -> Result | None:
        loop = asyncio.get_running_loop()
        self.calls.append((key, loop.time(), structlog.contextvars.get_contextvars()))
        answer = self.answers.pop(0) if self.answers else None
        if isinstance(answer, BaseException):
            raise answer
        if isinstance(answer, int | float):
            await asyncio.sleep(answer)
            return None
        assert answer is None or isinstance(answer, Result)
        return answer


async def run_for(workers: Workers, seconds: float) -> None:
    task = asyncio.create_task(workers.run())
    await asyncio.sleep(seconds)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_success_forgets_the_backoff_and_binds_the_run_key() -> None:
    metrics = Metrics()
    queue: WorkQueue[str] = WorkQueue("q")
    reconcile = Script(None)
    queue.add_rate_limited("ns/a")  # one earlier failure
    workers = Workers(queue, reconcile, metrics=metrics, name="c")
    await run_for(workers, 1)
    assert [call[0] for call in reconcile.calls] == ["ns/a"]
    assert reconcile.calls[0][2] == {"run": "ns/a"}
    assert queue.num_requeues("ns/a") == 0
    assert (
        sample(metrics, "controller_runtime_reconcile_total", controller="c", result="success") == 1
    )
    assert sample(metrics, "controller_runtime_reconcile_time_seconds_count", controller="c") == 1
    assert sample(metrics, "controller_runtime_max_concurrent_reconciles", controller="c") == 1


async def test_errors_are_retried_with_per_key_backoff() -> None:
    metrics = Metrics()
    queue: WorkQueue[str] = WorkQueue("q")
    reconcile = Script(RuntimeError("boom"), ApiError(409, "Conflict"), None)
    queue.add("ns/a")
    workers = Workers(queue, reconcile, metrics=metrics, name="c")
    await run_for(workers, 5)
    times = [call[1] for call in reconcile.calls]
    assert len(times) == 3
    assert times[1] - times[0] == pytest.approx(0.005, abs=1e-5)
    assert times[2] - times[1] == pytest.approx(0.010, abs=1e-5)
    assert queue.num_requeues("ns/a") == 0  # forgotten after the success
    assert (
        sample(metrics, "controller_runtime_reconcile_total", controller="c", result="error") == 2
    )
    assert sample(metrics, "controller_runtime_reconcile_errors_total", controller="c") == 2


async def test_terminal_errors_are_not_retried() -> None:
    metrics = Metrics()
    queue: WorkQueue[str] = WorkQueue("q")
    reconcile = Script(TerminalError("spec.configRef is missing"))
    queue.add("ns/a")
    workers = Workers(queue, reconcile, metrics=metrics, name="c")
    await run_for(workers, 3600)
    assert len(reconcile.calls) == 1
    assert (
        sample(metrics, "controller_runtime_terminal_reconcile_errors_total", controller="c") == 1
    )
    assert (
        sample(
            metrics, "controller_runtime_reconcile_total", controller="c", result="terminal_error"
        )
        == 1
    )


async def test_requeue_after_brings_the_key_back_after_the_delay() -> None:
    queue: WorkQueue[str] = WorkQueue("q")
    reconcile = Script(Result(requeue_after=30), None)
    queue.add("ns/a")
    await run_for(Workers(queue, reconcile), 100)
    times = [call[1] for call in reconcile.calls]
    assert len(times) == 2
    assert times[1] - times[0] == pytest.approx(30)


async def test_every_key_is_resynced_every_period_while_it_exists() -> None:
    queue: WorkQueue[str] = WorkQueue("q")
    reconcile = Script()
    existing = {"ns/a"}
    queue.add("ns/a")
    queue.add("ns/gone")
    workers = Workers(
        queue, reconcile, resync_period=300, should_resync=lambda key: key in existing
    )
    await run_for(workers, 1000)
    a_times = [t for key, t, _ in reconcile.calls if key == "ns/a"]
    assert [round(t - a_times[0]) for t in a_times] == [0, 300, 600, 900]
    assert [key for key, _, _ in reconcile.calls].count("ns/gone") == 1


async def test_a_real_change_restarts_the_resync_clock() -> None:
    queue: WorkQueue[str] = WorkQueue("q")
    reconcile = Script()
    queue.add("ns/a")
    workers = Workers(queue, reconcile, resync_period=300)
    task = asyncio.create_task(workers.run())
    await asyncio.sleep(100)
    queue.add("ns/a")  # an event at t=100
    await asyncio.sleep(350)
    task.cancel()
    times = [round(t) for _, t, _ in reconcile.calls]
    start = times[0]
    assert [t - start for t in times] == [0, 100, 400]


async def test_workers_run_concurrently_but_never_on_the_same_key() -> None:
    metrics = Metrics()
    queue: WorkQueue[str] = WorkQueue("q")
    running: set[str] = set()
    overlaps = []
    peak = 0

    async def reconcile(key: str) -> None:
        nonlocal peak
        if key in running:
            overlaps.append(key)
        running.add(key)
        peak = max(peak, len(running))
        await asyncio.sleep(10)
        running.discard(key)

    for key in ["a", "b", "c", "d", "e"]:
        queue.add(key)
    queue_task = asyncio.create_task(Workers(queue, reconcile, workers=2, metrics=metrics).run())
    await asyncio.sleep(5)
    queue.add("a")  # re-added while being processed
    assert sample(metrics, "controller_runtime_active_workers", controller="inferencerun") == 2
    await asyncio.sleep(100)
    queue_task.cancel()
    assert peak == 2
    assert overlaps == []
    assert (
        sample(
            metrics,
            "controller_runtime_reconcile_total",
            controller="inferencerun",
            result="success",
        )
        == 6
    )


async def test_workers_stop_when_the_queue_is_shut_down_and_drained() -> None:
    queue: WorkQueue[str] = WorkQueue("q")
    reconcile = Script(1, 1)
    queue.add("a")
    queue.add("b")
    queue.shut_down()
    await asyncio.wait_for(Workers(queue, reconcile).run(), timeout=10)
    assert [key for key, _, _ in reconcile.calls] == ["a", "b"]


async def test_cancelling_a_reconcile_marks_its_key_done() -> None:
    queue: WorkQueue[str] = WorkQueue("q")
    reconcile = Script(1000)
    queue.add("a")
    await run_for(Workers(queue, reconcile), 1)
    assert queue.num_processing() == 0


def test_nonsense_is_rejected() -> None:
    queue: WorkQueue[str] = WorkQueue("q")
    with pytest.raises(ValueError, match="at least one worker"):
        Workers(queue, Script(), workers=0)
    with pytest.raises(ValueError, match="resync_period"):
        Workers(queue, Script(), resync_period=0)
