"""Runs reconciled per second against the API server's own write limit, and start-to-Job latency.

    .venv/bin/python -m bench.controller_throughput [--runs 200] [--workers 4] [--latency-runs 20]

On one fresh local control plane (``hack.cluster.running_cluster``), with the
controller running as the Helm chart's ServiceAccount, ``--workers`` workers
(``MAX_RECONCILE_RATE``) and client-side limits far above what is reached
(``KUBE_API_QPS=500``, ``KUBE_API_BURST=1000``), every run ``suspend: true``
so that no pod runs and a run counts as reconciled once its Job exists. The
benchmark's own requests go through the controller's client
(``kubeclient.client.KubeClient``) as the admin user, with limits far
above what is reached too:

1. **API server limit** (namespace ``bench-direct``, which the controller does
   not watch): the admin user creates ``--runs`` ConfigMap + Job pairs exactly
   as the controller renders them (``controller.render`` on the stored runs),
   ``--workers`` at a time, each worker ConfigMap then Job, as a reconcile
   does; bodies are rendered before the clock starts. A second variant adds the
   other two writes the controller makes for a new run (its status and a
   ``Created`` Event). Measured before and after the controller's phases; the
   spread says how far to trust a ratio on a shared machine.
2. **Latency**: ``--latency-runs`` runs created one at a time (admin POST), each
   timed from just before its create request to the moment a watch on Jobs
   (opened beforehand, same client) sees its Job.
3. **Burst**: ``--runs`` runs in one ``kubectl apply`` of a List; time from
   starting kubectl to the last Job seen. kubectl creates the runs one by one,
   so the time kubectl itself took is printed too: the controller cannot be
   faster than the runs arrive.
4. **Backlog**: ``--runs`` runs of a config that does not exist yet (the
   controller marks them ConfigNotFound and waits, without retries); then the
   config is created and every run becomes ready at once. Time from the
   config's create request to the last Job: the controller's own drain rate
   with everything cached, independent of how fast runs can be created.

For each timed phase the benchmark also prints, per run: the CPU time of the
controller, the API server, etcd, the kube-controller-manager and itself
(``/proc/<pid>/stat``), every request by client from the audit log (the
controller by its ServiceAccount, kubectl by its user agent, the benchmark as
the admin), and the controller's reconciles, so what lies behind a ratio is
visible. Measured and printed, never asserted: the numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import statistics
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from bench.common import config_body, load_average, machine, proc_cpu_seconds, run_body
from controller.api import InferenceConfig, InferenceRun
from controller.naming import RUN_UID_LABEL, managed_selector
from controller.render import desired_configmap, desired_job
from hack import chart
from hack.cluster import LocalCluster, free_port, running_cluster, spawn, stop_process
from hack.crds import install_crds
from kubeclient.client import KubeClient
from kubeclient.resources import CONFIGMAPS, CONFIGS, EVENTS, JOBS, RUNS, Obj, Resource
from runner.batching import map_ordered

NAMESPACE = "bench"
DIRECT_NAMESPACE = "bench-direct"
IMAGE = "test.local/fake-ok:1"
CONFIG = "cfg"
REPO = Path(__file__).resolve().parents[1]
# The control plane's processes whose CPU time is reported (by /proc/<pid>/comm).
CONTROL_PLANE_PROCESSES = ("kube-apiserver", "etcd", "kube-controller")


# ------------------------------------------------------------------------------ objects


def suspended_run(namespace: str, name: str, config: str = CONFIG) -> Obj:
    """A one-shot run that never starts a pod: its Job is created suspended."""
    return run_body(namespace, name, config, suspend=True)


# ------------------------------------------------------------------------------ watches


async def admin_client(cluster: LocalCluster) -> KubeClient:
    """The controller's own client as the admin user, with limits far above what is reached."""
    return await KubeClient.connect(kubeconfig=str(cluster.kubeconfig), qps=5000, burst=10000)


