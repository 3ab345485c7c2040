"""Wiring shared by the fault tier (``tests/faults``, marker ``faults``).

Every fault test runs on its session's control plane (under pytest-xdist, its
worker's: ``make test`` runs this tier on workers of its own, apart from the
rest of the suite, so an outage reaches no other worker's tests), one test at
a time on it, in its own namespace, and reads its invariants from the audit
log (``hack/invariants.py``). What this file adds:

- ``audit``: the audit log from the start of the test, in its namespace;
- ``world``: what every fault test starts from (API client, namespace,
  cluster, audit log, seed, its random source, timeline and runs), so no test
  repeats that set-up;
- ``apiserver_guard``: whatever a test does to kube-apiserver, it is running
  again when the test ends (the next test of the session uses the cluster);
- ``seed``: the random seed of the test (``KSC_FAULT_SEED`` replays one); it
  is printed in every failure message;
- :class:`Timeline`: what the test did and when, for failure messages;
- :func:`phases` / :func:`converge`: the state of every run in one list call;
- :func:`retry`: API calls from the test right after an API server restart;
- :func:`start_in_thread`: ``ControllerProcess.start`` (which blocks until
  the controller is ready) without blocking the event loop, so the test can
  kill the controller while it starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from hack.cluster import LocalCluster
from hack.controllerproc import ControllerProcess, controller_for, controller_user
from hack.invariants import AuditLog, Ledger, now
from tests.runs import GROUP, VERSION, Runs, inference_config

T = TypeVar("T")

# The order xdist hands the fault tests out in, with each one's length on the
# idle 2-core machine (`make test PYTEST_ARGS=--durations=40`, 2026-11-27).
# xdist's load scheduling starts each worker on two consecutive tests
# (positions 0-1 to the first worker, 2-3 to the second...), then gives a
# worker one more as it runs low. So the four longest come first, each paired
# with one of the four shortest, and the middle ones follow, longest first, to
# whichever worker frees up: the four workers end within ~15 s of each other
# (by the lengths below: 261, 254, 258 and 261 s). Longest first throughout
# paired the etcd test with the next longest (222 + 50 s on one worker, 300 s
# for the run). A test not named here goes after these, in file order;
# tests/unit checks that each name here is a test. A parametrized test is named
# whole, or by case (``name[id]``).
ORDER = (
    "test_etcd_outages.py::test_etcd_killed_and_stopped",  # 222 s
    "test_leader_failover.py::test_leader_killed_then_terminated",  # 39 s
    "test_apiserver_outages.py::test_apiserver_outages",  # 204 s
    "test_fuzz.py::test_fuzzed_specs_are_refused_or_given_a_reason",  # 30-50 s
    "test_frozen_connections.py::test_frozen_connections_are_noticed[frozen]",  # 100 s
    "test_namespace_deleted.py::test_namespace_of_active_runs_deleted",  # 48 s
    "test_frozen_connections.py::test_frozen_connections_are_noticed[working]",  # 81 s
    # 50 s
    "test_partition_edits.py::test_runs_created_during_a_partition_get_the_edited_config",
    "test_watch_delay.py::test_watch_streams_delayed",  # 72 s
    "test_controller_kills.py::test_controller_killed_at_random_moments",  # 61 s
    "test_delete_after_restart.py::test_runs_deleted_right_after_an_apiserver_restart",  # 58 s
    # 49 s
    "test_etcd_outages.py::test_node_agent_reports_a_status_that_failed_while_etcd_was_down",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The fault tests in :data:`ORDER` (a stable sort: the rest keep theirs)."""
    rank = {name: i for i, name in enumerate(ORDER)}

    def key(item: pytest.Item) -> int:
        # originalname: a parametrized test's name without its [id].
        whole = f"{item.path.name}::{getattr(item, 'originalname', item.name)}"
        return rank.get(f"{item.path.name}::{item.name}", rank.get(whole, len(rank)))

    items.sort(key=key)


OK, FAIL, SLOW = "test.local/fake-ok:1", "test.local/fake-fail:1", "test.local/fake-slow:1"
TERMINAL = ("Succeeded", "Failed")


@pytest.fixture
def audit(cluster: LocalCluster, namespace: str) -> AuditLog:
    return AuditLog(cluster, namespace)


@pytest.fixture
def apiserver_guard(cluster: LocalCluster) -> Iterator[LocalCluster]:
    """The cluster, with kube-apiserver started again after the test if the test left it down."""
    try:
        yield cluster
    finally:
        with contextlib.suppress(RuntimeError):  # "running already": nothing to restore
            cluster.start_apiserver()


@pytest.fixture
def seed() -> int:
    return int(os.environ.get("KSC_FAULT_SEED") or random.SystemRandom().randrange(2**32))


@dataclass
class World:
    """One fault test's namespace on the shared cluster, and what the test draws from."""

    api: client.ApiClient
    namespace: str
    cluster: LocalCluster
    tmp_path: Path
    audit: AuditLog
    seed: int
    # Made from the seed (the timeline prints it): KSC_FAULT_SEED replays the same choices.
    rng: random.Random = field(init=False)
    timeline: Timeline = field(init=False)
    runs: Runs = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.timeline = Timeline(self.seed)
        self.runs = Runs(self.api, self.namespace)

    @property
    def user(self) -> str:
        """The controller's user, as the audit log names it."""
        return controller_user(self.namespace)

    def controller(
        self, *, env: dict[str, str] | None = None, name: str = "controller"
    ) -> ControllerProcess:
        """A controller of this namespace (not started); installs the CRDs and the RBAC."""
        return controller_for(self.cluster, self.namespace, self.tmp_path, env=env, name=name)

    async def configs(self, **images: str) -> None:
        """One InferenceConfig per ``name=image``."""
        for name, image in images.items():
            await self.runs.create(inference_config(name, image))

    async def converge(
        self, ledger: Ledger, *, within: float = 120.0, note: Callable[[str], object] | None = None
    ) -> dict[str, dict[str, Any]]:
        return await converge(self.api, self.namespace, ledger, within=within, note=note)

    async def converged(
        self,
        ledger: Ledger,
        timeline: Timeline,
        violations: list[str],
        *,
        within: float = 120.0,
        step_by_step: bool = False,
    ) -> None:
        """:meth:`converge`, noted on ``timeline``; a run that never settles is a violation.

        ``step_by_step`` also notes what each run reached on the way.
        """
        try:
            await self.converge(ledger, within=within, note=timeline.note if step_by_step else None)
            timeline.note("every run converged")
        except AssertionError as exc:
            violations.append(f"liveness: {exc}")


