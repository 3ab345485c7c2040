"""Kubernetes Events about the objects the controller manages, without spamming the API.

:class:`EventRecorder` writes core/v1 Events (what ``kubectl describe`` and
``kubectl events`` show) for an involved object, the way client-go's recorder
and EventCorrelator do:

- ``record()`` is synchronous and never fails the caller: events go to a
  bounded in-memory queue written by one background task (:meth:`run`); a
  full queue drops the event (counted in ``kserve_inference_controller_events_total``).
- **Aggregation.** An event identical to an earlier one (same object, type,
  reason and message) is not a new Event: the existing one's ``count`` and
  ``lastTimestamp`` are patched, at most once per ``aggregate_interval`` per
  event (60 s); occurrences in between are counted locally and written by a
  single deferred patch. A run that fails the same way every few seconds thus
  costs one create and then at most one patch a minute.
- **Spam filter.** Distinct events about one object draw from a token bucket
  (burst 25, then one per 5 minutes, client-go's numbers); beyond that they
  are dropped.
- An Event that expired meanwhile (the API server keeps them one hour) is
  created again, carrying the accumulated count.
- **A namespace being deleted** refuses every create (403, cause
  ``NamespaceTerminating``): after one such refusal, events about objects of
  that namespace are dropped without a request for ``terminating_pause``
  (60 s), then tried again.

Events are written with the ``events`` permission of the core API group
(create and patch).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

import structlog

from kubeclient.errors import ApiError
from kubeclient.instruments import NO_METRICS, KubeMetrics
from kubeclient.resources import EVENTS

if TYPE_CHECKING:
    from kubeclient.client import KubeClient

EventType = Literal["Normal", "Warning"]

COMPONENT = "kserve-inference-controller"
MAX_MESSAGE = 1024
MAX_REASON = 128
AGGREGATE_INTERVAL = 60.0
SPAM_BURST = 25
SPAM_REFILL_SECONDS = 300.0
CACHE_SIZE = 4096
QUEUE_SIZE = 1000
TERMINATING_PAUSE = 60.0

log = structlog.stdlib.get_logger(__name__)


@dataclass(frozen=True)
class InvolvedObject:
    api_version: str
    kind: str
    namespace: str | None
    name: str
    uid: str | None
    resource_version: str | None

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> InvolvedObject:
        metadata = obj.get("metadata") or {}
        if not obj.get("kind") or not metadata.get("name"):
            raise ValueError("an involved object needs kind and metadata.name")
        return cls(
            api_version=str(obj.get("apiVersion") or ""),
            kind=str(obj["kind"]),
            namespace=metadata.get("namespace"),
            name=str(metadata["name"]),
            uid=metadata.get("uid"),
            resource_version=metadata.get("resourceVersion"),
        )

    @property
    def identity(self) -> tuple[str, ...]:
        """Who the event is about; the uid tells a re-created object of the same name apart."""
        return (self.kind, self.namespace or "", self.name, self.uid or "")

    def reference(self) -> dict[str, Any]:
        ref: dict[str, Any] = {"apiVersion": self.api_version, "kind": self.kind, "name": self.name}
        if self.namespace:
            ref["namespace"] = self.namespace
        if self.uid:
            ref["uid"] = self.uid
        if self.resource_version:
            ref["resourceVersion"] = self.resource_version
        return ref


@dataclass
class _Series:
    """One distinct event and what the API server knows of it."""

    involved: InvolvedObject
    type: EventType
    reason: str
    message: str
    action: str | None
    count: int
    first_seen: datetime
    last_seen: datetime
    name: str | None = None  # the Event object's name once created
    written_count: int = 0
    last_write: float | None = None  # loop time of the last create/patch
    flush_scheduled: bool = False
    in_flight: bool = False


@dataclass
class _Bucket:
    tokens: float
    updated: float


def event_name(object_name: str, at: datetime) -> str:
    """client-go's Event names: ``<object name>.<unix nanoseconds in hex>``."""
    nanos = int(at.timestamp() * 1_000_000_000)
    return f"{object_name[: 253 - 17]}.{nanos:x}"


