"""The controller SIGKILLed at random moments, again and again, while runs come and finish.

50 one-shot runs (stand-in runners that succeed or fail at once, ``backoffLimit:
0``) and 5 scheduled runs (``* * * * *``) are created over about half a
minute while the controller is killed 24 times, at a random moment of its
life each time (some while it starts and lists, most while it works) and
started again at once. Then it runs undisturbed until everything has
converged, and is killed and restarted once more with every run settled.

Read from the audit log (``hack/invariants.py``):

- every child (Job, ConfigMap, CronJob) is created once: no create of a name
  created before, whatever the code;
- one workload per run, and exactly one Job create for every one-shot run;
- the controller never deletes a one-shot run's Job;
- nothing written to a settled run (terminal phase, unchanged for 3 s) by a
  controller process started after it settled;

and from the API: every run converges to its phase (Succeeded, Failed,
Scheduled) within a liveness bound.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import datetime
from typing import Any

import pytest

from hack.controllerproc import ControllerProcess
from hack.invariants import (
    Ledger,
    children_once,
    count_by_verb,
    now,
    refused_creates,
    report,
    writes_after,
)
from tests.faults.conftest import (
    FAIL,
    OK,
    TERMINAL,
    World,
    log_excerpt,
    phases,
    start_in_thread,
    wait_spawned,
)
from tests.kubehelpers import eventually
from tests.runs import inference_run

ONE_SHOT = 50
SCHEDULED = 5
KILLS = 24
# A kill lands this long after the start began: the controller needs ~1-3 s
# to import, list and sync, so the low end kills it while it starts.
KILL_AFTER = (0.3, 4.0)
STABLE = 3.0  # a terminal run unchanged this long has settled


@pytest.mark.timeout(480)
async def test_controller_killed_at_random_moments(world: World) -> None:
    rng, timeline, runs = world.rng, world.timeline, world.runs
    proc = world.controller()
    await world.configs(ok=OK, fail=FAIL)

    plan: list[tuple[dict[str, Any], str]] = []
    kinds = ["ok"] * (ONE_SHOT // 2) + ["fail"] * (ONE_SHOT - ONE_SHOT // 2)
    rng.shuffle(kinds)
    for i, kind in enumerate(kinds):
        body = inference_run(f"once-{i:02d}", kind, backoffLimit=0, timeoutSeconds=120)
        plan.append((body, "Succeeded" if kind == "ok" else "Failed"))
    for i in range(SCHEDULED):
        body = inference_run(f"cron-{i}", "ok", schedule="* * * * *", backoffLimit=0)
        plan.insert(rng.randrange(len(plan) + 1), (body, "Scheduled"))
    pauses = [rng.uniform(0.1, 1.1) for _ in plan]
    kill_after = [rng.uniform(*KILL_AFTER) for _ in range(KILLS)]

    ledger = Ledger()

    async def create_all() -> None:
        for (body, expect), pause in zip(plan, pauses, strict=True):
            ledger.add(await runs.create(body), expect)
            await asyncio.sleep(pause)
        timeline.note(f"all {len(plan)} runs created")

    # name -> (resourceVersion, first seen); settled: name -> when found stable.
    seen: dict[str, tuple[str, datetime]] = {}
    settled: dict[str, datetime] = {}

    async def watch_settling() -> None:
        while True:
            with contextlib.suppress(Exception):
                for name, run in (await phases(world.api, world.namespace)).items():
                    record = ledger.by_name.get(name)
                    phase = (run.get("status") or {}).get("phase")
                    if record is None or record.scheduled or phase not in TERMINAL:
                        continue
                    rv, at = run["metadata"]["resourceVersion"], now()
                    if name not in seen or seen[name][0] != rv:
                        seen[name] = (rv, at)
                    elif name not in settled and (at - seen[name][1]).total_seconds() >= STABLE:
                        settled[name] = at
            await asyncio.sleep(0.5)

    starts: list[datetime] = []
    creating = asyncio.create_task(create_all())
    settling = asyncio.create_task(watch_settling())
    violations: list[str] = []
    try:
        for n, after in enumerate(kill_after, 1):
            previous = proc.proc
            starts.append(now())
            starting = start_in_thread(proc)
            await asyncio.sleep(after)
            await wait_spawned(proc, previous)
            state = "ready" if starting.done() and starting.exception() is None else "starting"
            proc.kill()
            timeline.note(f"SIGKILL #{n} {after:.1f} s after start ({state})")
            with contextlib.suppress(Exception):
                await starting
        await creating
        starts.append(now())
        await start_in_thread(proc)
        timeline.note("controller started, left alone")
        await world.converged(ledger, timeline, violations, within=120)

        # Every one-shot run settled: one more kill, then a fresh controller
        # reconciles them all at start-up and must write nothing to them.
        await _settle(settled, ledger, within=30)
        proc.kill()
        timeline.note("SIGKILL with every run settled")
        starts.append(now())
        await start_in_thread(proc)
        timeline.note("controller started again")
        await _start_up_pass_done(proc, len(plan))
    finally:
        creating.cancel()
        settling.cancel()
        await asyncio.gather(creating, settling, return_exceptions=True)
        code = proc.stop()
    assert code == 0, f"controller exited {code} on SIGTERM:\n{proc.output()[-3000:]}"

    requests = world.audit.requests()
    user = world.user
    violations += children_once(requests, user, ledger)
    for name, at in sorted(settled.items()):
        restart = next((s for s in starts if s > at), None)
        if restart is not None:
            violations += writes_after(
                requests,
                user,
                name,
                restart,
                f"{name} settled at {at:%H:%M:%S.%f}, written after a restart at "
                f"{restart:%H:%M:%S.%f}",
            )
    context = [
        *timeline.lines,
        f"controller requests: {count_by_verb(requests, user)}",
        *refused_creates(requests, user),
        *log_excerpt(proc, '"level":"error"', "deleted stale child", "reconcile failed", limit=30),
    ]
    print("\n".join(context))  # shown with -s, and with a failure
    assert not violations, report("controller kills", violations, context)


async def _start_up_pass_done(proc: ControllerProcess, runs: int, within: float = 60) -> None:
    """Wait until the fresh controller has reconciled every run and has nothing left to do.

    Its start-up list queues each of the ``runs`` keys once: its reconcile
    counter reaching ``runs`` with the run queue empty and no reconcile in
    flight (one /metrics scrape) means the start-up pass is over.
    """

    def done() -> bool:
        page = proc.metrics()
        return (
            proc.metric("controller_runtime_reconcile_total", page, controller="inferencerun")
            >= runs
            and proc.metric("workqueue_depth", page) == 0
            and proc.metric("controller_runtime_active_workers", page) == 0
        )

    await eventually(
        lambda: asyncio.to_thread(done), within=within, what="the start-up pass to finish"
    )


async def _settle(settled: dict[str, datetime], ledger: Ledger, within: float) -> None:
    """Wait until the settling watcher has seen every one-shot run settle."""
    for _ in range(int(within / 0.5)):
        if all(run.name in settled for run in ledger if not run.scheduled):
            return
        await asyncio.sleep(0.5)