@pytest.fixture
def world(
    api_client: client.ApiClient,
    namespace: str,
    cluster: LocalCluster,
    tmp_path: Path,
    audit: AuditLog,
    seed: int,
) -> World:
    return World(api_client, namespace, cluster, tmp_path, audit, seed)


class Timeline:
    """What the test did, with wall-clock times comparable to the audit log's."""

    def __init__(self, seed: int) -> None:
        self.started = time.monotonic()
        self.lines = [f"seed {seed} (KSC_FAULT_SEED={seed} replays the same choices)"]

    def note(self, text: str) -> datetime:
        at = now()
        self.lines.append(f"{at:%H:%M:%S.%f} +{time.monotonic() - self.started:6.1f}s {text}")
        return at


def start_in_thread(proc: ControllerProcess) -> asyncio.Task[None]:
    """``proc.start()`` in a thread; the task fails if the process dies before it is ready.

    The process dies with the executor thread that started it
    (``PR_SET_PDEATHSIG``), at the latest when the test's event loop closes.
    Never start a process that must outlive the test this way (kube-apiserver).
    """
    return asyncio.create_task(asyncio.to_thread(proc.start, 60.0))


async def wait_spawned(proc: ControllerProcess, previous: object, within: float = 10.0) -> None:
    """Wait until :func:`start_in_thread` has replaced ``previous`` with a new process."""
    deadline = time.monotonic() + within
    while proc.proc is previous or proc.proc is None:
        if time.monotonic() > deadline:
            raise AssertionError("the controller process did not start")
        await asyncio.sleep(0.01)


def through(kubeconfig: Path, server: str) -> Path:
    """Rewrite ``kubeconfig`` in place to talk to ``server`` (a proxy); returns it."""
    config = yaml.safe_load(kubeconfig.read_text())
    for entry in config["clusters"]:
        entry["cluster"]["server"] = server
    kubeconfig.write_text(yaml.safe_dump(config))
    return kubeconfig


_TRANSIENT = (aiohttp.ClientError, OSError, asyncio.TimeoutError)


async def retry(call: Callable[[], Awaitable[T]], *, within: float = 30.0) -> T:
    """``call()`` until it is not refused for a transient reason (server just restarted)."""
    deadline = time.monotonic() + within
    while True:
        try:
            return await call()
        except ApiException as exc:
            transient = exc.status >= 500 or exc.status in (0, 429)
            if not transient or time.monotonic() > deadline:
                raise
        except _TRANSIENT:
            if time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.2)


async def phases(api: client.ApiClient, namespace: str) -> dict[str, dict[str, Any]]:
    """name -> the run (one list call): ``status(run)['phase']`` and friends."""
    listed = await client.CustomObjectsApi(api).list_namespaced_custom_object(
        GROUP, VERSION, namespace, "inferenceruns"
    )
    return {item["metadata"]["name"]: item for item in listed["items"]}


def _phase(run: dict[str, Any]) -> str | None:
    return (run.get("status") or {}).get("phase")


async def converge(
    api: client.ApiClient,
    namespace: str,
    ledger: Ledger,
    *,
    within: float = 120.0,
    note: Callable[[str], object] | None = None,
) -> dict[str, dict[str, Any]]:
    """Wait until every run is in the phase it must end in and every deleted run is gone.

    A liveness bound, not a timing assertion: the message lists what had not
    converged, with each run's status reason and message. ``note`` (e.g.
    ``Timeline.note``) is told every 10 s what is still awaited.
    """
    deadline = time.monotonic() + within
    next_note = time.monotonic() + 10
    while True:
        current = await retry(lambda: phases(api, namespace))
        behind = []
        for run in ledger:
            found = current.get(run.name)
            if run.deleted:
                if found is not None:
                    behind.append(f"{run.name}: deleted but still there")
            elif run.expect is not None and (found is None or _phase(found) != run.expect):
                st = (found or {}).get("status") or {}
                behind.append(
                    f"{run.name}: {_phase(found) if found else 'gone'} (want {run.expect}; "
                    f"reason {st.get('reason')!r}, message {st.get('message')!r})"
                )
        if not behind:
            return current
        if note is not None and time.monotonic() > next_note:
            next_note += 10
            note(f"awaiting {len(behind)}: " + "; ".join(behind[:4]))
        if time.monotonic() > deadline:
            raise AssertionError(
                f"{len(behind)} run(s) did not converge within {within:.0f}s:\n  "
                + "\n  ".join(behind)
            )
        await asyncio.sleep(0.5)


def log_excerpt(proc: ControllerProcess, *needles: str, limit: int = 60) -> list[str]:
    """Controller log lines holding any of ``needles`` (the last ``limit`` of them)."""
    lines = [
        line
        for line in proc.output().splitlines()
        if any(n in line for n in needles) and line.strip()
    ]
    return [f"  log: {line[:300]}" for line in lines[-limit:]]
