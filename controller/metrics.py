"""Every Prometheus metric the controller exports, in one place.

The controller's own metrics share one prefix, ``kserve_inference_``. The
others follow the libraries operators already have dashboards for: client-go's
``workqueue_*`` and ``rest_client_requests_total``, controller-runtime's
``controller_runtime_reconcile_*`` and client-go's leader-election
``leader_election_master_status``.

Metrics live on a dedicated :class:`~prometheus_client.CollectorRegistry`
held by a :class:`Metrics` object that is passed to whoever records, never on
the global default registry: tests build their own ``Metrics()`` and read it
back without seeing each other's samples.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Protocol

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from kubeclient import instruments

# kubeclient records with these; they are defined there (it imports no app module).
from kubeclient.instruments import api_host as api_host
from kubeclient.instruments import labelled as labelled

# No ``<counter>_created`` / ``<histogram>_created`` series: they double the
# number of series, client-go and controller-runtime export none, and
# dashboards never use them. (Process-wide; the same as the env variable
# PROMETHEUS_DISABLE_CREATED_SERIES=True.)
disable_created_metrics()  # type: ignore[no-untyped-call]

# client-go's workqueue histograms: 10 ns .. 1000 s in decades
# (prometheus.ExponentialBuckets(10e-9, 10, 12)).
WORKQUEUE_BUCKETS: tuple[float, ...] = tuple(10e-9 * 10**i for i in range(12))

# A batch inference run lasts from seconds to hours: 10 s .. 12 h.
RUN_DURATION_BUCKETS: tuple[float, ...] = (
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1200.0,
    1800.0,
    3600.0,
    7200.0,
    10800.0,
    21600.0,
    43200.0,
)

# client-go's rest_client_request_duration_seconds buckets.
REQUEST_DURATION_BUCKETS: tuple[float, ...] = (
    0.005,
    0.025,
    0.1,
    0.25,
    0.5,
    1.0,
    2.0,
    4.0,
    8.0,
    15.0,
    30.0,
    60.0,
)

# Kept in step with kubeclient/events.py: the values of the ``outcome``
# label of kserve_inference_controller_events_total.
EVENT_OUTCOMES: tuple[str, ...] = ("created", "patched", "aggregated", "dropped", "failed")

# The values of the ``result`` label of kserve_inference_runs_finished_total.
RUN_RESULTS: tuple[str, ...] = ("Succeeded", "Failed")


def _version() -> str:
    try:
        return metadata.version("kserve-inference-controller")
    except metadata.PackageNotFoundError:
        return "unknown"


# controller-runtime's reconcile_time_seconds buckets.
RECONCILE_BUCKETS: tuple[float, ...] = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.15,
    0.2,
    0.25,
    0.3,
    0.35,
    0.4,
    0.45,
    0.5,
    0.6,
    0.7,
    0.8,
    0.9,
    1.0,
    1.25,
    1.5,
    1.75,
    2.0,
    2.5,
    3.0,
    3.5,
    4.0,
    4.5,
    5.0,
    6.0,
    7.0,
    8.0,
    9.0,
    10.0,
    15.0,
    20.0,
    25.0,
    30.0,
    40.0,
    50.0,
    60.0,
)

# Kept in step with kubeclient/workers.py: the values of the ``result``
# label of controller_runtime_reconcile_total.
RECONCILE_RESULTS: tuple[str, ...] = (
    "success",
    "error",
    "requeue",
    "requeue_after",
    "terminal_error",
)


# What RunsByPhase counts: the runs in the controller's cache, as the API returns them.
RunSource = Callable[[], Iterable[Mapping[str, Any]]]


def runs_by_phase(
    runs: Iterable[Mapping[str, Any]], phases: Iterable[str]
) -> dict[tuple[str, str, str], int]:
    """``(namespace, config, phase) -> count`` of ``runs``, every phase of a pair present.

    ``config`` is ``spec.configRef.name``, as in ``kserve_inference_runs_finished_total``.
    Every ``(namespace, config)`` that has a run gets every phase of ``phases``
    (at 0 when none is in it), so a panel shows 0 rather than "No data" and a
    run leaving a phase drops the count to 0 instead of making it vanish. A run
    without a phase yet (just created) or with one outside ``phases`` counts in
    none. Pairs with no run left have no series at all: the label values are
    bounded by the runs that exist now, never by the ones that came and went.
    """
    known = tuple(phases)
    counts: dict[tuple[str, str, str], int] = {}
    for run in runs:
        namespace = str((run.get("metadata") or {}).get("namespace") or "")
        config = str(((run.get("spec") or {}).get("configRef") or {}).get("name") or "")
        for known_phase in known:
            counts.setdefault((namespace, config, known_phase), 0)
        phase = (run.get("status") or {}).get("phase")
        if phase in known:
            counts[(namespace, config, str(phase))] += 1
    return counts


class RunsByPhase(Collector):
    """``kserve_inference_runs{namespace, config, phase}``, counted from the cache at scrape time.

    A custom collector rather than a Gauge: the series of a namespace/config
    pair go away with its last run (a Gauge's children stay until removed), and
    the count is never stale and costs no request.
    """

    NAME = "kserve_inference_runs"
    DOC = (
        "InferenceRuns in the controller's cache, by the run's namespace, its "
        "InferenceConfig (spec.configRef.name) and its status phase"
    )
    LABELS = ("namespace", "config", "phase")

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self._source: RunSource | None = None
        self._phases: tuple[str, ...] = ()
        if registry is not None:
            registry.register(self)

    def count(self, source: RunSource, phases: Iterable[str]) -> None:
        """Count the runs ``source`` returns on every scrape, by ``phases``."""
        self._source, self._phases = source, tuple(phases)

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(self.NAME, self.DOC, labels=self.LABELS)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(self.NAME, self.DOC, labels=self.LABELS)
        if self._source is not None:
            counted = runs_by_phase(self._source(), self._phases)
            for (namespace, config, phase), value in sorted(counted.items()):
                family.add_metric([namespace, config, phase], value)
        yield family


@dataclass(frozen=True)
class Family:
    """One metric family of :class:`Metrics`: the attribute holding it and how it is made."""

    attribute: str
    kind: type[Counter] | type[Gauge] | type[Histogram]
    name: str  # a counter's without ``_total``: prometheus_client adds it
    help: str
    labels: tuple[str, ...]
    buckets: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if (self.buckets is not None) != (self.kind is Histogram):
            raise ValueError(f"{self.name}: buckets are for histograms, and every histogram's")

    def make(self, registry: CollectorRegistry) -> Counter | Gauge | Histogram:
        if self.buckets is not None:
            return Histogram(
                self.name, self.help, self.labels, buckets=self.buckets, registry=registry
            )
        return self.kind(self.name, self.help, self.labels, registry=registry)


# Every family Metrics registers but the process collector and the runs counted
# from the cache (RunsByPhase), in the order they are registered.
FAMILIES: tuple[Family, ...] = (
    Family(
        "build_info",
        Gauge,
        "kserve_inference_controller_build_info",
        "Always 1; the labels say which version of the controller runs on which Python, "
        "and which shard it is (<index>-of-<count>; empty when not sharded).",
        ("version", "python_version", "shard"),
    ),
    # --- work queue (client-go names, labelled by queue name) ---
    Family("workqueue_depth", Gauge, "workqueue_depth", "Current depth of workqueue", ("name",)),
    Family(
        "workqueue_adds_total",
        Counter,
        "workqueue_adds",
        "Total number of adds handled by workqueue",
        ("name",),
    ),
    Family(
        "workqueue_queue_duration_seconds",
        Histogram,
        "workqueue_queue_duration_seconds",
        "How long in seconds an item stays in workqueue before being requested.",
        ("name",),
        WORKQUEUE_BUCKETS,
    ),
    Family(
        "workqueue_work_duration_seconds",
        Histogram,
        "workqueue_work_duration_seconds",
        "How long in seconds processing an item from workqueue takes.",
        ("name",),
        WORKQUEUE_BUCKETS,
    ),
    Family(
        "workqueue_retries_total",
        Counter,
        "workqueue_retries",
        "Total number of retries handled by workqueue",
        ("name",),
    ),
    Family(
        "workqueue_unfinished_work_seconds",
        Gauge,
        "workqueue_unfinished_work_seconds",
        "How many seconds of work has been done that is in progress and hasn't been "
        "observed by work_duration. Large values indicate stuck threads.",
        ("name",),
    ),
    Family(
        "workqueue_longest_running_processor_seconds",
        Gauge,
        "workqueue_longest_running_processor_seconds",
        "How many seconds has the longest running processor for workqueue been running.",
        ("name",),
    ),
    # --- reconcile (controller-runtime names, labelled by controller) ---
    Family(
        "reconcile_total",
        Counter,
        "controller_runtime_reconcile",
        "Total number of reconciliations per controller",
        ("controller", "result"),
    ),
    Family(
        "reconcile_errors_total",
        Counter,
        "controller_runtime_reconcile_errors",
        "Total number of reconciliation errors per controller",
        ("controller",),
    ),
    Family(
        "terminal_reconcile_errors_total",
        Counter,
        "controller_runtime_terminal_reconcile_errors",
        "Total number of terminal reconciliation errors per controller",
        ("controller",),
    ),
    Family(
        "reconcile_panics_total",
        Counter,
        "controller_runtime_reconcile_panics",
        "Total number of reconciliation panics per controller (here: an unexpected "
        "exception, not an API error, escaped reconcile)",
        ("controller",),
    ),
    Family(
        "reconcile_time_seconds",
        Histogram,
        "controller_runtime_reconcile_time_seconds",
        "Length of time per reconciliation per controller",
        ("controller",),
        RECONCILE_BUCKETS,
    ),
    Family(
        "active_workers",
        Gauge,
        "controller_runtime_active_workers",
        "Number of currently used workers per controller",
        ("controller",),
    ),
    Family(
        "max_concurrent_reconciles",
        Gauge,
        "controller_runtime_max_concurrent_reconciles",
        "Maximum number of concurrent reconciles per controller",
        ("controller",),
    ),
    # --- the product ---
    Family(
        "inference_runs_finished_total",
        Counter,
        "kserve_inference_runs_finished",
        "One-shot InferenceRuns whose phase turned Succeeded or Failed, by the run's "
        "namespace and InferenceConfig",
        ("namespace", "config", "result"),
    ),
    Family(
        "inference_run_duration_seconds",
        Histogram,
        "kserve_inference_run_duration_seconds",
        "Duration of finished InferenceRuns, start to completion",
        ("namespace", "config", "result"),
        RUN_DURATION_BUCKETS,
    ),
    Family(
        "inference_rows_total",
        Counter,
        "kserve_inference_rows",
        "Input rows read by finished InferenceRuns (the runner's result)",
        ("namespace", "config"),
    ),
    Family(
        "inference_run_workloads_deleted_total",
        Counter,
        "kserve_inference_run_workloads_deleted",
        "Jobs and CronJobs the controller deleted because their InferenceRun was deleted "
        "(RunDeleted), is being deleted (RunDeleting) or was found gone by the sweep "
        "(RunGone), instead of waiting for the garbage collector",
        ("kind", "reason"),
    ),
    Family(
        "inference_predictions_total",
        Counter,
        "kserve_inference_predictions",
        "Predictions written by finished InferenceRuns (the runner's result)",
        ("namespace", "config"),
    ),
    # --- API client (client-go's name; verb is the Kubernetes verb, method the HTTP one) ---
    Family(
        "rest_client_requests_total",
        Counter,
        "rest_client_requests",
        "Number of HTTP requests, partitioned by status code ('<error>' when no response "
        "came back), HTTP method and API server host, as client-go, plus the Kubernetes verb.",
        ("verb", "method", "code", "host"),
    ),
    Family(
        "rest_client_request_duration_seconds",
        Histogram,
        "rest_client_request_duration_seconds",
        "Request latency in seconds until the response headers came back, by HTTP "
        "method (client-go's 'verb') and API server host.",
        ("verb", "host"),
        REQUEST_DURATION_BUCKETS,
    ),
    Family(
        "rest_client_rate_limiter_wait_seconds",
        Histogram,
        "rest_client_rate_limiter_duration_seconds",
        "Client side rate limiter latency in seconds.",
        ("verb",),
        REQUEST_DURATION_BUCKETS,
    ),
    # --- informers ---
    Family(
        "informer_lists_total",
        Counter,
        "kserve_inference_informer_lists",
        "Full lists made by informers (the first one and every relist)",
        ("resource",),
    ),
    Family(
        "informer_watch_events_total",
        Counter,
        "kserve_inference_informer_watch_events",
        "Watch events received by informers, by event type",
        ("resource", "type"),
    ),
    Family(
        "informer_watch_errors_total",
        Counter,
        "kserve_inference_informer_watch_errors",
        "Watch or list failures that made an informer back off or relist, by reason",
        ("resource", "reason"),
    ),
    # --- leader election (client-go's name) ---
    Family(
        "leader_election_master_status",
        Gauge,
        "leader_election_master_status",
        "Gauge of if the reporting system is master of the relevant lease, 0 indicates "
        "backup, 1 indicates master. 'name' is the string used to identify the lease.",
        ("name",),
    ),
    # --- events ---
    Family(
        "events_total",
        Counter,
        "kserve_inference_controller_events",
        "Kubernetes Events handled by the recorder, by outcome "
        "(created, patched, aggregated, dropped, failed)",
        ("outcome",),
    ),
)


class Metrics:
    """The controller's metrics, registered on ``registry`` (a new one by default).

    One attribute per row of :data:`FAMILIES` (made from it), plus
    ``inference_runs``, the runs counted from the cache at scrape time.
    """

    build_info: Gauge
    workqueue_depth: Gauge
    workqueue_adds_total: Counter
    workqueue_queue_duration_seconds: Histogram
    workqueue_work_duration_seconds: Histogram
    workqueue_retries_total: Counter
    workqueue_unfinished_work_seconds: Gauge
    workqueue_longest_running_processor_seconds: Gauge
    reconcile_total: Counter
    reconcile_errors_total: Counter
    terminal_reconcile_errors_total: Counter
    reconcile_panics_total: Counter
    reconcile_time_seconds: Histogram
    active_workers: Gauge
    max_concurrent_reconciles: Gauge
    inference_runs_finished_total: Counter
    inference_run_duration_seconds: Histogram
    inference_rows_total: Counter
    inference_run_workloads_deleted_total: Counter
    inference_predictions_total: Counter
    rest_client_requests_total: Counter
    rest_client_request_duration_seconds: Histogram
    rest_client_rate_limiter_wait_seconds: Histogram
    informer_lists_total: Counter
    informer_watch_events_total: Counter
    informer_watch_errors_total: Counter
    leader_election_master_status: Gauge
    events_total: Counter

    def __init__(
        self, registry: CollectorRegistry | None = None, *, process: bool = True, shard: str = ""
    ) -> None:
        """``shard``: ``<index>-of-<count>`` when the controller is sharded (SHARD_COUNT > 1)."""
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        # The process (process_cpu_seconds_total, process_resident_memory_bytes, ...).
        if process:
            ProcessCollector(registry=self.registry)
        for family in FAMILIES:
            setattr(self, family.attribute, family.make(self.registry))
        self.inference_runs = RunsByPhase(registry=self.registry)

        # An empty label is no label to Prometheus: unsharded, the series is as it always was.
        self.build_info.labels(
            version=_version(), python_version=platform.python_version(), shard=shard
        ).set(1)
        # Present at 0 from the start: dropped and failed events are errors.
        for outcome in EVENT_OUTCOMES:
            self.events_total.labels(outcome=outcome)

    # ------------------------------------------------------------------ hooks

    def init_controller(self, controller: str, workers: int) -> None:
        """Create the reconcile series of ``controller``, errors at 0, before any reconcile.

        A counter that appears only on its first increment hides that first
        increment from ``rate()`` and ``increase()``, and an alert or panel on a
        missing series shows nothing rather than 0.
        """
        self.max_concurrent_reconciles.labels(controller=controller).set(workers)
        self.active_workers.labels(controller=controller).set(0)
        for result in RECONCILE_RESULTS:
            self.reconcile_total.labels(controller=controller, result=result)
        self.reconcile_errors_total.labels(controller=controller)
        self.terminal_reconcile_errors_total.labels(controller=controller)
        self.reconcile_panics_total.labels(controller=controller)
        self.reconcile_time_seconds.labels(controller=controller)

    def leader_election_disabled(self, lease: str) -> None:
        """Leader election is off: this replica is the leader of ``lease``, alone.

        Exported as client-go's gauge at 1 with the same ``name`` label as when
        election is on, so the NoLeader alert and the dashboard's variables
        (label_values(leader_election_master_status, ...)) work in both modes.
        """
        self.leader_election_master_status.labels(name=lease).set(1)

    def run_finished(
        self,
        namespace: str,
        config: str,
        result: str,
        duration_seconds: float | None = None,
        rows: int | None = None,
        predictions: int | None = None,
    ) -> None:
        """Count a one-shot run whose phase just turned ``Succeeded`` or ``Failed``.

        Call once per run, on the transition (the counters are not idempotent).
        ``duration_seconds`` (start to completion), ``rows`` and ``predictions``
        (the runner's result) are recorded when known. The other result's
        counter of the same namespace/config is created at 0, so that its first
        increment is seen by ``increase()``.
        """
        if result not in RUN_RESULTS:
            raise ValueError(f"result must be one of {RUN_RESULTS}, got {result!r}")
        for known in RUN_RESULTS:
            self.inference_runs_finished_total.labels(
                namespace=namespace, config=config, result=known
            )
        self.inference_runs_finished_total.labels(
            namespace=namespace, config=config, result=result
        ).inc()
        if duration_seconds is not None and duration_seconds >= 0:
            self.inference_run_duration_seconds.labels(
                namespace=namespace, config=config, result=result
            ).observe(duration_seconds)
        rows_total = self.inference_rows_total.labels(namespace=namespace, config=config)
        predictions_total = self.inference_predictions_total.labels(
            namespace=namespace, config=config
        )
        if rows is not None and rows > 0:
            rows_total.inc(rows)
        if predictions is not None and predictions > 0:
            predictions_total.inc(predictions)


class RunMetrics(instruments.KubeMetrics, Protocol):
    """What the reconcilers record: the client's families and the runs' own (:class:`Metrics`)."""

    @property
    def inference_run_workloads_deleted_total(self) -> instruments.Family: ...

    def run_finished(
        self,
        namespace: str,
        config: str,
        result: str,
        duration_seconds: float | None = None,
        rows: int | None = None,
        predictions: int | None = None,
    ) -> None:
        """Count a one-shot run that just finished (:meth:`Metrics.run_finished`)."""


class NoRunMetrics(instruments.NoMetrics):
    """:class:`RunMetrics` that records nothing: reconcilers driven by tests without /metrics."""

    inference_run_workloads_deleted_total = instruments.NO_FAMILY

    def run_finished(self, *args: Any, **kwargs: Any) -> None:
        pass


NO_RUN_METRICS: RunMetrics = NoRunMetrics()
