"""The controller's watches arrive 5 s late while its requests stay fast.

The controller talks to the API server through a proxy
(``tests/integration/tcpproxy.py`` in watch-delay mode) that holds every byte
of a watch stream back by ``DELAY`` seconds and passes lists, gets and writes
at once: its caches lag the cluster while its writes land. Then the world
changes under it:

- the Job of a run that has finished is deleted out of band: never created
  again (a finished run is never re-run);
- the Job of a Running run is deleted out of band: created again at most
  once, and only after the delete;
- a Running run is deleted: nothing created for it afterwards;
- a run is created and deleted a second later, before the controller's
  watch has even shown it: nothing created for it after the delete;
- a Running one-shot run is edited: no second Job, none replaced or deleted;
- a scheduled run is edited: its ConfigMap follows, its CronJob is created once;
- a run is edited a moment after it was created, before the controller has
  seen either: the contract of a Job created after the edit holds the edit.

Read from the audit log: the same invariants as the other fault tests
(children created once, one per run, nothing created after a delete, no Job
deleted by the controller) plus the last point above. From the API: every
run converges.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlparse

import pytest
from kubernetes_asyncio import client

from hack.invariants import (
    Ledger,
    Request,
    Run,
    children_once,
    count_by_verb,
    created_after_delete,
    delete_times,
    history,
    refused_creates,
    report,
)
from tests.faults.conftest import (
    FAIL,
    OK,
    SLOW,
    World,
    log_excerpt,
    start_in_thread,
    through,
)
from tests.integration.tcpproxy import TcpProxy, Tls
from tests.kubehelpers import eventually
from tests.runs import inference_run

DELAY = 5.0


@pytest.mark.timeout(420)
async def test_watch_streams_delayed(world: World) -> None:
    cluster, namespace = world.cluster, world.namespace
    assert cluster.pki is not None
    api = urlparse(cluster.server)
    tls = Tls.impersonating(cluster.pki.apiserver_cert, cluster.pki.apiserver_key, cluster.ca_path)
    proxy = TcpProxy(api.hostname or "127.0.0.1", api.port or 443, tls=tls, watch_delay=DELAY)
    await proxy.start()
    timeline, runs = world.timeline, world.runs
    batch = client.BatchV1Api(world.api)
    ledger = Ledger()
    proc = world.controller()
    await world.configs(ok=OK, fail=FAIL, slow=SLOW)

    async def create(name: str, config: str, expect: str | None, **spec: object) -> Run:
        return ledger.add(await runs.create(inference_run(name, config, **spec)), expect)

    through(proc.kubeconfig, f"https://127.0.0.1:{proxy.port}")
    violations: list[str] = []
    try:
        await start_in_thread(proc)
        timeline.note(f"controller ready behind the proxy (watches {DELAY:.0f} s late)")

        # Plain work under lag first.
        for i in range(6):
            await create(f"plain-ok-{i}", "ok", "Succeeded")
        for i in range(3):
            await create(f"plain-fail-{i}", "fail", "Failed", backoffLimit=0)
        finished = await create("job-gone-finished", "ok", "Succeeded")
        running_job = await create("job-gone-running", "slow", "Failed", timeoutSeconds=25)
        doomed = await create("deleted-running", "slow", None)
        edited = await create("edited-running", "slow", "Failed", timeoutSeconds=20)
        cron = await create("edited-cron", "ok", "Scheduled", schedule="0 0 1 1 *")
        await world.converge(_only(ledger, "plain-"), within=120)
        await runs.wait_phase(finished.name, "Succeeded", within=60)
        for run in (running_job, doomed, edited):
            await runs.wait_phase(run.name, "Running", within=60)
        await runs.wait_phase(cron.name, "Scheduled", within=60)
        timeline.note("plain runs converged; slow runs Running; scheduled run Scheduled")

        # The world changes, all at once.
        await batch.delete_namespaced_job(
            finished.child, namespace, propagation_policy="Background"
        )
        timeline.note(f"deleted Job {finished.child} of finished run {finished.name}")
        await batch.delete_namespaced_job(
            running_job.child, namespace, propagation_policy="Background"
        )
        timeline.note(f"deleted Job {running_job.child} of Running run {running_job.name}")
        await runs.delete(doomed.name)
        doomed.deleted = True
        timeline.note(f"deleted Running run {doomed.name}")
        await runs.patch(edited.name, {"spec": {"parameters": {"table": "edited"}}})
        timeline.note(f"edited Running run {edited.name}")
        await runs.patch(cron.name, {"spec": {"parameters": {"table": "edited"}}})
        timeline.note(f"edited scheduled run {cron.name}")
        brief = await create("deleted-unseen", "ok", None)
        late_edit = await create("edited-unseen", "ok", "Succeeded")
        await asyncio.sleep(0.5)
        await runs.patch(late_edit.name, {"spec": {"parameters": {"table": "edited"}}})
        timeline.note(f"created {late_edit.name}, edited it 0.5 s later")
        await asyncio.sleep(0.5)
        await runs.delete(brief.name)
        brief.deleted = True
        timeline.note(f"created {brief.name}, deleted it 1 s later")

        try:
            await world.converge(ledger, within=120)
            timeline.note("every run converged")
            await _eventually_contract(world.api, namespace, cron.child, "edited")
            timeline.note("the scheduled run's ConfigMap holds the edit")
        except AssertionError as exc:
            violations.append(f"liveness: {exc}")
        await asyncio.sleep(2 * DELAY + 2)  # late effects of late events
        timeline.note("watched the aftermath")
    finally:
        code = await asyncio.to_thread(proc.stop)  # the proxy lives on this loop
        await proxy.stop()

    requests = world.audit.requests()
    user = world.user
    deleted_at = delete_times(requests, "admin", ledger)
    late, races = created_after_delete(requests, user, ledger, deleted_at)
    violations += late
    violations += children_once(requests, user, ledger, recreatable=[running_job])
    contract = await _contract(world.api, namespace, late_edit)
    violations += _stale_contract(requests, user, late_edit, contract)
    if code != 0:
        violations.append(f"the controller exited {code} on SIGTERM")
    context = [
        *timeline.lines,
        f"proxy: {proxy.watches} watches delayed, {proxy.requests} requests passed at once",
        *races,
        f"controller requests: {count_by_verb(requests, user)}",
        *refused_creates(requests, user),
        *log_excerpt(proc, '"level":"error"', "deleted stale child", "reconcile failed", limit=30),
    ]
    print("\n".join(context))  # shown with -s, and with a failure
    assert not violations, report("delayed watches", violations, context)


def _only(ledger: Ledger, prefix: str) -> Ledger:
    return Ledger({n: r for n, r in ledger.by_name.items() if n.startswith(prefix)})


async def _contract(api: client.ApiClient, namespace: str, run: Run) -> dict[str, Any] | None:
    try:
        cm = await client.CoreV1Api(api).read_namespaced_config_map(run.child, namespace)
    except client.exceptions.ApiException:
        return None
    parsed: dict[str, Any] = json.loads(cm.data["contract.json"])
    return parsed


async def _eventually_contract(
    api: client.ApiClient, namespace: str, name: str, table: str
) -> None:
    core = client.CoreV1Api(api)

    async def holds() -> bool:
        cm = await core.read_namespaced_config_map(name, namespace)
        return bool(json.loads(cm.data["contract.json"])["parameters"].get("table") == table)

    await eventually(holds, within=60, what=f"ConfigMap {name} to hold the edit")


def _stale_contract(
    requests: list[Request], user: str, run: Run, contract: dict[str, Any] | None
) -> list[str]:
    """A child created after the run's edit completed carries the edit (else: a stale spec)."""
    edits = [
        r.completed
        for r in requests
        if r.user == "admin" and r.verb == "patch" and r.name == run.name and r.ok
    ]
    creates = [
        r
        for r in requests
        if r.user == user and r.verb == "create" and r.name == run.child and r.ok
    ]
    if not edits or not creates:
        return []
    after = [r for r in creates if r.received > edits[0]]
    table = ((contract or {}).get("parameters") or {}).get("table")
    if not after or table == "edited":
        return []
    return [
        f"run {run.name} edited at {edits[0]:%H:%M:%S.%f}, its children created afterwards "
        f"from the spec before the edit (contract table {table!r}):",
        *history(requests, run.child),
        *history(requests, run.name),
    ]
