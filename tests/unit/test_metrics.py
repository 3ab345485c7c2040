"""What the controller's registry (controller/metrics.py) serves, and docs/metrics.md about it."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
import yaml
from prometheus_client import Counter, Histogram, generate_latest
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families

from controller.metrics import (
    FAMILIES,
    RECONCILE_RESULTS,
    WORKQUEUE_BUCKETS,
    Family,
    Metrics,
    RunsByPhase,
    api_host,
    runs_by_phase,
)
from kubeclient.errors import ApiError
from kubeclient.workers import Workers
from kubeclient.workqueue import WorkQueue
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
        assert sample(metrics, "kserve_inference_controller_events_total", outcome=outcome) == 0, (
            outcome
        )


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
    finished = "kserve_inference_runs_finished_total"
    assert sample(metrics, finished, **labels, result="Succeeded") == 1
    # The other result exists at 0, so its first increment is seen by increase().
    assert sample(metrics, finished, **labels, result="Failed") == 0
    metrics.run_finished("team-a", "iris", "Failed", 7200.0, rows=None, predictions=None)
    assert sample(metrics, finished, **labels, result="Failed") == 1
    duration = "kserve_inference_run_duration_seconds"
    assert sample(metrics, f"{duration}_sum", **labels, result="Succeeded") == 90
    assert sample(metrics, f"{duration}_bucket", **labels, result="Failed", le="3600.0") == 0
    assert sample(metrics, f"{duration}_bucket", **labels, result="Failed", le="7200.0") == 1
    assert sample(metrics, "kserve_inference_rows_total", **labels) == 150
    assert sample(metrics, "kserve_inference_predictions_total", **labels) == 150
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


# The names borrowed from the libraries operators already have dashboards for;
# every other metric is the project's own and carries its one prefix.
LIBRARY_PREFIXES = ("workqueue_", "rest_client_", "controller_runtime_", "process_")
LIBRARY_NAMES = {"leader_election_master_status"}
OWN_PREFIX = "kserve_inference_"


def test_the_projects_own_metrics_share_one_prefix() -> None:
    served = served_names(page(Metrics()))
    own = {n for n in served if not n.startswith(LIBRARY_PREFIXES) and n not in LIBRARY_NAMES}
    assert len(own) >= 10, own  # the run, informer and event metrics at least
    assert {n for n in own if not n.startswith(OWN_PREFIX)} == set()
    # Nothing of the libraries' own was renamed.
    assert {"workqueue_depth", "rest_client_requests_total", "leader_election_master_status"} <= (
        served
    )
    assert "controller_runtime_reconcile_total" in served


def _run(namespace: str, config: str, phase: str | None) -> dict[str, object]:
    run: dict[str, object] = {
        "metadata": {"namespace": namespace, "name": f"r-{phase}"},
        "spec": {"configRef": {"name": config}},
    }
    if phase is not None:
        run["status"] = {"phase": phase}
    return run


def test_runs_by_phase_counts_per_namespace_and_config_with_every_phase_present() -> None:
    phases = ("Pending", "Running", "Failed", "Error")
    runs = [
        _run("a", "cfg", "Running"),
        _run("a", "cfg", "Running"),
        _run("a", "cfg", "Failed"),
        _run("b", "cfg", "Error"),
        _run("b", "other", None),  # no phase yet: counted in none, its pair still present
        _run("b", "other", "Bogus"),  # not a known phase: counted in none
    ]
    counted = runs_by_phase(runs, phases)
    assert counted == {
        ("a", "cfg", "Pending"): 0,
        ("a", "cfg", "Running"): 2,
        ("a", "cfg", "Failed"): 1,
        ("a", "cfg", "Error"): 0,
        ("b", "cfg", "Pending"): 0,
        ("b", "cfg", "Running"): 0,
        ("b", "cfg", "Failed"): 0,
        ("b", "cfg", "Error"): 1,
        ("b", "other", "Pending"): 0,
        ("b", "other", "Running"): 0,
        ("b", "other", "Failed"): 0,
        ("b", "other", "Error"): 0,
    }
    assert runs_by_phase([], phases) == {}


def test_kserve_inference_runs_follows_the_cache_and_forgets_pairs_with_no_run_left() -> None:
    metrics = Metrics(process=False)
    cache = [_run("a", "cfg", "Running"), _run("b", "cfg2", "Error")]
    # Before the controller wires its cache in: the family, no series.
    assert "kserve_inference_runs{" not in page(metrics)
    metrics.inference_runs.count(lambda: list(cache), ("Running", "Error"))
    running = {"namespace": "a", "config": "cfg", "phase": "Running"}
    errored = {"namespace": "b", "config": "cfg2", "phase": "Error"}
    assert sample(metrics, "kserve_inference_runs", **running) == 1
    assert sample(metrics, "kserve_inference_runs", **errored) == 1
    assert sample(metrics, "kserve_inference_runs", **{**errored, "phase": "Running"}) == 0
    cache.pop()  # the run in b is deleted: its pair's series go with it
    assert sample(metrics, "kserve_inference_runs", **errored) is None
    assert sample(metrics, "kserve_inference_runs", **running) == 1
    families = {f.name: f for f in text_string_to_metric_families(page(metrics))}
    assert families["kserve_inference_runs"].type == "gauge"


MIGRATION_MD = REPO / "docs" / "migration.md"


def _migration_section() -> str:
    text = MIGRATION_MD.read_text()
    start = text.index("## Metric renames")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _yaml_blocks(section: str) -> list[object]:
    return [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", section, re.DOTALL)]


def test_the_migration_guide_lists_every_rename_with_working_recipes() -> None:
    section = _migration_section()
    renames = dict(re.findall(r"^\| `([a-z_]+)`[^|]* \| `([a-z_]+)`", section, re.MULTILINE))
    served = served_names(page(Metrics()))
    own = {
        n
        for n in served
        if n.startswith(OWN_PREFIX) and n != "kserve_inference_controller_build_info"
    }
    assert own, "no metric of the project's own is served"
    # Every renamed metric is in the table, under the name it had before.
    assert set(renames.values()) == own
    for old, new in renames.items():
        assert new in {f"kserve_{old}", f"{OWN_PREFIX}{old}"}, (old, new)
    histograms = {
        f.name for f in text_string_to_metric_families(page(Metrics())) if f.type == "histogram"
    }

    def series(name: str, histogram: bool) -> list[str]:
        """The names a scrape stores for a metric: a histogram's three."""
        return [f"{name}_{s}" for s in ("bucket", "sum", "count")] if histogram else [name]

    recording, relabeling = _yaml_blocks(section)
    # The recording rules record every old series from its new one.
    assert isinstance(recording, dict)
    ((group,),) = [recording["groups"]]
    recorded = {r["record"]: r["expr"] for r in group["rules"]}
    expected = {
        o: n
        for old, new in renames.items()
        for o, n in zip(series(old, new in histograms), series(new, new in histograms), strict=True)
    }
    assert recorded.keys() == expected.keys()
    for old, new in expected.items():
        assert re.search(rf"\b{new}\b", recorded[old]), (old, recorded[old])
    # The scrape-time relabelings give every new name its old one back, and nothing else.
    assert isinstance(relabeling, dict)
    rules = relabeling["serviceMonitor"]["metricRelabelings"]

    def relabelled(name: str) -> str:
        for rule in rules:  # Prometheus anchors the regex and applies the rules in order
            match = re.fullmatch(rule["regex"], name)
            if match:
                name = match.expand(rule["replacement"].replace("$1", r"\1"))
        return name

    for old, new in expected.items():
        assert relabelled(new) == old, new
    for name in served - own:
        assert relabelled(name) == name, name


