"""An informer: a local cache of one resource kept true by list-then-watch.

client-go's reflector and indexer, in asyncio, on raw watch streams:

- **List, then watch.** List every page (``limit`` 500), replace the cache for
  the scope, remember the list's ``resourceVersion``, then watch from it with
  ``allowWatchBookmarks`` and a random ``timeoutSeconds`` between 5 and 10
  minutes, so that many watches do not all end together. Every event and
  bookmark advances the ``resourceVersion``; a watch the server ends normally
  is reopened at once from there, with no list.
- **A watch that goes quiet is closed.** The API server sends a bookmark on
  every watch about once a minute, so a watch that delivers neither an event
  nor a bookmark for ``idle_timeout`` seconds (75 by default, from opening
  the request) is taken for a stalled connection (one that stays open but
  carries nothing, which no read timeout notices in time): it is closed,
  counted (``kserve_inference_informer_watch_errors_total{reason="idle"}``), logged as a
  warning, and reopened after 0.5-1 s from its last ``resourceVersion``,
  with no list (unless that version is gone by then: 410, below).
- **410 Gone** (as the watch's HTTP status or as an ``ERROR`` event with code
  410): the ``resourceVersion`` is too old, so list again, at once. The relist
  turns into add/update/delete callbacks for whatever changed meanwhile (an
  object that vanished is delivered to ``on_delete`` with its last known
  state). Only a 410 that follows another with nothing but a list in between
  (the list was stale at once) waits first, on a backoff of its own (0.8 s
  doubling to 30 s, jittered) that anything else (an event, a watch the
  server ends, a failed list or watch) resets: a 410 after a broken watch, as
  after an API server restart, relists at once.
- **Errors** (5xx, 403 while RBAC settles, 404 while a CRD is being served,
  any other ``ERROR`` event, a watch that ends within a second without an
  event) wait with a jittered exponential backoff, 0.8 s doubling to 30 s,
  reset by a successful list and by the first event of a watch; then the
  watch resumes from the last ``resourceVersion`` (or the list is retried if
  it was the list that failed).
- **The API server down or restarting.** A request that gets no HTTP answer
  at all (connection refused or reset, TLS failure, timeout) is retried after
  0.5-1 s, jittered, however long that lasts, and does not grow the backoff;
  errors answered within 60 s of such a failure (a restarted server warming
  up) are retried after 0.5-1 s too. So every informer is back (after the
  410 a restart brings, relisted) within about a second of the server
  answering again, while a server that is down sees one connection attempt a
  second per informer and scope.
- **Retry-After.** An error answer with a ``Retry-After`` header (429, some
  503s) waits what the server asks, at least 0.1 s and at most 30 s, plus up
  to 20 % jitter, whatever the backoff says.
- **Scope.** All namespaces (one cluster-wide list+watch), or a set of
  namespaces (one list+watch each, sharing one cache), narrowed by a label
  and/or field selector.
- **Slim objects.** ``metadata.managedFields`` and the
  ``kubectl.kubernetes.io/last-applied-configuration`` annotation are dropped
  before caching; they are most of an object's size and nobody here reads them.
- **Transform** (client-go's ``SetTransform``): an optional function applied
  to every object before it is cached or handed to a handler, whether it came
  from a list, a watch event or :meth:`Informer.assume`. It may return a
  smaller projection of the object, or ``None`` to keep the object out of this
  cache altogether (an object that leaves the cache this way is delivered to
  ``on_delete``). It must not change the object's key or resourceVersion.
- **Packed** (``packed=True``): each cached object is kept as its JSON and
  parsed on every read (see :class:`Store`): a third of the memory, and a
  reader gets its own copy.
- **Indexes.** Named index functions map an object to keys ("runs by config",
  "children by owner uid"), answered without a scan by :meth:`Informer.by_index`.
- **Handlers** are plain synchronous callbacks (they enqueue keys); an
  exception in one is logged and does not stop the informer.
- :meth:`Informer.has_synced` is true once every scope has finished its first
  list and delivered it to the handlers; :attr:`Informer.last_sync` is the
  loop time (``time.monotonic()`` on the default loop) since which every
  scope has completed a list, and :attr:`Informer.lists` counts lists.

The API access is :class:`~kubeclient.client.KubeClient`'s ``list`` and
``watch``, the only two calls made; the unit tests drive the same code with a
scripted fake of those two.
"""

