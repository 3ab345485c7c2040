"""A rate-limited work queue with client-go's contract, for asyncio.

Contract (each numbered line has its own test in tests/unit/test_workqueue.py):

1. Fair: keys are handed out in the order they were added (FIFO).
2. Stingy: a key is held at most once; adding a key that is already queued is
   a no-op and keeps its place.
3. Exclusive: between ``get()`` returning a key and ``done(key)``, that key is
   not handed out again, so no key is ever processed by two workers at once.
4. Re-add while processing: adding a key that is being processed marks it
   dirty; ``done(key)`` then queues it again at the tail, so it is processed
   once more, after the current pass (however many times it was re-added).
5. Delayed adds: ``add_after(key, delay)`` adds the key once ``delay`` seconds
   have passed (``delay <= 0`` is ``add``). Pending delayed adds of one key
   collapse into the earliest.
6. Per-key backoff: ``add_rate_limited(key)`` adds the key after
   ``max(per-key backoff, global token bucket delay)``. The per-key backoff is
   5 ms * 2**n, where n counts the key's rate-limited adds since the last
   ``forget(key)``, capped at 1000 s; ``forget(key)`` resets n to 0.
7. Global token bucket: every rate-limited add takes a token from one bucket
   shared by all keys (10 tokens/s, burst 100 by default, configurable); when
   it is empty the add waits for its token. Plain and delayed adds are not
   rate-limited. (Lines 6 and 7 are ``default_rate_limiter`` of
   ``kubeclient.ratelimit``; any ``RateLimiter`` can be given instead.)
8. Resync at low priority: ``resync_after(key, delay)`` schedules a periodic
   requeue. It replaces the key's previous pending resync (the clock restarts
   from the latest call), and when due it is a no-op if the key is already
   queued or dirty; otherwise the key waits behind every normal-priority key,
   so real changes overtake it. A normal add of a key that waits at low
   priority promotes it to the normal lane (at the tail).
9. Shutdown: after ``shut_down()`` adds are ignored and pending delayed adds
   and resyncs are dropped; ``get()`` still hands out keys already queued, then
   raises :class:`ShutDown` to every waiting and later caller.
   ``shut_down_with_drain()`` also waits until every key being processed is
   ``done``.
10. Many producers and consumers: any number of tasks may add, get and done
    concurrently (one event loop; adds are plain synchronous calls, so event
    handlers can enqueue without awaiting).
11. Batched adds: ``add_batched(key, delay)`` is ``add_after(key, delay)``,
    except when the key is already waiting at normal priority to be handed out
    (queued, or re-added while processing): that coming pass reads the caches
    after this change, so nothing more is scheduled. Changes that come close
    together then cost one pass, not one each (the Kubernetes Job controller
    batches its pod events the same way, for 1 s).

The mechanism is client-go's: a FIFO per priority, a ``dirty`` map (keys that
need processing, with their priority) and a ``processing`` set; delays are a
heap served by one loop timer (``loop.call_at``), so there is no background
task and fake loop time (looptime) drives every delay in tests.

Metrics (client-go's names, labelled ``name``): ``workqueue_depth``,
``workqueue_adds_total``, ``workqueue_queue_duration_seconds``,
``workqueue_work_duration_seconds``, ``workqueue_retries_total``,
``workqueue_unfinished_work_seconds``,
``workqueue_longest_running_processor_seconds``.
"""

from __future__ import annotations

import asyncio
import enum
import heapq
import itertools
from collections import deque
from collections.abc import Hashable
from typing import Generic, TypeVar

from kubeclient.instruments import NO_METRICS, KubeMetrics, labelled
from kubeclient.ratelimit import RateLimiter, default_rate_limiter

K = TypeVar("K", bound=Hashable)


class ShutDown(Exception):
    """Raised by :meth:`WorkQueue.get` once the queue is shut down and empty."""


class Priority(enum.IntEnum):
    """Lanes of the queue: every NORMAL key is handed out before any LOW one."""

    LOW = 0
    NORMAL = 1


class _Timing:
    """Workqueue metrics for one queue (on NO_METRICS when the queue is given none)."""

    def __init__(self, metrics: KubeMetrics, name: str) -> None:
        self._metrics = metrics
        self._name = name

    def depth(self, value: int) -> None:
        labelled(self._metrics.workqueue_depth, name=self._name).set(value)

    def added(self) -> None:
        labelled(self._metrics.workqueue_adds_total, name=self._name).inc()

    def retried(self) -> None:
        labelled(self._metrics.workqueue_retries_total, name=self._name).inc()

    def queued_for(self, seconds: float) -> None:
        labelled(self._metrics.workqueue_queue_duration_seconds, name=self._name).observe(seconds)

    def worked_for(self, seconds: float) -> None:
        labelled(self._metrics.workqueue_work_duration_seconds, name=self._name).observe(seconds)


