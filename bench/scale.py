"""Scale on simulated nodes: thousands of runs over many namespaces, pods played by kwok.

    .venv/bin/python -m bench.scale   # 10,000 one-shot, 1,000 scheduled, 1,000 backlog
    .venv/bin/python -m bench.scale --runs 5000 --scheduled 4000   # 10,000 runs in all: 30 min
    .venv/bin/python -m bench.scale --runs 500 --namespaces 10 --nodes 10 --scheduled 50
    .venv/bin/python -m bench.scale --shards 2        # two controller processes, one per shard

One command starts everything and stops everything: a local control plane
without the node agent (``hack.cluster.LocalCluster``), kwok with ``--nodes``
fake Nodes whose pods go Pending -> Running -> Succeeded (or Failed for
``--failure-share`` of them; ``hack/kwok.py``), and the controller (``python -m
controller`` under the Helm chart's RBAC for all namespaces, chart defaults:
``settings.maxReconcileRate`` workers, ``KUBE_API_QPS=200``, polling 5 min;
config probes off so that every Job counted is a run's). Then, in this order:

1. **API server's own rate** (before any controller runs): the bench writes,
   for ``--backlog`` suspended runs, exactly what the controller's planner
   (``controller.plan.plan``) says the first reconcile writes: the ConfigMap,
   the Job and the status, as fast as it can (``--direct-concurrency``
   requests in flight, and again with as many as the controller has workers).
2. **Controller start**: time to ready (informers synced), idle RSS.
3. **Backlog drain**: ``--backlog`` suspended runs whose config does not exist
   yet are created and reconciled (waiting); then the config is created in
   every namespace at once and the controller drains them: runs per second
   from the first config create to the last run ``Suspended`` (its status
   written) seen by a watch, divided by the API server's rate of step 1.
4. **One-shot phases**, one per ``--rates`` value: ``--runs`` / (number of
   rates) runs created round-robin over ``--namespaces`` at that rate, then
   until every run of the phase is Succeeded or Failed and the controller is
   quiet. Per run: create -> Job latency (the moment the create request
   returned to the moment a watch on Jobs saw the run's Job, both
   ``time.monotonic`` in this process), the controller's CPU
   (``/proc/<pid>/stat``) and its requests (the API server's audit log).
5. **Scheduled runs**: ``--scheduled`` runs with ``--schedule`` (default:
   once a year, so no Job fires during the bench: they cost a ConfigMap, a
   CronJob and their cache), created at the highest rate.
6. **Settled**: RSS with everything cached; then ``--idle-seconds`` of
   nothing: requests per idle minute.
7. **Restart**: the controller stops and a fresh one starts with everything
   present: time to ready (cache sync), time until quiet, RSS, its requests.

Prints Markdown tables, writes the series as JSON and plots them
(``--plots-dir``, default bench/results/img: scale-latency.png, scale-memory.png).
Measured and printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench.common import (
    MIB,
    AuditLog,
    config_body,
    load_average,
    machine,
    median_rss,
    mib,
    proc_cpu_seconds,
    proc_rss_bytes,
    quantile,
    run_body,
    since,
)
from controller.api import InferenceConfig, InferenceRun
from controller.naming import RUN_UID_LABEL, managed_selector
from controller.plan import Create, View, plan
from controller.sharding import shard_of
from hack import chart
from hack.cluster import LocalCluster, ensure_binaries
from hack.controllerproc import ControllerProcess
from hack.crds import install_crds
from hack.kwok import Kwok
from kubeclient.client import KubeClient
from kubeclient.errors import ApiError
from kubeclient.resources import CONFIGS, CRONJOBS, JOBS, NAMESPACES, RUNS, Obj, Resource
from runner.batching import map_ordered

REPO = Path(__file__).resolve().parents[1]
CONFIG, LATE_CONFIG = "cfg", "late"
IMAGE = "bench.local/runner:1"
DIRECT_NAMESPACE = "direct"
TERMINAL = ("Succeeded", "Failed")
# Processes whose CPU is reported beside the controller's (by /proc/<pid>/comm).
OTHERS = ("kube-apiserver", "etcd", "kube-controller", "kwok")


# ------------------------------------------------------------------------------ tracking


@dataclass
class Tracker:
    """What watches on runs, Jobs and CronJobs saw, with ``time.monotonic`` stamps."""

    kube: KubeClient
    created: dict[str, float] = field(default_factory=dict)  # run uid -> create returned
    namespace_of: dict[str, str] = field(default_factory=dict)  # run uid -> namespace
    child_seen: dict[str, float] = field(default_factory=dict)  # run uid -> Job/CronJob seen
    phase: dict[str, str] = field(default_factory=dict)  # run uid -> phase
    phase_at: dict[tuple[str, str], float] = field(default_factory=dict)  # (uid, phase) -> first
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def start(self) -> None:
        self.tasks = [
            asyncio.create_task(self._watch(RUNS, None, self._on_run)),
            asyncio.create_task(self._watch(JOBS, managed_selector(), self._on_child)),
            asyncio.create_task(self._watch(CRONJOBS, managed_selector(), self._on_child)),
        ]

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _on_run(self, obj: Obj) -> None:
        uid = obj["metadata"]["uid"]
        phase = (obj.get("status") or {}).get("phase")
        if phase:
            self.phase[uid] = phase
            self.phase_at.setdefault((uid, phase), time.monotonic())

    def _on_child(self, obj: Obj) -> None:
        uid = (obj["metadata"].get("labels") or {}).get(RUN_UID_LABEL)
        if uid:
            self.child_seen.setdefault(uid, time.monotonic())

    async def _watch(
        self, resource: Resource, selector: str | None, handle: Callable[[Obj], None]
    ) -> None:
        version: str | None = None
        while True:
            try:
                if version is None:
                    listed = await self.kube.list(resource, label_selector=selector)
                    for item in listed["items"]:
                        handle(item)
                    version = listed["metadata"]["resourceVersion"]
                async for event in self.kube.watch(
                    resource, resource_version=version, label_selector=selector, timeout_seconds=300
                ):
                    obj = event["object"]
                    if event["type"] == "ERROR":
                        version = None
                        break
                    version = obj["metadata"].get("resourceVersion", version)
                    if event["type"] in ("ADDED", "MODIFIED"):
                        handle(obj)
            except ApiError as exc:
                if not (exc.is_gone or exc.is_transient):
                    raise
                version = None if exc.is_gone else version
                await asyncio.sleep(0.5)

    def count(self, uids: Sequence[str], phases: Sequence[str]) -> int:
        return sum(1 for uid in uids if self.phase.get(uid) in phases)

    async def wait(
        self,
        uids: Sequence[str],
        phases: Sequence[str],
        within: float,
        what: str,
        alive: Callable[[], None],
    ) -> None:
        deadline = time.monotonic() + within
        while self.count(uids, phases) < len(uids):
            alive()
            if time.monotonic() > deadline:
                seen = Counter(self.phase.get(uid, "-") for uid in uids)
                raise TimeoutError(f"{what}: not all {'/'.join(phases)} after {within}s: {seen}")
            await asyncio.sleep(0.25)

    def done_at(self, uid: str, phases: Sequence[str]) -> float | None:
        stamps = [self.phase_at[(uid, p)] for p in phases if (uid, p) in self.phase_at]
        return min(stamps) if stamps else None


# ------------------------------------------------------------------------------ controllers


def metric_totals(text: str) -> dict[str, float]:
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


@dataclass
class Shard:
    """One controller process (one shard of ``count``) and its ServiceAccount identity."""

    index: int
    count: int
    namespace: str
    user: str
    proc: ControllerProcess
    generation: int = 0

    @property
    def pid(self) -> int:
        assert self.proc.proc is not None
        return self.proc.proc.pid

    def metrics(self) -> dict[str, float]:
        return metric_totals(self.proc.metrics())

    def check_alive(self) -> None:
        if self.proc.proc is not None and self.proc.proc.poll() is not None:
            raise RuntimeError(
                f"controller shard {self.index} exited {self.proc.proc.returncode}:\n"
                f"{self.proc.output()[-3000:]}"
            )


def make_shards(
    cluster: LocalCluster, workdir: Path, args: argparse.Namespace, run_namespaces: Sequence[str]
) -> list[Shard]:
    """The shards' controllers (not started), under the chart's RBAC for all namespaces.

    The runner ServiceAccount and Role go into every namespace of runs (the
    chart's ``runner.namespaces``): the chart's admission policy refuses the
    controller a Job that runs as any other ServiceAccount.
    """
    shards = []
    values = {"runner": {"namespaces": list(run_namespaces)}}
    for index in range(args.shards):
        namespace = f"ksc-system-{index}"
        cluster.kubectl("create", "namespace", namespace)
        chart.apply(cluster, chart.controller_rbac_objects(namespace, [], values=values))
        kubeconfig = chart.service_account_kubeconfig(
            cluster,
            namespace,
            path=workdir / f"controller-{index}.kubeconfig",
            expiration=timedelta(hours=6),
        )
        env = {
            "WATCH_NAMESPACE": "",
            "POD_NAMESPACE": namespace,
            "LEADER_ELECT": "false",
            # Every Job counted is a run's: a config probe would add one per config.
            "PROBE_INTERVAL": "0",
            "RUNNER_SERVICE_ACCOUNT": chart.RUNNER_SERVICE_ACCOUNT,
            "MAX_RECONCILE_RATE": str(args.workers),
            "LOG_LEVEL": "WARNING",
        }
        if args.shards > 1:
            env |= {"SHARD_COUNT": str(args.shards), "SHARD_INDEX": str(index)}
        user = chart.service_account_user(namespace, chart.CONTROLLER_SERVICE_ACCOUNT)
        proc = ControllerProcess(kubeconfig, workdir / f"controller-{index}.log", env)
        shards.append(Shard(index, args.shards, namespace, user, proc))
    return shards


def start_shards(shards: Sequence[Shard], within: float = 600.0) -> list[float]:
    """Start every shard at once; seconds from spawn to ready (informers synced), per shard."""
    for shard in shards:
        shard.proc.log.write_text("")
    started = time.monotonic()

    def start(shard: Shard) -> float:
        shard.generation += 1
        shard.proc.start(timeout=within)
        return time.monotonic() - started

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(shards)) as pool:
        return list(pool.map(start, shards))


def wait_quiet(shards: Sequence[Shard], within: float, still: float = 3.0) -> float:
    """Until every shard's work queue is empty and no reconcile happened for ``still`` s."""
    started = time.monotonic()
    deadline = started + within
    last: list[float] | None = None
    since_change = time.monotonic()
    while time.monotonic() < deadline:
        for shard in shards:
            shard.check_alive()
        metrics = [shard.metrics() for shard in shards]
        counts = [m.get("controller_runtime_reconcile_total", 0.0) for m in metrics]
        busy = sum(
            m.get("workqueue_depth", 0.0) + m.get("controller_runtime_active_workers", 0.0)
            for m in metrics
        )
        if counts != last or busy:
            last, since_change = counts, time.monotonic()
        elif time.monotonic() - since_change >= still:
            return since_change - started
        time.sleep(0.5)
    raise TimeoutError(f"controllers still busy after {within}s")


# ------------------------------------------------------------------------------ measuring


@dataclass
class Meter:
    """CPU seconds of the controllers and the control plane over a phase."""

    pids: dict[str, int]
    start: dict[str, float] = field(default_factory=dict)
    used: dict[str, float] = field(default_factory=dict)
    wall: float = 0.0
    _t0: float = 0.0

    def __enter__(self) -> Meter:
        self._t0 = time.monotonic()
        self.start = {name: proc_cpu_seconds(pid) for name, pid in self.pids.items()}
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.monotonic() - self._t0
        self.used = {
            name: proc_cpu_seconds(pid) - self.start[name] for name, pid in self.pids.items()
        }


def process_pids(cluster: LocalCluster, kwok: Kwok, shards: Sequence[Shard]) -> dict[str, int]:
    pids: dict[str, int] = {}
    for pid in [*cluster.pids(), kwok.pid()]:
        with contextlib.suppress(OSError):
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            name = next((o for o in OTHERS if comm.startswith(o)), comm)
            pids[name] = pid
    for shard in shards:
        pids[f"controller-{shard.index}"] = shard.pid
    pids["bench"] = os.getpid()
    return pids


@dataclass
class Phase:
    name: str
    runs: int
    target_rate: float | None = None
    create_seconds: float = 0.0
    settle_seconds: float = 0.0
    latencies: dict[str, float] = field(default_factory=dict)  # run uid -> seconds
    cpu: dict[str, float] = field(default_factory=dict)
    wall: float = 0.0
    requests: dict[int, Counter[str]] = field(default_factory=dict)  # shard -> requests
    runs_by_shard: Counter[int] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    metrics: dict[str, float] = field(default_factory=dict)  # controllers' metric deltas


# Controller metrics whose change over a phase says where a reconcile's time went.
PHASE_METRICS = (
    "controller_runtime_reconcile_total",
    "controller_runtime_reconcile_time_seconds_sum",
    "rest_client_requests_total",
    "rest_client_request_duration_seconds_sum",
    "rest_client_request_duration_seconds_count",
    "workqueue_queue_duration_seconds_sum",
    "workqueue_queue_duration_seconds_count",
)


@dataclass
class Sample:
    elapsed: float
    runs: int  # runs whose Job or CronJob exists so far (all kinds)
    rss: list[int]  # per shard, bytes


@dataclass
class Bench:
    args: argparse.Namespace
    cluster: LocalCluster
    kwok: Kwok
    shards: list[Shard]
    kube: KubeClient
    namespaces: list[str]
    tracker: Tracker
    audit: AuditLog
    started: float = field(default_factory=time.monotonic)
    samples: list[Sample] = field(default_factory=list)
    series: list[tuple[int, float, str]] = field(default_factory=list)  # (index, latency, phase)
    created_total: int = 0

    # ---- helpers

    def alive(self) -> None:
        self.kwok.check_alive()
        for shard in self.shards:
            shard.check_alive()

    def shard_of(self, namespace: str) -> int:
        return shard_of(namespace, len(self.shards)) if len(self.shards) > 1 else 0

    def meter(self) -> Meter:
        return Meter(process_pids(self.cluster, self.kwok, self.shards))

    def requests(self) -> list[Counter[str]]:
        self.audit.update()
        return [self.audit.snapshot([s.user]) for s in self.shards]

    async def sampler(self) -> None:
        while True:
            with contextlib.suppress(OSError):
                rss = [proc_rss_bytes(s.pid) for s in self.shards]
                self.samples.append(
                    Sample(time.monotonic() - self.started, len(self.tracker.child_seen), rss)
                )
            await asyncio.sleep(2.0)

    async def create_paced(
        self, bodies: Sequence[Obj], rate: float | None, in_flight: int = 32
    ) -> list[str]:
        """Create runs at ``rate`` per second (None: as fast as ``in_flight`` allows); uids."""
        gate = asyncio.Semaphore(in_flight)
        uids: list[str] = [""] * len(bodies)
        t0 = time.monotonic()

        async def one(index: int, body: Obj) -> None:
            try:
                namespace = body["metadata"]["namespace"]
                created = await self.kube.create(RUNS, namespace, body)
                now = time.monotonic()
                uid = created["metadata"]["uid"]
                self.tracker.created[uid] = now
                self.tracker.namespace_of[uid] = namespace
                uids[index] = uid
                self.created_total += 1
            finally:
                gate.release()

        tasks = []
        for index, body in enumerate(bodies):
            if rate is not None:
                delay = t0 + index / rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            await gate.acquire()
            tasks.append(asyncio.create_task(one(index, body)))
        await asyncio.gather(*tasks)
        return uids

    def phase_requests(self, phase: Phase, before: list[Counter[str]]) -> None:
        after = self.requests()
        phase.requests = {i: since(after[i], before[i]) for i in range(len(self.shards))}

    def metric_mark(self) -> dict[str, float]:
        totals: dict[str, float] = {}
        for shard in self.shards:
            values = shard.metrics()
            for name in PHASE_METRICS:
                totals[name] = totals.get(name, 0.0) + values.get(name, 0.0)
        return totals

    def phase_metrics(self, phase: Phase, before: dict[str, float]) -> None:
        after = self.metric_mark()
        phase.metrics = {name: after[name] - before.get(name, 0.0) for name in after}

    # ---- steps

    async def direct(self, count: int, concurrency: int) -> tuple[float, Meter]:
        """The API server's own rate for the controller's first-reconcile writes; runs/s."""
        namespace = f"{DIRECT_NAMESPACE}-{concurrency}"
        await self.kube.create(NAMESPACES, None, {"metadata": {"name": namespace}})
        raw_config = await self.kube.create(
            CONFIGS, namespace, config_body(namespace, CONFIG, IMAGE)
        )
        config = InferenceConfig.model_validate(raw_config)
        bodies = [run_body(namespace, f"d-{i:05d}", CONFIG, suspend=True) for i in range(count)]
        stored = await map_ordered(bodies, lambda b: self.kube.create(RUNS, namespace, b), 32)
        work: list[tuple[Obj, list[Create], Obj]] = []
        now = datetime.now(UTC)
        for raw in stored:
            run = InferenceRun.model_validate(raw)
            planned = plan(
                View(
                    run=run,
                    now=now,
                    config=config,
                    confirmed=True,
                    runner_service_account=chart.RUNNER_SERVICE_ACCOUNT,
                )
            )
            writes = [w for w in planned.writes if isinstance(w, Create)]
            assert planned.status is not None, planned
            assert len(writes) == 2, planned
            work.append((raw, writes, {**raw, "status": planned.status.to_api()}))

        async def one(raw: Obj, writes: list[Create], status: Obj) -> None:
            for write in writes:
                await self.kube.create(write.resource, namespace, write.obj)
            await self.kube.update_status(RUNS, namespace, raw["metadata"]["name"], status)

        with Meter(process_pids(self.cluster, self.kwok, [])) as meter:
            await map_ordered(work, lambda item: one(*item), concurrency)
        await self.kube.delete(NAMESPACES, None, namespace)
        return count / meter.wall, meter

    async def wait_writes_quiet(self, within: float, still: float = 10.0) -> None:
        """Until the controllers made no write for ``still`` seconds (or ``within`` passed)."""
        deadline = time.monotonic() + within
        last = sum(self._writes(c) for c in self.requests())
        quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            await asyncio.sleep(1.0)
            now = sum(self._writes(c) for c in self.requests())
            if now != last:
                last, quiet_since = now, time.monotonic()
            elif time.monotonic() - quiet_since >= still:
                return

    @staticmethod
    def _writes(counts: Counter[str]) -> int:
        return sum(v for k, v in counts.items() if k.split()[0] in WRITE_VERBS)

    async def wait_namespaces_gone(self, prefix: str, within: float = 300.0) -> None:
        deadline = time.monotonic() + within
        while True:
            names = [
                n["metadata"]["name"]
                for n in (await self.kube.list(NAMESPACES))["items"]
                if n["metadata"]["name"].startswith(prefix)
            ]
            if not names:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"namespaces {names} not gone after {within}s")
            await asyncio.sleep(1.0)

    async def backlog(self, count: int) -> tuple[Phase, float]:
        """Runs waiting for a missing config, then the config: the controller's drain rate."""
        bodies = [
            run_body(self.namespaces[i % len(self.namespaces)], f"b-{i:05d}", LATE_CONFIG,
                     suspend=True)
            for i in range(count)
        ]  # fmt: skip
        uids = await self.create_paced(bodies, None)
        await self.tracker.wait(uids, ("Pending", "Error"), 600, "backlog waiting", self.alive)
        await asyncio.to_thread(wait_quiet, self.shards, 600)
        phase = Phase("backlog drain (suspended runs, config created late)", count)
        for uid in uids:
            phase.runs_by_shard[self.shard_of(self.tracker.namespace_of[uid])] += 1
        before = self.requests()
        marks = self.metric_mark()
        with self.meter() as meter:
            t0 = time.monotonic()
            await asyncio.gather(
                *(
                    self.kube.create(CONFIGS, ns, config_body(ns, LATE_CONFIG, IMAGE))
                    for ns in self.namespaces
                )
            )
            await self.tracker.wait(uids, ("Suspended",), 900, "backlog drained", self.alive)
            ends = [self.tracker.done_at(uid, ("Suspended",)) or t0 for uid in uids]
            drained = max(ends) - t0
            phase.latencies = {uid: (self.tracker.child_seen.get(uid, t0) - t0) for uid in uids}
            await asyncio.to_thread(wait_quiet, self.shards, 600)
        phase.cpu, phase.wall = meter.used, meter.wall
        self.phase_metrics(phase, marks)
        phase.settle_seconds = drained
        self.phase_requests(phase, before)
        return phase, count / drained

    async def paced(
        self,
        phase: Phase,
        bodies: Sequence[Obj],
        until: Sequence[str],
        within: float,
        quiet_within: float,
    ) -> list[str]:
        """Create ``bodies`` at the phase's rate, timed until every run is in a phase of ``until``.

        Fills in ``phase``: create and settle seconds, CPU and wall time (up to the
        controllers' going quiet), metric deltas, requests, runs per shard and
        each run's start latency (created -> its Job or CronJob seen). The uids.
        """
        before = self.requests()
        marks = self.metric_mark()
        with self.meter() as meter:
            t0 = time.monotonic()
            uids = await self.create_paced(bodies, phase.target_rate)
            phase.create_seconds = time.monotonic() - t0
            await self.tracker.wait(uids, until, within, phase.name, self.alive)
            phase.settle_seconds = time.monotonic() - t0
            await asyncio.to_thread(wait_quiet, self.shards, quiet_within)
        phase.cpu, phase.wall = meter.used, meter.wall
        self.phase_metrics(phase, marks)
        self.phase_requests(phase, before)
        for uid in uids:
            phase.runs_by_shard[self.shard_of(self.tracker.namespace_of[uid])] += 1
            seen = self.tracker.child_seen.get(uid)
            if seen is not None:
                phase.latencies[uid] = max(0.0, seen - self.tracker.created[uid])
        return uids

    async def one_shot(self, index: int, count: int, rate: float) -> Phase:
        label = f"p{index}"
        offset = index * count
        bodies = [
            run_body(
                self.namespaces[(offset + i) % len(self.namespaces)], f"{label}-{i:05d}", CONFIG
            )
            for i in range(count)
        ]
        phase = Phase(f"one-shot runs at {rate:g}/s", count, rate)
        uids = await self.paced(phase, bodies, TERMINAL, 3600, 900)
        for uid in uids:
            phase.outcomes[self.tracker.phase.get(uid, "-")] += 1
        ordered = sorted(uids, key=lambda u: self.tracker.created[u])
        base = len(self.series)
        for position, uid in enumerate(ordered):
            if uid in phase.latencies:
                self.series.append((base + position, phase.latencies[uid], phase.name))
        return phase

    async def scheduled(self, count: int, rate: float) -> Phase:
        bodies = [
            run_body(
                self.namespaces[i % len(self.namespaces)],
                f"s-{i:05d}",
                CONFIG,
                schedule=self.args.schedule,
            )
            for i in range(count)
        ]
        phase = Phase(f"scheduled runs at {rate:g}/s", count, rate)
        await self.paced(phase, bodies, ("Scheduled",), 1800, 600)
        return phase


