"""What the controller's informer events put into its run queue, and when.

The controller is built as ``python -m controller`` builds it, on a client
that is never used (no informer runs): watch events are applied by hand with
:meth:`Informer.handle_event`, the informer's own code path for every event,
and the run queue is read on looptime's fake clock.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from controller.controller import CHILD_EVENTS_BATCH, PHASES, Controller
from controller.metrics import Metrics, runs_by_phase
from controller.projection import project_job, project_pod, unchanged
from controller.settings import load_settings
from kubeclient.client import KubeClient
from kubeclient.incluster import InClusterConfiguration
from tests.unit.test_projection import (
    job_status,
    running,
    served_pod,
    served_run,
    terminated,
)

pytestmark = [pytest.mark.unit, pytest.mark.looptime]

RUN_KEY = "ns/r"


@pytest.fixture
async def controller() -> AsyncIterator[Controller]:
    # Plain HTTP to a closed port: nothing here sends a request.
    configuration = InClusterConfiguration(
        host="http://127.0.0.1:1", ssl_ca_cert="", token_file=Path("/nonexistent/token")
    )
    kube = KubeClient(configuration)
    settings = load_settings(
        [], {"WATCH_NAMESPACE": "ns", "LEADER_ELECT": "false"}, namespace_file=Path("/nonexistent")
    )
    built = Controller(settings, kube, Metrics())
    try:
        yield built
    finally:
        built.queue.shut_down()
        await kube.close()


def event(kind: str, obj: dict[str, Any], rv: str) -> dict[str, Any]:
    changed = copy.deepcopy(obj)
    changed["metadata"]["resourceVersion"] = rv
    return {"type": kind, "object": changed}


async def passes(controller: Controller, within: float) -> list[float]:
    """Loop times (from now) at which the run queue hands out the run, within ``within`` s."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    seen: list[float] = []
    while True:
        left = start + within - loop.time()
        if left <= 0:
            return seen
        try:
            key = await asyncio.wait_for(controller.queue.get(), timeout=left)
        except TimeoutError:
            return seen
        assert key == RUN_KEY
        seen.append(round(loop.time() - start, 3))
        controller.queue.done(key)


async def with_run(controller: Controller) -> None:
    controller.caches.runs.handle_event(event("ADDED", served_run(), "10"))
    assert await passes(controller, 0.1) == [0.0]  # a run's own event: at once


async def test_a_childs_changes_within_the_batch_make_one_pass_after_the_first(
    controller: Controller,
) -> None:
    await with_run(controller)
    pods = controller.caches.pods
    pending = served_pod("r-job", {"waiting": {"reason": "ContainerCreating"}})
    pods.handle_event(event("ADDED", pending, "20"))
    await asyncio.sleep(CHILD_EVENTS_BATCH / 2)
    pods.handle_event(event("MODIFIED", served_pod("r-job", running()), "21"))
    assert await passes(controller, 10) == [CHILD_EVENTS_BATCH / 2]
    pods.handle_event(event("MODIFIED", served_pod("r-job", terminated(0)), "22"))
    assert await passes(controller, 10) == [CHILD_EVENTS_BATCH]


async def test_a_change_nobody_reads_makes_no_pass(controller: Controller) -> None:
    await with_run(controller)
    pod = served_pod("r-job", running())
    controller.caches.pods.handle_event(event("ADDED", pod, "20"))
    assert await passes(controller, 10) == [CHILD_EVENTS_BATCH]
    moved = copy.deepcopy(pod)
    moved["status"]["podIP"] = "10.1.0.6"
    moved["metadata"]["finalizers"] = []
    controller.caches.pods.handle_event(event("MODIFIED", moved, "21"))
    assert await passes(controller, 10) == []
    # The cache has the new resourceVersion all the same.
    cached = controller.caches.pods.store.list()
    assert [p["metadata"]["resourceVersion"] for p in cached] == ["21"]


async def test_a_childs_deletion_is_not_batched(controller: Controller) -> None:
    await with_run(controller)
    pod = served_pod("r-job", running())
    controller.caches.pods.handle_event(event("ADDED", pod, "20"))
    await asyncio.sleep(0.1)
    controller.caches.pods.handle_event(event("DELETED", pod, "21"))
    # At once; the batched add still comes (a pass then finds nothing new).
    assert (await passes(controller, 10))[0] == 0.0


async def test_a_change_to_a_run_waiting_in_the_queue_adds_no_later_pass(
    controller: Controller,
) -> None:
    controller.caches.runs.handle_event(event("ADDED", served_run(), "10"))
    controller.caches.pods.handle_event(event("ADDED", served_pod("r-job", running()), "20"))
    assert await passes(controller, 10) == [0.0]


def test_unchanged_is_equality_but_for_the_resource_version() -> None:
    job: dict[str, Any] = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j", "namespace": "ns", "uid": "u", "resourceVersion": "1"},
        "spec": {"suspend": False},
        "status": job_status(active=1),
    }
    later = copy.deepcopy(job)
    later["metadata"]["resourceVersion"] = "2"
    later["status"]["active"] = 0
    later["status"]["ready"] = 1
    assert unchanged(project_job(job), project_job(later))
    done = copy.deepcopy(later)
    done["status"]["succeeded"] = 1
    assert not unchanged(project_job(job), project_job(done))
    renamed = copy.deepcopy(later)
    renamed["metadata"]["generation"] = 2
    assert not unchanged(project_job(job), project_job(renamed))
    assert not unchanged(project_job(job), {**project_job(later), "extra": {}})
    pod = served_pod("j", running())
    assert not unchanged(project_pod(pod), project_pod(served_pod("j", terminated(0))))


async def test_the_runs_gauge_counts_the_cache_own_writes_included(
    controller: Controller,
) -> None:
    def gauge(phase: str, config: str = "cfg") -> float | None:
        labels = {"namespace": "ns", "config": config, "phase": phase}
        return controller.metrics.registry.get_sample_value("kserve_inference_runs", labels)

    def from_the_runs() -> dict[tuple[str, str, str], int]:
        return runs_by_phase(controller.caches.runs.list(), PHASES)

    runs = controller.caches.runs
    cases = (("a", "Running", "cfg"), ("b", "Running", "cfg"), ("c", "Succeeded", "cfg"))
    for name, phase, config in (*cases, ("d", None, "cfg"), ("e", "Failed", "other")):
        run = served_run({"phase": phase} if phase else {}, configRef={"name": config})
        run["metadata"].update(name=name, uid=f"uid-{name}")
        runs.handle_event(event("ADDED", run, "10"))
    assert (gauge("Running"), gauge("Succeeded"), gauge("Failed")) == (2, 1, 0)
    assert gauge("Failed", "other") == 1
    assert runs_by_phase(controller._runs_by_phase(), PHASES) == from_the_runs()
    # The controller's own status write goes into the cache without an event.
    written = served_run({"phase": "Failed"})
    written["metadata"].update(name="a", uid="uid-a", resourceVersion="11")
    runs.assume(written)
    assert (gauge("Running"), gauge("Succeeded"), gauge("Failed")) == (1, 1, 1)
    runs.handle_event(event("DELETED", written, "12"))
    assert (gauge("Running"), gauge("Succeeded"), gauge("Failed")) == (1, 1, 0)
    assert runs_by_phase(controller._runs_by_phase(), PHASES) == from_the_runs()
