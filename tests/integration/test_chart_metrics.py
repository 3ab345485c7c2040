"""The chart's alerts and dashboard against a live ``/metrics`` page of the controller.

The page is served by the controller's own metrics server
(``controller.server.start_servers``) over the controller's registry
(``controller.metrics.Metrics``), scraped over HTTP like Prometheus does, and
parsed with prometheus_client's text-format parser: every metric the rendered
PrometheusRule and Grafana dashboard use must be declared there.
"""

from __future__ import annotations

import aiohttp
import pytest

from controller.metrics import Metrics
from controller.server import start_servers
from tests.chart import chart_metric_names, render, scraped_metric_names

# The first test of a run may build helm from source (minutes on a cold machine:
# hack/helm/build.sh); later ones reuse the cached binary.
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def monitored() -> list[dict[str, object]]:
    return render({"prometheusRule": {"enabled": True}, "grafanaDashboard": {"enabled": True}})


async def scrape() -> str:
    metrics = Metrics()
    servers = await start_servers(
        registry=metrics.registry,
        readiness={},
        bind_address="127.0.0.1",
        metrics_port=0,
        health_port=0,
    )
    try:
        url = f"http://127.0.0.1:{servers.metrics_port}/metrics"
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/plain")
            return await response.text()
    finally:
        await servers.stop()


async def test_alerts_and_dashboard_use_only_metrics_on_the_live_page(
    monitored: list[dict[str, object]],
) -> None:
    served = scraped_metric_names(await scrape())
    used = chart_metric_names(monitored)
    assert any(where.startswith("alert ") for where in used)
    assert any(where.startswith("dashboard ") for where in used)
    for where, names in used.items():
        assert names, f"{where}: no metric found"
        assert names <= served, f"{where} uses {sorted(names - served)}, not on /metrics"