# ------------------------------------------------------------------------------ report


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


WRITE_VERBS = ("create", "update", "patch", "delete")


def per_run_requests(counts: Counter[str], runs: int) -> str:
    writes = sum(v for k, v in counts.items() if k.split()[0] in WRITE_VERBS)
    return f"{sum(counts.values()) / runs:.2f} ({writes / runs:.2f} writes)"


@dataclass
class Results:
    args: argparse.Namespace
    loads: list[tuple[str, str]]
    started_utc: str
    kwok_nodes: int
    direct: dict[int, tuple[float, Meter]]
    ready_seconds: list[float]
    idle_rss: list[int]
    backlog: Phase | None
    drain_rate: float
    phases: list[Phase]
    cached_runs: int
    settled_rss: list[int]
    idle_requests: list[Counter[str]]
    idle_seconds: float
    events_drain: float
    restart_ready: list[float]
    restart_quiet: float
    restart_rss: list[int]
    restart_requests: list[Counter[str]]
    runs_per_shard: Counter[int]
    wall: float
    profile: str = ""


def phase_table(results: Results) -> list[str]:
    shards = range(results.args.shards)
    lines = [
        "| phase | runs | created at (runs/s) | settled in | create -> Job p50 | p99 | max |"
        " controller CPU per run | requests per run | outcomes |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    every = ([results.backlog] if results.backlog else []) + results.phases
    for phase in every:
        values = list(phase.latencies.values())
        cpu = sum(v for k, v in phase.cpu.items() if k.startswith("controller"))
        requests: Counter[str] = Counter()
        for counts in phase.requests.values():
            requests.update(counts)
        rate = f"{phase.runs / phase.create_seconds:.1f}" if phase.create_seconds else "-"
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(phase.outcomes.items())) or "-"
        lines.append(
            f"| {phase.name} | {phase.runs} | {rate} | {phase.settle_seconds:.1f} s | "
            f"{ms(quantile(values, 0.5))} | {ms(quantile(values, 0.99))} | "
            f"{ms(max(values, default=0.0))} | {cpu * 1000 / phase.runs:.2f} ms | "
            f"{per_run_requests(requests, phase.runs)} | {outcomes} |"
        )
    if results.args.shards > 1:
        lines += ["", "| phase | shard | runs | CPU per run | requests per run | p50 | p99 |",
                  "|---|---|---|---|---|---|---|"]  # fmt: skip
        for phase in every:
            for shard in shards:
                runs = phase.runs_by_shard.get(shard, 0)
                if not runs:
                    continue
                cpu = phase.cpu.get(f"controller-{shard}", 0.0)
                lats = [
                    v for uid, v in phase.latencies.items() if _shard_by_uid(results, uid) == shard
                ]
                lines.append(
                    f"| {phase.name} | {shard} | {runs} | {cpu * 1000 / runs:.2f} ms | "
                    f"{per_run_requests(phase.requests.get(shard, Counter()), runs)} | "
                    f"{ms(quantile(lats, 0.5))} | {ms(quantile(lats, 0.99))} |"
                )
    return lines


