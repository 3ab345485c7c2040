"""The controller's caches of one namespace, for tests that drive its reconcilers by hand.

Built by :func:`controller.caches.build_caches`, as the controller builds
them (projected and indexed), without the work queues: a test decides when
each reconcile happens and which informer lags.
"""

from __future__ import annotations

import asyncio
import contextlib

from controller.caches import build_caches
from kubeclient.client import KubeClient
from kubeclient.informer import Informer


class NamespaceCaches:
    """The controller's caches of ``namespace``, started and stopped by the test."""

    def __init__(self, kube: KubeClient, namespace: str) -> None:
        self.caches = build_caches(kube, [namespace])
        self.tasks: list[tuple[Informer, asyncio.Task[None]]] = []

    async def start(self) -> None:
        """Run every informer, each synced before the next starts (the controller's order)."""
        for informer in self.caches.all():
            self.tasks.append((informer, asyncio.create_task(informer.run())))
            await informer.wait_for_sync()

    async def stop(self, *informers: Informer) -> None:
        """Stop ``informers`` (all by default); their caches keep what they had."""
        stopping = [t for i, t in self.tasks if not informers or any(i is x for x in informers)]
        self.tasks = [(i, t) for i, t in self.tasks if all(t is not s for s in stopping)]
        for task in stopping:
            task.cancel()
        for task in stopping:
            with contextlib.suppress(asyncio.CancelledError):
                await task
