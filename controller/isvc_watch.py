"""The controller's view of KServe InferenceServices: a cache, only while the CRD exists.

Configs may name their model by ``spec.kserve.inferenceServiceRef``
(``controller.isvc`` resolves it). :class:`ModelWatch` keeps what that needs:

- **Off** (``INFERENCESERVICES=false``, the chart's ``inferenceServices.enabled``):
  nothing is read; configs with a reference say so in their status.
- **The CRD**: the API group ``serving.kserve.io/v1beta1`` is looked up in
  discovery at start and again until it serves ``inferenceservices``. While
  some config references an InferenceService (``wanted``), every
  :data:`DISCOVERY_INTERVAL` seconds; while none does, after
  :data:`DISCOVERY_INTERVAL`, then twice as long each time up to
  :data:`DISCOVERY_MAX_INTERVAL` (an idle controller in a cluster without
  KServe, where nobody uses it, asks once per 5 minutes, not 6 times a
  minute). A reconcile that meets a reference while the CRD is missing asks
  for a look sooner (:meth:`ModelWatch.recheck`, never sooner than
  :data:`DISCOVERY_INTERVAL` after the last one). Without the CRD, no
  informer runs (its lists would only fail), the controller logs it once (a
  warning) and configs with a reference are not Ready
  (``InferenceServiceCRDMissing``). Once the CRD is there, the informer
  starts, and keeps running: a CRD deleted later shows as its lists
  answering 404, which reads the same.
- **The informer** lists and watches InferenceServices in the controller's
  namespaces. It is not part of the controller's readiness: a cluster without
  KServe, or a controller not allowed to read InferenceServices, still runs
  every config with a ``modelUrl``. A list answered 403 is
  ``InferenceServiceForbidden`` in the configs' status, with the API server's
  words.
- **Events**: a change of an InferenceService calls ``on_service`` with its
  key (the controller enqueues the configs that reference it, and their
  runs); a change of :meth:`ModelWatch.state` (the CRD found, the grant
  missing or back, the first list done) calls ``on_state``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence

import structlog

from controller.isvc import INFERENCESERVICES, Access, AccessState
from controller.metrics import Metrics
from kubeclient.client import KubeClient
from kubeclient.errors import ApiError, TransportError
from kubeclient.informer import WATCH_IDLE_TIMEOUT, Informer
from kubeclient.objects import object_key
from kubeclient.resources import Obj

log = structlog.stdlib.get_logger(__name__)

# How long after a look discovery is asked again whether the InferenceService CRD
# exists (until it does): DISCOVERY_INTERVAL while a config references one; else
# DISCOVERY_INTERVAL first, twice as long each time after, up to
# DISCOVERY_MAX_INTERVAL. A recheck() is never sooner than DISCOVERY_INTERVAL after
# the last look.
DISCOVERY_INTERVAL = 10.0
DISCOVERY_MAX_INTERVAL = 300.0
# How often the informer's state is looked at (for on_state).
STATE_INTERVAL = 1.0


class ModelWatch:
    def __init__(
        self,
        client: KubeClient,
        namespaces: Sequence[str] = (),
        *,
        enabled: bool = True,
        metrics: Metrics | None = None,
        idle_timeout: float | None = WATCH_IDLE_TIMEOUT,
        discovery_interval: float = DISCOVERY_INTERVAL,
        discovery_max_interval: float = DISCOVERY_MAX_INTERVAL,
        wanted: Callable[[], bool] = lambda: False,
    ) -> None:
        self.client = client
        self.namespaces = tuple(namespaces)
        self.enabled = enabled
        self.metrics = metrics
        self.idle_timeout = idle_timeout
        self.discovery_interval = discovery_interval
        self.discovery_max_interval = max(discovery_max_interval, discovery_interval)
        # Whether some config references an InferenceService now (the controller's cache).
        self.wanted = wanted
        self._wake = asyncio.Event()
        self._last_look = float("-inf")
        self.informer: Informer | None = None
        self._crd_found = False
        # Discovery has answered at least once (before that: SYNCING).
        self._discovered = False
        self._on_service: list[Callable[[str], None]] = []
        self._on_state: list[Callable[[], None]] = []

    def on_service(self, handler: Callable[[str], None]) -> None:
        """``handler(namespace/name)`` on every change of an InferenceService."""
        self._on_service.append(handler)

    def on_state(self, handler: Callable[[], None]) -> None:
        """``handler()`` whenever :meth:`state` changes."""
        self._on_state.append(handler)

    def state(self) -> AccessState:
        if not self.enabled:
            return AccessState(Access.DISABLED)
        if not self._discovered:
            return AccessState(Access.SYNCING)
        if not self._crd_found or self.informer is None:
            return AccessState(Access.CRD_MISSING)
        errors = list(self.informer.list_errors.values())
        forbidden = next((e for e in errors if e.is_forbidden), None)
        if forbidden is not None:
            return AccessState(Access.FORBIDDEN, forbidden.message)
        if any(e.is_not_found for e in errors):
            return AccessState(Access.CRD_MISSING)
        if not self.informer.has_synced():
            return AccessState(Access.SYNCING)
        return AccessState(Access.READY)

    def get(self, key: str) -> Obj | None:
        """The cached InferenceService ``namespace/name``, if any."""
        if self.informer is None:
            return None
        return self.informer.get_by_key(key)

    async def read_live(self, key: str) -> None:
        """Bring the cache's copy of ``key`` up to the API server's (one GET), when readable."""
        if self.informer is None or self.state().access is not Access.READY:
            return
        namespace, name = key.split("/", 1)
        try:
            live: Obj = await self.client.get(INFERENCESERVICES, namespace, name)
        except ApiError as exc:
            if exc.is_not_found:
                self.informer.refresh_deleted(key)
                return
            if exc.is_forbidden:
                return  # the informer's list says so
            raise
        self.informer.refresh({"apiVersion": INFERENCESERVICES.api_version, **live})

    def recheck(self) -> None:
        """Ask discovery again soon (no sooner than DISCOVERY_INTERVAL after the last look).

        For the reconcilers, when something references an InferenceService while
        the CRD is missing; a no-op once the CRD is found.
        """
        if not self._crd_found:
            self._wake.set()

    async def _pause(self, delay: float) -> bool:
        """Wait ``delay`` seconds, or less when :meth:`recheck` asks; True if it asked."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + delay
        asked = False
        while (remaining := deadline - loop.time()) > 0:
            try:
                await asyncio.wait_for(self._wake.wait(), remaining)
            except TimeoutError:
                break
            self._wake.clear()
            asked = True
            deadline = min(deadline, self._last_look + self.discovery_interval)
        return asked

    async def _crd_served(self) -> bool:
        group = f"/apis/{INFERENCESERVICES.group}/{INFERENCESERVICES.version}"
        self._last_look = asyncio.get_running_loop().time()
        try:
            answer = await self.client.request("get", "GET", group)
        except ApiError as exc:
            if exc.is_not_found:
                return False
            raise
        return any(r.get("name") == INFERENCESERVICES.plural for r in answer.get("resources") or [])

    def _changed(self, obj: Obj) -> None:
        key = object_key(obj)
        for handler in self._on_service:
            handler(key)

    def _notify_state(self) -> None:
        for handler in self._on_state:
            handler()

    async def run(self) -> None:
        """Until cancelled: find the CRD, then run the informer."""
        if not self.enabled:
            log.info("InferenceService support is off: inferenceServiceRef cannot be used")
            return
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._follow_state(), name="inferenceservices state")
            tasks.create_task(self._discover_and_watch(), name="inferenceservices")

    async def _discover_and_watch(self) -> None:
        warned = False
        delay = self.discovery_interval
        while not self._crd_found:
            self._wake.clear()
            try:
                found = await self._crd_served()
            except (ApiError, TransportError) as exc:
                log.warning("cannot ask discovery for InferenceServices", error=str(exc))
                found = False
            else:
                if found:
                    # The informer first: the state must never read "found" without one.
                    self._start_informer()
                    self._crd_found = self._discovered = True
                    break
                self._discovered = True
                if not warned:
                    log.warning(
                        "the cluster has no InferenceService CRD (serving.kserve.io/v1beta1): "
                        "configs with inferenceServiceRef are not Ready until it exists",
                        recheck_within=self.discovery_max_interval,
                    )
                    warned = True
            asked = await self._pause(delay)
            delay = next_discovery_delay(
                delay, asked or self.wanted(), self.discovery_interval, self.discovery_max_interval
            )
        assert self.informer is not None
        log.info("watching InferenceServices", namespaces=list(self.namespaces) or "all")
        await self.informer.run()

    def _start_informer(self) -> None:
        informer = Informer(
            self.client,
            INFERENCESERVICES,
            namespaces=self.namespaces,
            metrics=self.metrics,
            idle_timeout=self.idle_timeout,
        )
        informer.add_event_handler(
            on_add=self._changed,
            on_update=lambda _old, new: self._changed(new),
            on_delete=self._changed,
        )
        self.informer = informer

    async def _follow_state(self) -> None:
        last = None
        while True:
            state = self.state()
            if state != last:
                if state.access is Access.FORBIDDEN:
                    log.warning("may not list InferenceServices", error=state.detail)
                elif state.access is Access.READY:
                    log.info("InferenceServices cached")
                last = state
                with contextlib.suppress(Exception):
                    self._notify_state()
            await asyncio.sleep(STATE_INTERVAL)


def next_discovery_delay(delay: float, wanted: bool, first: float, most: float) -> float:
    """The wait before the next look at discovery: ``first`` while the CRD is wanted
    (a config references an InferenceService, or a recheck asked), else twice the
    last, at most ``most``."""
    if wanted:
        return first
    return min(delay * 2, most)