_UID_SHARD: dict[str, int] = {}


def _shard_by_uid(results: Results, uid: str) -> int:
    return _UID_SHARD.get(uid, 0)


def where_table(results: Results) -> list[str]:
    """Where a reconcile's time went, from the controllers' own metrics over each phase."""
    lines = [
        "| phase | reconciles per run | mean reconcile | API requests per run | mean API "
        "request (controller's view) | mean wait in work queue |",
        "|---|---|---|---|---|---|",
    ]
    every = ([results.backlog] if results.backlog else []) + results.phases
    for phase in every:
        m = phase.metrics
        reconciles = m.get("controller_runtime_reconcile_total", 0.0)
        requests = m.get("rest_client_request_duration_seconds_count", 0.0)
        queued = m.get("workqueue_queue_duration_seconds_count", 0.0)
        if not reconciles:
            continue
        lines.append(
            f"| {phase.name} | {reconciles / phase.runs:.2f} | "
            f"{ms(m.get('controller_runtime_reconcile_time_seconds_sum', 0.0) / reconciles)} | "
            f"{requests / phase.runs:.2f} | "
            f"{ms(m.get('rest_client_request_duration_seconds_sum', 0.0) / max(requests, 1))} | "
            f"{ms(m.get('workqueue_queue_duration_seconds_sum', 0.0) / max(queued, 1))} |"
        )
    return lines


