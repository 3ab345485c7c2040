"""Two controller shards on the real control plane, under the chart's RBAC for two shards.

Each shard is a ``python -m controller`` process with ``SHARD_COUNT=2`` and its
own ``SHARD_INDEX``, both watching the same namespaces with leader election
on. What is shown, from the API server's audit log (each process has a token
of its own, so its requests carry a credential id of their own):

- each shard holds its own Lease (``<lease>-shard-<i>-of-2``);
- every write to a namespace's runs, configs, Jobs and ConfigMaps comes from the
  shard owning that namespace, and each run gets exactly one Job;
- killing one shard's controller stops nothing of the other's: its runs go on
  succeeding while the killed shard's wait, and a new process of the killed
  shard picks them up;
- changing the shard count moves a namespace to a new owner, which adopts the
  runs in flight there (their existing Job, no second one) through the
  level-triggered reconcile;
- the chart installs with 2 shards and upgrades to 3 and back to 1 on a real
  API server (one Deployment and PDB per shard, each shard's Lease granted).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from kubernetes_asyncio import client
from prometheus_client.parser import text_string_to_metric_families

from controller.sharding import shard_of
from hack.cluster import LocalCluster
from hack.controllerproc import ControllerProcess, apply_controller_rbac, controller_user
from hack.crds import install_crds
from hack.invariants import AuditLog, Request
from kubeclient.client import KubeClient
from kubeclient.errors import NotFound
from kubeclient.resources import LEASES, Obj
from tests import chart
from tests.integration.test_selfcheck import run_check
from tests.kubehelpers import eventually
from tests.runs import Runs, inference_config, inference_run, status

OK, SLOW = "test.local/fake-ok:1", "test.local/fake-slow:1"
SHARDS = 2
WRITES = ("create", "update", "patch", "delete")


def lease_of(index: int, count: int = SHARDS) -> str:
    return f"{chart.FULLNAME}-shard-{index}-of-{count}"


class Shards:
    """Namespaces spread over the shards, the chart's RBAC, and the controller processes."""

    def __init__(self, cluster: LocalCluster, release_namespace: str, workdir: Path) -> None:
        self.cluster = cluster
        self.release_namespace = release_namespace  # the Leases and the ServiceAccount
        self.workdir = workdir
        self.namespaces: list[str] = []
        self.procs: list[ControllerProcess] = []

    def owner(self, namespace: str, count: int = SHARDS) -> int:
        return shard_of(namespace, count)

    def of_shard(self, index: int) -> list[str]:
        return [ns for ns in self.namespaces if self.owner(ns) == index]

    def pick_namespaces(self, per_shard: int = 2) -> list[str]:
        """Fresh names, ``per_shard`` for each of the shards."""
        picked: dict[int, list[str]] = {index: [] for index in range(SHARDS)}
        while any(len(names) < per_shard for names in picked.values()):
            name = f"shard-test-{uuid.uuid4().hex[:8]}"
            names = picked[self.owner(name)]
            if len(names) < per_shard:
                names.append(name)
        self.namespaces = [ns for names in picked.values() for ns in names]
        return self.namespaces

    def apply_rbac(self, count: int = SHARDS) -> None:
        """The chart's RBAC for ``count`` shards (its leader-election Role names their Leases)."""
        install_crds(self.cluster)
        apply_controller_rbac(
            self.cluster,
            self.release_namespace,
            self.namespaces,
            values={"sharding": {"shards": count}},
        )

    def controller(self, index: int, count: int = SHARDS, *, name: str = "") -> ControllerProcess:
        """A (not started) controller of shard ``index`` of ``count``, with a token of its own."""
        name = name or f"shard-{index}-of-{count}"
        kubeconfig = chart.service_account_kubeconfig(
            self.cluster, self.release_namespace, path=self.workdir / f"{name}.kubeconfig"
        )
        env = {
            "WATCH_NAMESPACE": ",".join(self.namespaces),
            "POD_NAMESPACE": self.release_namespace,
            "POD_NAME": name,
            "POD_SERVICE_ACCOUNT": chart.CONTROLLER_SERVICE_ACCOUNT,
            "RUNNER_SERVICE_ACCOUNT": chart.RUNNER_SERVICE_ACCOUNT,
            "POLLING_INTERVAL": "30s",
            "PROBE_INTERVAL": "0",
            "MAX_RECONCILE_RATE": "2",
            "LEADER_ELECT": "true",
            "LEASE_NAME": chart.FULLNAME,  # as the chart sets it; the shard adds its suffix
            "LEASE_DURATION": "4s",
            "RENEW_DEADLINE": "3s",
            "RETRY_PERIOD": "1s",
            "SHARD_COUNT": str(count),
            "SHARD_INDEX": str(index),
        }
        proc = ControllerProcess(kubeconfig=kubeconfig, log=self.workdir / f"{name}.log", env=env)
        self.procs.append(proc)
        return proc

    def stop_all(self) -> list[str]:
        """Stop every process still running; the outputs of those that did not exit 0."""
        bad = []
        for proc in self.procs:
            code = proc.stop()
            if code not in (0, None, -9):
                bad.append(f"exit {code}:\n{proc.output()[-3000:]}")
        return bad


