"""Test wiring shared by every test.

- Markers come from the directory: ``tests/unit`` -> ``unit`` (pure logic, no
  binaries), ``tests/integration`` and ``tests/runner`` -> ``integration``
  (real API server and/or real loopback servers), ``tests/e2e`` -> ``e2e``,
  ``tests/faults`` -> ``faults`` (kills, outages, delayed watches, fuzzing).
- One local control plane per test run (``cluster``, started lazily by the
  first test that needs it); each test gets a fresh namespace. Under
  pytest-xdist (``-n N``) each worker is a session of its own, so each has its
  own control plane.
- Every process the suite starts inherits ``KSC_TEST_RUN``; when the session
  ends the suite looks for processes still carrying it, kills them and fails.
  Each xdist worker has its own value (the run's, ``-gwN``), so a worker only
  ever looks for (and kills) what it started; it hands what it found to the
  controlling process, which reports it and fails the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client, config

from hack import chart
from hack.cluster import LocalCluster, ensure_binaries, leftover_processes
from hack.controllerproc import (
    FORK_SERVER,
    START_ENV,
    ControllerProcess,
    controller_for,
    running,
)
from hack.crds import install_crds
from kubeclient.client import KubeClient
from runner.redact import REDACTOR
from tests.kubehelpers import delete_admission_policy
from tests.runs import Runs
from tests.servers import (
    model_server,
    openai_server,
    openai_server_process,
    postgres,
    postgres_pki,
    postgres_server,
    s3_server,
)

# Session fixtures shared by runner and end-to-end tests.
__all__ = [
    "model_server",
    "openai_server",
    "openai_server_process",
    "postgres",
    "postgres_pki",
    "postgres_server",
    "s3_server",
]

MARKER_ENV = "KSC_TEST_RUN"

_DIR_MARKERS = {
    "unit": "unit",
    "integration": "integration",
    "runner": "integration",
    "e2e": "e2e",
    "faults": "faults",
    "node": "node",
}


def _xdist_worker(config: pytest.Config) -> str | None:
    """This process's xdist worker id (``gw0``...), or None outside a worker."""
    workerinput: dict[str, object] | None = getattr(config, "workerinput", None)
    return None if workerinput is None else str(workerinput["workerid"])


def _xdist_controller(config: pytest.Config) -> bool:
    """True in the process that hands tests to xdist workers and runs none itself."""
    return _xdist_worker(config) is None and config.pluginmanager.hasplugin("dsession")


def pytest_configure(config: pytest.Config) -> None:
    inherited = os.environ.get(MARKER_ENV)
    worker = _xdist_worker(config)
    if worker is not None:
        # Inherited from the controlling process, which every worker shares: make it ours.
        os.environ[MARKER_ENV] = f"{inherited or uuid.uuid4().hex}-{worker}"
    elif inherited:
        # A pytest a test started (tests/integration/test_images.py runs the
        # runner's tests on a pruned pyarrow): its leftover scan must not take
        # the outer session's control plane for its own processes and kill it.
        os.environ[MARKER_ENV] = f"{inherited}-inner-{uuid.uuid4().hex[:12]}"
    else:
        os.environ[MARKER_ENV] = uuid.uuid4().hex
    config.stash[_LEFTOVERS] = []
    # Controllers forked from a server that has imported them (hack/forkserver.py),
    # unless the caller asks for KSC_CONTROLLER_START=exec.
    os.environ.setdefault(START_ENV, "fork")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    tests_dir = Path(__file__).parent
    for item in items:
        parts = item.path.relative_to(tests_dir).parts
        marker = _DIR_MARKERS.get(parts[0]) if len(parts) > 1 else None
        if marker and not item.get_closest_marker(marker):
            item.add_marker(marker)


@pytest.fixture(autouse=True)
def _fresh_redactor() -> Iterator[None]:
    """Each test's runs start with no registered secret, as each runner process does.

    The runner's redactor is process-wide (one run per process in a pod), but
    the tests run many runs in one process: a value one test registered (a
    wrong token "wrong", say) would be hidden in every later test's messages.
    """
    REDACTOR.clear()
    yield
    REDACTOR.clear()


@pytest.fixture
def tasks() -> Iterator[list[asyncio.Task[None]]]:
    """Tasks a test starts (an informer's run, say), cancelled when it ends."""
    started: list[asyncio.Task[None]] = []
    yield started
    for task in started:
        task.cancel()


