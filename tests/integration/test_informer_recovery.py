"""Informers across a kube-apiserver restart on the shared test control plane.

The API server is stopped for about 20 s (etcd, the controller manager and
the node agent keep running) and started again; every informer must be
following the server again within seconds of it answering, not after the
30 s that an exponential backoff grown through the outage would cost. A
longer outage, with the whole controller, is a fault test of its own.

Stopping the API server affects every user of the shared cluster, so the
test always starts it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from hack.cluster import LocalCluster
from kubeclient.client import KubeClient
from kubeclient.errors import ApiError
from kubeclient.informer import Informer, OnAdd
from kubeclient.resources import CONFIGMAPS

OUTAGE = 20.0  # seconds without an API server
LIVENESS = 6.0  # seconds from the first write the server takes; an informer needs about 1


async def test_every_informer_follows_the_api_server_again_soon_after_a_restart(
    cluster: LocalCluster, kube: KubeClient, namespace: str
) -> None:
    label = {"restart-test": "yes"}
    await kube.create(CONFIGMAPS, namespace, {"metadata": {"name": "before", "labels": label}})
    # Several informers of each shape, so that the old, randomly grown backoff
    # cannot pass by luck: each of them would wait anything up to 30 s.
    informers = [
        informer
        for copy in ("a", "b")
        for informer in (
            Informer(kube, CONFIGMAPS, namespaces=[namespace], name=f"namespaced-{copy}"),
            Informer(
                kube,
                CONFIGMAPS,
                namespaces=[namespace],
                label_selector="restart-test=yes",
                name=f"namespaced-selector-{copy}",
            ),
            Informer(
                kube, CONFIGMAPS, label_selector="restart-test=yes", name=f"cluster-wide-{copy}"
            ),
            Informer(
                kube,
                CONFIGMAPS,
                field_selector=f"metadata.namespace={namespace}",
                name=f"field-selector-{copy}",
            ),
        )
    ]
    seen_at: dict[str, float] = {}  # informer -> when it saw "after"
    all_seen = asyncio.Event()
    for informer in informers:
        informer.add_event_handler(
            on_add=_note_arrival(seen_at, informer.name, "after", len(informers), all_seen)
        )
    tasks = [asyncio.create_task(informer.run()) for informer in informers]
    stopped = False
    starting: asyncio.Task[float] | None = None
    try:
        for informer in informers:
            await asyncio.wait_for(informer.wait_for_sync(), timeout=30)
            assert informer.get(namespace, "before") is not None

        stopped = True
        # kube-apiserver drains for its grace period: the outage starts when it is gone.
        await asyncio.to_thread(cluster.stop_apiserver)
        down_at = time.monotonic()
        await asyncio.sleep(OUTAGE)
        starting = asyncio.create_task(asyncio.to_thread(cluster.start_apiserver))
        # The clock starts when the server takes a write, which may be before
        # /readyz says ready: from then on it answers the informers too.
        created_at = await _create_when_answering(
            kube, namespace, {"metadata": {"name": "after", "labels": label}}
        )
        startup = await starting
        ready_at = time.monotonic()
        stopped = False
        for task in tasks:
            assert not task.done(), "an informer gave up during the outage"

        with contextlib.suppress(TimeoutError):
            left = created_at + LIVENESS - time.monotonic()
            await asyncio.wait_for(all_seen.wait(), timeout=max(0.0, left))
        report = {
            informer.name: {
                "relisted": _since(informer.last_sync, ready_at),
                "saw_new_object": _since(seen_at.get(informer.name), ready_at),
            }
            for informer in informers
        }
        print(
            f"\napiserver down {ready_at - down_at:.1f}s (startup {startup:.1f}s), took the"
            f" write {created_at - ready_at:+.2f}s after ready; seconds after ready: {report}"
        )
        late = [i.name for i in informers if i.name not in seen_at]
        assert not late, f"{late} did not see a new object within {LIVENESS}s of the restart"
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if starting is not None:
            with contextlib.suppress(Exception):
                await starting
        if stopped:
            with contextlib.suppress(RuntimeError):  # running already
                await asyncio.to_thread(cluster.start_apiserver)


def _note_arrival(
    seen_at: dict[str, float], informer: str, name: str, informers: int, all_seen: asyncio.Event
) -> OnAdd:
    def on_add(obj: dict[str, Any]) -> None:
        if obj["metadata"]["name"] == name:
            seen_at.setdefault(informer, time.monotonic())
            if len(seen_at) == informers:
                all_seen.set()

    return on_add


async def _create_when_answering(kube: KubeClient, namespace: str, body: dict[str, Any]) -> float:
    """Create ``body`` as soon as the starting API server takes it; when it did (monotonic)."""
    deadline = time.monotonic() + 120
    while True:
        try:
            await kube.create(CONFIGMAPS, namespace, body)
        except ApiError as exc:
            if exc.is_already_exists:  # an earlier try got through after all
                return time.monotonic()
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)
        else:
            return time.monotonic()


def _since(moment: float | None, ready_at: float) -> float | None:
    return None if moment is None else round(moment - ready_at, 2)
