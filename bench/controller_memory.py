"""Controller memory per cached run, children included.

    .venv/bin/python -m bench.controller_memory [--runs 1000]

On one fresh local control plane, the controller (``python -m controller``,
the Helm chart's RBAC, ``--workers`` workers (``MAX_RECONCILE_RATE``, default:
the chart's), ``POLLING_INTERVAL=1h`` so that resyncs never keep it from
settling) watching one namespace:

1. **Empty**: a fresh controller, caches synced with no run, settled (work
   queue empty, no reconcile for a few seconds): its RSS.
2. **Grown**: ``--runs`` suspended one-shot runs are created; the same
   controller creates a ConfigMap and a (suspended, so pod-less) Job for each
   and writes their status. Once everything settled: its RSS. This includes
   whatever the work left behind (the allocator keeps freed memory).
3. **Restarted**: that controller stops and a fresh one starts with the
   ``--runs`` runs, ConfigMaps and Jobs already there; synced and settled (each
   run reconciled once, which writes nothing): its RSS. **Restarted - Empty**
   is the memory the caches need for that many runs with their children.

RSS is ``VmRSS`` of the controller's process from ``/proc/<pid>/status`` (the
median of several samples a moment apart), with ``VmHWM`` (peak) beside it.
Also printed: the requests the restarted controller made after starting (it
should list and watch, and write nothing), and, for scale, the size of what
its caches hold (each object's projection, ``controller.projection``, kept as
JSON bytes) and what those are as parsed Python objects (parsed with orjson in
the benchmark's process, measured with ``tracemalloc``).
Measured and printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from bench.api_requests import controller_requests
from bench.common import (
    MIB,
    config_body,
    load_average,
    machine,
    mib,
    proc_cpu_seconds,
    readings,
)
from bench.controller_throughput import (
    CONFIG,
    IMAGE,
    NAMESPACE,
    Controller,
    Setup,
    Watch,
    admin_client,
    job_run_uid,
    object_uid,
    prepare,
    suspended_run,
)
from bench.scale import chart_workers
from controller.naming import managed_selector
from controller.projection import projection
from hack.cluster import running_cluster
from kubeclient.client import KubeClient
from kubeclient.resources import CONFIGMAPS, CONFIGS, JOBS, RUNS
from runner.batching import map_ordered


@dataclass(frozen=True)
class Memory:
    rss: int  # bytes
    hwm: int  # bytes


def proc_memory(pid: int) -> Memory:
    """``VmRSS`` and ``VmHWM`` of a process, in bytes."""
    fields: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) * 1024  # "1234 kB"
    return Memory(fields["VmRSS"], fields["VmHWM"])


def sample(pid: int, count: int = 5, every: float = 0.5) -> Memory:
    samples = readings(lambda: proc_memory(pid), count, every)
    return Memory(int(statistics.median(m.rss for m in samples)), max(m.hwm for m in samples))


def cached_json(kind: str, obj: dict[str, Any]) -> bytes:
    """``obj`` as the controller's cache keeps it: its projection, as JSON bytes."""
    projected = projection(kind)({**obj, "kind": kind})
    return orjson.dumps(projected) if projected is not None else b""


def parsed_size(blobs: list[bytes]) -> int:
    """Bytes of Python objects the JSON documents take once parsed (tracemalloc, here)."""
    tracemalloc.start()
    try:
        parsed = [orjson.loads(blob) for blob in blobs]
        size, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del parsed
    return size


@dataclass(frozen=True)
class Cached:
    count: int
    json_bytes: int
    parsed_bytes: int


async def cached_sizes(kube: KubeClient) -> dict[str, Cached]:
    """What the controller's caches hold, by kind: count, size as cached JSON, parsed size."""
    selector = managed_selector()
    lists = {
        "InferenceRun": await kube.list(RUNS, NAMESPACE),
        "ConfigMap": await kube.list(CONFIGMAPS, NAMESPACE, label_selector=selector),
        "Job": await kube.list(JOBS, NAMESPACE, label_selector=selector),
    }
    sizes = {}
    for kind, listed in lists.items():
        blobs = [cached_json(kind, item) for item in listed["items"]]
        sizes[kind] = Cached(len(blobs), sum(map(len, blobs)), parsed_size(blobs))
    return sizes