def cpu_table(results: Results) -> list[str]:
    names = [f"controller-{i}" for i in range(results.args.shards)] + [*OTHERS, "bench"]
    lines = [
        "| phase (CPU ms per run; share of one core) | " + " | ".join(names) + " | wall |",
        "|---|" + "---|" * (len(names) + 1),
    ]
    rows: list[tuple[str, int, dict[str, float], float]] = [
        (f"direct writes, {c} in flight", results.args.backlog, m.used, m.wall)
        for c, (_, m) in results.direct.items()
    ]
    every = ([results.backlog] if results.backlog else []) + results.phases
    rows += [(p.name, p.runs, p.cpu, p.wall) for p in every]
    for name, runs, used, wall in rows:
        cells = []
        for proc in names:
            value = used.get(proc)
            cells.append(
                "-" if value is None else f"{value * 1000 / runs:.2f} ({value / wall:.0%})"
            )
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {wall:.1f} s |")
    return lines


def requests_table(
    title: str, counts: Sequence[Counter[str]], divide: Sequence[float], unit: str
) -> list[str]:
    """One row per ``verb resource``, one column per shard, each count / its divisor."""
    keys = sorted(set().union(*counts)) if counts else []
    head = " | ".join(f"shard {i} {unit}" for i in range(len(counts))) if len(counts) > 1 else unit
    lines = [f"| {title} | {head} |", "|---|" + "---|" * max(1, len(counts))]
    for key in keys:
        cells = " | ".join(f"{c.get(key, 0) / d:.3g}" for c, d in zip(counts, divide, strict=True))
        lines.append(f"| `{key}` | {cells} |")
    totals = " | ".join(
        f"**{sum(c.values()) / d:.3g}**" for c, d in zip(counts, divide, strict=True)
    )
    lines.append(f"| **total** | {totals} |")
    return lines


