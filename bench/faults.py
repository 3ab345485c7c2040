"""Recovery times under faults, on the local control plane.

    .venv/bin/python -m bench.faults [--short 5] [--long 60] [--short-repeat 3] [--long-repeat 1]
                                     [--takeovers 3]

One control plane, one namespace, the controller under the Helm chart's RBAC
(``hack.controllerproc``), a stand-in runner that succeeds at once.

1. **API server outages**: kube-apiserver killed (``LocalCluster.stop_apiserver``,
   SIGKILL, as a crash), left down for ``--short`` seconds
   (``--short-repeat`` times) and ``--long`` seconds (``--long-repeat`` times),
   started again. From the moment it is ready (``start_apiserver`` returns):

   - **informers back**: for each of the controller's six informers, its first
     successful list (``ResponseComplete``) or re-opened watch
     (``ResponseStarted``) in the API server's audit log after the process
     started, relative to ready (negative: before the readiness probe, polled
     by ``start_apiserver``, saw it); the last of the six is
     when the controller's caches can all be trusted again. Whether each came
     back by a relist or by resuming its watch is shown, and the relists are
     also counted from the controller's ``kserve_inference_informer_lists`` metric;
   - **Job of a run created right after**: a run is created as soon as the API
     server is ready; the controller's ``create jobs`` for it in the audit log.

2. **Leader take-over**: two replicas with leader election, with the default
   timings (lease 15 s, renew deadline 10 s, retry 2 s) and with the fault
   tier's (4/3/1). The leader is SIGKILLed (no release: the standby waits for
   the lease to expire) or SIGTERMed (it releases the lease), ``--takeovers``
   times each; from the signal to the standby's
   ``leader_election_master_status`` = 1 (metrics polled every 50 ms), and to
   the Job of a run created at the moment of the signal (audit log).

Prints Markdown tables. Figures, not assertions: see bench/results/faults.md.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from controller.naming import job_name
from hack.cluster import LocalCluster, running_cluster
from hack.controllerproc import ControllerProcess, controller_for, controller_user
from hack.crds import install_crds
from hack.invariants import (
    INFORMED,
    AuditLog,
    Request,
    informers_back,
    now,
)
from hack.manifests import inference_config, inference_run
from hack.polling import wait_for

NAMESPACE = "bench-faults"
IMAGE = "test.local/fake-ok:1"
LEASE = "kserve-inference-controller"
TIMINGS = {
    "default 15/10/2 s": {"LEASE_DURATION": "15s", "RENEW_DEADLINE": "10s", "RETRY_PERIOD": "2s"},
    "fault tier 4/3/1 s": {"LEASE_DURATION": "4s", "RENEW_DEADLINE": "3s", "RETRY_PERIOD": "1s"},
}


def create_run(cluster: LocalCluster, name: str) -> dict[str, Any]:
    body = {**inference_run(name, "cfg")}
    body["metadata"] = {"name": name, "namespace": NAMESPACE}
    done = cluster.kubectl("create", "-o", "json", "-f", "-", input=json.dumps(body))
    created: dict[str, Any] = json.loads(done.stdout)
    return created


def job_created(audit: AuditLog, user: str, run: dict[str, Any]) -> Request | None:
    name = job_name(run["metadata"]["name"], run["metadata"]["uid"], False)
    return next(
        (
            r
            for r in audit.requests()
            if r.user == user and r.verb == "create" and r.name == name and r.ok
        ),
        None,
    )


def all_back(audit: AuditLog, user: str, ready: datetime) -> dict[str, Request] | None:
    """Every informer's first list or watch after ``ready``, once all six have one."""
    found = informers_back(audit.requests(("ResponseStarted", "ResponseComplete")), user, ready)
    if any(r is None for r in found.values()):
        return None
    return {k: v for k, v in found.items() if v is not None}


def leading(procs: list[ControllerProcess]) -> ControllerProcess | None:
    """The replica among ``procs`` whose metrics say it leads."""
    for p in procs:
        alive = p.proc is not None and p.proc.poll() is None
        if alive and metric(p, "leader_election_master_status") == 1:
            return p
    return None


def metric(proc: ControllerProcess, name: str, **labels: str) -> float:
    total = 0.0
    for family in text_string_to_metric_families(proc.metrics()):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def seconds(later: datetime, earlier: datetime) -> float:
    return (later - earlier).total_seconds()


# ------------------------------------------------------------------ outages


def outages(
    cluster: LocalCluster, workdir: Path, plan: list[tuple[str, float]]
) -> list[dict[str, Any]]:
    proc = controller_for(cluster, NAMESPACE, workdir, env={"LOG_LEVEL": "INFO"})
    user = controller_user(NAMESPACE)
    results = []
    proc.start()
    try:
        for i in range(5):  # something in every cache
            audit = AuditLog(cluster, NAMESPACE)
            run = create_run(cluster, f"before-{i}")
            wait_for(partial(job_created, audit, user, run), within=60, what="a Job", every=0.05)
        time.sleep(3)
        for n, (label, down) in enumerate(plan):
            audit = AuditLog(cluster, NAMESPACE)
            lists = metric(proc, "kserve_inference_informer_lists_total")
            cluster.stop_apiserver()  # killed outright, as a crash
            time.sleep(down)
            starting = now()
            ready_s = cluster.start_apiserver()
            ready = now()
            run = create_run(cluster, f"after-{n}")
            job = wait_for(
                partial(job_created, audit, user, run), within=300, what="the run's Job", every=0.2
            )
            # From the process start: an informer can be back before the probe saw /readyz.
            back = wait_for(
                partial(all_back, audit, user, starting),
                within=300,
                what="every informer back",
                every=0.5,
            )
            results.append(
                {
                    "outage": label,
                    "ready": ready_s,
                    "back": {k: (seconds(r.received, ready), r.verb) for k, r in back.items()},
                    "relists": metric(proc, "kserve_inference_informer_lists_total") - lists,
                    "job": seconds(job.received, ready),
                }
            )
            print(f"outage {label}: {results[-1]}", file=sys.stderr, flush=True)
            time.sleep(5)
    finally:
        proc.stop()
    return results


