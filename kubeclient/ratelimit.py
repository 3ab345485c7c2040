"""Rate limiters: how long a key waits before a rate-limited add (client-go's workqueue).

- :class:`ExponentialBackoff`: per key, ``base * 2**failures`` capped, reset
  by ``forget(key)`` (client-go's ItemExponentialFailureRateLimiter);
- :class:`TokenBucket`: one bucket shared by every key, answering with the
  wait for a token (client-go's BucketRateLimiter);
- :class:`MaxOf`: the longest of several (MaxOfRateLimiter);
- :func:`default_rate_limiter`: DefaultControllerRateLimiter, per-key backoff
  (5 ms doubling to 1000 s) and a bucket (10 tokens/s, burst 100).

Pure: the caller passes the time.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, Protocol, TypeVar

K = TypeVar("K", bound=Hashable)
K_contra = TypeVar("K_contra", bound=Hashable, contravariant=True)

# client-go DefaultControllerRateLimiter's numbers.
DEFAULT_BASE_DELAY = 0.005
DEFAULT_MAX_DELAY = 1000.0
DEFAULT_QPS = 10.0
DEFAULT_BURST = 100


class RateLimiter(Protocol[K_contra]):
    """How long a key waits before a rate-limited add (client-go's RateLimiter)."""

    def when(self, key: K_contra, now: float) -> float:
        """Delay in seconds for this rate-limited add of ``key`` (records the attempt)."""
        ...

    def forget(self, key: K_contra) -> None:
        """The key succeeded: reset its history."""
        ...

    def num_requeues(self, key: K_contra) -> int:
        """Rate-limited adds of ``key`` since its last ``forget``."""
        ...


class ExponentialBackoff(Generic[K]):
    """Per-key exponential backoff: ``base * 2**failures``, capped at ``max_delay``."""

    def __init__(
        self, base_delay: float = DEFAULT_BASE_DELAY, max_delay: float = DEFAULT_MAX_DELAY
    ) -> None:
        if base_delay <= 0 or max_delay < base_delay:
            raise ValueError(
                f"need 0 < base_delay <= max_delay, got base_delay={base_delay} "
                f"max_delay={max_delay}"
            )
        self.base_delay = base_delay
        self.max_delay = max_delay
        self._failures: dict[K, int] = {}

    def when(self, key: K, now: float) -> float:
        n = self._failures.get(key, 0)
        self._failures[key] = n + 1
        # 2**n overflows float quickly; past 2**64 the cap has long been reached.
        if n > 64:
            return self.max_delay
        return min(self.base_delay * 2.0**n, self.max_delay)

    def forget(self, key: K) -> None:
        self._failures.pop(key, None)

    def num_requeues(self, key: K) -> int:
        return self._failures.get(key, 0)


class TokenBucket(Generic[K]):
    """A token bucket answering with a reservation delay (golang.org/x/time/rate's Reserve).

    Each call takes one token, even when the bucket is empty: the caller then
    waits ``delay`` seconds, the time the bucket needs to earn that token back.
    Unlike an acquire-style limiter (aiolimiter) nobody sleeps here; the queue
    turns the delay into a delayed add.
    """

    def __init__(self, qps: float = DEFAULT_QPS, burst: int = DEFAULT_BURST) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError(f"need qps > 0 and burst >= 1, got qps={qps} burst={burst}")
        self.qps = qps
        self.burst = burst
        self._tokens = float(burst)
        self._last: float | None = None

    def when(self, key: K, now: float) -> float:
        if self._last is not None:
            self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.qps)
        self._last = now
        self._tokens -= 1.0
        return 0.0 if self._tokens >= 0 else -self._tokens / self.qps

    def forget(self, key: K) -> None:
        pass

    def num_requeues(self, key: K) -> int:
        return 0


class MaxOf(Generic[K]):
    """The longest delay of several rate limiters (client-go's MaxOfRateLimiter)."""

    def __init__(self, *limiters: RateLimiter[K]) -> None:
        if not limiters:
            raise ValueError("MaxOf needs at least one rate limiter")
        self.limiters = limiters

    def when(self, key: K, now: float) -> float:
        # Every limiter must record the attempt, so no short-circuit.
        return max([limiter.when(key, now) for limiter in self.limiters])

    def forget(self, key: K) -> None:
        for limiter in self.limiters:
            limiter.forget(key)

    def num_requeues(self, key: K) -> int:
        return max(limiter.num_requeues(key) for limiter in self.limiters)


def default_rate_limiter(
    qps: float = DEFAULT_QPS,
    burst: int = DEFAULT_BURST,
    base_delay: float = DEFAULT_BASE_DELAY,
    max_delay: float = DEFAULT_MAX_DELAY,
) -> MaxOf[K]:
    """client-go's DefaultControllerRateLimiter: per-key backoff and a global bucket."""
    return MaxOf(ExponentialBackoff(base_delay, max_delay), TokenBucket(qps, burst))
