"""What the controller's registry (controller/metrics.py) serves, and docs/metrics.md about it."""

from __future__ import annotations

import asyncio
import re

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from controller.kube.errors import ApiError
from controller.kube.workers import Workers
from controller.kube.workqueue import WorkQueue
from controller.metrics import RECONCILE_RESULTS, WORKQUEUE_BUCKETS, Metrics, api_host
from tests.chart import REPO

pytestmark = [pytest.mark.unit]

METRICS_MD = REPO / "docs" / "metrics.md"


def page(metrics: Metrics) -> str:
    return generate_latest(metrics.registry).decode()


def sample(metrics: Metrics, metric: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(metric, labels)


def served_names(text: str) -> set[str]:
    """Names as a query writes them: counters with ``_total``, histograms by family."""
    names = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name + ("_total" if family.type == "counter" else ""))
    return names


def documented_names() -> set[str]:
    """The metric names in the first column of docs/metrics.md's tables."""
    found = re.findall(r"^\| `([a-z_:][a-z0-9_:]*)` \|", METRICS_MD.read_text(), re.MULTILINE)
    return set(found)


def test_no_created_series() -> None:
    metrics = Metrics()
    metrics.init_controller("inferencerun", 2)
    metrics.run_finished("ns", "cfg", "Succeeded", 12.0, rows=3, predictions=3)
    metrics.rest_client_requests_total.labels(
        verb="get", method="GET", code="200", host="h:6443"
    ).inc()
    metrics.rest_client_request_duration_seconds.labels(verb="GET", host="h:6443").observe(0.1)
    assert "_created" not in page(metrics)


def test_process_and_build_info_are_served() -> None:
    metrics = Metrics()
    text = page(metrics)
    for name in ("process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds"):
        assert re.search(rf"^{name} ", text, re.MULTILINE), name
    (info,) = [
        s
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "kserve_inference_controller_build_info"
    ]
    assert info.value == 1
    assert info.labels["version"] == "0.1.0"
    assert re.fullmatch(r"3\.\d+\.\d+.*", info.labels["python_version"])


def test_reconcile_series_exist_at_zero_before_the_first_reconcile() -> None:
    metrics = Metrics()
    Workers(
        WorkQueue[str]("q"), lambda _key: asyncio.sleep(0), metrics=metrics, name="c", workers=3
    )
    for result in RECONCILE_RESULTS:
        assert (
            sample(metrics, "controller_runtime_reconcile_total", controller="c", result=result)
            == 0
        )
    for name in (
        "controller_runtime_reconcile_errors_total",
        "controller_runtime_terminal_reconcile_errors_total",
        "controller_runtime_reconcile_panics_total",
        "controller_runtime_reconcile_time_seconds_count",
        "controller_runtime_active_workers",
    ):
        assert sample(metrics, name, controller="c") == 0, name
    assert sample(metrics, "controller_runtime_max_concurrent_reconciles", controller="c") == 3


def test_event_outcomes_exist_at_zero_from_the_start() -> None:
    metrics = Metrics()
    for outcome in ("created", "patched", "aggregated", "dropped", "failed"):
        assert sample(metrics, "controller_events_total", outcome=outcome) == 0, outcome


@pytest.mark.looptime
async def test_an_unexpected_exception_is_a_panic_an_api_error_is_not() -> None:
    metrics = Metrics()
    queue: WorkQueue[str] = WorkQueue("q")
    answers: list[BaseException] = [ApiError(409, "Conflict", "lost"), KeyError("bug")]

    async def reconcile(_key: str) -> None:
        raise answers.pop(0)

    workers = Workers(queue, reconcile, metrics=metrics, name="c")
    queue.add("ns/a")
    assert await workers.process_next_item()
    assert sample(metrics, "controller_runtime_reconcile_panics_total", controller="c") == 0
    assert sample(metrics, "controller_runtime_reconcile_errors_total", controller="c") == 1
    queue.add("ns/b")
    assert await workers.process_next_item()
    assert sample(metrics, "controller_runtime_reconcile_panics_total", controller="c") == 1
    assert sample(metrics, "controller_runtime_reconcile_errors_total", controller="c") == 2


def test_leader_election_off_reports_the_single_replica_as_leader() -> None:
    metrics = Metrics()
    metrics.leader_election_disabled("kserve-inference-controller")
    status = "leader_election_master_status"
    assert sample(metrics, status, name="kserve-inference-controller") == 1


def test_run_finished_counts_results_durations_rows_and_predictions() -> None:
    metrics = Metrics()
    metrics.run_finished("team-a", "iris", "Succeeded", 90.0, rows=150, predictions=150)
    labels = {"namespace": "team-a", "config": "iris"}
    finished = "inference_runs_finished_total"
    assert sample(metrics, finished, **labels, result="Succeeded") == 1
    # The other result exists at 0, so its first increment is seen by increase().
    assert sample(metrics, finished, **labels, result="Failed") == 0
    metrics.run_finished("team-a", "iris", "Failed", 7200.0, rows=None, predictions=None)
    assert sample(metrics, finished, **labels, result="Failed") == 1
    duration = "inference_run_duration_seconds"
    assert sample(metrics, f"{duration}_sum", **labels, result="Succeeded") == 90
    assert sample(metrics, f"{duration}_bucket", **labels, result="Failed", le="3600.0") == 0
    assert sample(metrics, f"{duration}_bucket", **labels, result="Failed", le="7200.0") == 1
    assert sample(metrics, "inference_rows_total", **labels) == 150
    assert sample(metrics, "inference_predictions_total", **labels) == 150
    with pytest.raises(ValueError, match="result"):
        metrics.run_finished("team-a", "iris", "Error")


def test_workqueue_buckets_are_client_gos_up_to_1000_seconds() -> None:
    assert WORKQUEUE_BUCKETS[0] == pytest.approx(1e-8)
    assert WORKQUEUE_BUCKETS[-1] == pytest.approx(1e3)
    assert len(WORKQUEUE_BUCKETS) == 12
    metrics = Metrics()
    metrics.workqueue_queue_duration_seconds.labels(name="q").observe(300)  # a resync's wait
    assert sample(metrics, "workqueue_queue_duration_seconds_bucket", name="q", le="100.0") == 0
    assert sample(metrics, "workqueue_queue_duration_seconds_bucket", name="q", le="1000.0") == 1


def test_rest_client_metrics_have_client_gos_labels() -> None:
    metrics = Metrics()
    families = {f.name: f for f in metrics.registry.collect()}
    requests = metrics.rest_client_requests_total
    duration = metrics.rest_client_request_duration_seconds
    # client-go's code, method and host, plus the Kubernetes verb.
    assert set(requests._labelnames) == {"code", "method", "host", "verb"}
    assert set(duration._labelnames) == {"verb", "host"}
    assert families["rest_client_request_duration_seconds"].type == "histogram"
    assert api_host("https://10.0.0.1:6443") == "10.0.0.1:6443"
    assert api_host("https://kubernetes.default.svc/") == "kubernetes.default.svc"


def test_metrics_md_lists_exactly_what_metrics_serves() -> None:
    served = served_names(page(Metrics()))
    documented = documented_names()
    assert served - documented == set(), "served but not in docs/metrics.md"
    assert documented - served == set(), "in docs/metrics.md but not served"
