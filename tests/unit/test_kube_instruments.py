"""What kubeclient and the reconcilers record with: Metrics and the no-ops agree on it."""

from __future__ import annotations

import asyncio
import inspect

import pytest
from prometheus_client import generate_latest
from prometheus_client.metrics import MetricWrapperBase

from controller.metrics import NO_RUN_METRICS, Metrics, NoRunMetrics, RunMetrics
from kubeclient.instruments import NO_METRICS, KubeMetrics, NoMetrics, labelled
from kubeclient.workers import Workers
from kubeclient.workqueue import WorkQueue

pytestmark = pytest.mark.unit


def _families(protocol: type = KubeMetrics) -> list[str]:
    return [
        name
        for name, member in inspect.getmembers(protocol)
        if isinstance(member, property) and not name.startswith("_")
    ]


def test_the_app_metrics_have_every_family_the_client_records() -> None:
    families = _families()
    assert len(families) >= 20, families
    metrics = Metrics(process=False)
    for name in families:
        assert isinstance(getattr(metrics, name), MetricWrapperBase), name
        assert hasattr(NoMetrics, name), name


def test_no_metrics_takes_every_sample_and_keeps_none() -> None:
    for name in _families():
        child = labelled(getattr(NO_METRICS, name), name="q", controller="c")
        child.inc()
        child.inc(2)
        child.dec()
        child.set(1)
        child.observe(0.5)
        child.set_function(lambda: 1.0)
    NO_METRICS.init_controller("c", 2)


def test_the_reconcilers_no_metrics_have_every_family_and_take_a_finished_run() -> None:
    families = _families(RunMetrics)
    assert "inference_run_workloads_deleted_total" in families, families
    assert set(_families()) < set(families)
    metrics = Metrics(process=False)
    for name in families:
        assert isinstance(getattr(metrics, name), MetricWrapperBase), name
        assert hasattr(NoRunMetrics, name), name
        labelled(getattr(NO_RUN_METRICS, name), kind="Job", reason="RunDeleted").inc()
    NO_RUN_METRICS.run_finished("ns", "config", "Succeeded", duration_seconds=1.0, rows=2)


async def test_a_queue_and_its_workers_run_without_metrics() -> None:
    queue: WorkQueue[str] = WorkQueue("plain")
    seen: list[str] = []

    async def reconcile(key: str) -> None:
        seen.append(key)
        queue.shut_down()

    workers = Workers(queue, reconcile, name="plain")
    queue.add("a")
    await asyncio.wait_for(workers.run(), timeout=30)
    assert seen == ["a"]


async def test_the_same_queue_with_metrics_records() -> None:
    metrics = Metrics(process=False)
    queue: WorkQueue[str] = WorkQueue("measured", metrics=metrics)

    async def reconcile(key: str) -> None:
        queue.shut_down()

    workers = Workers(queue, reconcile, name="measured", metrics=metrics)
    queue.add("a")
    await asyncio.wait_for(workers.run(), timeout=30)
    text = generate_latest(metrics.registry).decode()
    assert 'workqueue_adds_total{name="measured"} 1.0' in text
    assert 'controller_runtime_reconcile_total{controller="measured",result="success"} 1.0' in text
