"""The health and metrics servers on real sockets (no cluster needed)."""

from __future__ import annotations

import aiohttp

from controller.metrics import Metrics
from controller.server import start_servers
from hack.cluster import free_port
from kubeclient.workqueue import WorkQueue


async def test_health_readiness_and_metrics_on_two_ports() -> None:
    metrics = Metrics()
    queue: WorkQueue[str] = WorkQueue("inferenceruns", metrics=metrics)
    queue.add("ns/run")
    synced = False
    servers = await start_servers(
        registry=metrics.registry,
        readiness={"informers-synced": lambda: synced},
        bind_address="127.0.0.1",
        metrics_port=0,
        health_port=0,
    )
    try:
        assert servers.metrics_port != servers.health_port
        health = f"http://127.0.0.1:{servers.health_port}"
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{health}/healthz") as response:
                assert response.status == 200
                assert await response.text() == "ok\n"
            async with http.get(f"{health}/readyz") as response:
                assert response.status == 503
                assert "[-]informers-synced failed" in await response.text()
            synced = True
            async with http.get(f"{health}/readyz?verbose") as response:
                assert response.status == 200
                assert "[+]informers-synced ok" in await response.text()
            async with http.get(f"http://127.0.0.1:{servers.metrics_port}/metrics") as response:
                assert response.status == 200
                assert response.headers["Content-Type"].startswith("text/plain")
                text = await response.text()
            async with http.get(f"{health}/metrics") as response:
                assert response.status == 404  # metrics live on their own port
        assert 'workqueue_depth{name="inferenceruns"} 1.0' in text
    finally:
        await servers.stop()


async def test_one_port_serves_everything_and_a_broken_check_fails_readiness() -> None:
    metrics = Metrics()

    def broken() -> bool:
        raise RuntimeError("cache exploded")

    port = free_port()
    servers = await start_servers(
        registry=metrics.registry,
        readiness={"informers-synced": broken},
        liveness={"loop": lambda: True},
        bind_address="127.0.0.1",
        metrics_port=port,
        health_port=port,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/readyz") as response:
                assert response.status == 503
                assert "RuntimeError: cache exploded" in await response.text()
            async with http.get(f"{base}/healthz?verbose") as response:
                assert response.status == 200
                assert "[+]loop ok" in await response.text()
            async with http.get(f"{base}/metrics") as response:
                assert response.status == 200
    finally:
        await servers.stop()
