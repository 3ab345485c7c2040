"""Leader election on a coordination.k8s.io/v1 Lease, so two replicas never both act.

client-go's algorithm (``tools/leaderelection``), in asyncio:

- Every candidate reads the Lease every ``retry_period`` (2 s, jittered up to
  x2.2 while waiting). The lease is free when it has no holder, or when its
  record has not changed for ``leaseDurationSeconds`` (15 s) **as measured on
  this candidate's own monotonic clock** since it last saw the record change;
  remote timestamps are never compared with the local wall clock, so clock
  skew between nodes cannot hand out the lease twice.
- Taking or renewing the lease is a PUT carrying the ``resourceVersion`` that
  was read: of two candidates racing for a free lease, the API server accepts
  one and answers 409 Conflict to the other. Creating a missing Lease races the
  same way (409 AlreadyExists).
- The leader renews every ``retry_period``; the renewal first reuses the last
  Lease it wrote (one request), and on a conflict falls back to read-then-write.
  If no renewal succeeds within ``renew_deadline`` (10 s) of the last good one,
  leadership is lost: the leading work is cancelled and :meth:`run` raises
  :class:`LeadershipLost` (the process should exit and start over, as
  client-go's users do). The lease outlives the deadline (15 s > 10 s), so a
  former leader has stopped before anyone else can take over.
- A renewal counts from when it was **sent**, not from when its answer came:
  the API server may have written it long before a slow answer arrived, and
  the other candidates time the lease from the write. Every Lease request
  gives up after ``request_timeout`` (half the renew deadline by default; the
  client's own timeout is far longer), so a request stuck on a connection
  that stalled without closing cannot use up the renew deadline: the next
  attempt, on another connection, still has time.
- On a graceful stop (the task running :meth:`run` is cancelled, e.g. on
  SIGTERM) the leader releases the lease (empty holder, 1 s duration), so the
  standby takes over in about ``retry_period`` rather than ``lease_duration``.
- Given an owner ServiceAccount (the pod's own, which the Helm chart creates
  and deletes), the Lease carries an ownerReference to it, so the garbage
  collector deletes the Lease with the release. The ServiceAccount is read
  once, before the first write; a Lease this candidate creates, takes over or
  renews gets the reference when it lacks it (:func:`with_owner`), and one
  that has it costs no extra request. A ServiceAccount that cannot be read
  never holds up the election: one warning, then the Lease goes without an
  owner and the read is retried now and then (backing off to
  ``OWNER_RETRY_MAX``).

kubernetes_asyncio ships a ``leaderelection`` package, but it does not hold up:
it never releases the lease, measures expiry and renew deadlines with
``time.time()`` and writes naive local times marked as UTC, keeps renewing
after the leading coroutine died, and logs a stack trace for every lost race.
Hence this small module.

The decisions are pure functions (:func:`decide`, :func:`lease_spec`,
:func:`with_owner`), tested without a cluster; :class:`LeaderElector` does the I/O.
"""

from __future__ import annotations

import asyncio
import enum
import random
import socket
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import structlog

from kubeclient.errors import ApiError, TransportError
from kubeclient.instruments import NO_METRICS, KubeMetrics
from kubeclient.resources import LEASES, Obj, Resource

if TYPE_CHECKING:
    from kubeclient.client import KubeClient

DEFAULT_LEASE_DURATION = 15.0
DEFAULT_RENEW_DEADLINE = 10.0
DEFAULT_RETRY_PERIOD = 2.0
JITTER_FACTOR = 1.2
# Retrying to read an unreadable owner ServiceAccount backs off up to this (seconds).
OWNER_RETRY_MAX = 300.0

SERVICEACCOUNTS = Resource("", "v1", "serviceaccounts", "ServiceAccount")

log = structlog.stdlib.get_logger(__name__)


class LeadershipLost(Exception):
    """This candidate was the leader and could not renew within the renew deadline."""