@pytest.fixture
def shards(cluster: LocalCluster, namespace: str, tmp_path: Path) -> Iterator[Shards]:
    found = Shards(cluster, namespace, tmp_path)
    found.pick_namespaces()
    try:
        yield found
    finally:
        problems = found.stop_all()
        assert not problems, "\n".join(problems)


@pytest.fixture
async def run_namespaces(api_client: client.ApiClient, shards: Shards) -> AsyncIterator[list[str]]:
    core = client.CoreV1Api(api_client)
    for name in shards.namespaces:
        await core.create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels={"ksc-test": "true"}))
        )
    shards.apply_rbac()
    try:
        yield shards.namespaces
    finally:
        for name in shards.namespaces:
            await core.delete_namespace(name)


async def lease_holder(kube: KubeClient, namespace: str, name: str) -> str | None:
    try:
        lease = await kube.get(LEASES, namespace, name)
    except NotFound:
        return None
    return str((lease.get("spec") or {}).get("holderIdentity") or "") or None


def credentials_of_lease(requests: list[Request], lease: str) -> set[str]:
    """The credential ids that wrote ``lease``: the processes that held it."""
    return {r.credential for r in requests if r.name == lease and r.verb in WRITES and r.ok}


def controller_writes(log: AuditLog, user: str) -> list[Request]:
    return [r for r in log.requests() if r.user == user and r.verb in WRITES and r.ok]


def job_creates(log: AuditLog, user: str) -> list[Request]:
    return [r for r in controller_writes(log, user) if r.resource == "jobs" and r.verb == "create"]