@dataclass
class Watch:
    """When this client first saw each object (by ``key``), from a list then a watch."""

    kube: KubeClient
    resource: Resource
    namespace: str
    key: Callable[[Obj], str | None]
    selector: str | None = None
    seen: dict[str, float] = field(default_factory=dict)
    objects: dict[str, Obj] = field(default_factory=dict)
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    _task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        listed = await self.kube.list(self.resource, self.namespace, label_selector=self.selector)
        now = time.monotonic()
        for obj in listed.get("items") or []:
            self._record(obj, now)
        version = listed["metadata"]["resourceVersion"]
        self._task = asyncio.create_task(self._watch(version))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def _record(self, obj: Obj, now: float) -> None:
        key = self.key(obj)
        if key is None:
            return
        self.seen.setdefault(key, now)
        self.objects[key] = obj

    async def _watch(self, version: str) -> None:
        while True:
            async for event in self.kube.watch(
                self.resource,
                self.namespace,
                resource_version=version,
                timeout_seconds=600,
                label_selector=self.selector,
                allow_bookmarks=False,
            ):
                if event["type"] == "ERROR":
                    raise RuntimeError(f"watch {self.resource}: {event['object']}")
                obj = event["object"]
                version = obj["metadata"]["resourceVersion"]
                if event["type"] in ("ADDED", "MODIFIED"):
                    self._record(obj, time.monotonic())
                    async with self._changed:
                        self._changed.notify_all()

    async def wait_for(
        self, predicate: Callable[[Watch], bool], within: float, what: str = "objects"
    ) -> None:
        async def until() -> None:
            async with self._changed:
                await self._changed.wait_for(lambda: predicate(self))

        assert self._task is not None, "start() the watch first"
        waiter = asyncio.ensure_future(until())
        done, _ = await asyncio.wait(
            {waiter, self._task}, timeout=within, return_when=asyncio.FIRST_COMPLETED
        )
        if waiter in done:
            return
        waiter.cancel()
        if self._task in done:
            self._task.result()  # the watch failed: raise its error, not a timeout
        raise TimeoutError(f"{what} not seen within {within}s")

    async def wait_keys(self, keys: Iterable[str], within: float) -> None:
        wanted = set(keys)
        await self.wait_for(lambda w: wanted <= w.seen.keys(), within, f"{len(wanted)} keys")


def job_run_uid(obj: Obj) -> str | None:
    labels: dict[str, str] = obj["metadata"].get("labels") or {}
    return labels.get(RUN_UID_LABEL)


def object_uid(obj: Obj) -> str | None:
    uid: str | None = obj["metadata"].get("uid")
    return uid


# ------------------------------------------------------------------------ cluster + controller


@dataclass
class Setup:
    cluster: LocalCluster
    workdir: Path
    kubeconfig: Path
    user: str


def as_a_pod(setup: Setup, mount: Path, command: list[str]) -> list[str]:
    """``command`` run with the controller's service account mounted where a pod has it.

    A private mount namespace (root only) with a tmpfs over ``/run`` holds the
    token and CA at ``/var/run/secrets/kubernetes.io/serviceaccount``; the
    host's own ``/run`` is untouched. ``exec`` keeps the controller's pid the
    one :func:`spawn` returns.
    """
    chart.service_account_mount(setup.cluster, NAMESPACE, directory=mount)
    script = (
        "mount -t tmpfs tmpfs /run && mkdir -p /run/secrets/kubernetes.io/serviceaccount"
        ' && cp "$0/token" "$0/ca.crt" /run/secrets/kubernetes.io/serviceaccount/'
        ' && exec "$@"'
    )
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        script,
        str(mount),
        *command,
    ]


