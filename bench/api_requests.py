"""API requests the controller makes, counted by the API server's audit log.

    .venv/bin/python -m bench.api_requests [--runs 100] [--idle-seconds 600]

On a fresh local control plane, with the controller running as the Helm
chart's ServiceAccount (leader election off, as ``python -m controller``
runs locally; with it on, add one Lease renewal per retry period):

1. **One run's whole life**: an InferenceConfig and a one-shot InferenceRun
   (stand-in runner image, so the pod's own time does not matter), from create
   to Succeeded, every request of the controller's user.
2. **Idle**: ``--runs`` finished runs in the cache, ``POLLING_INTERVAL=30s`` so
   each is reconciled ``idle/30`` times, and nothing else happening for
   ``--idle-seconds`` (measured once the controller has been quiet for 15 s:
   its Events writer drains a backlog after a burst of runs): every request
   of the controller's user. Watches that time out (5-10 min, randomised) and
   are reopened show up as ``watch`` lines.

Requests are counted from ``ResponseComplete`` audit events (a watch counts
once, when it ends; a watch still open at the end is counted as opened from
its ``ResponseStarted`` event). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.common import config_body, request_key, run_body
from hack import chart
from hack.cluster import LocalCluster, free_port, running_cluster, spawn, stop_process
from hack.crds import install_crds

NAMESPACE = "bench"
IMAGE = "test.local/fake-ok:1"


def config_and_run(run: str) -> list[dict[str, Any]]:
    return [config_body(NAMESPACE, "cfg", IMAGE), run_body(NAMESPACE, run, "cfg")]


def controller_requests(cluster: LocalCluster, user: str, since: int) -> tuple[Counter[str], int]:
    """(verb resource -> count) of the user's requests after audit line ``since``; new mark."""
    counts: Counter[str] = Counter()
    lines = cluster.audit_log.read_text().splitlines()
    for line in lines[since:]:
        event = json.loads(line)
        if event.get("user", {}).get("username") != user:
            continue
        verb = event["verb"]
        if event["stage"] == "ResponseComplete" or (
            verb == "watch" and event["stage"] == "ResponseStarted"
        ):
            if verb == "watch" and event["stage"] == "ResponseComplete":
                continue  # counted when it started
            counts[request_key(event)] += 1
    return counts, len(lines)


def wait_phase(cluster: LocalCluster, names: list[str], phase: str, within: float) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        out = cluster.kubectl(
            "get", "infrun", "-n", NAMESPACE, "-o", "jsonpath={.items[*].status.phase}"
        ).stdout.split()
        if len(out) >= len(names) and all(p == phase for p in out):
            return
        time.sleep(0.5)
    raise TimeoutError(f"runs not {phase} after {within}s")


def wait_quiet(cluster: LocalCluster, user: str, mark: int, quiet: float, within: float) -> int:
    """Wait until ``user`` made no request for ``quiet`` seconds; the audit mark then."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        time.sleep(quiet)
        counts, new_mark = controller_requests(cluster, user, mark)
        writes = {k: v for k, v in counts.items() if not k.startswith("watch ")}
        mark = new_mark
        if not writes:
            return mark
    raise TimeoutError(f"the controller did not go quiet within {within}s")


def table(title: str, counts: Counter[str]) -> str:
    rows = [f"| {title} | count |", "|---|---|"]
    rows += [f"| `{k}` | {v} |" for k, v in sorted(counts.items())]
    rows.append(f"| **total** | **{sum(counts.values())}** |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.api_requests")
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--idle-seconds", type=float, default=600)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="ksc-bench-") as tmp, running_cluster() as cluster:
        workdir = Path(tmp)
        install_crds(cluster)
        cluster.kubectl("create", "namespace", NAMESPACE)
        chart.apply(cluster, chart.controller_rbac_objects(NAMESPACE, [NAMESPACE]))
        kubeconfig = chart.service_account_kubeconfig(cluster, NAMESPACE, path=workdir / "kc")
        user = chart.service_account_user(NAMESPACE, chart.CONTROLLER_SERVICE_ACCOUNT)
        env = {
            "PATH": "/usr/bin:/bin",
            "KUBECONFIG": str(kubeconfig),
            "WATCH_NAMESPACE": NAMESPACE,
            "POLLING_INTERVAL": "30s",
            # Runs' requests only: a config's probe (a Job per config and
            # interval) would be counted as the first run's.
            "PROBE_INTERVAL": "0",
            "MAX_RECONCILE_RATE": "4",
            "HEALTH_PORT": str(free_port()),
            "METRICS_PORT": str(free_port()),
            "BIND_ADDRESS": "127.0.0.1",
            "LOG_LEVEL": "WARNING",
        }
        controller = spawn(
            [sys.executable, "-m", "controller"], workdir / "controller.log", env=env
        )
        try:
            time.sleep(3)  # start-up: lists and watches
            _, mark = controller_requests(cluster, user, 0)

            cluster.kubectl(
                "apply",
                "-f",
                "-",
                input=json.dumps(
                    {"apiVersion": "v1", "kind": "List", "items": config_and_run("one")}
                ),
            )
            wait_phase(cluster, ["one"], "Succeeded", 60)
            time.sleep(2)  # trailing writes, if any
            life, mark = controller_requests(cluster, user, mark)

            items = [config_and_run(f"run-{i}")[1] for i in range(args.runs)]
            cluster.kubectl(
                "apply",
                "-f",
                "-",
                input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}),
            )
            wait_phase(cluster, [*(i["metadata"]["name"] for i in items), "one"], "Succeeded", 600)
            # Events are written by one background writer: let its backlog drain.
            mark = wait_quiet(cluster, user, mark, quiet=15, within=300)
            time.sleep(args.idle_seconds)
            idle, mark = controller_requests(cluster, user, mark)
        finally:
            stop_process(controller)
            with contextlib.suppress(Exception):
                tail = (workdir / "controller.log").read_text()[-2000:]
                if controller.returncode not in (0, None):
                    print(tail, file=sys.stderr)

    print(table("one one-shot run, create to Succeeded", life))
    print()
    print(
        table(f"{args.idle_seconds:.0f} s idle, {args.runs + 1} finished runs, polling 30 s", idle)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
