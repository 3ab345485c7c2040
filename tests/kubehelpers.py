"""Small helpers for tests that talk to the real API server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def eventually(
    probe: Callable[[], Awaitable[T | None]],
    *,
    within: float = 60.0,
    interval: float = 0.25,
    what: str = "condition",
) -> T:
    """Poll ``probe`` until it returns something truthy; fail with ``what`` after ``within``."""
    deadline = time.monotonic() + within
    last: T | None = None
    while True:
        last = await probe()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}; last: {last!r}")
        await asyncio.sleep(interval)


def job_condition(job: dict[str, Any], kind: str) -> bool:
    conditions = (job.get("status") or {}).get("conditions") or []
    return any(c["type"] == kind and c["status"] == "True" for c in conditions)
