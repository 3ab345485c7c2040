"""Sending many rows as few requests: batches, bounded concurrency, sharding.

- Rows are cut into batches of ``batch_size`` (:func:`batch_ranges`) and sent by
  ``concurrency`` workers; :func:`map_ordered` returns the answers in batch order,
  whatever order they arrive in, and stops everything at the first failure.
- Each call is retried on its own, as :mod:`runner.retry` says (backoff,
  ``Retry-After``, the run's deadline).
- **Sharding.** When one run is spread over ``count`` pods, the pod with index
  ``index`` (``JOB_COMPLETION_INDEX`` of an Indexed Job) handles the rows whose
  position ``i`` in the input satisfies ``i % count == index`` (:func:`shard`).
  Each pod reads the whole input, predicts its own rows and stores its own
  predictions under its own ``pod_uid``; row ``i`` of the input is prediction
  number ``i // count`` of shard ``i % count``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")
U = TypeVar("U")


def batch_ranges(total: int, size: int) -> list[range]:
    if size < 1:
        raise ValueError(f"batch size must be at least 1, got {size}")
    return [range(start, min(start + size, total)) for start in range(0, total, size)]


def shard(rows: Sequence[T], count: int, index: int) -> list[T]:
    """The rows of shard ``index`` of ``count``: positions ``i`` with ``i % count == index``."""
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"shard index {index} is not in [0, {count})")
    return list(rows[index::count]) if count > 1 else list(rows)


async def map_ordered(
    items: Sequence[T], call: Callable[[T], Awaitable[U]], concurrency: int
) -> list[U]:
    """``[await call(item) for item in items]`` with ``concurrency`` calls in flight.

    Results keep the order of ``items``. The first failure cancels the calls in
    flight and is raised as itself (not wrapped in an ``ExceptionGroup``).
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    results: list[Any] = [None] * len(items)
    # One shared iterator: a worker takes the next item only when it is free, so at
    # most `concurrency` calls are in flight and no item is taken twice.
    pending = iter(enumerate(items))

    async def worker() -> None:
        for index, item in pending:
            results[index] = await call(item)

    try:
        async with asyncio.TaskGroup() as group:
            for _ in range(min(concurrency, len(items))):
                group.create_task(worker())
    except BaseExceptionGroup as failures:
        raise failures.exceptions[0] from None
    return results