from __future__ import annotations

import asyncio
import ctypes
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog

from kubeclient.backoff import Retries
from kubeclient.errors import ApiError, TransportError
from kubeclient.instruments import NO_METRICS, KubeMetrics, labelled
from kubeclient.objects import object_key, resource_version
from kubeclient.resources import Obj, Resource, Transform
from kubeclient.store import IndexFunc, Store

if TYPE_CHECKING:
    from kubeclient.client import KubeClient

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
PAGE_SIZE = 500
MIN_WATCH_TIMEOUT = 300
MAX_WATCH_TIMEOUT = 600
# A watch closed sooner than this without a single event counts as a failure,
# so a server that hangs up at once cannot make the informer spin.
MIN_HEALTHY_WATCH = 1.0
# A watch that delivers neither an event nor a bookmark for this long is
# taken for stalled and reopened. The API server sends a bookmark about every
# 60 s: 75 s leaves room for a late one. The controller's WATCH_IDLE_TIMEOUT.
WATCH_IDLE_TIMEOUT = 75.0

# Aliases, because Informer.list shadows the builtin in its class.
ObjList = list[Obj]
KeyList = list[str]
OnAdd = Callable[[Obj], None]
OnUpdate = Callable[[Obj, Obj], None]
OnDelete = Callable[[Obj], None]

log = structlog.stdlib.get_logger(__name__)


# ------------------------------------------------------------------------- pure parts


def slim(obj: Obj) -> Obj:
    """``obj`` without managedFields and the last-applied annotation (a shallow copy)."""
    metadata = obj.get("metadata")
    if not isinstance(metadata, dict):
        return obj
    annotations = metadata.get("annotations")
    has_last_applied = isinstance(annotations, dict) and LAST_APPLIED in annotations
    if "managedFields" not in metadata and not has_last_applied:
        return obj
    metadata = {k: v for k, v in metadata.items() if k != "managedFields"}
    if has_last_applied:
        assert isinstance(annotations, dict)
        rest = {k: v for k, v in annotations.items() if k != LAST_APPLIED}
        if rest:
            metadata["annotations"] = rest
        else:
            metadata.pop("annotations", None)
    return {**obj, "metadata": metadata}


@dataclass(frozen=True)
class EventHandler:
    on_add: OnAdd | None = None
    on_update: OnUpdate | None = None
    on_delete: OnDelete | None = None


class WatchExpired(Exception):
    """The watch's resourceVersion is too old (410 Gone): list again."""


class WatchFailed(Exception):
    """An ``ERROR`` event other than 410."""


class WatchStalled(TransportError):
    """The watch delivered neither an event nor a bookmark for the informer's idle bound."""


# ---------------------------------------------------------------------------- informer


