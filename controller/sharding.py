"""Sharding the controller by namespace: each shard handles the runs of its own namespaces.

For clusters with more runs than one leader can keep up with, ``SHARD_COUNT``
= n > 1 splits the work into n shards, each a separate Deployment (the chart's
``sharding.shards``) with its own leader election. A namespace belongs to
exactly one shard:

    shard(namespace) = first 4 bytes of sha256(namespace name), big-endian, mod n

SHA-256 because it is the same in every process, language and release
(Python's ``hash()`` is salted per process) and because its low bits are as
good as its high ones (FNV-1a's lowest bit is the parity of the name's bytes'
lowest bits: ``ns-1``, ``ns-3``, ``ns-5`` would all land on one of two
shards). From a shell: ``echo $(( 0x$(printf %s NAMESPACE | sha256sum | cut -c1-8) % n ))``.

What a shard keeps and does (:meth:`Shard.keep`, applied through the
informers' ``transform`` hook before anything else, so other shards' objects
never reach a cache, an index or a handler):

- **Runs and their children** (Jobs, CronJobs, ConfigMaps, pods live in the
  run's namespace): only those of its own namespaces. With an explicit
  ``WATCH_NAMESPACE`` list the shard also watches only its own namespaces
  (:meth:`Shard.narrow`); watching all namespaces, it watches them all and drops
  the rest on arrival.
- **InferenceConfigs**: all of them, because a run may use a config in another
  namespace (``configRef.namespace``); but a config is reconciled (status,
  probes) only by the shard owning its namespace (:meth:`Shard.owns`).

Each shard elects its leader on a Lease of its own,
``<LEASE_NAME>-shard-<index>-of-<count>`` (:func:`lease_name`), so shards never
compete for one Lease. With ``SHARD_COUNT`` = 1 (the default) nothing is
filtered and the Lease is ``LEASE_NAME``, exactly as without this module.

Changing the count moves namespaces between shards. Nothing is handed over
explicitly and nothing needs to be: a shard that starts owning a namespace
lists its runs and their Jobs, and the level-triggered reconcile carries on
from what exists (a Job found by the run's uid label is the run's Job; none is
created twice because a Job's name is derived from the run).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kubeclient.resources import Obj, Transform

# A bound on SHARD_COUNT: far beyond any sensible count, short of a typo's.
MAX_SHARDS = 1000


@functools.lru_cache(maxsize=65536)
def namespace_hash(namespace: str) -> int:
    """The namespace's stable 32-bit hash: the first 4 bytes of its name's SHA-256."""
    return int.from_bytes(hashlib.sha256(namespace.encode()).digest()[:4], "big")


def shard_of(namespace: str, count: int) -> int:
    """The shard (0..count-1) that owns ``namespace`` when there are ``count`` shards."""
    if count < 1:
        raise ValueError(f"the shard count must be at least 1, not {count}")
    return namespace_hash(namespace) % count


def lease_name(base: str, index: int, count: int) -> str:
    """The Lease of shard ``index`` of ``count``: ``base`` unsharded, else a suffix of its own."""
    return base if count <= 1 else f"{base}-shard-{index}-of-{count}"


def compose(*transforms: Transform | None) -> Transform | None:
    """One transform applying ``transforms`` in order (``None`` ones skipped).

    The first that drops an object (returns ``None``) ends it: what comes
    after never sees another shard's objects. ``None`` when there is nothing
    to apply, so an informer without any keeps its plain path.
    """
    steps = [step for step in transforms if step is not None]
    if not steps:
        return None
    if len(steps) == 1:
        return steps[0]

    def composed(obj: Obj) -> Obj | None:
        for step in steps:
            kept = step(obj)
            if kept is None:
                return None
            obj = kept
        return obj

    return composed


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` of ``count`` (``0`` of ``1``: the whole cluster, no sharding)."""

    index: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.count <= MAX_SHARDS:
            raise ValueError(f"the shard count must be 1..{MAX_SHARDS}, not {self.count}")
        if not 0 <= self.index < self.count:
            raise ValueError(
                f"shard index {self.index} is out of range for {self.count} shard(s): "
                f"use 0..{self.count - 1}"
            )

    @property
    def sharded(self) -> bool:
        return self.count > 1

    @property
    def label(self) -> str:
        """``<index>-of-<count>`` for logs and metrics; empty when not sharded."""
        return f"{self.index}-of-{self.count}" if self.sharded else ""

    def owns(self, namespace: str | None) -> bool:
        """Whether ``namespace``'s objects are this shard's (cluster-scoped ones: every shard's)."""
        if not self.sharded or not namespace:
            return True
        return shard_of(namespace, self.count) == self.index

    def narrow(self, namespaces: Sequence[str]) -> tuple[str, ...]:
        """The watch list this shard needs: its own of ``namespaces``.

        Empty stays empty (all namespaces, filtered on arrival). A list none of
        whose namespaces is this shard's stays whole rather than turning into
        "all namespaces"; :meth:`keep` then drops everything in it.
        """
        mine = tuple(namespace for namespace in namespaces if self.owns(namespace))
        return mine or tuple(namespaces)

    @property
    def keep(self) -> Transform | None:
        """The informer transform keeping this shard's objects (None: not sharded, keep all)."""
        return self._keep if self.sharded else None

    def _keep(self, obj: Obj) -> Obj | None:
        metadata: Any = obj.get("metadata") or {}
        return obj if self.owns(metadata.get("namespace")) else None

    def lease_name(self, base: str) -> str:
        return lease_name(base, self.index, self.count)