def sample(proc: ControllerProcess, metric: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(proc.metrics()):
        for s in family.samples:
            if s.name == metric and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return None


def phase(run: Obj | None) -> str | None:
    return status(run).get("phase") if run else None


async def check(proc: ControllerProcess) -> tuple[int, list[str]]:
    """``python -m controller check`` with the shard's own settings and credentials."""
    done = await asyncio.to_thread(run_check, proc.kubeconfig, proc.env)
    assert done.stderr == "", done.stderr
    return done.returncode, done.stdout.splitlines()


async def start(proc: ControllerProcess) -> None:
    await asyncio.to_thread(proc.start)


async def held(kube: KubeClient, namespace: str, lease: str) -> str:
    """The holder of ``lease`` once it has one."""

    async def probe() -> str | None:
        return await lease_holder(kube, namespace, lease)

    return await eventually(probe, within=30, what=f"a holder of {lease}")


async def test_each_shard_leads_on_its_own_lease_and_handles_only_its_namespaces(
    cluster: LocalCluster,
    api_client: client.ApiClient,
    kube: KubeClient,
    namespace: str,
    shards: Shards,
    run_namespaces: list[str],
) -> None:
    user = controller_user(namespace)
    logs = {ns: AuditLog(cluster, ns) for ns in [namespace, *run_namespaces]}
    zero, one = shards.controller(0), shards.controller(1)
    await asyncio.gather(start(zero), start(one))

    # Two Leases, one leader each.
    for index in range(SHARDS):
        holder = await held(kube, namespace, lease_of(index))
        assert holder.startswith(f"shard-{index}-of-2_"), holder
    assert await lease_holder(kube, namespace, chart.FULLNAME) is None  # no unsharded Lease
    lease_requests = logs[namespace].requests()
    credential = {i: credentials_of_lease(lease_requests, lease_of(i)) for i in range(SHARDS)}
    assert all(len(c) == 1 and "" not in c for c in credential.values()), credential
    assert credential[0] != credential[1]
    for index, proc in enumerate((zero, one)):
        assert sample(proc, "leader_election_master_status", name=lease_of(index)) == 1
        info = sample(proc, "kserve_inference_controller_build_info", shard=f"{index}-of-2")
        assert info == 1, proc.metrics()
        # The helm test of each shard checks that shard's Lease.
        code, lines = await check(proc)
        assert code == 0, lines
        (lease_line,) = [line for line in lines if "Lease" in line]
        assert lease_line.startswith(
            f"ok: Lease {namespace}/{lease_of(index)} is held by shard-{index}-of-2_"
        ), lease_line

    # A run in every namespace: each succeeds, handled by its namespace's shard alone.
    for ns in run_namespaces:
        runs = Runs(api_client, ns)
        await runs.create(inference_config("cfg", OK))
        await runs.create(inference_run("iris", "cfg", timeoutSeconds=60))
    for ns in run_namespaces:
        await Runs(api_client, ns).wait_phase("iris", "Succeeded", within=90)
    for ns in run_namespaces:
        writes = controller_writes(logs[ns], user)
        writers = {r.credential for r in writes}
        owner = shards.owner(ns)
        assert writers == credential[owner], (ns, owner, [str(r) for r in writes])
        assert len(job_creates(logs[ns], user)) == 1, ns
        # The Events name the instance that acted: the owner's.
        events = await client.CoreV1Api(api_client).list_namespaced_event(
            ns, field_selector="involvedObject.name=iris"
        )
        instances = {e.reporting_instance for e in events.items}
        assert instances, ns
        assert all(i.startswith(f"shard-{owner}-of-2_") for i in instances), (ns, instances)
    # Each cache holds its own shard's runs only.
    for index, proc in enumerate((zero, one)):
        expected = float(len(shards.of_shard(index)))

        async def counted(p: ControllerProcess = proc, n: float = expected) -> bool:
            # Summed over the namespaces and configs of the shard's runs.
            return p.metric("kserve_inference_runs", phase="Succeeded") == n

        await eventually(counted, within=30, what=f"shard {index} to count its runs")


async def test_a_killed_shard_stops_only_its_own_namespaces(
    cluster: LocalCluster,
    api_client: client.ApiClient,
    kube: KubeClient,
    namespace: str,
    shards: Shards,
    run_namespaces: list[str],
) -> None:
    zero, one = shards.controller(0), shards.controller(1)
    await asyncio.gather(start(zero), start(one))
    for index in range(SHARDS):
        await held(kube, namespace, lease_of(index))
    for ns in run_namespaces:
        await Runs(api_client, ns).create(inference_config("cfg", OK))

    one.kill()  # SIGKILL: no release, shard 1 has no leader until a new process takes over
    for ns in run_namespaces:
        await Runs(api_client, ns).create(inference_run("after-kill", "cfg", timeoutSeconds=60))
    for ns in shards.of_shard(0):
        await Runs(api_client, ns).wait_phase("after-kill", "Succeeded", within=90)
    # Shard 0 has done all its work; shard 1's runs were never touched.
    for ns in shards.of_shard(1):
        run = await Runs(api_client, ns).get("after-kill")
        assert run is not None
        assert not run.get("status"), run
        jobs = await client.BatchV1Api(api_client).list_namespaced_job(ns)
        assert not jobs.items, ns

    # Its helm test says so (once the dead leader's Lease has run out); shard 0's passes.
    async def stale() -> list[str] | None:
        code, lines = await check(one)
        return lines if code == 1 else None

    lines = await eventually(stale, within=30, what="shard 1's check to fail")
    assert any(
        line.startswith(f"FAIL: Lease {namespace}/{lease_of(1)} is held by shard-1-of-2_")
        for line in lines
    ), lines
    assert (await check(zero))[0] == 0

    # Shard 1 again (a new pod): it waits for the dead holder's Lease, then catches up.
    again = shards.controller(1, name="shard-1-of-2-again")
    await start(again)
    for ns in shards.of_shard(1):
        await Runs(api_client, ns).wait_phase("after-kill", "Succeeded", within=90)
    holder = await lease_holder(kube, namespace, lease_of(1))
    assert holder is not None
    assert holder.startswith("shard-1-of-2-again_")
    assert zero.proc is not None
    assert zero.proc.poll() is None  # shard 0 ran throughout


async def test_a_new_shard_count_adopts_the_runs_in_flight(
    cluster: LocalCluster,
    api_client: client.ApiClient,
    kube: KubeClient,
    namespace: str,
    shards: Shards,
    run_namespaces: list[str],
) -> None:
    user = controller_user(namespace)
    # A namespace of shard 1 of 2 that moves to another shard index with 3 shards.
    moved = next((ns for ns in shards.of_shard(1) if shard_of(ns, 3) != 1), shards.of_shard(1)[0])
    new_index = shard_of(moved, 3)
    log = AuditLog(cluster, moved)
    old = [shards.controller(0), shards.controller(1)]
    await asyncio.gather(*(start(p) for p in old))
    runs = Runs(api_client, moved)
    await runs.create(inference_config("cfg", SLOW))
    running = await runs.create_and_wait(
        inference_run("long", "cfg", timeoutSeconds=30), "Running", within=60
    )
    (job,) = (await client.BatchV1Api(api_client).list_namespaced_job(moved)).items
    assert status(running)["jobStatus"]["name"] == job.metadata.name

    # The "upgrade" to 3 shards: the old shards stop, the namespace's new owner starts.
    for proc in old:
        assert proc.stop() == 0, proc.output()[-3000:]
    before = {r.credential for r in controller_writes(log, user)}
    shards.apply_rbac(3)  # helm upgrade --set sharding.shards=3: the new Leases
    new = shards.controller(new_index, 3)
    await start(new)
    # The run ends under its new owner, from the Job it already had.
    failed = await runs.wait_phase("long", "Failed", within=90)
    assert status(failed)["reason"] == "DeadlineExceeded"
    assert status(failed)["jobStatus"]["name"] == job.metadata.name
    jobs = (await client.BatchV1Api(api_client).list_namespaced_job(moved)).items
    assert [j.metadata.uid for j in jobs] == [job.metadata.uid]
    assert len(job_creates(log, user)) == 1
    # The final status was written by the new process, not by either old one.
    status_writers = {
        r.credential
        for r in controller_writes(log, user)
        if r.resource == "inferenceruns/status" and r.name == "long"
    }
    assert status_writers - before, "the new shard never wrote the run's status"
    holder = await lease_holder(kube, namespace, lease_of(new_index, 3))
    assert holder is not None
    assert holder.startswith(f"shard-{new_index}-of-3_")


# ------------------------------------------------------------------------------- the chart


def release_objects(cluster: LocalCluster, kind: str, namespace: str) -> list[str]:
    done = cluster.kubectl(
        "get",
        kind,
        "-n",
        namespace,
        "-l",
        f"app.kubernetes.io/instance={chart.RELEASE}",
        "-o",
        "json",
    )
    return sorted(item["metadata"]["name"] for item in json.loads(done.stdout)["items"])


def may_get_lease(cluster: LocalCluster, namespace: str, lease: str) -> bool:
    who = controller_user(namespace)
    done = cluster.kubectl(
        "auth", "can-i", "update", f"leases/{lease}", "-n", namespace, f"--as={who}", check=False
    )
    return done.stdout.strip() == "yes"


async def test_helm_install_and_upgrades_change_the_shard_count(
    cluster: LocalCluster, restricted_namespace: str
) -> None:
    ns = restricted_namespace

    def helm_release(verb: str, shards: int) -> None:
        done = chart.helm(
            verb,
            chart.RELEASE,
            str(chart.CHART_DIR),
            "--namespace",
            ns,
            "--set",
            f"sharding.shards={shards}",
            "--set",
            "crds.install=false",  # the run's shared CRDs were applied without Helm
            kubeconfig=cluster.kubeconfig,
        )
        assert "STATUS: deployed" in done.stdout, done.stdout

    async def shaped_as(shards: int) -> None:
        if shards == 1:
            expected = [chart.RELEASE]
        else:
            expected = [f"{chart.RELEASE}-shard-{i}" for i in range(shards)]

        async def probe() -> bool:
            return (
                release_objects(cluster, "deployments", ns) == expected
                and release_objects(cluster, "poddisruptionbudgets", ns) == expected
            )

        await eventually(probe, within=30, what=f"the release's {shards} Deployment(s) and PDB(s)")
        leases = [chart.RELEASE] if shards == 1 else [lease_of(i, shards) for i in range(shards)]
        for lease in leases:
            assert may_get_lease(cluster, ns, lease), lease
        for other in (chart.RELEASE, lease_of(0, 2), lease_of(2, 3)):
            if other not in leases:
                assert not may_get_lease(cluster, ns, other), other

    helm_release("install", 2)
    try:
        await shaped_as(2)
        # Shard Deployments keep their names and selectors: an upgrade only changes their env.
        helm_release("upgrade", 3)
        await shaped_as(3)
        helm_release("upgrade", 1)
        await shaped_as(1)
    finally:
        chart.helm("uninstall", chart.RELEASE, "-n", ns, kubeconfig=cluster.kubeconfig)
