"""How long an informer waits before it lists or watches again. Pure but for the clock.

:class:`Backoff` is a jittered exponential backoff (client-go's
``wait.Backoff``); :class:`Retries` is told every outcome of one scope's lists
and watches and answers the wait (the rules are the informer's: see
``kubeclient.informer``).
"""

from __future__ import annotations

import random
from collections.abc import Callable

from kubeclient.errors import ApiError, TransportError

# While the API server gives no answer, and for RECOVERY_WINDOW seconds after
# it last gave none, failures are retried after RETRY_SOON/2 to RETRY_SOON.
RETRY_SOON = 1.0
RECOVERY_WINDOW = 60.0
# Retry-After is honoured within these bounds.
MIN_RETRY_AFTER = 0.1
MAX_RETRY_AFTER = 30.0


class Backoff:
    """Jittered exponential backoff: ``initial * factor**n`` capped, times [1, 1 + jitter)."""

    def __init__(
        self,
        initial: float = 0.8,
        cap: float = 30.0,
        factor: float = 2.0,
        jitter: float = 1.0,
        rng: random.Random | None = None,
    ) -> None:
        if initial <= 0 or cap < initial or factor < 1 or jitter < 0:
            raise ValueError("need 0 < initial <= cap, factor >= 1 and jitter >= 0")
        self.initial = initial
        self.cap = cap
        self.factor = factor
        self.jitter = jitter
        self._rng = rng if rng is not None else random.Random()
        self._steps = 0

    @property
    def steps(self) -> int:
        return self._steps

    def next(self) -> float:
        base = min(self.cap, self.initial * self.factor ** min(self._steps, 64))
        self._steps += 1
        return min(self.cap, base * (1.0 + self.jitter * self._rng.random()))

    def reset(self) -> None:
        self._steps = 0


class Retries:
    """How long one scope of an informer waits before trying again (see the module docstring).

    Told every outcome of its lists and watches; :meth:`expired` and
    :meth:`failed` answer the delay.
    """

    def __init__(self, rng: random.Random, clock: Callable[[], float]) -> None:
        self._rng = rng
        self._clock = clock
        self.errors = Backoff(rng=rng)
        self.expiries = Backoff(rng=rng)
        self._expired_last = False
        self._unanswered_at: float | None = None
        self.failures = 0  # in a row, for the logs

    def listed(self) -> None:
        """A list succeeded."""
        self.errors.reset()
        self.failures = 0

    def progressed(self) -> None:
        """A watch delivered its first event."""
        self.errors.reset()
        self.failures = 0
        self._end_expiries()

    def watch_ended(self) -> None:
        """The server ended a watch normally."""
        self._end_expiries()

    def expired(self) -> float:
        """A 410: the wait before listing again, 0 unless the previous watch expired too."""
        delay = self.expiries.next() if self._expired_last else 0.0
        self._expired_last = True
        return delay

    def failed(self, exc: Exception) -> float:
        """A list or a watch failed: the wait before trying again."""
        self._end_expiries()
        self.failures += 1
        now = self._clock()
        if isinstance(exc, TransportError):
            self._unanswered_at = now
            return self._soon()
        retry_after = exc.retry_after if isinstance(exc, ApiError) else None
        if retry_after is not None:
            asked = max(MIN_RETRY_AFTER, retry_after) * (1.0 + 0.2 * self._rng.random())
            return min(MAX_RETRY_AFTER, asked)
        if self._unanswered_at is not None and now - self._unanswered_at < RECOVERY_WINDOW:
            return self._soon()
        return self.errors.next()

    def _soon(self) -> float:
        return RETRY_SOON * (0.5 + 0.5 * self._rng.random())

    def _end_expiries(self) -> None:
        self._expired_last = False
        self.expiries.reset()