# ----------------------------------------------------------------------------- the families

FAMILIES_SNAPSHOT = REPO / "tests" / "unit" / "metric_families.json"


def family_snapshot(metrics: Metrics) -> dict[str, dict[str, object]]:
    """Each family of ``metrics``' registry: its type, help, label names and buckets.

    Label names and buckets are read from the metric objects (prometheus_client
    keeps them in ``_labelnames`` / ``_upper_bounds``): a labelled family with
    no child yet has no sample to read them from.
    """
    families: dict[str, dict[str, object]] = {
        family.name: {"type": family.type, "help": family.documentation}
        for family in metrics.registry.collect()
    }
    for value in vars(metrics).values():
        if isinstance(value, MetricWrapperBase):
            entry = families[value._name]
            entry["labels"] = list(value._labelnames)
            if isinstance(value, Histogram):
                entry["buckets"] = list(value._upper_bounds)
        elif isinstance(value, RunsByPhase):
            families[value.NAME]["labels"] = list(value.LABELS)
    return families


def test_the_registry_serves_the_families_it_always_served() -> None:
    """Names, types, help, label names and buckets are an API: dashboards and alerts use them.

    The snapshot was taken from the registry as it was; regenerate it only for
    a change of the metrics that docs/metrics.md and the migration guide say.
    """
    expected = json.loads(FAMILIES_SNAPSHOT.read_text())
    actual = family_snapshot(Metrics(process=False))
    assert len(expected) >= 25, "the snapshot holds too few families"
    assert all("labels" in entry for entry in actual.values()), actual
    assert actual == expected


def test_every_family_row_is_an_annotated_attribute_of_its_kind() -> None:
    metrics = Metrics(process=False)
    annotated = {name for name in Metrics.__annotations__ if name != "registry"}
    assert FAMILIES
    assert {family.attribute for family in FAMILIES} == annotated
    for family in FAMILIES:
        assert type(getattr(metrics, family.attribute)) is family.kind, family.attribute


def test_a_family_row_with_buckets_is_a_histogram() -> None:
    with pytest.raises(ValueError, match="buckets"):
        Family("a", Counter, "a", "A.", (), buckets=(1.0,))
    with pytest.raises(ValueError, match="buckets"):
        Family("a", Histogram, "a", "A.", ())