_LEFTOVERS = pytest.StashKey[list[str]]()
_WORKER_LEFTOVERS = "ksc_leftover_processes"


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """xdist: a worker finished; keep what it found still running, to report at the end."""
    output: dict[str, Any] = getattr(node, "workeroutput", None) or {}
    node.config.stash[_LEFTOVERS].extend(output.get(_WORKER_LEFTOVERS, []))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    pytest_config = session.config
    found = pytest_config.stash[_LEFTOVERS]
    # The controlling process starts nothing; its workers (which carry its value) check theirs.
    if not _xdist_controller(pytest_config):
        # The fork server is ours to stop, after its children are looked at: one
        # still running is a leftover, and would die unseen with the server.
        leftovers = [
            (pid, cmd)
            for pid, cmd in leftover_processes(MARKER_ENV, os.environ[MARKER_ENV])
            if pid != FORK_SERVER.pid
        ]
        FORK_SERVER.stop()
        for pid, _ in leftovers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        found.extend(f"pid {pid}: {cmd[:200]}" for pid, cmd in leftovers)
    worker = _xdist_worker(pytest_config)
    if worker is not None:
        # Sent to the controlling process with the worker's "finished" event.
        workeroutput: dict[str, Any] = getattr(pytest_config, "workeroutput")  # noqa: B009
        workeroutput[_WORKER_LEFTOVERS] = [f"{worker} {line}" for line in found]
    if not found:
        return
    reporter = pytest_config.pluginmanager.get_plugin("terminalreporter")
    lines = "\n".join(f"  {line}" for line in found)
    message = f"processes started by the test suite outlived it (now killed):\n{lines}"
    if reporter is not None:
        reporter.write_line(message, red=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session")
def cluster() -> Iterator[LocalCluster]:
    """The one local control plane of this test run, with the node agent."""
    bin_dir = ensure_binaries()
    with tempfile.TemporaryDirectory(prefix="ksc-test-cluster-") as tmp:
        local = LocalCluster(bin_dir=bin_dir, workdir=Path(tmp))
        local.start()
        try:
            yield local
        finally:
            local.stop()
            for pid in local.pids():
                # stop() waited for each child: none may remain.
                assert not Path(f"/proc/{pid}").exists() or _is_zombie(pid), f"pid {pid} survived"


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


async def make_api_client(kubeconfig: Path) -> client.ApiClient:
    configuration = client.Configuration()
    await config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    return client.ApiClient(configuration)


@pytest.fixture
async def api_client(cluster: LocalCluster) -> AsyncIterator[client.ApiClient]:
    api = await make_api_client(cluster.kubeconfig)
    async with api:
        yield api


@pytest.fixture
async def kube(cluster: LocalCluster) -> AsyncIterator[KubeClient]:
    """The controller's own client (kubeclient.client), as the cluster's admin."""
    async with await KubeClient.connect(kubeconfig=str(cluster.kubeconfig)) as kube:
        yield kube


@pytest.fixture
def crds(cluster: LocalCluster) -> None:
    """The CRDs, installed (once per cluster) for tests that need no controller."""
    install_crds(cluster)


async def _namespace(
    api: client.ApiClient, request: pytest.FixtureRequest, labels: dict[str, str]
) -> AsyncIterator[str]:
    # Names are derived from the test so that a leftover in logs says where it came from.
    base = request.node.name.lower().replace("_", "-")
    base = "".join(c for c in base if c.isalnum() or c == "-")[:40].strip("-")
    name = f"{base}-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(api)
    await core.create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels=labels))
    )
    try:
        yield name
    finally:
        # Namespace deletion (and the GC behind it) runs in the background: tests don't wait.
        await core.delete_namespace(name)
        await _delete_admission_policy(api, name)


async def _delete_admission_policy(api: client.ApiClient, namespace: str) -> None:
    """The chart's admission policies for a controller released in ``namespace``, if any.

    It is cluster-scoped (named after the release and its namespace), so the
    namespace's deletion does not take it.
    """
    admission = client.AdmissionregistrationV1Api(api)
    for policy in ("own-objects", "runner-pods"):
        await delete_admission_policy(admission, f"{chart.FULLNAME}-{namespace}-{policy}")


@pytest.fixture
async def namespace(
    api_client: client.ApiClient, request: pytest.FixtureRequest
) -> AsyncIterator[str]:
    async for name in _namespace(api_client, request, {"ksc-test": "true"}):
        yield name


@pytest.fixture
async def restricted_namespace(
    api_client: client.ApiClient, request: pytest.FixtureRequest
) -> AsyncIterator[str]:
    labels = {
        "ksc-test": "true",
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest",
    }
    async for name in _namespace(api_client, request, labels):
        yield name


@pytest.fixture
def runs(api_client: client.ApiClient, namespace: str) -> Runs:
    """InferenceConfigs and InferenceRuns of this test's namespace."""
    return Runs(api_client, namespace)


@pytest.fixture
def controller(
    cluster: LocalCluster, namespace: str, tmp_path: Path
) -> Iterator[ControllerProcess]:
    """A running controller watching this test's namespace, under the chart's RBAC."""
    with running(controller_for(cluster, namespace, tmp_path)) as proc:
        yield proc


@pytest.fixture
def probing_controller(
    cluster: LocalCluster, namespace: str, tmp_path: Path
) -> Iterator[ControllerProcess]:
    """The ``controller`` fixture with config probes on (elsewhere they are off)."""
    env = {"PROBE_INTERVAL": "1h"}
    with running(controller_for(cluster, namespace, tmp_path, env=env)) as proc:
        yield proc
