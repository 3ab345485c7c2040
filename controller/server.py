"""The health and metrics endpoints (aiohttp).

- ``/healthz``: the process is alive and its event loop answers (plus any
  liveness checks given).
- ``/readyz``: every readiness check passes. The controller's check is "the
  informers have synced"; with leader election a standby whose cache is warm
  is ready too, because being ready means "can take over", not "is leading".
  ``?verbose`` lists each check, as the API server's own endpoints do.
- ``/metrics``: the controller's :class:`~prometheus_client.CollectorRegistry`
  in the Prometheus text format.

Metrics and health usually listen on two ports (8080 and 8081, as upstream and
controller-runtime do); when both ports are the same, one server serves all
three paths.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

Check = Callable[[], bool]


def _run_checks(checks: Mapping[str, Check]) -> tuple[bool, list[str]]:
    lines = []
    healthy = True
    for name, check in checks.items():
        try:
            ok = bool(check())
        except Exception as exc:  # a broken check is a failing check, not a 500
            ok = False
            name = f"{name}: {type(exc).__name__}: {exc}"
        healthy = healthy and ok
        lines.append(f"[{'+' if ok else '-'}]{name} {'ok' if ok else 'failed'}")
    return healthy, lines


def _check_handler(
    what: str, checks: Mapping[str, Check]
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handler(request: web.Request) -> web.StreamResponse:
        healthy, lines = _run_checks(checks)
        verbose = "verbose" in request.query
        if healthy:
            body = "\n".join([*lines, f"{what} check passed"]) if verbose else "ok"
            return web.Response(text=body + "\n")
        body = "\n".join([*lines, f"{what} check failed"])
        return web.Response(status=503, text=body + "\n")

    return handler


def add_health_routes(
    app: web.Application,
    *,
    readiness: Mapping[str, Check],
    liveness: Mapping[str, Check] | None = None,
) -> None:
    app.router.add_get("/healthz", _check_handler("healthz", dict(liveness or {})))
    app.router.add_get("/readyz", _check_handler("readyz", dict(readiness)))


def add_metrics_route(app: web.Application, registry: CollectorRegistry) -> None:
    async def metrics(_: web.Request) -> web.Response:
        response = web.Response(body=generate_latest(registry))
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    app.router.add_get("/metrics", metrics)


@dataclass
class Servers:
    """Running health and metrics servers; ``ports`` are the bound ports (useful with port 0)."""

    runners: list[web.AppRunner] = field(default_factory=list)
    metrics_port: int = 0
    health_port: int = 0

    async def stop(self) -> None:
        for runner in self.runners:
            await runner.cleanup()
        self.runners.clear()


async def start_servers(
    *,
    registry: CollectorRegistry,
    readiness: Mapping[str, Check],
    liveness: Mapping[str, Check] | None = None,
    bind_address: str = "0.0.0.0",
    metrics_port: int = 8080,
    health_port: int = 8081,
) -> Servers:
    """Start serving; call :meth:`Servers.stop` on shutdown."""
    servers = Servers()
    try:
        if metrics_port == health_port and metrics_port != 0:
            app = web.Application()
            add_health_routes(app, readiness=readiness, liveness=liveness)
            add_metrics_route(app, registry)
            port = await _serve(servers, app, bind_address, metrics_port)
            servers.metrics_port = servers.health_port = port
            return servers
        metrics_app = web.Application()
        add_metrics_route(metrics_app, registry)
        servers.metrics_port = await _serve(servers, metrics_app, bind_address, metrics_port)
        health_app = web.Application()
        add_health_routes(health_app, readiness=readiness, liveness=liveness)
        servers.health_port = await _serve(servers, health_app, bind_address, health_port)
    except BaseException:
        await servers.stop()
        raise
    return servers


async def _serve(servers: Servers, app: web.Application, host: str, port: int) -> int:
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    servers.runners.append(runner)
    site = web.TCPSite(runner, host, port)
    await site.start()
    # Port 0 asks the kernel for a free port: report the one it chose.
    address = runner.addresses[-1]
    return int(address[1])
