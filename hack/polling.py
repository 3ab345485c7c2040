"""Waiting, without an event loop, for something a probe can see.

:func:`wait_for` is the one synchronous poll loop of the test tiers that block
(``tests/node``) and of the benchmarks that do (``bench.faults``); async code
has ``tests.kubehelpers.eventually``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(probe: Callable[[], T | None], *, within: float, what: str, every: float = 0.5) -> T:
    """``probe()`` every ``every`` seconds until it answers something truthy; that answer.

    After ``within`` seconds: :class:`TimeoutError` naming ``what`` and the probe's
    last answer (what it did see is usually the best clue).
    """
    deadline = time.monotonic() + within
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(every)
    raise TimeoutError(f"timed out after {within}s waiting for {what}; last: {last!r}")