class WorkQueue(Generic[K]):
    """The queue whose contract is the module docstring."""

    def __init__(
        self,
        name: str = "default",
        *,
        rate_limiter: RateLimiter[K] | None = None,
        metrics: KubeMetrics | None = None,
    ) -> None:
        self.name = name
        self.rate_limiter: RateLimiter[K] = (
            rate_limiter if rate_limiter is not None else default_rate_limiter()
        )
        self._seq = itertools.count()
        # FIFO lanes hold (seq, key); an entry is live only while
        # _queued[key] == (lane, seq), so a promoted key leaves a dead entry
        # behind instead of an O(n) removal.
        self._lanes: dict[Priority, deque[tuple[int, K]]] = {p: deque() for p in Priority}
        self._queued: dict[K, tuple[Priority, int]] = {}
        # Keys that need processing (queued, or re-added while processing), by priority.
        self._dirty: dict[K, Priority] = {}
        self._processing: dict[K, float] = {}  # key -> start time
        self._enqueued_at: dict[K, float] = {}
        # Delays: one pending normal add and one pending resync per key; heap
        # entries that no longer match these maps are skipped.
        self._waiting: dict[K, tuple[float, int]] = {}
        self._resync_waiting: dict[K, tuple[float, int]] = {}
        self._heap: list[tuple[float, int, Priority, K]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._getters: list[asyncio.Future[None]] = []
        self._drained: list[asyncio.Future[None]] = []
        self._shutting_down = False
        self._loop: asyncio.AbstractEventLoop | None = None
        if metrics is None:
            metrics = NO_METRICS
        self._timing = _Timing(metrics, name)
        metrics.workqueue_unfinished_work_seconds.labels(name=name).set_function(
            self._unfinished_work_seconds
        )
        metrics.workqueue_longest_running_processor_seconds.labels(name=name).set_function(
            self._longest_running_seconds
        )

    # ------------------------------------------------------------------ state

    def __len__(self) -> int:
        """Keys queued and ready to be handed out (``workqueue_depth``)."""
        return len(self._queued)

    @property
    def shutting_down(self) -> bool:
        return self._shutting_down

    def is_processing(self, key: K) -> bool:
        return key in self._processing

    def num_processing(self) -> int:
        return len(self._processing)

    def num_waiting(self) -> int:
        """Keys with a pending delayed add or resync."""
        return len(self._waiting.keys() | self._resync_waiting.keys())

    def num_requeues(self, key: K) -> int:
        return self.rate_limiter.num_requeues(key)

    # ------------------------------------------------------------------- adds

    def add(self, key: K) -> None:
        """Queue ``key`` now at normal priority (lines 1, 2, 4, 8)."""
        self._add(key, Priority.NORMAL)

    def add_after(self, key: K, delay: float) -> None:
        """Queue ``key`` at normal priority after ``delay`` seconds (line 5)."""
        self._schedule(self._waiting, key, delay, Priority.NORMAL, keep_sooner=True)

    def add_batched(self, key: K, delay: float) -> None:
        """Queue ``key`` after ``delay`` seconds unless a pass of it is already due (line 11)."""
        if self._dirty.get(key) is Priority.NORMAL:
            return
        self.add_after(key, delay)

    def add_rate_limited(self, key: K) -> None:
        """Queue ``key`` after its backoff and a token from the global bucket (lines 6, 7)."""
        if self._shutting_down:
            return
        self._timing.retried()
        self.add_after(key, self.rate_limiter.when(key, self._now()))

    def forget(self, key: K) -> None:
        """The key was processed successfully: reset its backoff (line 6)."""
        self.rate_limiter.forget(key)

    def resync_after(self, key: K, delay: float) -> None:
        """Requeue ``key`` at low priority after ``delay`` seconds; restarts its clock (line 8)."""
        self._schedule(self._resync_waiting, key, delay, Priority.LOW, keep_sooner=False)

    def cancel_resync(self, key: K) -> None:
        """Drop the key's pending resync (e.g. its object was deleted)."""
        self._resync_waiting.pop(key, None)

    # ------------------------------------------------------------ processing

    async def get(self) -> K:
        """The next key to process; the caller must call ``done(key)`` afterwards.

        Raises :class:`ShutDown` once the queue is shut down and empty (line 9).
        """
        while True:
            key = self._pop()
            if key is not None:
                return key
            if self._shutting_down:
                raise ShutDown
            await self._woken(self._getters)

    def done(self, key: K) -> None:
        """Processing of ``key`` finished; requeue it if it was re-added meanwhile (line 4)."""
        started = self._processing.pop(key, None)
        if started is None:
            raise ValueError(f"done({key!r}) for a key that is not being processed")
        self._timing.worked_for(self._now() - started)
        priority = self._dirty.get(key)
        if priority is not None:
            self._push(key, priority)
        if not self._processing:
            _wake(self._drained)

    # --------------------------------------------------------------- shutdown

    def shut_down(self) -> None:
        """Stop accepting adds and drop pending delays; queued keys are still served (line 9)."""
        self._shutting_down = True
        self._waiting.clear()
        self._resync_waiting.clear()
        self._heap.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        _wake(self._getters)

    async def shut_down_with_drain(self) -> None:
        """``shut_down()``, then wait until no key is being processed."""
        self.shut_down()
        while self._processing:
            await self._woken(self._drained)

    # ---------------------------------------------------------------- private

    async def _woken(self, waiters: list[asyncio.Future[None]]) -> None:
        """Wait for the next ``_wake(waiters)``; the future is gone from ``waiters`` after."""
        waiter = self._get_loop().create_future()
        waiters.append(waiter)
        try:
            await waiter
        finally:
            if waiter in waiters:
                waiters.remove(waiter)

    def _add(self, key: K, priority: Priority) -> None:
        if self._shutting_down:
            return
        current = self._dirty.get(key)
        if current is not None:
            # Already queued (or re-added while processing): coalesce, but a
            # real change lifts a waiting resync into the normal lane.
            if priority > current:
                self._dirty[key] = priority
                if key in self._queued:
                    self._push(key, priority)
            return
        self._dirty[key] = priority
        self._timing.added()
        if key in self._processing:
            return
        self._push(key, priority)

    def _push(self, key: K, priority: Priority) -> None:
        seq = next(self._seq)
        self._queued[key] = (priority, seq)
        self._enqueued_at.setdefault(key, self._now())
        self._lanes[priority].append((seq, key))
        self._timing.depth(len(self._queued))
        _wake(self._getters)

    def _pop(self) -> K | None:
        for priority in (Priority.NORMAL, Priority.LOW):
            lane = self._lanes[priority]
            while lane:
                seq, key = lane.popleft()
                if self._queued.get(key) != (priority, seq):
                    continue  # dead entry left by a promotion
                del self._queued[key]
                del self._dirty[key]
                now = self._now()
                self._processing[key] = now
                self._timing.queued_for(now - self._enqueued_at.pop(key, now))
                self._timing.depth(len(self._queued))
                return key
        return None

    def _schedule(
        self,
        pending: dict[K, tuple[float, int]],
        key: K,
        delay: float,
        priority: Priority,
        *,
        keep_sooner: bool,
    ) -> None:
        """Add ``key`` after ``delay`` seconds (at once if not positive), noted in ``pending``.

        ``keep_sooner``: a pending add of the key that comes no later stands
        (add_after); without it the key's clock restarts (resync_after).
        """
        if self._shutting_down:
            return
        if delay <= 0:
            self._add(key, priority)
            return
        ready_at = self._now() + delay
        if keep_sooner and (waiting := pending.get(key)) is not None and waiting[0] <= ready_at:
            return
        seq = next(self._seq)
        pending[key] = (ready_at, seq)
        heapq.heappush(self._heap, (ready_at, seq, priority, key))
        self._arm()

    def _arm(self) -> None:
        """Point the single loop timer at the earliest live heap entry."""
        while self._heap and not self._is_live(self._heap[0]):
            heapq.heappop(self._heap)
        if not self._heap:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            return
        when = self._heap[0][0]
        if self._timer is not None:
            if self._timer.when() == when:
                return
            self._timer.cancel()
        self._timer = self._get_loop().call_at(when, self._fire)

    def _is_live(self, entry: tuple[float, int, Priority, K]) -> bool:
        ready_at, seq, priority, key = entry
        pending = self._waiting if priority is Priority.NORMAL else self._resync_waiting
        return pending.get(key) == (ready_at, seq)

    def _fire(self) -> None:
        self._timer = None
        now = self._now()
        while self._heap and self._heap[0][0] <= now:
            entry = heapq.heappop(self._heap)
            if not self._is_live(entry):
                continue
            _, _, priority, key = entry
            if priority is Priority.NORMAL:
                del self._waiting[key]
            else:
                del self._resync_waiting[key]
            self._add(key, priority)
        self._arm()

    def _get_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def _now(self) -> float:
        return self._get_loop().time()

    def _unfinished_work_seconds(self) -> float:
        if not self._processing or self._loop is None:
            return 0.0
        now = self._loop.time()
        return sum(now - started for started in self._processing.values())

    def _longest_running_seconds(self) -> float:
        if not self._processing or self._loop is None:
            return 0.0
        return self._loop.time() - min(self._processing.values())


def _wake(waiters: list[asyncio.Future[None]]) -> None:
    # Wake everybody: a woken getter that is cancelled before it runs must not
    # swallow the wake-up, and each getter re-checks the lanes anyway.
    for waiter in waiters:
        if not waiter.done():
            waiter.set_result(None)