def report(results: Results) -> str:
    args = results.args
    one_shot = [p for p in results.phases if p.name.startswith("one-shot")]
    direct_best = max(rate for rate, _ in results.direct.values())
    direct_same = results.direct.get(args.workers, (direct_best, None))[0]
    lines = [
        f"machine: {machine()}",
        f"started {results.started_utc}, wall {results.wall / 60:.1f} min",
        "load average (1/5/15 min): " + "; ".join(f"{what} {load}" for what, load in results.loads),
        f"size: {args.namespaces} namespaces, {results.kwok_nodes} kwok nodes, "
        f"{sum(p.runs for p in one_shot)} one-shot runs at "
        f"{', '.join(f'{r:g}' for r in args.rates)} runs/s, "
        f"{args.scheduled} scheduled runs (`{args.schedule}`), backlog {args.backlog}, "
        f"pods Pending {args.pending_seconds:g} s, Running {args.run_seconds:g} s, failure share "
        f"{args.failure_share:g}; controller: {args.shards} shard(s), {args.workers} worker(s)",
        "",
    ]
    lines += phase_table(results)
    lines += [
        "",
        "| API server's own rate (ConfigMap + Job + status, as the controller's planner "
        "renders them) | runs/s |",
        "|---|---|",
    ]
    for concurrency, (rate, _) in sorted(results.direct.items()):
        lines.append(f"| {concurrency} in flight | {rate:.1f} |")
    lines.append(f"| **controller backlog drain** | **{results.drain_rate:.1f}** |")
    lines += [
        "",
        f"**Drain ratio**: {results.drain_rate / direct_best:.2f} of the API server's best rate "
        f"({direct_best:.1f} runs/s), {results.drain_rate / direct_same:.2f} of its rate at the "
        f"controller's concurrency ({args.workers} in flight, {direct_same:.1f} runs/s).",
        "",
    ]
    lines += cpu_table(results)
    lines += [""]
    lines += where_table(results)
    lines += [
        "",
        f"After the last reconcile the controller kept writing (Events, budget EVENTS_QPS) for "
        f"{results.events_drain:.0f} s more; the idle minute starts after that.",
        "",
    ]
    if results.idle_seconds > 0:
        lines += requests_table(
            f"requests per idle minute ({results.idle_seconds:.0f} s idle, "
            f"{results.cached_runs} runs cached)",
            results.idle_requests,
            [results.idle_seconds / 60] * args.shards,
            "per minute",
        )
    else:
        lines.append("Requests per idle minute: not measured (`--idle-seconds 0`).")
    creates: list[Counter[str]] = []
    for shard in range(args.shards):
        total: Counter[str] = Counter()
        for phase in one_shot:
            total.update(phase.requests.get(shard, Counter()))
        creates.append(total)
    runs_total = sum(p.runs for p in one_shot)
    shard_runs = [
        max(1, sum(p.runs_by_shard.get(i, 0) for p in one_shot)) for i in range(args.shards)
    ]
    lines += [""]
    lines += requests_table(
        f"requests per one-shot run, create to Succeeded or Failed ({runs_total} runs)",
        creates,
        shard_runs,
        "per run",
    )
    lines += [
        "",
        "| controller memory (VmRSS) | "
        + " | ".join(f"shard {i}" for i in range(args.shards))
        + " |",
        "|---|" + "---|" * args.shards,
        "| started, nothing cached (MiB) | " + " | ".join(mib(r) for r in results.idle_rss) + " |",
        f"| settled, {results.cached_runs} runs cached (MiB) | "
        + " | ".join(mib(r) for r in results.settled_rss)
        + " |",
        "| restarted, same runs cached (MiB) | "
        + " | ".join(mib(r) for r in results.restart_rss)
        + " |",
        "| per cached run, settled - started (KiB) | "
        + " | ".join(
            f"{(s - i) / 1024 / max(1, results.runs_per_shard.get(n, 0)):.2f}"
            for n, (s, i) in enumerate(zip(results.settled_rss, results.idle_rss, strict=True))
        )
        + " |",
        "| per cached run, restarted - started (KiB) | "
        + " | ".join(
            f"{(s - i) / 1024 / max(1, results.runs_per_shard.get(n, 0)):.2f}"
            for n, (s, i) in enumerate(zip(results.restart_rss, results.idle_rss, strict=True))
        )
        + " |",
        "",
        f"Cache sync after a restart with {results.cached_runs} runs (and their ConfigMaps, "
        f"Jobs, CronJobs, pods) present: ready (informers synced) after "
        + ", ".join(f"{s:.1f} s" for s in results.restart_ready)
        + f"; quiet (every run reconciled once) after {results.restart_quiet:.1f} s more. "
        f"First start (empty): ready after "
        + ", ".join(f"{s:.1f} s" for s in results.ready_seconds)
        + ".",
        "",
    ]
    lines += requests_table(
        "restarted controller's requests (start, sync, reconcile all)",
        results.restart_requests,
        [1.0] * args.shards,
        "count",
    )
    if results.profile:
        lines += ["", results.profile]
    return "\n".join(lines)