def _timestamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


class EventRecorder:
    """Records Events for involved objects; start :meth:`run` as a background task."""

    def __init__(
        self,
        client: KubeClient,
        *,
        component: str = COMPONENT,
        instance: str = "",
        metrics: KubeMetrics | None = None,
        aggregate_interval: float = AGGREGATE_INTERVAL,
        spam_burst: int = SPAM_BURST,
        spam_refill_seconds: float = SPAM_REFILL_SECONDS,
        cache_size: int = CACHE_SIZE,
        queue_size: int = QUEUE_SIZE,
        terminating_pause: float = TERMINATING_PAUSE,
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.client = client
        self.component = component
        self.instance = _truncate(instance, 128)
        self.aggregate_interval = aggregate_interval
        self.spam_burst = spam_burst
        self.spam_refill_seconds = spam_refill_seconds
        self._metrics = NO_METRICS if metrics is None else metrics
        self._wall_clock = wall_clock
        self._cache_size = cache_size
        self._series: OrderedDict[tuple[Any, ...], _Series] = OrderedDict()
        self._buckets: OrderedDict[tuple[str, ...], _Bucket] = OrderedDict()
        self._queue: asyncio.Queue[_Series] = asyncio.Queue(maxsize=queue_size)
        self._timers: set[asyncio.TimerHandle] = set()
        self.terminating_pause = terminating_pause
        # Namespaces being deleted -> loop time until which their events are dropped.
        self._terminating: dict[str, float] = {}

    # ---------------------------------------------------------------- recording

    def normal(self, obj: Mapping[str, Any], reason: str, message: str, **kw: Any) -> None:
        self.record(obj, "Normal", reason, message, **kw)

    def warning(self, obj: Mapping[str, Any], reason: str, message: str, **kw: Any) -> None:
        self.record(obj, "Warning", reason, message, **kw)

    def record(
        self,
        obj: Mapping[str, Any],
        type: EventType,
        reason: str,
        message: str,
        *,
        action: str | None = None,
    ) -> None:
        """Queue an event about ``obj`` (a raw object with apiVersion, kind and metadata).

        Call it from the event loop (reconcile code); it never blocks or raises
        for API trouble.
        """
        if type not in ("Normal", "Warning"):
            raise ValueError(f"event type must be Normal or Warning, got {type!r}")
        involved = InvolvedObject.of(obj)
        if self._is_terminating(involved.namespace):
            self._count("dropped")
            return
        reason = _truncate(reason, MAX_REASON)
        message = _truncate(message, MAX_MESSAGE)
        key = (involved.identity, type, reason, message)
        now = self._wall_clock()
        series = self._series.get(key)
        if series is not None:
            self._series.move_to_end(key)
            series.count += 1
            series.last_seen = now
            self._count("aggregated")
            self._schedule_patch(series)
            return
        if not self._take_token(involved):
            self._count("dropped")
            log.debug("event dropped by the spam filter", reason=reason, object=involved.name)
            return
        series = _Series(involved, type, reason, message, action, 1, now, now)
        self._series[key] = series
        while len(self._series) > self._cache_size:
            self._series.popitem(last=False)
        self._enqueue(series)

    # --------------------------------------------------------------- writing

    async def run(self) -> None:
        """Write queued events until cancelled."""
        try:
            while True:
                series = await self._queue.get()
                try:
                    if self._is_terminating(series.involved.namespace):
                        self._count("dropped")
                    else:
                        await self._write(series)
                except ApiError as exc:
                    if exc.is_namespace_terminating:
                        self._count("failed")
                        self._terminating_now(series.involved.namespace or "default")
                        continue
                    # The API server's weather (429 while it is busy, an outage):
                    # the event is lost, not the controller; no stack trace.
                    self._count("failed")
                    log.warning("event write failed", reason=series.reason, error=str(exc))
                except Exception:
                    self._count("failed")
                    log.exception("event write failed", reason=series.reason)
                finally:
                    series.in_flight = False
                    self._queue.task_done()
                # Occurrences counted while the write was on its way.
                if series.name is not None and series.count > series.written_count:
                    self._schedule_patch(series)
        finally:
            for timer in self._timers:
                timer.cancel()
            self._timers.clear()

    async def flush(self) -> None:
        """Wait until every event queued so far is written (deferred patches excluded)."""
        await self._queue.join()

    async def _write(self, series: _Series) -> None:
        if series.name is not None and series.count == series.written_count:
            return
        count = series.count
        if series.name is None:
            await self._create(series, count)
        else:
            patch = {"count": count, "lastTimestamp": _timestamp(series.last_seen)}
            namespace = series.involved.namespace or "default"
            try:
                await self.client.patch(EVENTS, namespace, series.name, patch)
                self._count("patched")
            except ApiError as exc:
                if not exc.is_not_found:
                    raise
                # Expired (events live one hour): start a new Event with the total.
                await self._create(series, count)
        series.written_count = count
        series.last_write = asyncio.get_running_loop().time()

    async def _create(self, series: _Series, count: int) -> None:
        involved = series.involved
        namespace = involved.namespace or "default"
        name = event_name(involved.name, self._wall_clock())
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": involved.reference(),
            "type": series.type,
            "reason": series.reason,
            "message": series.message,
            "count": count,
            "firstTimestamp": _timestamp(series.first_seen),
            "lastTimestamp": _timestamp(series.last_seen),
            "source": {"component": self.component},
            "reportingComponent": self.component,
            "reportingInstance": self.instance,
        }
        if series.action:
            body["action"] = series.action
        try:
            await self.client.create(EVENTS, namespace, body)
        except ApiError as exc:
            if not exc.is_already_exists:
                raise
        series.name = name
        self._count("created")

    # -------------------------------------------------------------- plumbing

    def _is_terminating(self, namespace: str | None) -> bool:
        until = self._terminating.get(namespace or "default")
        if until is None:
            return False
        if asyncio.get_running_loop().time() < until:
            return True
        del self._terminating[namespace or "default"]
        return False

    def _terminating_now(self, namespace: str) -> None:
        log.info(
            "namespace is being deleted: its events are dropped for a while",
            namespace=namespace,
            pause=self.terminating_pause,
        )
        self._terminating[namespace] = asyncio.get_running_loop().time() + self.terminating_pause

    def _enqueue(self, series: _Series) -> None:
        if series.in_flight:
            return
        try:
            self._queue.put_nowait(series)
        except asyncio.QueueFull:
            self._count("dropped")
            log.warning("event queue full, event dropped", reason=series.reason)
            return
        series.in_flight = True

    def _schedule_patch(self, series: _Series) -> None:
        """Write the new count now if the last write is old enough, else once it is."""
        if series.in_flight or series.flush_scheduled:
            return
        loop = asyncio.get_running_loop()
        if series.last_write is None:
            # Not created yet: the create in flight or a retry will carry the count.
            if series.name is None:
                self._enqueue(series)
            return
        due = series.last_write + self.aggregate_interval
        if loop.time() >= due:
            self._enqueue(series)
            return
        series.flush_scheduled = True

        def flush() -> None:
            self._timers.discard(timer)
            series.flush_scheduled = False
            self._enqueue(series)

        timer = loop.call_at(due, flush)
        self._timers.add(timer)

    def _take_token(self, involved: InvolvedObject) -> bool:
        now = asyncio.get_running_loop().time()
        key = involved.identity
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = _Bucket(float(self.spam_burst), now)
            self._buckets[key] = bucket
            while len(self._buckets) > self._cache_size:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(key)
            bucket.tokens = min(
                float(self.spam_burst),
                bucket.tokens + (now - bucket.updated) / self.spam_refill_seconds,
            )
            bucket.updated = now
        if bucket.tokens < 1.0:
            return False
        bucket.tokens -= 1.0
        return True

    def _count(self, outcome: str) -> None:
        self._metrics.events_total.labels(outcome=outcome).inc()
