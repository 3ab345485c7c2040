"""Two controller replicas with leader election while runs are created: the leader
SIGKILLed (no release: the standby waits for the lease to expire), started again as
a standby, and later the new leader SIGTERMed (it releases the lease: the standby
takes over at its next retry).

Lease timings are shortened (4 s lease, 3 s renew deadline, 1 s retry) so
take-overs take seconds; the algorithm is the one of the defaults (15/10/2,
measured by ``python -m bench.faults``).

Read from the audit log: every child created once (no create of a name
created before, by either replica: the log tells them apart by token), one
Job per run, no one-shot run's Job deleted. From the replicas' metrics
(polled every 0.1 s): never two replicas leading at once. From the API:
every run converges; the SIGTERMed leader exits 0. The take-over times are
printed (with ``-s``), never asserted.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from kubernetes_asyncio import client

from hack.controllerproc import ControllerProcess
from hack.invariants import (
    Ledger,
    children_once,
    count_by_verb,
    refused_creates,
    report,
)
from tests.faults.conftest import (
    FAIL,
    OK,
    World,
    log_excerpt,
    start_in_thread,
)
from tests.runs import inference_run

LEASE = "kserve-inference-controller"  # the chart's Lease name (its RBAC names it)
ELECTION = {
    "LEADER_ELECT": "true",
    "LEASE_NAME": LEASE,
    "LEASE_DURATION": "4s",
    "RENEW_DEADLINE": "3s",
    "RETRY_PERIOD": "1s",
}
RUNS = 40


@pytest.mark.timeout(300)
async def test_leader_killed_then_terminated(world: World) -> None:
    rng, timeline, runs = world.rng, world.timeline, world.runs
    replicas = {
        name: world.controller(env={**ELECTION, "POD_NAME": name}, name=name)
        for name in ("replica-a", "replica-b")
    }
    await world.configs(ok=OK, fail=FAIL)
    await asyncio.gather(*(start_in_thread(p) for p in replicas.values()))
    coordination = client.CoordinationV1Api(world.api)

    async def holder() -> str:
        with contextlib.suppress(client.exceptions.ApiException):
            lease = await coordination.read_namespaced_lease(LEASE, world.namespace)
            return str(lease.spec.holder_identity or "")
        return ""

    async def leader(other_than: str = "", within: float = 60.0) -> tuple[str, float]:
        """The replica leading (its metrics say so), and when that was first seen."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            leading = [n for n, p in replicas.items() if n != other_than and await _leads(p)]
            if len(leading) == 1:
                return leading[0], time.monotonic()
            await asyncio.sleep(0.05)
        raise AssertionError(f"no single leader within {within}s; lease holder {await holder()!r}")

    both: list[str] = []

    async def watch_leaders() -> None:
        while True:
            leading = [n for n, p in replicas.items() if await _leads(p)]
            if len(leading) > 1:
                both.append(f"{timeline.note('two leaders')}: {leading}")
            await asyncio.sleep(0.1)

    ledger = Ledger()

    async def create_all() -> None:
        for i in range(RUNS):
            ok = rng.random() < 0.6
            body = inference_run(f"r{i:02d}", "ok" if ok else "fail", backoffLimit=0)
            ledger.add(await runs.create(body), "Succeeded" if ok else "Failed")
            await asyncio.sleep(rng.uniform(0.2, 0.8))
        timeline.note(f"all {RUNS} runs created")

    violations: list[str] = []
    figures: dict[str, float] = {}
    watching = asyncio.create_task(watch_leaders())
    creating = asyncio.create_task(create_all())
    try:
        first, _ = await leader()
        timeline.note(f"{first} leads (lease holder {await holder()})")
        await asyncio.sleep(rng.uniform(3, 6))

        replicas[first].kill()
        killed = time.monotonic()
        timeline.note(f"SIGKILL {first}")
        second, seen = await leader(other_than=first)
        figures["take-over after SIGKILL"] = seen - killed
        timeline.note(f"{second} leads, {seen - killed:.1f} s after the SIGKILL")
        await start_in_thread(replicas[first])
        timeline.note(f"{first} started again (standby)")
        await asyncio.sleep(rng.uniform(3, 6))

        terminated = time.monotonic()
        timeline.note(f"SIGTERM {second}")
        stopping = asyncio.create_task(asyncio.to_thread(replicas[second].stop))
        third, seen = await leader(other_than=second)
        figures["take-over after SIGTERM"] = seen - terminated
        timeline.note(f"{third} leads, {seen - terminated:.1f} s after the SIGTERM")
        code = await stopping
        figures["SIGTERM to exit"] = time.monotonic() - terminated
        if code != 0:
            violations.append(f"{second} exited {code} on SIGTERM")
        await start_in_thread(replicas[second])
        timeline.note(f"{second} started again (standby)")

        await creating
        await world.converged(ledger, timeline, violations, within=120)
    finally:
        creating.cancel()
        watching.cancel()
        await asyncio.gather(creating, watching, return_exceptions=True)
        codes = await asyncio.gather(*(asyncio.to_thread(p.stop) for p in replicas.values()))
    violations += [f"both replicas led at once: {line}" for line in both]
    violations += [f"replica exited {c} on SIGTERM" for c in codes if c not in (0, None)]

    requests = world.audit.requests()
    user = world.user
    violations += children_once(requests, user, ledger)
    creators = {r.credential[-6:] for r in requests if r.user == user and r.verb == "create"}
    context = [
        *timeline.lines,
        *(f"{k}: {v:.1f} s" for k, v in figures.items()),
        f"creates came from {len(creators)} tokens (replicas): {sorted(creators)}",
        f"controller requests: {count_by_verb(requests, user)}",
        *refused_creates(requests, user),
        *(
            line.replace("  log:", f"  {name}:", 1)
            for name, p in replicas.items()
            for line in log_excerpt(p, "lease", "leader", "error", "Traceback", limit=20)
        ),
    ]
    print("\n".join(context))  # shown with -s, and with a failure
    assert not violations, report("leader fail-over", violations, context)


async def _leads(proc: ControllerProcess) -> bool:
    if proc.proc is None or proc.proc.poll() is not None:
        return False
    text = await asyncio.to_thread(proc.metrics)
    return any(
        line.startswith("leader_election_master_status") and line.rstrip().endswith(" 1.0")
        for line in text.splitlines()
    )