def plot(results: Results, bench: Bench, plots_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots_dir.mkdir(parents=True, exist_ok=True)
    out = []
    fig, ax = plt.subplots(figsize=(9, 4.5), dpi=100)
    phases = sorted({name for _, _, name in bench.series}, key=lambda n: min(
        i for i, _, p in bench.series if p == n))  # fmt: skip
    for name in phases:
        points = [(i, v) for i, v, p in bench.series if p == name]
        ax.scatter([i for i, _ in points], [v for _, v in points], s=2, label=name, alpha=0.6)
    window = 200
    for number, name in enumerate(phases):
        points = [(i, v) for i, v, p in bench.series if p == name]
        xs, p50, p99 = [], [], []
        step = max(1, window // 4)
        for start in range(0, max(1, len(points) - window + 1), step):
            chunk = [v for _, v in points[start : start + window]]
            xs.append(points[min(start + len(chunk) // 2, len(points) - 1)][0])
            p50.append(quantile(chunk, 0.5))
            p99.append(quantile(chunk, 0.99))
        first = number == 0
        ax.plot(
            xs, p50, color="black", linewidth=1, label=f"p50 over {window} runs" if first else None
        )
        ax.plot(xs, p99, color="red", linewidth=1,
                label=f"p99 over {window} runs" if first else None)  # fmt: skip
    ax.axhline(0.5, color="black", linestyle=":", linewidth=0.8)
    ax.axhline(2.0, color="red", linestyle=":", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_xlabel("one-shot run (creation order)")
    ax.set_ylabel("create -> Job seen (s, log)")
    ax.set_title(
        f"create -> Job latency, {results.args.namespaces} namespaces, "
        f"{results.args.shards} controller shard(s); dotted: goals p50 0.5 s, p99 2 s"
    )
    ax.legend(loc="upper left", fontsize=7, markerscale=4)
    fig.tight_layout()
    path = plots_dir / "scale-latency.png"
    fig.savefig(path)
    plt.close(fig)
    out.append(path)

    fig, ax = plt.subplots(figsize=(9, 4.5), dpi=100)
    for shard in range(results.args.shards):
        ax.plot(
            [s.runs for s in bench.samples],
            [s.rss[shard] / MIB for s in bench.samples],
            marker=".",
            markersize=3,
            linewidth=0.8,
            label=f"controller shard {shard}" if results.args.shards > 1 else "controller",
        )
    ax.set_xlabel("runs with their Job or CronJob so far (plus ConfigMaps, pods; all kinds)")
    ax.set_ylabel("controller VmRSS (MiB)")
    ax.set_title("controller memory vs runs (sampled every 2 s; restart not shown)")
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = plots_dir / "scale-memory.png"
    fig.savefig(path)
    plt.close(fig)
    out.append(path)
    return out


# ------------------------------------------------------------------------------ profile


def py_spy(pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes] | None:
    binary = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(binary).exists():
        return None
    return subprocess.Popen(
        [binary, "record", "-p", str(pid), "-d", str(int(seconds)), "-r", "50", "--nonblocking",
         "-f", "raw", "-o", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip


def profile_summary(raw: Path, top: int = 15) -> str:
    """Top functions by inclusive and self samples from py-spy's collapsed stacks."""
    if not raw.exists():
        return ""
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = idle = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        if _short(frames[-1]).startswith(("EpollSelector.select", "select (")):
            idle += count  # the event loop waiting: not CPU
            continue
        total += count
        for frame in set(frames):
            inclusive[_short(frame)] += count
        own[_short(frames[-1])] += count
    if not total:
        return ""
    lines = [
        f"py-spy profile of the controller: {total} busy samples at 50 Hz "
        f"({idle} more were the event loop waiting); share of busy samples:",
        "",
        "| function (self) | self % | | function (inclusive) | inclusive % |",
        "|---|---|---|---|---|",
    ]
    for (fs, cs), (fi, ci) in zip(own.most_common(top), inclusive.most_common(top), strict=False):
        lines.append(f"| `{fs}` | {cs / total:.1%} | | `{fi}` | {ci / total:.1%} |")
    return "\n".join(lines)


def _short(frame: str) -> str:
    # "function (path/to/file.py:123)" -> "function (file.py)"
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    return f"{name} ({Path(path).name})" if path else name


# ------------------------------------------------------------------------------ main


async def measure(
    args: argparse.Namespace, cluster: LocalCluster, kwok: Kwok, workdir: Path
) -> tuple[Results, Bench]:
    loads = [("start", load_average())]
    started_utc = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    t_start = time.monotonic()
    install_crds(cluster)
    kube = await KubeClient.connect(kubeconfig=str(cluster.kubeconfig), qps=5000, burst=10000)
    shards: list[Shard] = []
    try:
        namespaces = [f"bench-{i:03d}" for i in range(args.namespaces)]
        labels = kwok.namespace_labels()
        await asyncio.gather(
            *(
                kube.create(NAMESPACES, None, {"metadata": {"name": n, "labels": labels}})
                for n in namespaces
            )
        )
        shards = await asyncio.to_thread(make_shards, cluster, workdir, args, namespaces)
        await asyncio.gather(
            *(kube.create(CONFIGS, n, config_body(n, CONFIG, IMAGE)) for n in namespaces)
        )

        tracker = Tracker(kube)
        bench = Bench(
            args, cluster, kwok, shards, kube, namespaces, tracker, AuditLog(cluster.audit_log)
        )
        # 1. The API server's own rate, before any controller runs.
        direct: dict[int, tuple[float, Meter]] = {}
        for concurrency in sorted({args.direct_concurrency, args.workers}):
            direct[concurrency] = await bench.direct(args.backlog, concurrency)
            print(
                f"direct {concurrency} in flight: {direct[concurrency][0]:.1f} runs/s", flush=True
            )
        await bench.wait_namespaces_gone(DIRECT_NAMESPACE)

        # 2. Controller start.
        ready = await asyncio.to_thread(start_shards, shards)
        await asyncio.to_thread(wait_quiet, shards, 300)
        idle_rss = [await asyncio.to_thread(median_rss, s.pid) for s in shards]
        tracker.start()
        sampler = asyncio.create_task(bench.sampler())
        bench.started = time.monotonic()
        print(f"controller ready in {ready}; idle RSS {[mib(r) for r in idle_rss]}", flush=True)

        # 3. Backlog drain.
        backlog: Phase | None = None
        drain_rate = float("nan")
        if args.backlog:
            backlog, drain_rate = await bench.backlog(args.backlog)
            print(f"backlog drained at {drain_rate:.1f} runs/s", flush=True)
        loads.append(("after backlog", load_average()))

        # 4. One-shot phases; 5. scheduled runs.
        phases: list[Phase] = []
        per_phase = args.runs // len(args.rates)
        profiler = None
        for index, rate in enumerate(args.rates):
            if args.profile and index == len(args.rates) - 1:
                profiler = py_spy(shards[0].pid, args.profile, workdir / "py-spy.txt")
            phase = await bench.one_shot(index, per_phase, rate)
            phases.append(phase)
            values = list(phase.latencies.values())
            print(
                f"{phase.name}: {phase.runs} runs, settled in {phase.settle_seconds:.1f} s, "
                f"p50 {ms(quantile(values, 0.5))} p99 {ms(quantile(values, 0.99))}",
                flush=True,
            )
            loads.append((f"after {rate:g}/s", load_average()))
        if args.scheduled:
            phase = await bench.scheduled(args.scheduled, max(args.rates))
            phases.append(phase)
            print(f"{phase.name}: settled in {phase.settle_seconds:.1f} s", flush=True)

        # 6. Settled, then idle. Quiet means 3 s without a reconcile, as after
        # each phase: at 10,000 runs the resyncs alone (every run every
        # POLLING_INTERVAL, in bursts) leave no 10 s gap, and a bench that gave
        # up here lost every figure of the hour before it.
        try:
            await asyncio.to_thread(wait_quiet, shards, 900)
        except TimeoutError as exc:
            print(f"settled RSS taken while still busy: {exc}", flush=True)
        settled_rss = [await asyncio.to_thread(median_rss, s.pid) for s in shards]
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
        await tracker.stop()
        runs_per_shard: Counter[int] = Counter(
            bench.shard_of(ns) for ns in tracker.namespace_of.values()
        )
        for uid, ns in tracker.namespace_of.items():
            _UID_SHARD[uid] = bench.shard_of(ns)
        # The Events writer has a budget of its own (EVENTS_QPS): after a burst
        # it is still writing when every reconcile is done. Idle starts after it.
        events_started = time.monotonic()
        await bench.wait_writes_quiet(args.settle_limit)
        events_drain = time.monotonic() - events_started
        print(f"controller writes quiet after {events_drain:.0f} s more", flush=True)
        before = bench.requests()
        await asyncio.sleep(args.idle_seconds)
        after = bench.requests()
        idle_requests = [since(a, b) for a, b in zip(after, before, strict=True)]
        loads.append(("idle", load_average()))

        # 7. Restart with everything present.
        for shard in shards:
            await asyncio.to_thread(shard.proc.stop)
        before = bench.requests()
        restart_ready = await asyncio.to_thread(start_shards, shards, 900)
        quiet_start = time.monotonic()
        try:
            await asyncio.to_thread(wait_quiet, shards, 900)
            restart_quiet = time.monotonic() - quiet_start
        except TimeoutError as exc:
            print(f"after the restart: {exc}", flush=True)
            restart_quiet = float("nan")
        restart_rss = [await asyncio.to_thread(median_rss, s.pid) for s in shards]
        await asyncio.sleep(2)
        restart_requests = [since(a, b) for a, b in zip(bench.requests(), before, strict=True)]
        loads.append(("end", load_average()))

        profile = ""
        if profiler is not None:
            await asyncio.to_thread(profiler.wait)
            profile = profile_summary(workdir / "py-spy.txt")
        results = Results(
            args=args,
            loads=loads,
            started_utc=started_utc,
            kwok_nodes=kwok.nodes,
            direct=direct,
            ready_seconds=ready,
            idle_rss=idle_rss,
            backlog=backlog,
            drain_rate=drain_rate,
            phases=phases,
            cached_runs=len(tracker.created),
            settled_rss=settled_rss,
            idle_requests=idle_requests,
            idle_seconds=args.idle_seconds,
            events_drain=events_drain,
            restart_ready=restart_ready,
            restart_quiet=restart_quiet,
            restart_rss=restart_rss,
            restart_requests=restart_requests,
            runs_per_shard=runs_per_shard,
            wall=time.monotonic() - t_start,
            profile=profile,
        )
        return results, bench
    finally:
        for shard in shards:
            await asyncio.to_thread(shard.proc.stop)
        await kube.close()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.scale", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    parser.add_argument("--runs", type=int, default=10000, help="one-shot runs, split over rates")
    parser.add_argument("--scheduled", type=int, default=1000, help="scheduled (cron) runs")
    parser.add_argument("--namespaces", type=int, default=100)
    parser.add_argument("--nodes", type=int, default=100, help="kwok nodes")
    parser.add_argument(
        "--rates", type=lambda s: [float(r) for r in s.split(",")], default=[10.0, 100.0],
        help="creation rates (runs/s), one phase each (default 10,100)",
    )  # fmt: skip
    parser.add_argument("--backlog", type=int, default=1000, help="runs of the drain measurement")
    parser.add_argument("--direct-concurrency", type=int, default=8)
    parser.add_argument("--schedule", default="0 0 1 1 *", help="cron of the scheduled runs")
    parser.add_argument("--pending-seconds", type=float, default=0.5)
    parser.add_argument("--run-seconds", type=float, default=2.0)
    parser.add_argument("--failure-share", type=float, default=0.1)
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    parser.add_argument(
        "--settle-limit", type=float, default=1800.0,
        help="longest wait for the controller's writes (Events) to stop before the idle minute",
    )  # fmt: skip
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument(
        "--workers", type=int, default=chart_workers(),
        help="MAX_RECONCILE_RATE (default: the chart's settings.maxReconcileRate)",
    )  # fmt: skip
    parser.add_argument(
        "--profile", type=float, default=0.0,
        help="py-spy the controller for this many seconds from the start of the last phase",
    )  # fmt: skip
    parser.add_argument("--plots-dir", type=Path, default=REPO / "bench" / "results" / "img")
    parser.add_argument("--json", type=Path, help="also write the series and figures here")
    args = parser.parse_args(argv)
    if args.runs < len(args.rates) or args.namespaces < 1 or args.nodes < 1 or args.shards < 1:
        parser.error("need runs >= number of rates, and at least one namespace, node and shard")
    return args


def chart_workers() -> int:
    """The chart's default MAX_RECONCILE_RATE, so the bench measures what operators install."""
    values = yaml.safe_load((chart.CHART_DIR / "values.yaml").read_text())
    return int(values["settings"]["maxReconcileRate"])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="ksc-scale-"))
    # SIGTERM (a stopped long run) unwinds like Ctrl-C: the cluster stops, its files go.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        return _main(args, workdir)
    finally:
        # Also after a failure or an interrupt: the cluster's data is GBs at 10,000 runs.
        shutil.rmtree(workdir, ignore_errors=True)


def _main(args: argparse.Namespace, workdir: Path) -> int:
    cluster = LocalCluster(bin_dir=ensure_binaries(), workdir=workdir / "cluster", node_agent=False)
    try:
        cluster.start()
        kwok = Kwok(
            cluster,
            workdir / "kwok",
            nodes=args.nodes,
            pending_seconds=args.pending_seconds,
            run_seconds=args.run_seconds,
            failure_share=args.failure_share,
        )
        kwok.start()
        try:
            results, bench = asyncio.run(measure(args, cluster, kwok, workdir))
        finally:
            kwok.stop(delete=False)
    finally:
        cluster.stop()
    text = report(results)
    print(text)
    paths = plot(results, bench, args.plots_dir)
    print("\nplots: " + ", ".join(str(p) for p in paths))
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "report": text,
                    "latency_series": bench.series,
                    "memory_series": [(s.elapsed, s.runs, s.rss) for s in bench.samples],
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
