"""Workers: drain the work queue into a reconcile function (sample-controller's runWorker).

For each key a worker takes from the queue (controller-runtime's
reconcileHandler, in asyncio):

- ``reconcile(key)`` runs with ``run=<key>`` bound to every log line;
- it returns :class:`Result` (or None): success, so the key's backoff is
  forgotten, and with ``requeue_after`` the key comes back after that delay;
  with ``requeue=True`` it lost a normal race (AlreadyExists, Conflict,
  NotFound): the key comes back rate-limited, as controller-runtime's
  ``Requeue: true``, without counting an error;
- it raises :class:`TerminalError`: retrying cannot help (say, an invalid
  spec that only an edit fixes), so the key is forgotten, not requeued;
- it raises anything else: the key is requeued with per-key exponential
  backoff (``add_rate_limited``);
- in every case, when ``resync_period`` is set and ``should_resync(key)``
  (e.g. the run is still in the cache), a low-priority resync is scheduled
  ``resync_period`` from now: every key is looked at every POLLING_INTERVAL
  even when nothing happens, and real changes overtake the resync;
- finally ``done(key)``, so a key re-added while it was processed comes back.

Metrics: ``controller_runtime_reconcile_total{result}``,
``controller_runtime_reconcile_errors_total``,
``controller_runtime_terminal_reconcile_errors_total``,
``controller_runtime_reconcile_panics_total`` (an exception that is not an
:class:`ApiError`: a bug, not the API's weather),
``controller_runtime_reconcile_time_seconds``,
``controller_runtime_active_workers``,
``controller_runtime_max_concurrent_reconciles``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog

from kubeclient.errors import ApiError
from kubeclient.instruments import NO_METRICS, KubeMetrics, labelled
from kubeclient.workqueue import ShutDown, WorkQueue

log = structlog.stdlib.get_logger(__name__)


@dataclass(frozen=True)
class Result:
    """What should happen next to a key that reconciled without error."""

    requeue_after: float | None = None
    # Look again soon, rate-limited (a lost race, not an error).
    requeue: bool = False


class TerminalError(Exception):
    """A reconcile failure that retrying cannot fix: logged, counted, not requeued."""


Reconcile = Callable[[str], Awaitable[Result | None]]


class Workers:
    """``workers`` tasks draining ``queue`` into ``reconcile``."""

    def __init__(
        self,
        queue: WorkQueue[str],
        reconcile: Reconcile,
        *,
        workers: int = 1,
        name: str = "inferencerun",
        metrics: KubeMetrics | None = None,
        resync_period: float | None = None,
        should_resync: Callable[[str], bool] = lambda _key: True,
        log_key: str = "run",
    ) -> None:
        if workers < 1:
            raise ValueError(f"need at least one worker, got {workers}")
        if resync_period is not None and resync_period <= 0:
            raise ValueError(f"resync_period must be positive, got {resync_period}")
        self.queue = queue
        self.reconcile = reconcile
        self.workers = workers
        self.name = name
        self.resync_period = resync_period
        self.should_resync = should_resync
        self.log_key = log_key
        self._metrics = NO_METRICS if metrics is None else metrics
        self._metrics.init_controller(name, workers)

    async def run(self) -> None:
        """Run the workers until the queue is shut down and drained (or until cancelled)."""
        async with asyncio.TaskGroup() as group:
            for i in range(self.workers):
                group.create_task(self._worker(), name=f"{self.name} worker {i}")

    async def _worker(self) -> None:
        while await self.process_next_item():
            pass

    async def process_next_item(self) -> bool:
        """Process one key; False once the queue is shut down and empty."""
        try:
            key = await self.queue.get()
        except ShutDown:
            return False
        loop = asyncio.get_running_loop()
        started = loop.time()
        result_label: str | None = None  # stays None if cancelled mid-reconcile
        self._active(+1)
        try:
            with structlog.contextvars.bound_contextvars(**{self.log_key: key}):
                try:
                    result = await self.reconcile(key)
                except TerminalError as exc:
                    result_label = "terminal_error"
                    self.queue.forget(key)
                    log.error("reconcile failed for good", error=str(exc))
                except Exception as exc:
                    result_label = "error"
                    if not isinstance(exc, ApiError):
                        # Not the API's weather but a bug: controller-runtime's
                        # reconcile_panics_total counts its equivalent (a panic).
                        self._panicked()
                    self.queue.add_rate_limited(key)
                    log.warning(
                        "reconcile failed, retrying",
                        error=str(exc) or type(exc).__name__,
                        retries=self.queue.num_requeues(key),
                        # API errors are expected weather: no stack trace for them.
                        exc_info=not isinstance(exc, ApiError),
                    )
                else:
                    result_label = "success"
                    if result is not None and result.requeue:
                        result_label = "requeue"
                        self.queue.add_rate_limited(key)
                    else:
                        self.queue.forget(key)
                    if result is not None and result.requeue_after is not None:
                        result_label = "requeue_after"
                        self.queue.add_after(key, result.requeue_after)
                if self.resync_period is not None and self.should_resync(key):
                    self.queue.resync_after(key, self.resync_period)
        finally:
            self._active(-1)
            self.queue.done(key)
            if result_label is not None:
                self._observe(result_label, loop.time() - started)
        return True

    def _panicked(self) -> None:
        labelled(self._metrics.reconcile_panics_total, controller=self.name).inc()

    def _active(self, delta: int) -> None:
        labelled(self._metrics.active_workers, controller=self.name).inc(delta)

    def _observe(self, result: str, seconds: float) -> None:
        m = self._metrics
        labelled(m.reconcile_total, controller=self.name, result=result).inc()
        labelled(m.reconcile_time_seconds, controller=self.name).observe(seconds)
        if result == "error":
            labelled(m.reconcile_errors_total, controller=self.name).inc()
        elif result == "terminal_error":
            labelled(m.reconcile_errors_total, controller=self.name).inc()
            labelled(m.terminal_reconcile_errors_total, controller=self.name).inc()
