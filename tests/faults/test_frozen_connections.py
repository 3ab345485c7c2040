"""The controller's link to the API server freezes: connections stay open, nothing flows.

The controller talks to the API server through a proxy
(``tests/integration/tcpproxy.py``) that, once a run has gone through,
freezes every open connection: no byte is forwarded either way, and none is
closed or reset, as on a link whose middlebox dropped the flow silently. A
read timeout only notices this after many minutes; the informers' idle bound
(``WATCH_IDLE_TIMEOUT``, 75 s: the API server sends a bookmark about every
minute) must notice it within 90 s of the freeze:

- **new connections work**: runs created right after the freeze are
  reconciled (they get a status) within 90 s of it, and the stall was
  counted (``kserve_inference_informer_watch_errors_total{reason="idle"}``) and logged with
  the resource;
- **new connections freeze too** (accepted, never forwarded): the stall is
  counted within 90 s of the freeze all the same; once the proxy lets
  everything through again, the runs created during the freeze converge.

From the audit log: every run got its children once (no duplicate create
from a request retried on a new connection). From the API: every run
converges.
"""

from __future__ import annotations

import asyncio
import time
from urllib.parse import urlparse

import pytest

from hack.invariants import Ledger, Run, children_once, count_by_verb, report
from tests.faults.conftest import OK, World, log_excerpt, phases, start_in_thread, through
from tests.integration.tcpproxy import TcpProxy
from tests.kubehelpers import eventually
from tests.runs import inference_run

NOTICED_WITHIN = 90.0  # seconds after the freeze
RUNS_DURING = 3
STALLED = "watch stalled"


@pytest.mark.timeout(480)
@pytest.mark.parametrize("new_connections", ["working", "frozen"])
async def test_frozen_connections_are_noticed(world: World, new_connections: str) -> None:
    api = urlparse(world.cluster.server)
    proxy = TcpProxy(api.hostname or "127.0.0.1", api.port or 443)
    await proxy.start()
    timeline, runs = world.timeline, world.runs
    ledger = Ledger()
    proc = world.controller()
    await world.configs(ok=OK)

    async def create(name: str) -> Run:
        return ledger.add(await runs.create(inference_run(name, "ok")), "Succeeded")

    async def stalls() -> float:
        # /metrics is served on loopback directly, not through the proxy;
        # scraped off the event loop, which the proxy runs on.
        return await asyncio.to_thread(
            proc.metric, "kserve_inference_informer_watch_errors_total", reason="idle"
        )

    through(proc.kubeconfig, f"https://127.0.0.1:{proxy.port}")
    violations: list[str] = []
    try:
        await start_in_thread(proc)
        timeline.note("controller ready behind the proxy")
        await create("before")
        await world.converge(ledger, within=120, note=timeline.note)
        timeline.note("a run went through the proxy")
        stalled_before = await stalls()

        # Right after the controller's own traffic: its watches have just
        # delivered, so the freeze comes near the start of their idle bound.
        await asyncio.sleep(world.rng.uniform(0, 5))
        proxy.freeze(new_connections=new_connections == "frozen")
        frozen_at = time.monotonic()
        timeline.note(f"proxy frozen (new connections {new_connections})")
        during = [await create(f"during-{i}") for i in range(RUNS_DURING)]
        timeline.note(f"created {[r.name for r in during]}")

        def left() -> float:
            return max(1.0, NOTICED_WITHIN - (time.monotonic() - frozen_at))

        try:

            async def noticed() -> bool:
                return await stalls() > stalled_before

            await eventually(noticed, within=left(), interval=1.0, what="a stalled watch counted")
            timeline.note(f"stalls counted: {await stalls() - stalled_before:.0f}")
        except AssertionError as exc:
            violations.append(f"not noticed within {NOTICED_WITHIN:.0f} s of the freeze: {exc}")

        if new_connections == "working":

            async def reconciled() -> bool:
                current = await phases(world.api, world.namespace)
                return all((current.get(r.name) or {}).get("status") for r in during)

            try:
                await eventually(reconciled, within=left(), interval=1.0, what="runs reconciled")
                timeline.note("the runs created after the freeze were reconciled")
            except AssertionError as exc:
                violations.append(
                    f"runs created after the freeze not reconciled within "
                    f"{NOTICED_WITHIN:.0f} s of it: {exc}"
                )
        else:

            async def reconnected() -> bool:
                return proxy.held_connections > 0

            # Let the reconnections meet the frozen proxy for a while.
            try:
                await eventually(
                    reconnected,
                    within=60,
                    interval=1.0,
                    what="a new connection held by the frozen proxy",
                )
            except AssertionError as exc:
                violations.append(f"the controller never reconnected while frozen: {exc}")
            await asyncio.sleep(10)
            timeline.note(f"{proxy.held_connections} new connection(s) held, unfreezing")
            proxy.unfreeze()

        await world.converged(ledger, timeline, violations, within=120, step_by_step=True)
    finally:
        proxy.unfreeze()  # what a frozen shutdown does is not this test's question
        code = await asyncio.to_thread(proc.stop)  # the proxy lives on this loop
        await proxy.stop()

    if proxy.held_bytes == 0:
        violations.append("the freeze held no byte: it tested nothing")
    stalled_logs = [line for line in proc.output().splitlines() if STALLED in line]
    if not any("inferenceruns.ai.krateo.io" in line for line in stalled_logs):
        violations.append("no 'watch stalled' warning names the runs' resource")
    requests = world.audit.requests()
    user = world.user
    created = {r.name for r in requests if r.user == user and r.verb == "create"}
    missing = [r.name for r in ledger if r.child not in created]
    if missing:
        violations.append(f"the audit log holds no create of the children of {missing}")
    violations += children_once(requests, user, ledger)
    if code != 0:
        violations.append(f"the controller exited {code} on SIGTERM")
    context = [
        *timeline.lines,
        f"proxy: {proxy.held_bytes} bytes and {proxy.held_connections} connections held",
        f"controller requests: {count_by_verb(requests, user)}",
        *log_excerpt(proc, STALLED, "watch failed", "list failed", "watch expired", limit=40),
        *log_excerpt(proc, "reconcile failed", limit=6),
    ]
    print("\n".join(context))  # shown with -s, and with a failure
    assert not violations, report(
        f"frozen connections (new {new_connections})", violations, context
    )
