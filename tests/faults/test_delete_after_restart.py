"""Runs deleted right after a kube-apiserver restart, under two controller replicas.

The incident: after a 5 s API server outage with two replicas, runner pods
started 3-9 s after their run was deleted, and one ran to the end. The
controller left the run's Job to the garbage collector, and the garbage
collector (its caches coming back after the restart) lagged; meanwhile the
Job controller created the Job's pods.

Each round, with two replicas under leader election (short lease timings, so
the leader loses its lease during the outage, exits 1 and is started again
as a standby, as its Deployment would; the other replica takes over):

- before the outage: two Running runs (stand-in runner that runs for minutes),
  one scheduled run with its CronJob (a schedule that does not fire during
  the test, see :data:`SCHEDULE`), one run that must succeed;
- kube-apiserver killed, down 5 s, started again;
- at once: the Running and the scheduled runs are deleted; then fresh runs are
  created and each is deleted the moment its Job (or CronJob) exists, while
  the Job controller is about to create its pod.

Read from the audit log (``hack/invariants.py``): once the controller
could see a run deleted (:func:`~hack.invariants.delete_seen`: the
delete done, a leader leading again and its runs cache fresh after the
restart), the controller deleted the run's Job or CronJob within 1 s, and no
runner pod of it was bound to the node later than that
(:func:`~hack.invariants.late_executions`); nothing created for a
deleted run; every child created once; no live run's Job deleted. From the
API: the surviving runs succeed, the deleted runs and their workloads are
gone. kube-apiserver is running again when the test ends, whatever happens.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import datetime

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from controller.naming import RUN_UID_LABEL
from hack.cluster import GARBAGE_COLLECTOR, LocalCluster
from hack.controllerproc import ControllerProcess
from hack.invariants import (
    Ledger,
    Run,
    children_once,
    count_by_verb,
    created_after_delete,
    delete_seen,
    delete_times,
    late_executions,
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
from tests.faults.test_leader_failover import ELECTION
from tests.kubehelpers import eventually
from tests.runs import inference_run

OUTAGES = (5.0, 5.0)
FRESH = 3  # one-shot runs created and deleted after each restart
WATCH_AFTER = 10.0  # a late runner would start within this
# Never fires during the test. A CronJob controller whose cache lags after the
# restart can create a minute's Job for a CronJob the controller has already
# deleted (seen: 69 s later); the controller deletes that Job as soon as it sees
# it (tests/integration/test_cleanup.py), but the Job controller's pod create
# races that delete, so such a runner can start whatever the controller does.
# What this test holds the controller to is its own deletes.
SCHEDULE = "0 0 1 1 *"


@pytest.mark.timeout(480)
async def test_runs_deleted_right_after_an_apiserver_restart(
    world: World, apiserver_guard: LocalCluster
) -> None:
    cluster, timeline, runs = apiserver_guard, world.timeline, world.runs
    batch = client.BatchV1Api(world.api)
    replicas = {
        name: world.controller(env={**ELECTION, "POD_NAME": name}, name=name)
        for name in ("replica-a", "replica-b")
    }
    await world.configs(ok=OK, slow=SLOW)
    await asyncio.gather(*(start_in_thread(p) for p in replicas.values()))
    ledger = Ledger()

    async def create(name: str, config: str, expect: str | None, **spec: object) -> Run:
        body = inference_run(name, config, backoffLimit=0, timeoutSeconds=600, **spec)
        return ledger.add(await retry(lambda: runs.create(body)), expect)

    async def workload_exists(run: Run) -> bool:
        read = batch.read_namespaced_cron_job if run.scheduled else batch.read_namespaced_job
        try:
            await read(run.child, world.namespace)
        except ApiException as exc:
            if exc.status == 404 or exc.status >= 500:
                return False
            raise
        except OSError:
            return False
        return True

    async def wait_workload(run: Run, within: float = 60.0) -> None:
        async def exists() -> bool:
            return await workload_exists(run)

        await eventually(exists, within=within, interval=0.05, what=f"{run.child} created")

    async def delete(run: Run) -> None:
        await retry(lambda: _delete_once(world, run.name))
        run.deleted, run.expect = True, None
        timeline.note(f"deleted {run.name}")

    stopping = asyncio.Event()
    restarted: list[str] = []

    async def supervise() -> None:
        """Start a replica that exited (lost its lease) again, as its Deployment would."""
        while not stopping.is_set():
            for name, proc in replicas.items():
                if proc.proc is not None and proc.proc.poll() is not None:
                    timeline.note(f"{name} exited {proc.proc.returncode}: starting it again")
                    restarted.append(name)
                    try:
                        await start_in_thread(proc)
                    except Exception as exc:  # the API server may be down: try again
                        timeline.note(f"{name} did not start: {exc}")
            await asyncio.sleep(0.2)

    supervisor = asyncio.create_task(supervise())
    violations: list[str] = []
    starts: list[datetime] = []
    try:
        for k, seconds in enumerate(OUTAGES):
            await create(f"o{k}-keep", "ok", "Succeeded")
            doomed = [await create(f"o{k}-running-{i}", "slow", "Running") for i in range(2)]
            for run in doomed:
                await runs.wait_phase(run.name, "Running", within=90)
            cron = await create(f"o{k}-cron", "slow", None, schedule=SCHEDULE)
            await wait_workload(cron)
            doomed.append(cron)
            timeline.note(f"outage {k}: {[r.name for r in doomed]} Running/Scheduled")

            cluster.stop_apiserver()
            timeline.note(f"outage {k}: kube-apiserver killed, down for {seconds:.0f} s")
            await asyncio.sleep(seconds)
            starts.append(timeline.note(f"outage {k}: kube-apiserver starting"))
            took = cluster.start_apiserver()
            timeline.note(f"outage {k}: kube-apiserver ready ({took:.1f} s)")

            for run in doomed:
                await delete(run)
            for i in range(FRESH + 1):
                scheduled = i == FRESH
                fresh = await create(
                    f"o{k}-fresh-{i}",
                    "slow",
                    None,
                    **({"schedule": SCHEDULE} if scheduled else {}),
                )
                await wait_workload(fresh)
                await delete(fresh)
            timeline.note(f"outage {k}: deletes done")
            try:
                await world.converge(ledger, within=120, note=timeline.note)
                await eventually(
                    lambda: _none_left(world, batch, ledger),
                    within=60,
                    what="the deleted runs' Jobs and CronJobs gone",
                )
                timeline.note(f"outage {k}: converged, the deleted runs' workloads gone")
            except AssertionError as exc:
                violations.append(f"liveness after outage {k}: {exc}")
        await asyncio.sleep(WATCH_AFTER)
        timeline.note("watched the aftermath")
    finally:
        stopping.set()
        supervisor.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await supervisor
        codes = await asyncio.gather(*(asyncio.to_thread(p.stop) for p in replicas.values()))
    violations += [f"replica exited {c} on SIGTERM" for c in codes if c not in (0, None)]

    everything = world.audit.requests(stages=("ResponseStarted", "ResponseComplete"))
    requests = [r for r in everything if r.stage == "ResponseComplete"]
    user = world.user
    deleted_at = delete_times(requests, "admin", ledger)
    deleted = [run.name for run in ledger if run.deleted]
    assert sorted(deleted_at) == sorted(deleted), "the audit log lacks some of the test's deletes"
    seen = delete_seen(everything, user, deleted_at, starts=starts)
    violations += late_executions(requests, user, ledger, seen)
    late, races = created_after_delete(requests, user, ledger, deleted_at)
    violations += late
    violations += children_once(requests, user, ledger)
    context = [
        *timeline.lines,
        *(
            f"{name}: deleted {deleted_at[name]:%H:%M:%S.%f}, seen {seen[name]:%H:%M:%S.%f}"
            for name in sorted(seen)
        ),
        *races,
        f"replicas started again: {restarted}",
        f"garbage collector deletes: {count_by_verb(requests, GARBAGE_COLLECTOR)}",
        f"controller requests: {count_by_verb(requests, user)}",
        *(
            line.replace("  log:", f"  {name}:", 1)
            for name, p in replicas.items()
            for line in _log(p)
        ),
    ]
    print("\n".join(context))  # shown with -s, and with a failure
    assert not violations, report("runs deleted after an API server restart", violations, context)


def _log(proc: ControllerProcess) -> list[str]:
    return log_excerpt(proc, "deleted a deleted run", "sweep", "leader", "lease", limit=30)


async def _delete_once(world: World, name: str) -> None:
    try:
        await world.runs.delete(name)
    except ApiException as exc:
        if exc.status != 404:  # a retried delete whose first attempt went through
            raise


async def _none_left(world: World, batch: client.BatchV1Api, ledger: Ledger) -> bool:
    """Whether no Job or CronJob of a deleted run is left (a CronJob's Jobs included)."""
    jobs = await retry(lambda: batch.list_namespaced_job(world.namespace))
    crons = await retry(lambda: batch.list_namespaced_cron_job(world.namespace))
    gone = {run.uid for run in ledger if run.deleted}
    labels = [o.metadata.labels or {} for o in jobs.items] + [
        o.metadata.labels or {} for o in crons.items
    ]
    return not any(label.get(RUN_UID_LABEL) in gone for label in labels)