def prepare(cluster: LocalCluster, workdir: Path, namespaces: Sequence[str] = ()) -> Setup:
    """CRDs, the watched namespace with the chart's RBAC, extra namespaces, the config."""
    install_crds(cluster)
    for namespace in (NAMESPACE, *namespaces):
        cluster.kubectl("create", "namespace", namespace)
    # The runner ServiceAccount in the namespace of runs (the chart's runner.namespaces):
    # the chart's admission policy refuses a Job that runs as any other.
    values = {"runner": {"namespaces": [NAMESPACE]}}
    chart.apply(cluster, chart.controller_rbac_objects(NAMESPACE, [NAMESPACE], values=values))
    kubeconfig = chart.service_account_kubeconfig(cluster, NAMESPACE, path=workdir / "kc")
    user = chart.service_account_user(NAMESPACE, chart.CONTROLLER_SERVICE_ACCOUNT)
    return Setup(cluster, workdir, kubeconfig, user)


@dataclass
class Controller:
    """``python -m controller`` watching NAMESPACE, as bench/api_requests.py runs it."""

    setup: Setup
    workers: int
    name: str = "controller"
    extra_env: dict[str, str] = field(default_factory=dict)
    # Connect as a pod does (the service account's token and CA at the
    # kubelet's path, KUBERNETES_SERVICE_*), not through a kubeconfig: how the
    # chart runs it, and the only way that never loads kubernetes_asyncio.
    in_cluster: bool = False
    # The interpreter to run it with: another venv (for example one with only
    # the controller image's packages) measures what the image would hold.
    python: str = sys.executable
    health_port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    proc: Any = None

    @property
    def log(self) -> Path:
        return self.setup.workdir / f"{self.name}.log"

    @property
    def pid(self) -> int:
        return int(self.proc.pid)

    def start(self, within: float = 60.0) -> None:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "KUBECONFIG": str(self.setup.kubeconfig),
            "WATCH_NAMESPACE": NAMESPACE,
            "MAX_RECONCILE_RATE": str(self.workers),
            "RUNNER_SERVICE_ACCOUNT": chart.RUNNER_SERVICE_ACCOUNT,
            # Far above what the benchmark reaches: the API server must be the limit.
            "KUBE_API_QPS": "500",
            "KUBE_API_BURST": "1000",
            "QUEUE_QPS": "1000",
            "QUEUE_BURST": "10000",
            "HEALTH_PORT": str(self.health_port),
            "METRICS_PORT": str(self.metrics_port),
            "BIND_ADDRESS": "127.0.0.1",
            "LOG_LEVEL": "WARNING",
            **self.extra_env,
        }
        command = [self.python, "-m", "controller"]
        if self.python != sys.executable:
            env["PYTHONPATH"] = str(REPO)  # the controller's code, that venv's packages
        if self.in_cluster:
            del env["KUBECONFIG"]
            env["KUBERNETES_SERVICE_HOST"] = "127.0.0.1"
            env["KUBERNETES_SERVICE_PORT"] = str(self.setup.cluster.api_port)
            command = as_a_pod(self.setup, self.setup.workdir / f"{self.name}-sa", command)
        self.proc = spawn(command, self.log, env=env, cwd=REPO)
        deadline = time.monotonic() + within
        while self._get(self.health_port, "/readyz")[0] != 200:
            if self.proc.poll() is not None:
                raise RuntimeError(f"controller exited {self.proc.returncode}:\n{self.tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"controller not ready within {within}s:\n{self.tail()}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)

    def tail(self) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text(errors="replace")[-3000:]
        return ""

    @staticmethod
    def _get(port: int, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as resp:
                return int(resp.status), resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, ""
        except OSError:
            return 0, ""

    def metrics(self) -> dict[str, float]:
        """Every sample of /metrics, summed over labels, by sample name."""
        totals: dict[str, float] = {}
        for family in text_string_to_metric_families(self._get(self.metrics_port, "/metrics")[1]):
            for sample in family.samples:
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
        return totals

    def wait_quiet(self, within: float = 120.0, still: float = 3.0) -> None:
        """Until the work queue is empty and no reconcile happened for ``still`` seconds."""
        deadline = time.monotonic() + within
        last: float | None = None
        since = time.monotonic()
        while time.monotonic() < deadline:
            metrics = self.metrics()
            count = metrics.get("controller_runtime_reconcile_total", 0.0)
            busy = metrics.get("workqueue_depth", 0.0) + metrics.get(
                "controller_runtime_active_workers", 0.0
            )
            if count != last or busy:
                last, since = count, time.monotonic()
            elif time.monotonic() - since >= still:
                return
            time.sleep(0.5)
        raise TimeoutError(f"controller still busy after {within}s")


def audit_lines(cluster: LocalCluster) -> int:
    with cluster.audit_log.open("rb") as log:
        return sum(1 for _ in log)


def client_of(event: dict[str, Any], cluster: LocalCluster, controller_user: str) -> str:
    """Who sent an audited request: ``controller``, ``kubectl``, ``bench`` or its user agent.

    This benchmark talks through the controller's own client, user agent and
    all, so the user tells the two apart (the controller's ServiceAccount, the
    admin here); the user agent tells kubectl (also the admin) from the bench.
    The test node agent (``hack.nodeagent``, the admin over plain aiohttp)
    counts as the bench, as it did when the bench had an aiohttp client too.
    """
    agent = (event.get("userAgent") or "?").split("/")[0]
    user = (event.get("user") or {}).get("username", "")
    if agent == "kubectl":
        return "kubectl"
    if user == controller_user:
        return "controller"
    if user == cluster.users["admin"].name:
        return "bench"
    return agent


def audit_requests(cluster: LocalCluster, since: int, controller_user: str) -> Counter[str]:
    """Requests after audit line ``since``, as ``"<client> <verb> <resource>"`` -> count.

    The client is :func:`client_of`'s; a watch counts once, when it opens. The
    kube-controller-manager is not audited.
    """
    counts: Counter[str] = Counter()
    with cluster.audit_log.open() as log:
        for index, line in enumerate(log):
            if index < since:
                continue
            event = json.loads(line)
            verb = event["verb"]
            if event["stage"] != ("ResponseStarted" if verb == "watch" else "ResponseComplete"):
                continue
            client = client_of(event, cluster, controller_user)
            ref = event.get("objectRef") or {}
            what = ref.get("resource", "?") + (
                "/" + ref["subresource"] if ref.get("subresource") else ""
            )
            counts[f"{client} {verb} {what}"] += 1
    return counts


@dataclass
class PhaseMeter:
    """What one timed phase cost: CPU seconds of named processes, requests, reconciles.

    CPU and wall time are taken between ``start()`` and ``stop()`` (the timed
    part); requests and reconciles from ``start()`` to ``finish()``, which the
    caller invokes once the controller is quiet again, so trailing writes
    (status, Events) are counted.
    """

    cluster: LocalCluster
    controller_user: str
    pids: dict[str, int]
    reconciles: Callable[[], float] | None = None
    used: dict[str, float] = field(default_factory=dict)
    wall: float = 0.0
    requests: Counter[str] = field(default_factory=Counter)
    reconciled: float = 0.0
    _cpu: dict[str, float] = field(default_factory=dict)
    _wall: float = 0.0
    _audit: int = 0
    _reconciles: float = 0.0

    def start(self) -> None:
        self._audit = audit_lines(self.cluster)
        self._reconciles = self.reconciles() if self.reconciles else 0.0
        self._cpu = {name: proc_cpu_seconds(pid) for name, pid in self.pids.items()}
        self._wall = time.monotonic()

    def stop(self) -> None:
        self.wall = time.monotonic() - self._wall
        self.used = {
            name: proc_cpu_seconds(pid) - self._cpu[name] for name, pid in self.pids.items()
        }

    def finish(self) -> None:
        self.requests = audit_requests(self.cluster, self._audit, self.controller_user)
        if self.reconciles:
            self.reconciled = self.reconciles() - self._reconciles


def process_names(pids: Iterable[int]) -> dict[str, int]:
    """``comm`` -> pid of the given processes (the control plane's, here)."""
    return {Path(f"/proc/{pid}/comm").read_text().strip(): pid for pid in pids}


def quantile(values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile (no interpolation: with 20 samples p95 is the 19th)."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q * len(ordered))))
    return ordered[rank - 1]


# ------------------------------------------------------------------------------ phases


@dataclass
class DirectResult:
    label: str
    when: str
    pairs: int
    seconds: float
    writes_per_run: int
    cpu: PhaseMeter

    @property
    def rate(self) -> float:
        return self.pairs / self.seconds


def event_body(run: Obj, index: int) -> Obj:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    meta = run["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{meta['name']}.{index:08x}", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": run["apiVersion"],
            "kind": run["kind"],
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta["uid"],
            "resourceVersion": meta["resourceVersion"],
        },
        "type": "Normal",
        "reason": "Created",
        "message": f"created Job inf-{meta['name']}",
        "count": 1,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "source": {"component": "bench"},
        "reportingComponent": "bench",
        "reportingInstance": "bench",
    }


def status_body(run: Obj) -> Obj:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    status = {
        "phase": "Suspended",
        "reason": "Suspended",
        "observedGeneration": run["metadata"].get("generation", 1),
        "conditions": [
            {
                "type": "Ready",
                "status": "False",
                "reason": "Suspended",
                "message": "the run is suspended",
                "lastTransitionTime": now,
                "observedGeneration": run["metadata"].get("generation", 1),
            }
        ],
    }
    return {**run, "status": status}


async def direct_writes(
    kube: KubeClient, when: str, runs: int, workers: int, full: bool, cpu: PhaseMeter
) -> DirectResult:
    """The admin creates what the controller would for ``runs`` stored runs, timed."""
    namespace = DIRECT_NAMESPACE
    config = InferenceConfig.model_validate(await kube.get(CONFIGS, namespace, CONFIG))
    stored = await map_ordered(
        [suspended_run(namespace, f"{when}-{int(full)}-{i}") for i in range(runs)],
        lambda body: kube.create(RUNS, namespace, body),
        concurrency=8,
    )
    # Rendered before the clock starts, as the controller has them by the time it writes.
    bodies: list[tuple[Obj, ...]] = []
    for index, raw in enumerate(stored):
        run = InferenceRun.model_validate(raw)
        pair = (desired_configmap(run, config), desired_job(run, config))
        extra = (status_body(raw), event_body(raw, index)) if full else ()
        bodies.append(pair + extra)

    async def one(raw: Obj, body: tuple[Obj, ...]) -> None:
        await kube.create(CONFIGMAPS, namespace, body[0])
        await kube.create(JOBS, namespace, body[1])
        if full:
            await kube.update_status(RUNS, namespace, raw["metadata"]["name"], body[2])
            await kube.create(EVENTS, namespace, body[3])

    cpu.start()
    start = time.perf_counter()
    await map_ordered(
        list(zip(stored, bodies, strict=True)), lambda pair: one(*pair), concurrency=workers
    )
    seconds = time.perf_counter() - start
    cpu.stop()
    cpu.finish()
    label = "ConfigMap + Job" if not full else "ConfigMap + Job + status + Event"
    return DirectResult(label, when, runs, seconds, 4 if full else 2, cpu)


async def latency(kube: KubeClient, jobs: Watch, count: int) -> list[float]:
    """Seconds from each run's create request to its Job seen by the watch, one at a time."""
    samples = []
    for index in range(count):
        body = suspended_run(NAMESPACE, f"latency-{index}")
        start = time.monotonic()
        created = await kube.create(RUNS, NAMESPACE, body)
        uid = created["metadata"]["uid"]
        await jobs.wait_keys([uid], 60)
        samples.append(jobs.seen[uid] - start)
        await asyncio.sleep(0.3)
    return samples


@dataclass
class BurstResult:
    runs: int
    created_seconds: float  # kubectl's own time, or the config create request
    jobs_seconds: float
    per_run: list[float]  # run seen -> its Job seen
    cpu: PhaseMeter

    @property
    def rate(self) -> float:
        return self.runs / self.jobs_seconds


async def burst(setup: Setup, runs: Watch, jobs: Watch, count: int, cpu: PhaseMeter) -> BurstResult:
    """One kubectl apply of ``count`` runs; time until every one has its Job."""
    items = [suspended_run(NAMESPACE, f"burst-{i}") for i in range(count)]
    document = json.dumps({"apiVersion": "v1", "kind": "List", "items": items}).encode()
    cluster = setup.cluster
    cpu.start()
    start = time.monotonic()
    kubectl = await asyncio.create_subprocess_exec(
        str(cluster.bin_dir / "kubectl"),
        f"--kubeconfig={cluster.kubeconfig}",
        "apply",
        "-f",
        "-",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await kubectl.communicate(document)
    applied = time.monotonic() - start
    if kubectl.returncode != 0:
        raise RuntimeError(f"kubectl apply failed: {err.decode()}")
    names = {f"burst-{i}" for i in range(count)}

    def uids(w: Watch) -> list[str]:
        return [uid for uid, obj in w.objects.items() if obj["metadata"]["name"] in names]

    await runs.wait_for(lambda w: len(uids(w)) == count, 60, "burst runs")
    wanted = uids(runs)
    await jobs.wait_keys(wanted, 600)
    cpu.stop()
    finished = max(jobs.seen[uid] for uid in wanted) - start
    per_run = [jobs.seen[uid] - runs.seen[uid] for uid in wanted]
    return BurstResult(count, applied, finished, per_run, cpu)


async def backlog(
    kube: KubeClient, runs: Watch, jobs: Watch, count: int, cpu: PhaseMeter
) -> BurstResult:
    """``count`` runs waiting for a missing config; time from its creation to the last Job."""
    config = "later"
    names = {f"backlog-{i}" for i in range(count)}
    await map_ordered(
        [suspended_run(NAMESPACE, n, config) for n in sorted(names)],
        lambda body: kube.create(RUNS, NAMESPACE, body),
        concurrency=8,
    )

    def waiting(w: Watch) -> list[str]:
        return [
            uid
            for uid, obj in w.objects.items()
            if obj["metadata"]["name"] in names and (obj.get("status") or {}).get("conditions")
        ]

    # Every run has been reconciled once (ConfigNotFound written): the backlog is cached.
    await runs.wait_for(lambda w: len(waiting(w)) == count, 300, "ConfigNotFound on every run")
    wanted = waiting(runs)
    await asyncio.sleep(2)  # the status writes' own watch events, reconciled to no-ops
    cpu.start()
    start = time.monotonic()
    await kube.create(CONFIGS, NAMESPACE, config_body(NAMESPACE, config, IMAGE))
    created = time.monotonic() - start
    await jobs.wait_keys(wanted, 600)
    cpu.stop()
    finished = max(jobs.seen[uid] for uid in wanted) - start
    per_run = [jobs.seen[uid] - start for uid in wanted]
    return BurstResult(count, created, finished, per_run, cpu)


# ------------------------------------------------------------------------------ report


def fmt(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


CLIENTS = ("controller", "kubectl", "bench")


def _phases(
    direct: Sequence[DirectResult], burst_result: BurstResult, backlog_result: BurstResult
) -> list[tuple[str, int, PhaseMeter]]:
    phases = [(f"direct {d.label}, {d.when}", d.pairs, d.cpu) for d in direct]
    phases += [
        ("controller burst", burst_result.runs, burst_result.cpu),
        ("controller backlog", backlog_result.runs, backlog_result.cpu),
    ]
    return phases


def cost_table(
    direct: Sequence[DirectResult], burst_result: BurstResult, backlog_result: BurstResult
) -> list[str]:
    """Per run of each timed phase: CPU ms per process (share of a core), requests, reconciles."""
    names = ["controller", *CONTROL_PLANE_PROCESSES, "bench client"]
    header = [*(f"{n} CPU ms" for n in names), "wall ms", *(f"{c} requests" for c in CLIENTS)]
    lines = [
        "| per run (CPU: share of one core) | " + " | ".join(header) + " | reconciles |",
        "|---" * (len(header) + 2) + "|",
    ]
    for label, runs, meter in _phases(direct, burst_result, backlog_result):
        cells = []
        for name in names:
            if name not in meter.used:
                cells.append("-")
                continue
            used = meter.used[name]
            cells.append(f"{used * 1000 / runs:.1f} ({used / meter.wall:.0%})")
        cells.append(f"{meter.wall * 1000 / runs:.1f}")
        by_client: Counter[str] = Counter()
        for key, count in meter.requests.items():
            by_client[key.split()[0]] += count
        cells += [f"{by_client[c] / runs:.2f}" for c in CLIENTS]
        cells.append(f"{meter.reconciled / runs:.2f}" if meter.reconciles else "-")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def requests_table(runs: int, burst_result: BurstResult, backlog_result: BurstResult) -> list[str]:
    """Every request of the controller phases, per run, by client, verb and resource."""
    burst_requests, backlog_requests = burst_result.cpu.requests, backlog_result.cpu.requests
    keys = sorted(set(burst_requests) | set(backlog_requests))
    lines = [
        f"| requests per run ({runs} runs), by client | burst | backlog |",
        "|---|---|---|",
    ]
    for key in keys:
        client, rest = key.split(" ", 1)
        lines.append(
            f"| {client} `{rest}` | {burst_requests[key] / runs:.2f} | "
            f"{backlog_requests[key] / runs:.2f} |"
        )
    return lines


def report(
    args: argparse.Namespace,
    loads: list[str],
    direct: list[DirectResult],
    latencies: list[float],
    burst_result: BurstResult,
    backlog_result: BurstResult,
    errors: float,
) -> str:
    pairs = [d for d in direct if d.writes_per_run == 2]
    fulls = [d for d in direct if d.writes_per_run == 4]
    best_pairs = max(d.rate for d in pairs)
    best_full = max(d.rate for d in fulls)
    lines = [
        f"machine: {machine()}",
        f"load average (1/5/15 min) at start, middle, end: {' | '.join(loads)}",
        f"runs per phase: {args.runs}, workers (MAX_RECONCILE_RATE): {args.workers}",
        "",
        "| API server limit, admin, same objects | when | runs/s | time |",
        "|---|---|---|---|",
    ]
    for d in direct:
        lines.append(
            f"| {d.label} ({d.writes_per_run} writes/run) | {d.when} | "
            f"{d.rate:.1f} | {fmt(d.seconds)} |"
        )
    lines += [
        "",
        "| controller | runs | runs/s | time | vs pairs (best) | vs 4 writes (best) |",
        "|---|---|---|---|---|---|",
    ]
    phases = (
        (
            f"burst: one kubectl apply (kubectl alone: {fmt(burst_result.created_seconds)})",
            burst_result,
        ),
        ("backlog: config created, every run ready at once", backlog_result),
    )
    for label, r in phases:
        lines.append(
            f"| {label} | {r.runs} | {r.rate:.1f} | {fmt(r.jobs_seconds)} | "
            f"{r.rate / best_pairs:.2f} | {r.rate / best_full:.2f} |"
        )
    lines += [
        "",
        "| start-to-Job latency | runs | median | p95 | max |",
        "|---|---|---|---|---|",
        f"| one at a time (create request -> Job seen) | {len(latencies)} | "
        f"{fmt(statistics.median(latencies))} | {fmt(quantile(latencies, 0.95))} | "
        f"{fmt(max(latencies))} |",
    ]
    for label, r in (
        ("burst (run seen -> Job seen)", burst_result),
        ("backlog (config created -> Job seen)", backlog_result),
    ):
        lines.append(
            f"| {label} | {len(r.per_run)} | {fmt(statistics.median(r.per_run))} | "
            f"{fmt(quantile(r.per_run, 0.95))} | {fmt(max(r.per_run))} |"
        )
    lines += ["", *cost_table(direct, burst_result, backlog_result)]
    lines += ["", *requests_table(args.runs, burst_result, backlog_result), ""]
    lines.append(f"controller reconcile errors over the whole benchmark: {errors:.0f}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ main


async def measure(setup: Setup, args: argparse.Namespace) -> str:
    cluster = setup.cluster
    kube = await admin_client(cluster)
    loads = [load_average()]
    direct: list[DirectResult] = []
    controller = Controller(setup, args.workers)
    control_plane = {
        name: pid
        for name, pid in process_names(cluster.pids()).items()
        if name in CONTROL_PLANE_PROCESSES
    }
    control_plane["bench client"] = os.getpid()

    def meter(with_controller: bool = False) -> PhaseMeter:
        if not with_controller:
            return PhaseMeter(cluster, setup.user, control_plane)

        def reconciles() -> float:
            return controller.metrics().get("controller_runtime_reconcile_total", 0.0)

        pids = {"controller": controller.pid, **control_plane}
        return PhaseMeter(cluster, setup.user, pids, reconciles)

    try:
        for namespace in (NAMESPACE, DIRECT_NAMESPACE):
            await kube.create(CONFIGS, namespace, config_body(namespace, CONFIG, IMAGE))

        for full in (False, True):
            direct.append(
                await direct_writes(kube, "before", args.runs, args.workers, full, meter())
            )

        await asyncio.to_thread(controller.start)
        runs = Watch(kube, RUNS, NAMESPACE, object_uid)
        jobs = Watch(kube, JOBS, NAMESPACE, job_run_uid, selector=managed_selector())
        await runs.start()
        await jobs.start()
        try:
            latencies = await latency(kube, jobs, args.latency_runs)
            await asyncio.to_thread(controller.wait_quiet)
            burst_result = await burst(setup, runs, jobs, args.runs, meter(True))
            await asyncio.to_thread(controller.wait_quiet)
            await asyncio.sleep(2)  # trailing Events are written in the background
            burst_result.cpu.finish()
            loads.append(load_average())
            backlog_result = await backlog(kube, runs, jobs, args.runs, meter(True))
            await asyncio.to_thread(controller.wait_quiet)
            await asyncio.sleep(2)
            backlog_result.cpu.finish()
            errors = controller.metrics().get("controller_runtime_reconcile_errors_total", 0.0)
        finally:
            await runs.stop()
            await jobs.stop()
            controller.stop()
            if controller.proc is not None and controller.proc.returncode not in (0, None, -15):
                print(controller.tail(), file=sys.stderr)

        for full in (False, True):
            direct.append(
                await direct_writes(kube, "after", args.runs, args.workers, full, meter())
            )
        loads.append(load_average())
    finally:
        controller.stop()
        await kube.close()
    return report(args, loads, direct, latencies, burst_result, backlog_result, errors)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.controller_throughput")
    parser.add_argument("--runs", type=int, default=200, help="runs per phase")
    parser.add_argument("--workers", type=int, default=4, help="MAX_RECONCILE_RATE")
    parser.add_argument("--latency-runs", type=int, default=20)
    args = parser.parse_args(argv)
    if args.runs < 1 or args.workers < 1 or args.latency_runs < 1:
        parser.error("--runs, --workers and --latency-runs must be at least 1")

    with tempfile.TemporaryDirectory(prefix="ksc-bench-") as tmp, running_cluster() as cluster:
        setup = prepare(cluster, Path(tmp), [DIRECT_NAMESPACE])
        print(asyncio.run(measure(setup, args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
