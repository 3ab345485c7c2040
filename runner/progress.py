"""Reporting the runner's progress while it predicts, as the lines of :mod:`contract.progress`."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from contract.progress import INTERVAL_SECONDS, Progress


class ProgressTracker:
    """Counts rows done and reports them at intervals through ``emit``."""

    def __init__(
        self,
        rows_total: int,
        emit: Callable[[Progress], None],
        interval: float = INTERVAL_SECONDS,
    ) -> None:
        self.rows_total = rows_total
        self.rows_done = 0
        self._emit = emit
        self._interval = interval
        self._last_emitted: Progress | None = None

    def advance(self, rows: int) -> None:
        self.rows_done += rows

    def snapshot(self) -> Progress:
        return Progress(rows_done=self.rows_done, rows_total=self.rows_total)

    def report(self) -> None:
        """Emit the current progress unless it is what was emitted last."""
        snapshot = self.snapshot()
        if snapshot != self._last_emitted:
            self._emit(snapshot)
            self._last_emitted = snapshot

    async def report_periodically(self) -> None:
        """Run until cancelled; the caller reports the final state itself."""
        while True:
            await asyncio.sleep(self._interval)
            self.report()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[ProgressTracker]:
        """Report now, every interval while the body runs, and once more at its end."""
        self.report()
        task = asyncio.create_task(self.report_periodically())
        try:
            yield self
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            self.report()
