"""Every Prometheus metric the controller exports, in one place.

The names follow the libraries operators already have dashboards for:
client-go's ``workqueue_*`` and ``rest_client_requests_total``,
controller-runtime's ``controller_runtime_reconcile_*`` and client-go's
leader-election ``leader_election_master_status``.

Metrics live on a dedicated :class:`~prometheus_client.CollectorRegistry`
held by a :class:`Metrics` object that is passed to whoever records, never on
the global default registry: tests build their own ``Metrics()`` and read it
back without seeing each other's samples.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# client-go's workqueue histograms: 10 ns .. 10 s in decades
# (prometheus.ExponentialBuckets(10e-9, 10, 10)).
WORKQUEUE_BUCKETS: tuple[float, ...] = tuple(10e-9 * 10**i for i in range(10))

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

# Kept in step with controller/kube/workers.py: the values of the ``result``
# label of controller_runtime_reconcile_total.
RECONCILE_RESULTS: tuple[str, ...] = (
    "success",
    "error",
    "requeue",
    "requeue_after",
    "terminal_error",
)


class Metrics:
    """The controller's metrics, registered on ``registry`` (a new one by default)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry

        # --- work queue (client-go names, labelled by queue name) ---
        self.workqueue_depth = Gauge(
            "workqueue_depth", "Current depth of workqueue", ["name"], registry=r
        )
        self.workqueue_adds_total = Counter(
            "workqueue_adds", "Total number of adds handled by workqueue", ["name"], registry=r
        )
        self.workqueue_queue_duration_seconds = Histogram(
            "workqueue_queue_duration_seconds",
            "How long in seconds an item stays in workqueue before being requested.",
            ["name"],
            buckets=WORKQUEUE_BUCKETS,
            registry=r,
        )
        self.workqueue_work_duration_seconds = Histogram(
            "workqueue_work_duration_seconds",
            "How long in seconds processing an item from workqueue takes.",
            ["name"],
            buckets=WORKQUEUE_BUCKETS,
            registry=r,
        )
        self.workqueue_retries_total = Counter(
            "workqueue_retries",
            "Total number of retries handled by workqueue",
            ["name"],
            registry=r,
        )
        self.workqueue_unfinished_work_seconds = Gauge(
            "workqueue_unfinished_work_seconds",
            "How many seconds of work has been done that is in progress and hasn't been "
            "observed by work_duration. Large values indicate stuck threads.",
            ["name"],
            registry=r,
        )
        self.workqueue_longest_running_processor_seconds = Gauge(
            "workqueue_longest_running_processor_seconds",
            "How many seconds has the longest running processor for workqueue been running.",
            ["name"],
            registry=r,
        )

        # --- reconcile (controller-runtime names, labelled by controller) ---
        self.reconcile_total = Counter(
            "controller_runtime_reconcile",
            "Total number of reconciliations per controller",
            ["controller", "result"],
            registry=r,
        )
        self.reconcile_errors_total = Counter(
            "controller_runtime_reconcile_errors",
            "Total number of reconciliation errors per controller",
            ["controller"],
            registry=r,
        )
        self.terminal_reconcile_errors_total = Counter(
            "controller_runtime_terminal_reconcile_errors",
            "Total number of terminal reconciliation errors per controller",
            ["controller"],
            registry=r,
        )
        self.reconcile_time_seconds = Histogram(
            "controller_runtime_reconcile_time_seconds",
            "Length of time per reconciliation per controller",
            ["controller"],
            buckets=RECONCILE_BUCKETS,
            registry=r,
        )
        self.active_workers = Gauge(
            "controller_runtime_active_workers",
            "Number of currently used workers per controller",
            ["controller"],
            registry=r,
        )
        self.max_concurrent_reconciles = Gauge(
            "controller_runtime_max_concurrent_reconciles",
            "Maximum number of concurrent reconciles per controller",
            ["controller"],
            registry=r,
        )

        # --- the product ---
        self.inference_runs = Gauge(
            "inference_runs",
            "InferenceRuns in the controller's cache, by status phase",
            ["phase"],
            registry=r,
        )

        # --- API client (client-go's name; verb is the Kubernetes verb, method the HTTP one) ---
        self.rest_client_requests_total = Counter(
            "rest_client_requests",
            "Number of HTTP requests, partitioned by Kubernetes verb, HTTP method and status "
            "code ('<error>' when no response came back).",
            ["verb", "method", "code"],
            registry=r,
        )
        self.rest_client_rate_limiter_wait_seconds = Histogram(
            "rest_client_rate_limiter_duration_seconds",
            "Client side rate limiter latency in seconds.",
            ["verb"],
            buckets=(0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0),
            registry=r,
        )

        # --- informers ---
        self.informer_lists_total = Counter(
            "informer_lists",
            "Full lists made by informers (the first one and every relist)",
            ["resource"],
            registry=r,
        )
        self.informer_watch_events_total = Counter(
            "informer_watch_events",
            "Watch events received by informers, by event type",
            ["resource", "type"],
            registry=r,
        )
        self.informer_watch_errors_total = Counter(
            "informer_watch_errors",
            "Watch or list failures that made an informer back off or relist, by reason",
            ["resource", "reason"],
            registry=r,
        )

        # --- leader election (client-go's name) ---
        self.leader_election_master_status = Gauge(
            "leader_election_master_status",
            "Gauge of if the reporting system is master of the relevant lease, 0 indicates "
            "backup, 1 indicates master. 'name' is the string used to identify the lease.",
            ["name"],
            registry=r,
        )

        # --- events ---
        self.events_total = Counter(
            "controller_events",
            "Kubernetes Events handled by the recorder, by outcome "
            "(created, patched, aggregated, dropped, failed)",
            ["outcome"],
            registry=r,
        )