def make_identity(pod_name: str | None = None) -> str:
    """``<pod name>_<random suffix>``: unique even if a pod restarts under the same name."""
    return f"{pod_name or socket.gethostname()}_{uuid.uuid4().hex[:10]}"


# --------------------------------------------------------------------- pure decisions


@dataclass(frozen=True)
class LeaseRecord:
    """What a Lease's spec says; two reads compare equal when nothing was written between."""

    holder: str
    lease_duration: float
    acquire_time: str | None
    renew_time: str | None
    transitions: int

    @classmethod
    def from_lease(cls, lease: Mapping[str, Any], default_duration: float) -> LeaseRecord:
        spec = lease.get("spec") or {}
        return cls(
            holder=str(spec.get("holderIdentity") or ""),
            lease_duration=float(spec.get("leaseDurationSeconds") or default_duration),
            acquire_time=spec.get("acquireTime"),
            renew_time=spec.get("renewTime"),
            transitions=int(spec.get("leaseTransitions") or 0),
        )


@dataclass(frozen=True)
class Observation:
    """The last record seen and when, on the local monotonic clock, it last changed."""

    record: LeaseRecord
    changed_at: float


class Action(enum.Enum):
    CREATE = "create"  # no Lease yet: create it, holding it
    ACQUIRE = "acquire"  # free (no holder, or expired): take it over
    RENEW = "renew"  # ours: renew it
    WAIT = "wait"  # held by someone else and still valid


def observe(previous: Observation | None, record: LeaseRecord, now: float) -> Observation:
    """The new observation: the clock restarts only when the record changed."""
    if previous is not None and previous.record == record:
        return previous
    return Observation(record, now)


def decide(identity: str, observation: Observation | None, now: float) -> Action:
    """What this candidate should do, given what it observed (None: the Lease does not exist)."""
    if observation is None:
        return Action.CREATE
    record = observation.record
    if record.holder == identity:
        return Action.RENEW
    if record.holder and observation.changed_at + record.lease_duration > now:
        return Action.WAIT
    return Action.ACQUIRE


def micro_time(moment: datetime) -> str:
    """A Kubernetes MicroTime: RFC 3339 in UTC with microseconds."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease_spec(
    action: Action,
    identity: str,
    record: LeaseRecord | None,
    wall_now: datetime,
    lease_duration: float,
) -> dict[str, Any]:
    """The spec to write for ``action`` (CREATE, ACQUIRE or RENEW)."""
    now = micro_time(wall_now)
    spec: dict[str, Any] = {
        "holderIdentity": identity,
        "leaseDurationSeconds": max(1, round(lease_duration)),
        "renewTime": now,
    }
    if action is Action.CREATE or record is None:
        spec.update(acquireTime=now, leaseTransitions=0)
    elif action is Action.RENEW:
        spec.update(acquireTime=record.acquire_time or now, leaseTransitions=record.transitions)
    elif action is Action.ACQUIRE:
        spec.update(acquireTime=now, leaseTransitions=record.transitions + 1)
    else:
        raise ValueError(f"nothing to write for {action}")
    return spec


def owner_reference(service_account: Mapping[str, Any]) -> dict[str, Any]:
    """An ownerReference to ``service_account`` (not a controller; it blocks no deletion)."""
    metadata = service_account["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "name": str(metadata["name"]),
        "uid": str(metadata["uid"]),
    }


def with_owner(metadata: Mapping[str, Any], owner: Mapping[str, Any]) -> dict[str, Any] | None:
    """``metadata`` with ``owner`` added to its ownerReferences; None when it is there already.

    The garbage collector knows an owner by its uid, so that is what is
    compared. Other references and the rest of ``metadata`` are kept as they are.
    """
    references = list(metadata.get("ownerReferences") or [])
    if any(reference.get("uid") == owner["uid"] for reference in references):
        return None
    return {**metadata, "ownerReferences": [*references, dict(owner)]}


def released_spec(record: LeaseRecord, wall_now: datetime) -> dict[str, Any]:
    """client-go's release: no holder, a 1 s lease, the transition count kept."""
    now = micro_time(wall_now)
    return {
        "holderIdentity": "",
        "leaseDurationSeconds": 1,
        "acquireTime": now,
        "renewTime": now,
        "leaseTransitions": record.transitions,
    }


