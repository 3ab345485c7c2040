"""What the Kubernetes client layer records, and a recorder that records nothing.

``kubeclient`` (client, transport, informers, work queue, workers,
leader election, events) measures itself with client-go's and
controller-runtime's metric families, but does not import the application
that exports them (the import-linter contract "kube-is-a-library" in
pyproject.toml): the application passes in an object with the families
named in :class:`KubeMetrics` (``controller.metrics.Metrics``), and whoever
passes none gets :data:`NO_METRICS`, whose families take every sample and
keep none. So the code that records never asks whether it has metrics.
"""

from __future__ import annotations

import functools
from typing import Any, Protocol
from urllib.parse import urlsplit


class Family(Protocol):
    """A metric family: a prometheus_client ``Counter``, ``Gauge`` or ``Histogram``."""

    def labels(self, *labelvalues: Any, **labelkwargs: Any) -> Any: ...

    # Hashable: labelled() caches its children by family.
    def __hash__(self) -> int: ...


class KubeMetrics(Protocol):
    """The families ``kubeclient`` records into (``controller.metrics.Metrics`` has them)."""

    @property
    def workqueue_depth(self) -> Family: ...
    @property
    def workqueue_adds_total(self) -> Family: ...
    @property
    def workqueue_queue_duration_seconds(self) -> Family: ...
    @property
    def workqueue_work_duration_seconds(self) -> Family: ...
    @property
    def workqueue_retries_total(self) -> Family: ...
    @property
    def workqueue_unfinished_work_seconds(self) -> Family: ...
    @property
    def workqueue_longest_running_processor_seconds(self) -> Family: ...
    @property
    def reconcile_total(self) -> Family: ...
    @property
    def reconcile_errors_total(self) -> Family: ...
    @property
    def terminal_reconcile_errors_total(self) -> Family: ...
    @property
    def reconcile_panics_total(self) -> Family: ...
    @property
    def reconcile_time_seconds(self) -> Family: ...
    @property
    def active_workers(self) -> Family: ...
    @property
    def rest_client_requests_total(self) -> Family: ...
    @property
    def rest_client_request_duration_seconds(self) -> Family: ...
    @property
    def rest_client_rate_limiter_wait_seconds(self) -> Family: ...
    @property
    def informer_lists_total(self) -> Family: ...
    @property
    def informer_watch_events_total(self) -> Family: ...
    @property
    def informer_watch_errors_total(self) -> Family: ...
    @property
    def leader_election_master_status(self) -> Family: ...
    @property
    def events_total(self) -> Family: ...

    def init_controller(self, controller: str, workers: int) -> None:
        """Create ``controller``'s reconcile series at 0 before its first reconcile."""


class _NoFamily:
    """A family, and each of its children, that takes every sample and keeps none."""

    def labels(self, *labelvalues: Any, **labelkwargs: Any) -> _NoFamily:
        return self

    def inc(self, amount: float = 1) -> None:
        pass

    def dec(self, amount: float = 1) -> None:
        pass

    def set(self, value: float) -> None:
        pass

    def set_function(self, f: Any) -> None:
        pass

    def observe(self, amount: float) -> None:
        pass


# Every family of NoMetrics, and of the app's no-op metrics (controller.metrics).
NO_FAMILY = _NoFamily()


class NoMetrics:
    """:class:`KubeMetrics` that records nothing: for clients, tools and tests without /metrics."""

    workqueue_depth = NO_FAMILY
    workqueue_adds_total = NO_FAMILY
    workqueue_queue_duration_seconds = NO_FAMILY
    workqueue_work_duration_seconds = NO_FAMILY
    workqueue_retries_total = NO_FAMILY
    workqueue_unfinished_work_seconds = NO_FAMILY
    workqueue_longest_running_processor_seconds = NO_FAMILY
    reconcile_total = NO_FAMILY
    reconcile_errors_total = NO_FAMILY
    terminal_reconcile_errors_total = NO_FAMILY
    reconcile_panics_total = NO_FAMILY
    reconcile_time_seconds = NO_FAMILY
    active_workers = NO_FAMILY
    rest_client_requests_total = NO_FAMILY
    rest_client_request_duration_seconds = NO_FAMILY
    rest_client_rate_limiter_wait_seconds = NO_FAMILY
    informer_lists_total = NO_FAMILY
    informer_watch_events_total = NO_FAMILY
    informer_watch_errors_total = NO_FAMILY
    leader_election_master_status = NO_FAMILY
    events_total = NO_FAMILY

    def init_controller(self, controller: str, workers: int) -> None:
        pass


NO_METRICS: KubeMetrics = NoMetrics()


@functools.lru_cache(maxsize=4096)
def labelled(metric: Any, **labels: str) -> Any:
    """``metric.labels(**labels)``, looked up once.

    prometheus_client validates the names and takes a lock on every
    ``labels()`` call; the hot paths (every request, watch event, reconcile
    and queue operation) ask for the same few children again and again. A
    child stays valid as long as nobody ``remove()``s it, which nothing here
    does for the metrics it is used with.
    """
    return metric.labels(**labels)


@functools.lru_cache(maxsize=64)
def api_host(url: str) -> str:
    """client-go's ``host`` label: the API server's host[:port], no scheme or path."""
    return urlsplit(url).netloc or url
