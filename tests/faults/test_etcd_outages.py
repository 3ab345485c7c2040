"""etcd killed, and stopped (SIGSTOP) for 10 s and for 60 s, under a working controller.

kube-apiserver stays up through all three: with etcd killed it answers
errors, with etcd stopped its requests hang (connections stay open) until
its own timeout. Around each fault:

- before it: runs that succeed, one that fails, runs of the slow stand-in
  runner (Running when etcd goes, deleted after it), and runs whose runner
  ends 8 s after it started, Running when etcd goes: their pods' final
  status is written during the fault (refused while etcd is killed: the node
  agent must write it again);
- during it: a run is created every second (the test's own creates wait and
  retry like any client; one that timed out but was stored is read back);
- after it: the slow runs are deleted.

Then every run must reach its end state (Succeeded, Failed, or gone), and the
audit log, non-empty, must show the invariants: each child created once, one
Job per run, nothing created for a run after its deletion completed, no
one-shot Job deleted by the controller. The controller must not crash-loop:
its process stays up, its liveness endpoint (``/healthz``, probed as the
chart's livenessProbe does: every 10 s, 3 failures in a row restart the pod)
never fails three times in a row, and it exits 0 on SIGTERM. etcd runs (and
is continued) when the test ends, whatever happens (``etcd_guard``).

:func:`test_node_agent_reports_a_status_that_failed_while_etcd_was_down` is the
same fault on the harness alone: a pod that exits while etcd is down gets
its final status once etcd is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from hack.cluster import LocalCluster
from hack.controllerproc import ControllerProcess
from hack.invariants import (
    Ledger,
    Run,
    children_once,
    count_by_verb,
    created_after_delete,
    delete_times,
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
from tests.kubehelpers import eventually
from tests.runs import inference_run

FAIL = "test.local/fake-fail:1"
BRIEF = "test.local/fake-brief:1"  # Running, then Succeeded 8 s later: while etcd is away
# (what, seconds): kill etcd and start it again after that long; or SIGSTOP it that long.
# The kill outlasts kube-apiserver's request timeout (60 s): writes made during it
# are refused (504), not just delayed, and must be made again.
FAULTS = (("kill", 75.0), ("stop", 10.0), ("stop", 60.0))
# The chart's livenessProbe: every 10 s, 2 s timeout, restart after 3 failures in a row.
LIVENESS_PERIOD, LIVENESS_TIMEOUT, LIVENESS_FAILURES = 10.0, 2.0, 3


@pytest.fixture
def etcd_guard(cluster: LocalCluster) -> Iterator[LocalCluster]:
    """The cluster, with etcd continued, or started again, after the test."""
    try:
        yield cluster
    finally:
        cluster.resume_etcd()
        with contextlib.suppress(RuntimeError):  # "running already"
            cluster.start_etcd()


async def fault(cluster: LocalCluster, what: str, seconds: float) -> None:
    """etcd killed or stopped for ``seconds``, then back (and kube-apiserver ready)."""
    if what == "kill":
        cluster.stop_etcd()
        await asyncio.sleep(seconds)
        await asyncio.to_thread(cluster.start_etcd)
    else:
        cluster.pause_etcd()
        try:
            await asyncio.sleep(seconds)
        finally:
            cluster.resume_etcd()
        await asyncio.to_thread(cluster._wait_ready, 120.0)


async def create_or_read(world: World, body: dict[str, Any]) -> dict[str, Any]:
    """Create ``body``, retrying through the fault; a create stored but not answered is read."""
    name = body["metadata"]["name"]
    deadline = time.monotonic() + 240
    while True:
        try:
            return await world.runs.create(body)
        except ApiException as exc:
            if exc.status == 409:
                found = await world.runs.get(name)
                if found is not None:
                    return found
            elif exc.status < 500 and exc.status not in (0, 429):
                raise
        except (aiohttp.ClientError, TimeoutError, OSError):
            pass  # no answer (connection lost, timed out): try again
        if time.monotonic() > deadline:
            raise AssertionError(f"could not create run {name} within 240 s")
        await asyncio.sleep(0.5)


class Liveness:
    """The controller's /healthz, probed like the chart's livenessProbe, in a thread."""

    def __init__(self, proc: ControllerProcess) -> None:
        self.proc = proc
        self.failures: list[str] = []
        self.in_a_row = 0
        self.worst = 0
        self.probes = 0

    def probe(self) -> None:
        url = f"http://127.0.0.1:{self.proc.health_port}/healthz"
        self.probes += 1
        try:
            with urllib.request.urlopen(url, timeout=LIVENESS_TIMEOUT) as answer:
                ok = 200 <= answer.status < 400
                why = str(answer.status)
        except Exception as exc:  # any failure is a failed probe, as for a kubelet
            ok, why = False, repr(exc)
        if ok:
            self.in_a_row = 0
            return
        self.in_a_row += 1
        self.worst = max(self.worst, self.in_a_row)
        self.failures.append(f"{time.strftime('%H:%M:%S')} /healthz failed: {why[:200]}")

    async def run(self) -> None:
        while True:
            await asyncio.to_thread(self.probe)
            await asyncio.sleep(LIVENESS_PERIOD)


@pytest.mark.timeout(1200)
async def test_etcd_killed_and_stopped(world: World, etcd_guard: LocalCluster) -> None:
    cluster = etcd_guard
    timeline = world.timeline
    ledger = Ledger()
    proc = world.controller()
    await world.configs(ok=OK, slow=SLOW, fail=FAIL, brief=BRIEF)
    await start_in_thread(proc)
    liveness = Liveness(proc)
    probing = asyncio.create_task(liveness.run())

    async def create(name: str, config: str, expect: str | None) -> Run:
        body = inference_run(name, config, backoffLimit=0, timeoutSeconds=900)
        return ledger.add(await create_or_read(world, body), expect)

    async def creating(k: int, stop: asyncio.Event) -> None:
        # Stopped between creates, never in one: a create that reached the API
        # server must be in the ledger (its run exists, and its Job will).
        i = 0
        while not stop.is_set():
            await create(f"f{k}-during-{i}", "ok", "Succeeded")
            i += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)

    violations: list[str] = []
    background: asyncio.Task[None] | None = None
    try:
        for k, (what, seconds) in enumerate(FAULTS):
            for i in range(2):
                await create(f"f{k}-keep-{i}", "ok", "Succeeded")
            await create(f"f{k}-fails", "fail", "Failed")
            doomed = [await create(f"f{k}-running-{i}", "slow", "Running") for i in range(2)]
            for run in doomed:
                await world.runs.wait_phase(run.name, "Running", within=90)
            stop = asyncio.Event()
            background = asyncio.create_task(creating(k, stop))
            ending = [await create(f"f{k}-ending-{i}", "brief", "Succeeded") for i in range(2)]
            for run in ending:  # runs are being created, and ending, when etcd goes
                await world.runs.wait_phase(run.name, "Running", within=90)
            timeline.note(f"fault {k}: etcd {what} for {seconds:.0f} s")
            try:
                await fault(cluster, what, seconds)
            finally:
                timeline.note(f"fault {k}: etcd back, kube-apiserver ready")
            await asyncio.sleep(3.0)
            stop.set()
            await background
            timeline.note(f"fault {k}: stopped creating")
            for run in doomed:
                await _delete(world, run.name)
                run.deleted, run.expect = True, None
                timeline.note(f"deleted {run.name}")
            try:
                await world.converge(ledger, within=240, note=timeline.note)
                timeline.note(f"fault {k}: converged")
            except AssertionError as exc:
                violations.append(f"liveness after fault {k} (etcd {what} {seconds:.0f} s): {exc}")
        if proc.proc is None or proc.proc.poll() is not None:
            violations.append(f"the controller exited during the test: {proc.output()[-3000:]}")
    finally:
        for task in (probing, background):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        code = proc.stop()

    requests = world.audit.requests()
    user = world.user
    deleted_at = delete_times(requests, "admin", ledger)
    late, races = created_after_delete(requests, user, ledger, deleted_at)
    violations += late
    violations += children_once(requests, user, ledger)
    if code != 0:
        violations.append(f"the controller exited {code} on SIGTERM")
    if liveness.worst >= LIVENESS_FAILURES:
        violations.append(
            f"/healthz failed {liveness.worst} times in a row: the kubelet would restart it"
        )
    assert liveness.probes > 0, "the liveness probe never ran"
    context = [
        *timeline.lines,
        f"runs: {len(ledger.by_name)}; liveness probes {liveness.probes}, failed "
        f"{len(liveness.failures)}, at most {liveness.worst} in a row",
        *liveness.failures[:10],
        *races,
        f"controller requests: {count_by_verb(requests, user)}",
        *refused_creates(requests, user),
        *log_excerpt(proc, "watch failed", "list failed", "watch expired", "synced", limit=30),
        *log_excerpt(proc, "reconcile failed", "Traceback", limit=10),
    ]
    print("\n".join(context))  # shown with -s, and with a failure
    assert not violations, report("etcd faults", violations, context)


async def _delete(world: World, name: str) -> None:
    async def once() -> None:
        try:
            await world.runs.delete(name)
        except ApiException as exc:
            if exc.status != 404:  # a retried delete whose first attempt went through
                raise

    await retry(once, within=60)


def _agent_log_since(log: Path, offset: int) -> str:
    with log.open("rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


@pytest.mark.timeout(600)
async def test_node_agent_reports_a_status_that_failed_while_etcd_was_down(
    api_client: client.ApiClient, namespace: str, etcd_guard: LocalCluster, tmp_path: Path
) -> None:
    """A pod that exits while etcd is down: the node agent's status update lands afterwards.

    Without a retry the pod stays Running for ever (and so would its Job and
    its run): the node agent had reported Running, and its one report of the
    end was refused.
    """
    cluster = etcd_guard
    core = client.CoreV1Api(api_client)
    flag = tmp_path / "exit-now"
    name = "waits-for-a-file"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "containers": [
                {
                    "name": "main",
                    "image": "test.local/waits:1",
                    "command": ["sh", "-c", f'while [ ! -e "{flag}" ]; do sleep 0.1; done'],
                }
            ],
        },
    }

    async def phase() -> str | None:
        got = await core.read_namespaced_pod(name, namespace)
        return str(got.status.phase) if got.status else None

    async def has_default_account() -> bool:
        with contextlib.suppress(ApiException):
            return bool(await core.read_namespaced_service_account("default", namespace))
        return False

    await eventually(has_default_account, within=60, what="the namespace's default ServiceAccount")
    await core.create_namespaced_pod(namespace, pod)

    async def running() -> bool:
        return await phase() == "Running"

    await eventually(running, within=120, what=f"pod {name} Running")
    log = cluster.log_dir / "node-agent.log"
    offset = log.stat().st_size

    cluster.stop_etcd()
    try:
        flag.touch()  # the container exits now; its status cannot be stored

        async def refused() -> str | None:
            text = _agent_log_since(log, offset)
            lines = [line for line in text.splitlines() if name in line]
            return lines[0] if lines else None

        seen = await eventually(
            refused, within=180, interval=1.0, what="the node agent's refused status update"
        )
    finally:
        await asyncio.to_thread(cluster.start_etcd)

    async def succeeded() -> str | None:
        with contextlib.suppress(ApiException, OSError):
            if await phase() == "Succeeded":
                return "Succeeded"
        return None

    await eventually(
        succeeded,
        within=180,
        interval=1.0,
        what=f"pod {name} Succeeded after etcd returned (refused: {seen!r})",
    )
