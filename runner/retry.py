"""Retrying one call: :class:`Transient` failures, backoff, ``Retry-After``, the deadline.

A call that fails with a :class:`Transient` error (connection error, timeout,
5xx, 429, 408) is retried by :func:`call_with_retries` with exponential backoff and
jitter, or after the server's ``Retry-After`` when it sent one, at most
``max_retries`` times and never past the run's :class:`Deadline` (a policy with
``rate_limit_retries`` counts 429s apart, up to that many). Any other
error fails at once. When retries run out the stage exits with its retryable
code (3, 4 or 5: a later pod may find the other side back); a refusal exits
with its permanent one (6, 7 or 8, see :mod:`contract.exitcodes`). Each attempt
gets ``min(request timeout, time left before the deadline)``.

tenacity does the retrying; this module says when to stop and how long to wait.
The clock, the sleep and the random source are parameters, so tests drive retries
without waiting.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
)
from tenacity.stop import stop_base
from tenacity.wait import wait_base

T = TypeVar("T")
# The jitter's source when the caller gives none: one per process (seeding a new
# Random from the OS on every call cost more than the call itself on a fast path).
_RNG = random.Random()


class Transient(Exception):
    """A failure worth retrying; ``retry_after`` is the server's own hint in seconds."""

    def __init__(
        self, message: str, retry_after: float | None = None, *, rate_limited: bool = False
    ) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after
        # A 429: the server is busy, not failing.
        self.rate_limited = rate_limited


class GaveUp(Exception):
    """Retries ran out (attempts or deadline); ``last`` is the last transient error."""

    def __init__(self, message: str, attempts: int, last: Transient | None) -> None:
        super().__init__(message)
        self.message = message
        self.attempts = attempts
        self.last = last


class Deadline:
    """An absolute point in monotonic time; ``None`` seconds means no deadline."""

    def __init__(self, seconds: float | None, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._at = math.inf if seconds is None else clock() + seconds

    def remaining(self) -> float:
        return self._at - self._clock()

    def cap(self, timeout: float) -> float:
        return min(timeout, self.remaining())


@dataclass(frozen=True)
class RetryPolicy:
    max_retries: int = 5
    initial_backoff: float = 0.2
    max_backoff: float = 10.0
    # A server's Retry-After is honoured up to this; beyond it, it is not a hint but a stall.
    max_retry_after: float = 300.0
    # None: a 429 is a failure like any other. A number: 429s (``Transient.rate_limited``)
    # do not count against max_retries, only against this many.
    rate_limit_retries: int | None = None

    def backoff(self, retry_number: int, rng: random.Random) -> float:
        """Exponential backoff with "equal jitter": half fixed, half random."""
        ceiling = min(self.max_backoff, self.initial_backoff * 2.0 ** (retry_number - 1))
        return ceiling / 2 + rng.uniform(0, ceiling / 2)


class _Wait(wait_base):
    def __init__(self, policy: RetryPolicy, rng: random.Random) -> None:
        self._policy = policy
        self._rng = rng

    def __call__(self, retry_state: RetryCallState) -> float:
        error = retry_state.outcome.exception() if retry_state.outcome else None
        if isinstance(error, Transient) and error.retry_after is not None:
            return min(max(0.0, error.retry_after), self._policy.max_retry_after)
        return self._policy.backoff(retry_state.attempt_number, self._rng)


class _StopAfterRetries(stop_base):
    """``max_retries`` failures, not counting rate limits when the policy says so."""

    def __init__(self, policy: RetryPolicy) -> None:
        self._policy = policy
        self._failures = 0
        self._rate_limited = 0
        self.fired = False

    def __call__(self, retry_state: RetryCallState) -> bool:
        error = retry_state.outcome.exception() if retry_state.outcome else None
        limit = self._policy.rate_limit_retries
        if limit is not None and isinstance(error, Transient) and error.rate_limited:
            self._rate_limited += 1
            self.fired = self._rate_limited > limit
        else:
            self._failures += 1
            self.fired = self._failures > self._policy.max_retries
        return self.fired


class _StopAtDeadline(stop_base):
    def __init__(self, deadline: Deadline) -> None:
        self._deadline = deadline

    def __call__(self, retry_state: RetryCallState) -> bool:
        # Waiting past the deadline only to be cut off would waste the wait.
        return self._deadline.remaining() <= retry_state.upcoming_sleep


async def call_with_retries(
    call: Callable[[float], Awaitable[T]],
    *,
    policy: RetryPolicy,
    deadline: Deadline,
    request_timeout: float,
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    rng: random.Random | None = None,
    on_retry: Callable[[int, Transient, float], None] | None = None,
) -> T:
    """``await call(timeout)``, retried on :class:`Transient` as the module docstring says.

    Raises :class:`GaveUp` when retries or time run out, or the call's own
    non-transient error at once.
    """

    def before_sleep(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        if on_retry is not None and isinstance(error, Transient):
            on_retry(state.attempt_number, error, state.upcoming_sleep)

    counted = _StopAfterRetries(policy)
    retrying = AsyncRetrying(
        retry=retry_if_exception_type(Transient),
        stop=counted | _StopAtDeadline(deadline),
        wait=_Wait(policy, rng or _RNG),
        sleep=sleep,
        before_sleep=before_sleep,
        reraise=True,
    )
    attempts = 0
    try:
        async for attempt in retrying:
            with attempt:
                attempts += 1
                timeout = deadline.cap(request_timeout)
                if timeout <= 0:
                    raise GaveUp("the run's deadline passed", attempts, None)
                return await call(timeout)
    except Transient as error:
        if counted.fired:
            reason = f"gave up after {attempts} attempts"
        else:
            reason = f"the run's deadline stopped retries after {attempts} attempt(s)"
        raise GaveUp(f"{error.message} ({reason})", attempts, error) from None
    raise AssertionError("unreachable: tenacity either returns, raises or reraises")


def log_retries(log: Any, event: str) -> Callable[[int, Transient, float], None]:
    """An ``on_retry`` for :func:`call_with_retries` that logs each retry as ``event``."""

    def on_retry(attempt: int, error: Transient, wait: float) -> None:
        log.warning(event, attempt=attempt, error=error.message, retryInSeconds=round(wait, 2))

    return on_retry