async def create_runs(setup: Setup, count: int) -> None:
    """``count`` suspended runs; until each has its Job and status ``Suspended``."""
    kube = await admin_client(setup.cluster)
    runs = Watch(kube, RUNS, NAMESPACE, object_uid)
    jobs = Watch(kube, JOBS, NAMESPACE, job_run_uid, selector=managed_selector())
    try:
        await kube.create(CONFIGS, NAMESPACE, config_body(NAMESPACE, CONFIG, IMAGE))
        await runs.start()
        await jobs.start()
        await map_ordered(
            [suspended_run(NAMESPACE, f"run-{i:05d}") for i in range(count)],
            lambda body: kube.create(RUNS, NAMESPACE, body),
            concurrency=8,
        )

        def suspended(w: Watch) -> bool:
            phases = [(o.get("status") or {}).get("phase") for o in w.objects.values()]
            return len(phases) == count and all(p == "Suspended" for p in phases)

        await runs.wait_for(suspended, 900, f"{count} runs Suspended")
        await jobs.wait_keys(runs.objects.keys(), 60)
    finally:
        await runs.stop()
        await jobs.stop()
        await kube.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.controller_memory")
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument(
        "--kubeconfig-mode",
        action="store_true",
        help="connect through a kubeconfig (as `python -m controller` in development) "
        "instead of as a pod (the service account's token and CA, as the chart runs it)",
    )
    parser.add_argument(
        "--controller-python",
        default=sys.executable,
        help="the interpreter to run the controller with, e.g. a venv made from "
        "deploy/images/requirements-controller.txt to measure the image's set of packages",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=chart_workers(),
        help="MAX_RECONCILE_RATE (default: the chart's settings.maxReconcileRate)",
    )
    args = parser.parse_args(argv)
    if args.runs < 1 or args.workers < 1:
        parser.error("--runs and --workers must be at least 1")

    loads = [load_average()]
    with tempfile.TemporaryDirectory(prefix="ksc-bench-") as tmp, running_cluster() as cluster:
        setup = prepare(cluster, Path(tmp))
        # No resync while the runs are created: at a few thousand runs creating
        # them takes longer than the default 5 minutes, and the resyncs would
        # keep the controller from ever settling.
        quiet = {"POLLING_INTERVAL": "1h"}
        in_cluster = not args.kubeconfig_mode
        options: dict[str, Any] = {"in_cluster": in_cluster, "python": args.controller_python}
        first = Controller(setup, args.workers, "controller-1", quiet, **options)
        second = Controller(setup, args.workers, "controller-2", quiet, **options)
        try:
            first.start()
            first.wait_quiet()
            empty = sample(first.pid)

            started = time.monotonic()
            cpu_before = proc_cpu_seconds(first.pid)
            asyncio.run(create_runs(setup, args.runs))
            first.wait_quiet(within=300)
            created_in = time.monotonic() - started
            created_cpu = proc_cpu_seconds(first.pid) - cpu_before
            grown = sample(first.pid)
            first.stop()
            loads.append(load_average())

            _, mark = controller_requests(cluster, setup.user, 0)
            second.start(within=120)
            second.wait_quiet(within=300)
            restarted_cpu = proc_cpu_seconds(second.pid)
            restarted = sample(second.pid)
            time.sleep(2)
            requests, _ = controller_requests(cluster, setup.user, mark)
            reconciles = second.metrics().get("controller_runtime_reconcile_total", 0.0)

            async def sizes() -> dict[str, Cached]:
                async with await admin_client(cluster) as kube:
                    return await cached_sizes(kube)

            cached = asyncio.run(sizes())
        finally:
            first.stop()
            second.stop()
        loads.append(load_average())

    per_thousand = (restarted.rss - empty.rss) * 1000 / args.runs
    grown_per_thousand = (grown.rss - empty.rss) * 1000 / args.runs
    objects = sum(c.count for c in cached.values())
    json_bytes = sum(c.json_bytes for c in cached.values())
    parsed_bytes = sum(c.parsed_bytes for c in cached.values())
    lines = [
        f"machine: {machine()}",
        f"load average (1/5/15 min) at start, middle, end: {' | '.join(loads)}",
        f"runs: {args.runs} (suspended one-shot runs, each with a ConfigMap and a Job)",
        "controller connected "
        + ("through a kubeconfig" if args.kubeconfig_mode else "as a pod (service account)")
        + f", run by {args.controller_python}",
        "",
        "| controller | runs cached | RSS MiB | peak (VmHWM) MiB |",
        "|---|---|---|---|",
        f"| fresh, nothing to cache | 0 | {mib(empty.rss)} | {mib(empty.hwm)} |",
        f"| same process after creating them all ({created_in:.0f} s) | {args.runs} | "
        f"{mib(grown.rss)} | {mib(grown.hwm)} |",
        f"| fresh, restarted with them in place | {args.runs} | {mib(restarted.rss)} | "
        f"{mib(restarted.hwm)} |",
        "",
        f"**{mib(per_thousand)} MiB per 1000 cached runs** after a restart "
        f"(restarted - fresh empty), {mib(grown_per_thousand)} MiB in the process that "
        f"created them (grown - fresh empty); each run with its ConfigMap and Job.",
        "",
        f"**Controller CPU per run: {created_cpu * 1000 / args.runs:.2f} ms** "
        f"(user+system CPU of the process that created them, {created_cpu:.1f} s over "
        f"{args.runs} runs, settling included; /proc/<pid>/stat). The restarted "
        f"controller used {restarted_cpu:.1f} s to start, sync and reconcile them "
        f"({restarted_cpu * 1000 / args.runs:.2f} ms per run).",
        "",
        f"For scale, the {objects} cached objects are {json_bytes / MIB:.1f} MiB as the "
        "controller's caches keep them (each object's projection as JSON bytes) and "
        f"{parsed_bytes / MIB:.1f} MiB as parsed Python dicts, what a read hands out for a "
        f"moment ({parsed_bytes * 1000 / args.runs / MIB:.1f} MiB per 1000 runs, measured with "
        "tracemalloc in the benchmark's own process).",
        "",
        "| cached kind | objects | cached JSON bytes per object | parsed bytes per object |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {kind} | {c.count} | {c.json_bytes / max(c.count, 1):.0f} | "
        f"{c.parsed_bytes / max(c.count, 1):.0f} |"
        for kind, c in cached.items()
    ]
    lines += [
        "",
        f"| restarted controller's requests (start, sync, {reconciles:.0f} reconciles) | count |",
        "|---|---|",
    ]
    lines += [f"| `{k}` | {v} |" for k, v in sorted(requests.items())]
    lines.append(f"| **total** | **{sum(requests.values())}** |")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