# ------------------------------------------------------------------------------ I/O


class LeaderElector:
    """One candidate for the Lease ``namespace/name``."""

    def __init__(
        self,
        client: KubeClient,
        *,
        name: str,
        namespace: str,
        identity: str,
        lease_duration: float = DEFAULT_LEASE_DURATION,
        renew_deadline: float = DEFAULT_RENEW_DEADLINE,
        retry_period: float = DEFAULT_RETRY_PERIOD,
        owner_service_account: str | None = None,
        metrics: KubeMetrics | None = None,
        rng: random.Random | None = None,
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        request_timeout: float | None = None,
    ) -> None:
        if lease_duration <= renew_deadline:
            raise ValueError("lease_duration must be greater than renew_deadline")
        if renew_deadline <= JITTER_FACTOR * retry_period:
            raise ValueError("renew_deadline must be greater than 1.2 x retry_period")
        if retry_period <= 0:
            raise ValueError("retry_period must be positive")
        if request_timeout is None:
            request_timeout = renew_deadline / 2
        if not 0 < request_timeout < renew_deadline:
            raise ValueError("request_timeout must be positive and shorter than renew_deadline")
        self.client = client
        self.name = name
        self.namespace = namespace
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.request_timeout = request_timeout
        self.owner_service_account = owner_service_account or None
        self._metrics = NO_METRICS if metrics is None else metrics
        self._rng = rng if rng is not None else random.Random()
        self._wall_clock = wall_clock
        self._observation: Observation | None = None
        self._lease: Obj | None = None  # the last Lease read or written
        # Loop time at which the last successful write was sent.
        self._written_at = 0.0
        self._is_leader = False
        self._owner: dict[str, Any] | None = None  # the ownerReference, once read
        self._owner_retry_at = 0.0  # loop time before which a failed read is not retried
        self._owner_backoff = retry_period
        self._owner_warned = False  # one warning per streak of failed reads
        self._log = log.bind(lease=f"{namespace}/{name}", identity=identity)
        self._set_gauge(False)

    @property
    def is_leader(self) -> bool:
        return self._is_leader

    @property
    def holder(self) -> str | None:
        """The holder last observed (None before the first read)."""
        return self._observation.record.holder if self._observation else None

    # --------------------------------------------------------------- main loop

    async def run(self, lead: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Wait to be elected, then run ``lead()`` while renewing the lease.

        Returns when ``lead()`` returns (the lease is released); raises what
        ``lead()`` raises (after releasing), or :class:`LeadershipLost` if
        the lease could not be renewed (``lead()`` is cancelled first).
        Cancelling ``run`` cancels ``lead()`` and releases the lease.
        """
        await self.acquire()
        leading = asyncio.create_task(lead(), name="leading")
        renewing = asyncio.create_task(self._renew_until_lost(), name="lease renewal")
        try:
            await asyncio.wait({leading, renewing}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            renewing.cancel()
            leading.cancel()
            await asyncio.gather(renewing, leading, return_exceptions=True)
            if self._is_leader:
                await asyncio.shield(self.release())
        if leading.done() and not leading.cancelled():
            leading.result()  # re-raise what lead() raised
            return
        raise LeadershipLost(f"{self.identity} lost the lease {self.namespace}/{self.name}")

    async def acquire(self) -> None:
        """Return once this candidate holds the lease."""
        self._log.info("waiting for the lease")
        while not await self.try_acquire_or_renew():
            delay = self.retry_period * (1.0 + JITTER_FACTOR * self._rng.random())
            await asyncio.sleep(delay)
        self._log.info("became leader")

    async def _renew_until_lost(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.retry_period)
            # From when the last good write was sent (acquiring included).
            deadline = self._written_at + self.renew_deadline
            renewed = False
            while not renewed and loop.time() < deadline:
                try:
                    async with asyncio.timeout_at(deadline):
                        renewed = await self.try_acquire_or_renew()
                except TimeoutError:
                    break
                if not renewed:
                    await asyncio.sleep(min(self.retry_period, max(0.0, deadline - loop.time())))
            if not renewed:
                self._became_follower()
                self._log.error("lost the lease: could not renew it within the renew deadline")
                return

    # ------------------------------------------------------------------ steps

    async def try_acquire_or_renew(self) -> bool:
        """One round of client-go's tryAcquireOrRenew; True when we hold the lease after it."""
        now = asyncio.get_running_loop().time()
        if self._is_leader and self._lease is not None and self._observation is not None:
            # Fast path: renew from the Lease we wrote last (one request).
            spec = lease_spec(
                Action.RENEW,
                self.identity,
                self._observation.record,
                self._wall_clock(),
                self.lease_duration,
            )
            body = self._owned({**self._lease, "spec": spec}, await self._owner_reference())
            sent = asyncio.get_running_loop().time()
            try:
                written = await self._bounded(
                    "update", self.client.replace(LEASES, self.namespace, self.name, body)
                )
            except ApiError as exc:
                self._log.debug("fast renew failed, reading the lease", error=str(exc))
            else:
                self._remember(written, now, sent=sent)
                return True

        try:
            lease: Obj | None = await self._bounded(
                "get", self.client.get(LEASES, self.namespace, self.name)
            )
        except ApiError as exc:
            if not exc.is_not_found:
                self._log.warning("cannot read the lease", error=str(exc))
                return False
            lease = None

        if lease is None:
            if self._lease is not None and self._owner is not None:
                # The Lease we knew is gone: perhaps collected with its owner.
                # Read the owner again rather than recreate a Lease whose owner
                # no longer exists (the collector would delete it at once).
                self._owner = None
                self._owner_retry_at = 0.0
            self._lease = None
            self._observation = None
            action = Action.CREATE
        else:
            record = LeaseRecord.from_lease(lease, self.lease_duration)
            self._observation = observe(self._observation, record, now)
            action = decide(self.identity, self._observation, now)

        if action is Action.WAIT:
            self._became_follower()
            return False
        owner = await self._owner_reference()
        record_for_spec = self._observation.record if self._observation else None
        spec = lease_spec(
            action, self.identity, record_for_spec, self._wall_clock(), self.lease_duration
        )
        sent = asyncio.get_running_loop().time()
        try:
            if action is Action.CREATE:
                body = {
                    "apiVersion": LEASES.api_version,
                    "kind": LEASES.kind,
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": spec,
                }
                written = await self._bounded(
                    "create", self.client.create(LEASES, self.namespace, self._owned(body, owner))
                )
            else:
                assert lease is not None
                # The resourceVersion read above is the precondition.
                owned = self._owned({**lease, "spec": spec}, owner)
                written = await self._bounded(
                    "update", self.client.replace(LEASES, self.namespace, self.name, owned)
                )
        except ApiError as exc:
            if exc.is_conflict:
                self._log.debug("lost a race for the lease", action=action.value)
            else:
                self._log.warning("cannot write the lease", action=action.value, error=str(exc))
            self._became_follower()
            return False
        if action is Action.ACQUIRE and lease is not None:
            self._log.info("took over the lease", previous_holder=self.holder or "<none>")
        self._remember(written, now, sent=sent)
        return True

    async def release(self) -> bool:
        """Give the lease up (only if we still hold it); True when released."""
        if self._lease is None or self._observation is None:
            return False
        if self._observation.record.holder != self.identity:
            return False
        spec = released_spec(self._observation.record, self._wall_clock())
        try:
            # Bounded: a shutdown must not hang on an unreachable API server;
            # the lease then simply expires.
            async with asyncio.timeout(self.renew_deadline):
                written = await self.client.replace(
                    LEASES, self.namespace, self.name, {**self._lease, "spec": spec}
                )
        except (ApiError, TimeoutError) as exc:
            self._log.warning("cannot release the lease", error=str(exc) or type(exc).__name__)
            return False
        finally:
            self._became_follower()
        self._remember(written, asyncio.get_running_loop().time(), leader=False)
        self._log.info("released the lease")
        return True

    # ---------------------------------------------------------------- private

    async def _owner_reference(self) -> dict[str, Any] | None:
        """The ownerReference to the owner ServiceAccount, read on first need; None without one.

        A failed read is retried on a later round, after a backoff that
        doubles from ``retry_period`` to ``OWNER_RETRY_MAX``, and never for
        longer than ``retry_period``: the election does not wait on it.
        """
        if self.owner_service_account is None or self._owner is not None:
            return self._owner
        loop = asyncio.get_running_loop()
        if loop.time() < self._owner_retry_at:
            return None
        try:
            async with asyncio.timeout(self.retry_period):
                account = await self.client.get(
                    SERVICEACCOUNTS, self.namespace, self.owner_service_account
                )
            owner = owner_reference(account)
        except (ApiError, TimeoutError) as exc:
            self._owner_retry_at = loop.time() + self._owner_backoff
            self._owner_backoff = min(2 * self._owner_backoff, OWNER_RETRY_MAX)
            reason = _reason(exc)
            if self._owner_warned:
                self._log.debug("still cannot read the lease's owner", reason=reason)
            else:
                self._owner_warned = True
                self._log.warning(
                    "cannot read the ServiceAccount that should own the lease; "
                    "the lease has no owner, so it outlives the release",
                    service_account=self.owner_service_account,
                    reason=reason,
                    error=str(exc) or type(exc).__name__,
                )
            return None
        if self._owner_warned:
            self._log.info("read the lease's owner", service_account=self.owner_service_account)
        self._owner = owner
        self._owner_warned = False
        self._owner_backoff = self.retry_period
        return owner

    @staticmethod
    def _owned(lease: Obj, owner: Mapping[str, Any] | None) -> Obj:
        """``lease`` with ``owner`` among its ownerReferences (``lease`` itself if it has it)."""
        if owner is None:
            return lease
        metadata = with_owner(lease.get("metadata") or {}, owner)
        return lease if metadata is None else {**lease, "metadata": metadata}

    async def _bounded(self, verb: str, request: Awaitable[Obj]) -> Obj:
        """``request``'s answer, or :class:`TransportError` after ``request_timeout``."""
        try:
            async with asyncio.timeout(self.request_timeout):
                return await request
        except TimeoutError:
            raise TransportError(
                0,
                "Timeout",
                f"no answer within {self.request_timeout:g}s",
                verb=verb,
                path=LEASES.path(self.namespace, self.name),
            ) from None

    def _remember(
        self, lease: Obj, now: float, *, leader: bool = True, sent: float | None = None
    ) -> None:
        self._lease = lease
        self._observation = Observation(LeaseRecord.from_lease(lease, self.lease_duration), now)
        if leader:
            self._is_leader = True
            self._written_at = now if sent is None else sent
            self._set_gauge(True)

    def _became_follower(self) -> None:
        self._is_leader = False
        self._set_gauge(False)

    def _set_gauge(self, leader: bool) -> None:
        self._metrics.leader_election_master_status.labels(name=self.name).set(1 if leader else 0)


def _reason(exc: ApiError | TimeoutError) -> str:
    """The API's reason for a refusal (``Forbidden``, ``NotFound``), else what went wrong."""
    if isinstance(exc, TimeoutError):
        return "Timeout"
    return exc.reason or (str(exc.status) if exc.status else "NoAnswer")
