"""``python -m controller``: run the KServe Inference Controller.

Settings come from flags and the environment (``--help`` lists them); a bad
setting exits 2 with a message naming it. SIGTERM/SIGINT shut down
gracefully: workers stop, the Lease is released, watches close. Losing the
Lease exits 1 so that the pod restarts as a clean standby.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys

import structlog

from controller.controller import Controller
from controller.kube.client import KubeClient
from controller.kube.leaderelection import LeadershipLost
from controller.logging import configure_logging
from controller.metrics import Metrics
from controller.settings import Settings, SettingsError, load_settings

log = structlog.stdlib.get_logger("controller")


async def run(settings: Settings) -> int:
    metrics = Metrics()
    client = await KubeClient.connect(
        kubeconfig=settings.kubeconfig,
        in_cluster=settings.in_cluster,
        qps=settings.kube_api_qps,
        burst=settings.kube_api_burst,
        metrics=metrics,
    )
    controller = Controller(settings, client, metrics)
    main = asyncio.create_task(controller.run(), name="controller")
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, main.cancel)
    log.info(
        "starting",
        namespaces=list(settings.watch_namespaces) or "all",
        workers=settings.workers,
        polling_interval=settings.polling_interval,
        leader_election=settings.leader_election,
    )
    try:
        await main
    except asyncio.CancelledError:
        log.info("stopped")
        return 0
    except BaseExceptionGroup as group:
        lost = group.subgroup(LeadershipLost)
        if lost is None:
            raise
        log.error("leadership lost", error=str(lost.exceptions[0]))
        return 1
    finally:
        with contextlib.suppress(Exception):
            await client.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        settings = load_settings(sys.argv[1:] if argv is None else argv)
    except SettingsError as exc:
        print(f"kserve-inference-controller: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, settings.log_format)
    return asyncio.run(run(settings))


if __name__ == "__main__":
    sys.exit(main())
