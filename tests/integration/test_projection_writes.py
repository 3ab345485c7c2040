"""Writes made from projected caches, against the real API server.

The caches keep projections (``controller.projection``): a run without its
labels, annotations, finalizers or managedFields, children without most of
their spec and status. The status write PUTs ``{**cached run, "status": new}``
to the status subresource; the API server must keep everything the
projection left out, and a pass over an unchanged run must write nothing (the
projection keeps what drift detection and the status compare).
"""

from __future__ import annotations

from typing import Any

import pytest

from controller.config_reconcile import ConfigReconciler
from controller.naming import managed_selector
from controller.reconcile import Reconciler
from kubeclient.client import KubeClient
from kubeclient.events import EventRecorder
from kubeclient.resources import CONFIGMAPS, CONFIGS, CRONJOBS, JOBS, RUNS
from tests.caches import NamespaceCaches
from tests.kubehelpers import eventually
from tests.runs import inference_config, inference_run

# The CRDs, for the runs and configs the tests create through ``kube`` (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("crds")

IMAGE = "test.local/fake-slow:1"


class Projected(NamespaceCaches):
    """The controller's caches, projected as the controller builds them, and its reconcilers."""

    def __init__(self, kube: KubeClient, namespace: str) -> None:
        super().__init__(kube, namespace)
        events = EventRecorder(kube)
        self.runs = Reconciler(client=kube, caches=self.caches, events=events)
        self.configs = ConfigReconciler(client=kube, caches=self.caches, events=events)

    async def __aenter__(self) -> Projected:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.stop()


# A yearly schedule: nothing fires, and the next tick in the status stays the same.
@pytest.mark.parametrize("schedule", [None, "0 3 1 1 *"])
async def test_status_writes_from_projected_objects_keep_the_rest_and_settle(
    kube: KubeClient, namespace: str, schedule: str | None
) -> None:
    config = inference_config("cfg", IMAGE)
    config["metadata"]["labels"] = {"team": "ml"}
    config["metadata"]["annotations"] = {"example.com/note": "kept"}
    await kube.create(CONFIGS, namespace, config)
    spec: dict[str, Any] = {"suspend": True} if schedule is None else {"schedule": schedule}
    run = inference_run("r", "cfg", **spec)
    run["metadata"]["labels"] = {"app": "demo"}
    run["metadata"]["annotations"] = {"example.com/owner": "me"}
    run["metadata"]["finalizers"] = ["example.com/keep"]
    await kube.create(RUNS, namespace, run)
    key = f"{namespace}/r"
    async with Projected(kube, namespace) as harness:
        try:

            async def config_cached() -> bool:
                return harness.caches.configs.get(namespace, "cfg") is not None

            await eventually(config_cached, within=10, what="the config in the cache")
            await harness.configs.reconcile(f"{namespace}/cfg")
            workload = harness.caches.cronjobs if schedule else harness.caches.jobs
            want = "Scheduled" if schedule else "Suspended"

            async def settled() -> bool:
                await harness.runs.reconcile(key)
                cached = harness.caches.runs.get_by_key(key) or {}
                phase = (cached.get("status") or {}).get("phase")
                return phase == want and len(workload.list(namespace)) == 1

            await eventually(settled, within=30, what=f"the run {want} with its children")
            # The cached run is a projection ...
            cached = harness.caches.runs.get_by_key(key)
            assert cached is not None
            assert "labels" not in cached["metadata"]
            assert "managedFields" not in cached["metadata"]
            # ... but what the API server keeps is whole.
            live = await kube.get(RUNS, namespace, "r")
            assert live["metadata"]["labels"] == {"app": "demo"}
            assert live["metadata"]["annotations"]["example.com/owner"] == "me"
            assert live["metadata"]["finalizers"] == ["example.com/keep"]
            assert live["spec"]["configRef"] == {"name": "cfg"}
            assert live["status"]["phase"] == want
            live_config = await kube.get(CONFIGS, namespace, "cfg")
            assert live_config["metadata"]["labels"] == {"team": "ml"}
            assert live_config["metadata"]["annotations"] == {"example.com/note": "kept"}
            assert [c["type"] for c in live_config["status"]["conditions"]][:1] == ["Ready"]

            # Nothing changed: more passes write nothing (no repair loop, no status churn).
            versions = {
                "run": live["metadata"]["resourceVersion"],
                "config": live_config["metadata"]["resourceVersion"],
            }
            children = {
                o["metadata"]["name"]: o["metadata"]["resourceVersion"]
                for resource in (CONFIGMAPS, CRONJOBS if schedule else JOBS)
                for o in (await kube.list(resource, namespace, label_selector=managed_selector()))[
                    "items"
                ]
            }

            async def caught_up() -> bool:
                run = harness.caches.runs.get_by_key(key) or {}
                cfg = harness.caches.configs.get(namespace, "cfg") or {}
                cached = {
                    o["metadata"]["name"]: o["metadata"]["resourceVersion"]
                    for informer in (harness.caches.configmaps, workload)
                    for o in informer.list(namespace)
                }
                return (
                    run.get("metadata", {}).get("resourceVersion") == versions["run"]
                    and cfg.get("metadata", {}).get("resourceVersion") == versions["config"]
                    and cached == children
                )

            # The caches hold what the API server holds; then passes write nothing.
            await eventually(caught_up, within=30, what="the caches to catch up")
            for _ in range(3):
                await harness.runs.reconcile(key)
                await harness.configs.reconcile(f"{namespace}/cfg")
            assert (await kube.get(RUNS, namespace, "r"))["metadata"]["resourceVersion"] == (
                versions["run"]
            )
            assert (await kube.get(CONFIGS, namespace, "cfg"))["metadata"]["resourceVersion"] == (
                versions["config"]
            )
            after = {
                o["metadata"]["name"]: o["metadata"]["resourceVersion"]
                for resource in (CONFIGMAPS, CRONJOBS if schedule else JOBS)
                for o in (await kube.list(resource, namespace, label_selector=managed_selector()))[
                    "items"
                ]
            }
            assert after == children
        finally:
            await kube.patch(RUNS, namespace, "r", {"metadata": {"finalizers": None}})