# ---------------------------------------------------------------- take-overs


def takeovers(cluster: LocalCluster, workdir: Path, repeat: int) -> list[dict[str, Any]]:
    user = controller_user(NAMESPACE)
    results = []
    for label, timing in TIMINGS.items():
        env = {"LEADER_ELECT": "true", "LEASE_NAME": LEASE, "LOG_LEVEL": "INFO", **timing}
        replicas = [
            controller_for(cluster, NAMESPACE, workdir, env={**env, "POD_NAME": n}, name=n)
            for n in ("replica-a", "replica-b")
        ]
        try:
            for proc in replicas:
                proc.start()
            wait_for(partial(leading, replicas), within=60, what="a leader", every=0.05)
            for sig in (signal.SIGKILL, signal.SIGTERM):
                for n in range(repeat):
                    leader = wait_for(
                        partial(leading, replicas), within=60, what="a leader", every=0.05
                    )
                    standby = next(p for p in replicas if p is not leader)
                    audit = AuditLog(cluster, NAMESPACE)
                    time.sleep(3)  # mid-term of a lease, as a crash would be
                    assert leader.proc is not None
                    signalled = now()
                    started = time.monotonic()
                    leader.proc.send_signal(sig)
                    run = create_run(cluster, f"{sig.name.lower()}-{label[:2]}-{n}")
                    wait_for(
                        partial(leading, [standby]), within=120, what="the take-over", every=0.05
                    )
                    took = time.monotonic() - started
                    job = wait_for(
                        partial(job_created, audit, user, run),
                        within=120,
                        what="the Job",
                        every=0.1,
                    )
                    leader.proc.wait(30)
                    results.append(
                        {
                            "timings": label,
                            "signal": sig.name,
                            "takeover": took,
                            "job": seconds(job.received, signalled),
                        }
                    )
                    print(f"take-over: {results[-1]}", file=sys.stderr, flush=True)
                    leader.start()  # back as the standby
        finally:
            for proc in replicas:
                proc.stop()
        # The next timings start from a free lease.
        cluster.kubectl("delete", "lease", LEASE, "-n", NAMESPACE, check=False)
    return results


# ------------------------------------------------------------------ tables


def outage_table(results: list[dict[str, Any]]) -> str:
    rows = [
        "| outage | start to ready (s) | informers back, first / last (s after ready) "
        "| relists | Job of a run created at ready (s after ready) |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        back = [t for t, _ in r["back"].values()]
        rows.append(
            f"| {r['outage']} | {r['ready']:.1f} | {min(back):+.1f} / "
            f"**{max(back):+.1f}** | {r['relists']:.0f} of 6 | **{r['job']:.1f}** |"
        )
    rows += [
        "",
        "| outage | " + " | ".join(INFORMED) + " |",
        "|---|" + "---|" * len(INFORMED),
    ]
    for r in results:
        cells = [f"{r['back'][k][0]:+.1f} {r['back'][k][1]}" for k in INFORMED]
        rows.append(f"| {r['outage']} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def takeover_table(results: list[dict[str, Any]]) -> str:
    rows = [
        "| lease timings | signal | take-over (s), each | median | "
        "Job of a run created at the signal (s), each |",
        "|---|---|---|---|---|",
    ]
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault((r["timings"], r["signal"]), []).append(r)
    for (timings, sig), rs in groups.items():
        each = ", ".join(f"{r['takeover']:.1f}" for r in rs)
        jobs = ", ".join(f"{r['job']:.1f}" for r in rs)
        median = statistics.median(r["takeover"] for r in rs)
        rows.append(f"| {timings} | {sig} | {each} | **{median:.1f}** | {jobs} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.faults")
    parser.add_argument("--short", type=float, default=5.0, help="short outage, seconds")
    parser.add_argument("--long", type=float, default=60.0, help="long outage, seconds")
    parser.add_argument("--short-repeat", type=int, default=3)
    parser.add_argument("--long-repeat", type=int, default=1)
    parser.add_argument("--takeovers", type=int, default=3, help="per signal and timings")
    args = parser.parse_args(argv)

    plan = [(f"{args.short:.0f} s", args.short)] * args.short_repeat
    plan += [(f"{args.long:.0f} s", args.long)] * args.long_repeat
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ksc-bench-") as tmp, running_cluster() as cluster:
        workdir = Path(tmp)
        cluster.kubectl("create", "namespace", NAMESPACE)
        install_crds(cluster)
        config = {**inference_config("cfg", IMAGE)}
        config["metadata"] = {"name": "cfg", "namespace": NAMESPACE}
        cluster.kubectl("apply", "-f", "-", input=json.dumps(config))
        load = os.getloadavg()
        outage_results = outages(cluster, workdir, plan)
        takeover_results = takeovers(cluster, workdir, args.takeovers)
    print(
        f"nproc {os.cpu_count()}, load average at start {load[0]:.2f} / {load[1]:.2f} / "
        f"{load[2]:.2f}, {time.monotonic() - started:.0f} s in all\n"
    )
    print(outage_table(outage_results))
    print()
    print(takeover_table(takeover_results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