class Informer:
    """A cache of ``resource`` in ``namespaces`` (empty: all), kept by list-then-watch."""

    def __init__(
        self,
        source: KubeClient,
        resource: Resource,
        *,
        namespaces: Sequence[str] = (),
        label_selector: str | None = None,
        field_selector: str | None = None,
        indexers: Mapping[str, IndexFunc] | None = None,
        metrics: KubeMetrics | None = None,
        name: str | None = None,
        rng: random.Random | None = None,
        page_size: int = PAGE_SIZE,
        watch_timeout: tuple[int, int] = (MIN_WATCH_TIMEOUT, MAX_WATCH_TIMEOUT),
        transform: Transform | None = None,
        idle_timeout: float | None = WATCH_IDLE_TIMEOUT,
        packed: bool = False,
    ) -> None:
        if not resource.namespaced and namespaces:
            raise ValueError(f"{resource.kind} is cluster-scoped: no namespaces to choose")
        if idle_timeout is not None and idle_timeout <= 0:
            raise ValueError(f"idle_timeout must be positive (None: no bound), not {idle_timeout}")
        self.source = source
        self.resource = resource
        self.name = name or str(resource)
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.store = Store(indexers, packed=packed)
        self.transform = transform
        self.page_size = page_size
        self.watch_timeout = watch_timeout
        self.idle_timeout = idle_timeout
        # None = one cluster-wide scope.
        self._scopes: tuple[str | None, ...] = tuple(dict.fromkeys(namespaces)) or (None,)
        self._handlers: list[EventHandler] = []
        self._metrics = NO_METRICS if metrics is None else metrics
        self._rng = rng if rng is not None else random.Random()
        self._synced_scopes: set[str | None] = set()
        self._synced = asyncio.Event()
        self._resource_versions: dict[str | None, str | None] = {}
        # Per scope: the newest resourceVersion the cache is complete as of (its
        # list's, then each watch event's), which tells a deleted object's late
        # copy from a new one (:meth:`_deleted_since`).
        self._complete_as_of: dict[str | None, str] = {}
        self._listed_at: dict[str | None, float] = {}
        self.lists = 0  # lists completed, every scope counted
        # Per scope: the API server's answer to its last list, while that failed
        # (a 403 or a 404 says more than a log line to whoever reads it).
        self.list_errors: dict[str | None, ApiError] = {}
        self._log = log.bind(informer=self.name)

    # ---------------------------------------------------------------- wiring

    def add_event_handler(
        self,
        on_add: OnAdd | None = None,
        on_update: OnUpdate | None = None,
        on_delete: OnDelete | None = None,
    ) -> None:
        """Callbacks for every change; objects already cached are replayed to ``on_add``."""
        handler = EventHandler(on_add, on_update, on_delete)
        self._handlers.append(handler)
        if on_add is not None:
            for obj in self.store.list():
                self._call(on_add, obj)

    # ----------------------------------------------------------------- reads

    def has_synced(self) -> bool:
        return self._synced.is_set()

    async def wait_for_sync(self) -> None:
        await self._synced.wait()

    @property
    def last_sync(self) -> float | None:
        """Loop time since which every scope has completed a list; None before the first sync.

        The loop's clock is ``time.monotonic()`` on the default event loop, so
        "relisted after the API server came back" is ``last_sync >= ready``.
        """
        if len(self._listed_at) < len(self._scopes):
            return None
        return min(self._listed_at.values())

    def get(self, namespace: str | None, name: str) -> Obj | None:
        return self.store.get(f"{namespace}/{name}" if namespace else name)

    def get_by_key(self, key: str) -> Obj | None:
        return self.store.get(key)

    def list(self, namespace: str | None = None) -> list[Obj]:
        return self.store.list(namespace)

    def by_index(self, index: str, value: str) -> ObjList:
        return self.store.by_index(index, value)

    def index_keys(self, index: str, value: str) -> KeyList:
        """The keys :meth:`by_index` would return objects of, without reading the objects."""
        return self.store.index_keys(index, value)

    def has_key(self, key: str) -> bool:
        return key in self.store

    # ---------------------------------------------------------- own writes

    def assume(self, obj: Obj) -> None:
        """Cache an object this controller just wrote, before its watch event arrives.

        The next reconcile then reads its own write instead of a stale copy
        (and does not create the same child twice). No handler is called, and
        the watch event carrying the same resourceVersion will not call one
        either. An older version never replaces a newer one already cached.
        """
        new = self._prepare(obj)
        if new is None:
            return
        old = self.store.get(object_key(new))
        if old is None and self._deleted_since(obj):
            return
        if old is not None and _is_older(resource_version(new), resource_version(old)):
            return
        self.store.upsert(new)

    def assume_deleted(self, key: str) -> None:
        """Drop an object this controller just deleted (its DELETED event still calls on_delete)."""
        self.store.remove(key)

    # ------------------------------------------------------------ live reads

    def refresh(self, obj: Obj) -> None:
        """Cache an object read live (not written by us), ahead of its watch event.

        Unlike :meth:`assume`, the handlers are called now, as the watch event
        would have called them (which, arriving with the same resourceVersion,
        then calls none): whoever follows this object hears of the change once.
        An older version never replaces a newer one already cached.
        """
        new = self._prepare(obj)
        if new is None:
            return
        old = self.store.get(object_key(new))
        if old is None and self._deleted_since(obj):
            return
        if old is not None and (
            resource_version(old) == resource_version(new)
            or _is_older(resource_version(new), resource_version(old))
        ):
            return
        self.store.upsert(new)
        if old is None:
            self._dispatch_add(new)
        else:
            self._dispatch_update(old, new)

    def _deleted_since(self, obj: Obj) -> bool:
        """Whether ``obj``, not in the cache, is a copy older than the cache: deleted since.

        The cache of a scope is complete as of its last list or watch event, so
        an object of an older resourceVersion that is not in it was deleted
        after that version (its DELETED event came, or a later list left it
        out). A write's answer or a live read that arrives after that event
        must not bring it back: the cache would hold a deleted run (and its
        workloads would be left to run) until the next list.
        """
        complete = self._complete_as_of.get(self._scope_of(obj))
        rv = resource_version(obj)
        return (
            complete is not None and rv is not None and (rv == complete or _is_older(rv, complete))
        )

    def _scope_of(self, obj: Obj) -> str | None:
        """The scope (watched namespace, or None: cluster-wide) ``obj`` is listed and watched in."""
        return None if self._scopes == (None,) else (obj.get("metadata") or {}).get("namespace")

    def _complete_as_of_now(self, namespace: str | None, rv: str | None) -> None:
        current = self._complete_as_of.get(namespace)
        if rv and (current is None or _is_older(current, rv)):
            self._complete_as_of[namespace] = rv

    def refresh_deleted(self, key: str) -> None:
        """Drop an object a live read found gone, calling the delete handlers now.

        Its DELETED event, if one still comes, calls them again (they only enqueue).
        """
        old = self.store.remove(key)
        if old is not None:
            self._dispatch_delete(old)

    # ------------------------------------------------------------------- run

    async def run(self) -> None:
        """List and watch every scope until cancelled."""
        async with asyncio.TaskGroup() as group:
            for scope in self._scopes:
                group.create_task(self._reflect(scope), name=f"informer {self.name} {scope or '*'}")

    async def _reflect(self, namespace: str | None) -> None:
        retries = Retries(self._rng, asyncio.get_running_loop().time)
        rv: str | None = None
        scope_log = self._log.bind(namespace=namespace or "*")
        while True:
            if rv is None:
                try:
                    rv = await self._list(namespace)
                except (ApiError, ValueError) as exc:
                    if isinstance(exc, ApiError):
                        self.list_errors[namespace] = exc
                    self._count_error("list_" + _error_reason(exc))
                    await self._retry_after(retries, exc, scope_log, "list failed")
                    continue
                retries.listed()
                self.list_errors.pop(namespace, None)
                self._resource_versions[namespace] = rv
            try:
                rv = await self._watch(namespace, rv, retries)
                retries.watch_ended()
            except WatchStalled as exc:
                rv = self._resource_versions.get(namespace) or rv
                self._count_error("idle")
                delay = retries.failed(exc)
                # Every time, not 1st/2nd/4th...: a stall is rare, and worth knowing of.
                scope_log.warning(
                    "watch stalled: no event or bookmark within the idle bound; reopening it",
                    resource=str(self.resource),
                    idle_timeout=self.idle_timeout,
                    resource_version=rv,
                    retry_in=delay,
                )
                await asyncio.sleep(delay)
            except WatchExpired:
                self._count_error("gone")
                delay = retries.expired()
                scope_log.info("watch expired, listing again", resource_version=rv, wait=delay)
                rv = None
                if delay:
                    await asyncio.sleep(delay)
            except (ApiError, WatchFailed, ValueError) as exc:
                # Resume after the last event the broken watch delivered.
                rv = self._resource_versions.get(namespace) or rv
                self._count_error(_error_reason(exc))
                await self._retry_after(retries, exc, scope_log, "watch failed")
            self._resource_versions[namespace] = rv

    @staticmethod
    async def _retry_after(
        retries: Retries, exc: Exception, scope_log: structlog.stdlib.BoundLogger, message: str
    ) -> None:
        delay = retries.failed(exc)
        # While the server is down failures come every second: log the 1st,
        # 2nd, 4th, 8th... in a row as warnings, the others as debug.
        n = retries.failures
        emit = scope_log.warning if n & (n - 1) == 0 else scope_log.debug
        emit(message, error=str(exc), failures=n, retry_in=delay)
        await asyncio.sleep(delay)

    async def _list(self, namespace: str | None) -> str:
        # Items of a built-in kind's list carry no apiVersion/kind; watch
        # events do. Cached objects look the same whichever way they came.
        type_meta = {"apiVersion": self.resource.api_version, "kind": self.resource.kind}
        fresh: dict[str, Obj] = {}
        continue_token: str | None = None
        while True:
            page = await self.source.list(
                self.resource,
                namespace,
                label_selector=self.label_selector,
                field_selector=self.field_selector,
                limit=self.page_size,
                continue_token=continue_token,
            )
            # Each page is slimmed and transformed as it comes, so only one
            # page of whole objects is ever held, not the whole list.
            for item in page.get("items") or []:
                new = self._prepare({**type_meta, **item})
                if new is not None:
                    fresh[object_key(new)] = new
            metadata = page.get("metadata") or {}
            del page
            continue_token = metadata.get("continue") or None
            if not continue_token:
                break
        self._metrics.informer_lists_total.labels(resource=self.name).inc()
        rv = str(metadata.get("resourceVersion") or "")
        if not rv:
            raise ApiError(0, "NoResourceVersion", "list answer has no resourceVersion")
        self._replace_prepared(namespace, fresh)
        self._complete_as_of[namespace] = rv
        _release_freed_memory()
        self._listed_at[namespace] = asyncio.get_running_loop().time()
        self.lists += 1
        return rv

    async def _watch(self, namespace: str | None, rv: str, retries: Retries) -> str:
        """Watch from ``rv`` until the server ends it; the resourceVersion to resume from."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        got_event = False
        timeout = self._rng.randint(*self.watch_timeout)
        stream = self.source.watch(
            self.resource,
            namespace,
            resource_version=rv,
            timeout_seconds=timeout,
            label_selector=self.label_selector,
            field_selector=self.field_selector,
            allow_bookmarks=True,
        )
        idle = self.idle_timeout
        quiet = asyncio.timeout(idle)
        try:
            # The bound runs from the request on (a stalled connection may not
            # even answer it) and starts again with every event or bookmark.
            async with quiet:
                async for event in stream:
                    if idle is not None:
                        quiet.reschedule(loop.time() + idle)
                    rv = self.handle_event(event) or rv
                    self._resource_versions[namespace] = rv
                    if not got_event:
                        got_event = True
                        retries.progressed()
        except TimeoutError:
            if not quiet.expired():
                raise
            raise WatchStalled(
                0,
                "WatchStalled",
                f"no event or bookmark for {idle:g}s",
                verb="watch",
                path=self.resource.path(namespace),
            ) from None
        except ApiError as exc:
            if exc.is_gone:
                raise WatchExpired from exc
            raise
        finally:
            # Close the HTTP stream now, not whenever the generator is collected.
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()
        if not got_event and loop.time() - started < MIN_HEALTHY_WATCH:
            raise WatchFailed("the watch ended at once without an event")
        return rv

    # ----------------------------------------------------------- pure events

    def handle_event(self, event: Mapping[str, Any]) -> str | None:
        """Apply one raw watch event to the cache and the handlers.

        Returns the event's resourceVersion (to resume from); raises
        :class:`WatchExpired` for a 410 ``ERROR`` event and
        :class:`WatchFailed` for any other.
        """
        kind = event.get("type")
        obj = event.get("object")
        if not isinstance(obj, dict):
            raise WatchFailed(f"watch event {kind!r} without an object")
        labelled(
            self._metrics.informer_watch_events_total, resource=self.name, type=str(kind)
        ).inc()
        if kind == "ERROR":
            code = obj.get("code")
            if code == 410:
                raise WatchExpired(obj.get("message", "resourceVersion too old"))
            raise WatchFailed(f"watch error {code}: {obj.get('reason')}: {obj.get('message')}")
        rv = resource_version(obj)
        if kind == "BOOKMARK":
            return rv
        if kind in ("ADDED", "MODIFIED"):
            new = self._prepare(obj)
            if new is None:
                left = self.store.remove(object_key(obj))
                if left is not None:
                    self._dispatch_delete(left)
                return rv
            old = self.store.upsert(new)
            if old is None:
                self._dispatch_add(new)
            elif resource_version(old) != rv:
                self._dispatch_update(old, new)
            # else: the event of a write already assumed into the cache.
        elif kind == "DELETED":
            gone = self._prepare(obj)
            cached = self.store.remove(object_key(obj))
            if gone is not None:
                self._dispatch_delete(gone)
            elif cached is not None:
                self._dispatch_delete(cached)
        else:
            self._log.warning("unknown watch event type", type=kind)
            return rv
        self._complete_as_of_now(self._scope_of(obj), rv)
        return rv

    def replace(self, namespace: str | None, items: Iterable[Obj]) -> None:
        """Make the scope's cache equal to a fresh list, calling the handlers for differences."""
        fresh: dict[str, Obj] = {}
        for obj in items:
            new = self._prepare(obj)
            if new is not None:
                fresh[object_key(new)] = new
        self._replace_prepared(namespace, fresh)

    def _replace_prepared(self, namespace: str | None, fresh: dict[str, Obj]) -> None:
        """:meth:`replace` with the list's objects already prepared, by key."""
        if namespace is None:
            stale = [key for key in self.store.list_keys() if key not in fresh]
        else:
            prefix = f"{namespace}/"
            stale = [
                key for key in self.store.list_keys() if key.startswith(prefix) and key not in fresh
            ]
        for new in fresh.values():
            old = self.store.upsert(new)
            if old is None:
                self._dispatch_add(new)
            elif resource_version(old) != resource_version(new):
                self._dispatch_update(old, new)
        for key in stale:
            old = self.store.remove(key)
            if old is not None:
                self._dispatch_delete(old)
        self._synced_scopes.add(namespace)
        if len(self._synced_scopes) == len(self._scopes):
            self._synced.set()

    def _prepare(self, obj: Obj) -> Obj | None:
        """The object as this cache keeps it: slimmed, then transformed (``None``: not kept)."""
        slimmed = slim(obj)
        return slimmed if self.transform is None else self.transform(slimmed)

    # -------------------------------------------------------------- dispatch

    def _dispatch_add(self, obj: Obj) -> None:
        for handler in self._handlers:
            if handler.on_add is not None:
                self._call(handler.on_add, obj)

    def _dispatch_update(self, old: Obj, new: Obj) -> None:
        for handler in self._handlers:
            if handler.on_update is not None:
                self._call(handler.on_update, old, new)

    def _dispatch_delete(self, obj: Obj) -> None:
        for handler in self._handlers:
            if handler.on_delete is not None:
                self._call(handler.on_delete, obj)

    def _call(self, callback: Callable[..., None], *args: Obj) -> None:
        try:
            callback(*args)
        except Exception:
            self._log.exception("event handler failed", key=object_key(args[-1]))

    def _count_error(self, reason: str) -> None:
        self._metrics.informer_watch_errors_total.labels(resource=self.name, reason=reason).inc()


def _load_malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(None)
        trim: Callable[[int], int] = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    return trim


_MALLOC_TRIM = _load_malloc_trim()


def _release_freed_memory() -> None:
    """Give the heap's free memory back to the system (glibc's malloc_trim).

    A list holds a page of whole objects at a time and keeps a projection of
    each: what the pages took is free again afterwards, but glibc keeps it in
    the process (RSS) unless asked. Done once per list, which is rare.
    """
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def _is_older(candidate: str | None, cached: str | None) -> bool:
    """Whether ``candidate`` is an older resourceVersion than ``cached``.

    resourceVersions are opaque, but every API server backed by etcd issues
    increasing integers; anything else is never judged older.
    """
    if candidate is None or cached is None:
        return False
    try:
        return int(candidate) < int(cached)
    except ValueError:
        return False


def _error_reason(exc: Exception) -> str:
    """The ``reason`` label of kserve_inference_informer_watch_errors_total."""
    if isinstance(exc, ApiError):
        return str(exc.status) if exc.status else "transport"
    return type(exc).__name__
