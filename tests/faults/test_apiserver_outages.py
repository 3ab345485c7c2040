"""kube-apiserver killed and started again under a working controller: down 5 s, 60 s, 5 s.

Around each outage:

- before it: runs that must survive (stand-in runner that succeeds), runs
  that will be deleted while their runner runs (``fake-slow``, Running when
  the API server is killed), and one that will be deleted after it finished;
- right after the API server is ready again, before the controller's
  informers have come back: those runs are deleted (the garbage collector
  then removes their Jobs, ConfigMaps and pods), new runs are created, and
  one more is created and deleted a moment later.

This is the field incident: after an API server restart the runs informer
came back 10-30 s after the Jobs informer; the user had deleted Running
runs; the garbage collector removed their Jobs; the reconciler, reading the
stale run, created the Job again and again (70 creates in 33 s).

Read from the audit log: no Job, ConfigMap or CronJob created for a run
after the request that deleted it completed (within 1 s it raced the delete:
reported, not counted, see ``invariants.RACE``); every child created once; one
Job per run uid; the controller deletes no one-shot run's Job. From the API:
every surviving run converges, every deleted run stays gone. After the last
outage the test watches for 35 s past the API server's return, longer than
the incident's window. kube-apiserver is running again when the test ends,
whatever happens (``apiserver_guard``).
"""

from __future__ import annotations

import asyncio
from datetime import datetime

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from hack.cluster import LocalCluster
from hack.invariants import (
    Ledger,
    Run,
    children_once,
    count_by_verb,
    created_after_delete,
    delete_times,
    describe_informers_back,
    informers_back,
    now,
    refused_creates,
    report,
)
from tests.faults.conftest import (
    OK,
    SLOW,
    World,
    log_excerpt,
    retry,
    start_in_thread,
)
from tests.runs import Runs, inference_run

OUTAGES = (5.0, 60.0, 5.0)
WATCH_AFTER_LAST = 35.0  # past the incident's 10-30 s window


@pytest.mark.timeout(600)
async def test_apiserver_outages(world: World, apiserver_guard: LocalCluster) -> None:
    cluster = apiserver_guard
    timeline, runs = world.timeline, world.runs
    ledger = Ledger()
    proc = world.controller()
    await world.configs(ok=OK, slow=SLOW)
    await start_in_thread(proc)

    async def create(name: str, config: str, expect: str | None) -> Run:
        body = inference_run(name, config, backoffLimit=0, timeoutSeconds=600)
        return ledger.add(await retry(lambda: runs.create(body)), expect)

    async def delete(run: Run) -> None:
        await retry(lambda: _delete_once(runs, run.name))
        run.deleted, run.expect = True, None
        timeline.note(f"deleted {run.name}")

    violations: list[str] = []
    starts: list[datetime] = []
    restarts: list[datetime] = []
    try:
        for k, seconds in enumerate(OUTAGES):
            for i in range(2):
                await create(f"o{k}-keep-{i}", "ok", "Succeeded")
            doomed = [await create(f"o{k}-running-{i}", "slow", "Running") for i in range(2)]
            doomed.append(await create(f"o{k}-finished", "ok", "Succeeded"))
            for run in doomed:
                await runs.wait_phase(run.name, run.expect or "", within=60)
            timeline.note(f"outage {k}: {[r.name for r in doomed]} Running/Succeeded")

            # On this thread: a child dies with the thread that started it
            # (PR_SET_PDEATHSIG), and an executor thread ends with the test.
            cluster.stop_apiserver()
            timeline.note(f"outage {k}: kube-apiserver killed, down for {seconds:.0f} s")
            await asyncio.sleep(seconds)
            starts.append(timeline.note(f"outage {k}: kube-apiserver starting"))
            took = cluster.start_apiserver()
            restarts.append(timeline.note(f"outage {k}: kube-apiserver ready ({took:.1f} s)"))

            for run in doomed:
                await delete(run)
            for i in range(2):
                await create(f"o{k}-after-{i}", "ok", "Succeeded")
            brief = await create(f"o{k}-brief", "ok", None)
            await asyncio.sleep(1.0)
            await delete(brief)
            timeline.note(f"outage {k}: deletes and creates done")
            try:
                await world.converge(ledger, within=120, note=timeline.note)
                timeline.note(f"outage {k}: converged")
            except AssertionError as exc:
                violations.append(f"liveness after outage {k}: {exc}")
        await asyncio.sleep(max(0.0, WATCH_AFTER_LAST - (now() - restarts[-1]).total_seconds()))
        timeline.note("watched the aftermath")
        try:
            await world.converge(ledger, within=60)
        except AssertionError as exc:
            violations.append(f"liveness at the end: {exc}")
    finally:
        code = proc.stop()

    everything = world.audit.requests(stages=("ResponseStarted", "ResponseComplete"))
    requests = [r for r in everything if r.stage == "ResponseComplete"]
    user = world.user
    deleted_at = delete_times(requests, "admin", ledger)
    late, races = created_after_delete(requests, user, ledger, deleted_at)
    violations += late
    violations += children_once(requests, user, ledger)
    if code != 0:
        violations.append(f"the controller exited {code} on SIGTERM")
    context = [
        *timeline.lines,
        *(
            f"outage {k}: informers back (s after ready): "
            + describe_informers_back(informers_back(everything, user, start), ready)
            for k, (start, ready) in enumerate(zip(starts, restarts, strict=True))
        ),
        *races,
        f"controller requests: {count_by_verb(requests, user)}",
        *refused_creates(requests, user),
        *log_excerpt(proc, "watch failed", "list failed", "watch expired", "synced", limit=40),
        *log_excerpt(proc, "reconcile failed", limit=6),
    ]
    print("\n".join(context))  # shown with -s, and with a failure
    assert not violations, report("API server outages", violations, context)


async def _delete_once(runs: Runs, name: str) -> None:
    try:
        await runs.delete(name)
    except ApiException as exc:
        if exc.status != 404:  # a retried delete whose first attempt went through
            raise
