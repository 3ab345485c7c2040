"""Leader election on a real Lease: one leader, fast hand-over on release, safe take-over,
and the Lease owned by the controller's ServiceAccount (so uninstalling deletes it).

Timings are shortened (lease 4 s, renew deadline 3 s, retry 1 s) so the
take-over cases take seconds; the algorithm is the same as with 15/10/2.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from controller.metrics import Metrics
from hack.cluster import LocalCluster
from hack.controllerproc import ControllerProcess, controller_for
from kubeclient.client import KubeClient
from kubeclient.errors import NotFound
from kubeclient.leaderelection import SERVICEACCOUNTS, LeaderElector, LeadershipLost
from kubeclient.resources import CONFIGMAPS, LEASES, Obj
from tests.chart import CONTROLLER_SERVICE_ACCOUNT, FULLNAME, service_account_user
from tests.integration.partition import behind_a_proxy
from tests.kubehelpers import eventually

FAST = {"lease_duration": 4.0, "renew_deadline": 3.0, "retry_period": 1.0}


class Candidate:
    """An elector plus a record of when its leading work ran."""

    def __init__(
        self,
        client: KubeClient,
        namespace: str,
        identity: str,
        owner: str | None = None,
        **timing: float,
    ) -> None:
        self.metrics = Metrics()
        self.elector = LeaderElector(
            client,
            name="controller-lock",
            namespace=namespace,
            identity=identity,
            owner_service_account=owner,
            metrics=self.metrics,
            **(timing or FAST),
        )
        self.started: float | None = None
        self.stopped: float | None = None
        self.task: asyncio.Task[None] | None = None

    async def _lead(self) -> None:
        self.started = time.monotonic()
        try:
            await asyncio.Future()
        finally:
            self.stopped = time.monotonic()

    def start(self) -> Candidate:
        self.task = asyncio.create_task(self.elector.run(self._lead))
        return self

    @property
    def leading(self) -> bool:
        return self.started is not None and self.stopped is None

    def master_status(self) -> float | None:
        return self.metrics.registry.get_sample_value(
            "leader_election_master_status", {"name": "controller-lock"}
        )

    async def stop(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)


async def holder(kube: KubeClient, namespace: str) -> str:
    lease = await kube.get(LEASES, namespace, "controller-lock")
    return str(lease["spec"].get("holderIdentity") or "")


async def test_exactly_one_of_two_candidates_leads(kube: KubeClient, namespace: str) -> None:
    a = Candidate(kube, namespace, "a").start()
    b = Candidate(kube, namespace, "b").start()
    try:
        await eventually(
            lambda: asyncio.sleep(0, a.leading or b.leading), within=30, what="a leader"
        )
        await asyncio.sleep(6)  # several renewals: still exactly one
        leader, standby = (a, b) if a.leading else (b, a)
        assert leader.leading
        assert not standby.leading
        assert standby.started is None
        assert await holder(kube, namespace) == leader.elector.identity
        assert leader.master_status() == 1
        assert standby.master_status() == 0
        lease = await kube.get(LEASES, namespace, "controller-lock")
        assert lease["spec"]["leaseDurationSeconds"] == 4
        assert lease["spec"]["renewTime"].endswith("Z")
    finally:
        await a.stop()
        await b.stop()


async def test_a_leader_that_stops_releases_and_the_standby_takes_over_quickly(
    kube: KubeClient, namespace: str
) -> None:
    slow = {"lease_duration": 60.0, "renew_deadline": 40.0, "retry_period": 1.0}
    first = Candidate(kube, namespace, "first", **slow).start()
    await eventually(lambda: asyncio.sleep(0, first.leading), within=30, what="first leads")
    second = Candidate(kube, namespace, "second", **slow).start()
    try:
        await asyncio.sleep(2)
        assert not second.leading
        await first.stop()  # graceful: SIGTERM in the real process
        assert first.stopped is not None
        assert await holder(kube, namespace) == ""
        # Released, so a 60 s lease does not make the standby wait 60 s.
        await eventually(lambda: asyncio.sleep(0, second.leading), within=10, what="take-over")
        lease = await kube.get(LEASES, namespace, "controller-lock")
        assert lease["spec"]["holderIdentity"] == "second"
        assert lease["spec"]["leaseTransitions"] >= 1
    finally:
        await first.stop()
        await second.stop()


async def test_a_partitioned_leader_steps_down_before_the_standby_takes_over(
    cluster: LocalCluster, kube: KubeClient, namespace: str
) -> None:
    proxy, configuration = await behind_a_proxy(cluster)
    cut_off = KubeClient(configuration, request_timeout=2)
    leader = Candidate(cut_off, namespace, "partitioned").start()
    standby: Candidate | None = None
    try:
        await eventually(lambda: asyncio.sleep(0, leader.leading), within=30, what="a leader")
        standby = Candidate(kube, namespace, "standby").start()
        await asyncio.sleep(2)
        assert not standby.leading

        proxy.cut()
        assert leader.task is not None
        with pytest.raises(LeadershipLost):
            await asyncio.wait_for(leader.task, timeout=30)
        assert leader.master_status() == 0
        await eventually(lambda: asyncio.sleep(0, standby.leading), within=30, what="take-over")
        # Never two leaders: the old one stopped before the new one started.
        assert leader.stopped is not None
        assert standby.started is not None
        assert leader.stopped < standby.started
        assert await holder(kube, namespace) == "standby"
    finally:
        await leader.stop()
        if standby is not None:
            await standby.stop()
        await cut_off.close()
        await proxy.stop()


ELECTOR_PROCESS = textwrap.dedent(
    """
    import asyncio, sys
    from kubeclient.client import KubeClient
    from kubeclient.leaderelection import LeaderElector

    async def main() -> None:
        kubeconfig, namespace = sys.argv[1], sys.argv[2]
        async with await KubeClient.connect(kubeconfig=kubeconfig) as client:
            elector = LeaderElector(client, name="controller-lock", namespace=namespace,
                                    identity="process", lease_duration=4, renew_deadline=3,
                                    retry_period=1)
            async def lead() -> None:
                print("leading", flush=True)
                await asyncio.Future()
            await elector.run(lead)

    asyncio.run(main())
    """
)


async def test_a_killed_leader_is_replaced_after_the_lease_expires(
    cluster: LocalCluster, kube: KubeClient, namespace: str
) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        ELECTOR_PROCESS,
        str(cluster.kubeconfig),
        namespace,
        stdout=asyncio.subprocess.PIPE,
        cwd=os.getcwd(),
    )
    standby: Candidate | None = None
    try:
        assert process.stdout is not None
        stdout = process.stdout

        async def wait_for_leading() -> None:
            # The elector's own log lines come first.
            while line := await stdout.readline():
                if line.strip() == b"leading":
                    return
            raise AssertionError("the elector process ended without leading")

        await asyncio.wait_for(wait_for_leading(), timeout=60)
        standby = Candidate(kube, namespace, "standby").start()
        await asyncio.sleep(2)
        assert not standby.leading
        assert await holder(kube, namespace) == "process"

        process.send_signal(signal.SIGKILL)  # no release: the lease must expire
        await asyncio.wait_for(process.wait(), timeout=10)
        killed_at = time.monotonic()
        await eventually(lambda: asyncio.sleep(0, standby.leading), within=30, what="take-over")
        assert standby.started is not None
        assert standby.started - killed_at >= 2  # waited for the lease, not a free-for-all
        assert await holder(kube, namespace) == "standby"
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        if standby is not None:
            await standby.stop()


async def test_leading_work_that_fails_releases_the_lease(kube: KubeClient, namespace: str) -> None:
    elector = LeaderElector(
        kube, name="controller-lock", namespace=namespace, identity="crashy", **FAST
    )

    async def lead() -> None:
        raise RuntimeError("reconcile loop crashed")

    with pytest.raises(RuntimeError, match="crashed"):
        await asyncio.wait_for(elector.run(lead), timeout=30)
    assert await holder(kube, namespace) == ""
    assert not elector.is_leader


async def test_an_existing_lease_is_not_recreated(kube: KubeClient, namespace: str) -> None:
    with pytest.raises(NotFound):
        await kube.get(LEASES, namespace, "controller-lock")
    elector = LeaderElector(kube, name="controller-lock", namespace=namespace, identity="x", **FAST)
    assert await elector.try_acquire_or_renew()  # creates
    first: dict[str, Any] = await kube.get(LEASES, namespace, "controller-lock")
    assert await elector.try_acquire_or_renew()  # renews the same object
    second = await kube.get(LEASES, namespace, "controller-lock")
    assert second["metadata"]["uid"] == first["metadata"]["uid"]
    assert second["spec"]["acquireTime"] == first["spec"]["acquireTime"]
    assert second["spec"]["renewTime"] >= first["spec"]["renewTime"]
    assert await elector.release()


# ------------------------------------------------------------------------ the Lease's owner
#
# The Lease is owned by the controller's ServiceAccount (POD_SERVICE_ACCOUNT),
# so that deleting it (helm uninstall) makes the garbage collector delete the
# Lease, which Helm does not know about.

ELECTION = {
    "LEADER_ELECT": "true",
    "LEASE_NAME": FULLNAME,  # the Lease the chart's leader-election Role names
    "LEASE_DURATION": "4s",
    "RENEW_DEADLINE": "3s",
    "RETRY_PERIOD": "1s",
}


def sa_reference(account: Obj) -> dict[str, str]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "name": account["metadata"]["name"],
        "uid": account["metadata"]["uid"],
    }


async def held_lease(kube: KubeClient, namespace: str, name: str) -> Obj:
    async def probe() -> Obj | None:
        try:
            lease = await kube.get(LEASES, namespace, name)
        except NotFound:
            return None
        return lease if (lease.get("spec") or {}).get("holderIdentity") else None

    return await eventually(probe, within=30, what=f"a holder of the Lease {namespace}/{name}")


def service_account_reads(cluster: LocalCluster, namespace: str, user: str) -> list[int]:
    """The response codes of ``user``'s GETs of ServiceAccounts in ``namespace``."""
    return [
        int((event.get("responseStatus") or {}).get("code") or 0)
        for event in cluster.audit_events()
        if event.get("stage") == "ResponseComplete"
        and event.get("verb") == "get"
        and (event.get("user") or {}).get("username") == user
        and (event.get("objectRef") or {}).get("resource") == "serviceaccounts"
        and (event.get("objectRef") or {}).get("namespace") == namespace
    ]


def election_warnings(proc: ControllerProcess) -> list[dict[str, Any]]:
    """The warnings the controller's leader election logged."""
    lines = [json.loads(line) for line in proc.output().splitlines() if line.startswith("{")]
    return [
        line
        for line in lines
        if line.get("logger") == "kubeclient.leaderelection" and line["level"] == "warning"
    ]


async def test_the_controllers_service_account_owns_the_lease_and_takes_it_along(
    cluster: LocalCluster, kube: KubeClient, namespace: str, tmp_path: Path
) -> None:
    # Under the chart's RBAC: its leader-election Role lets the controller get
    # its own ServiceAccount, and nothing else.
    proc = controller_for(
        cluster,
        namespace,
        tmp_path,
        env={**ELECTION, "POD_SERVICE_ACCOUNT": CONTROLLER_SERVICE_ACCOUNT},
    )
    await asyncio.to_thread(proc.start)
    try:
        lease = await held_lease(kube, namespace, FULLNAME)
        account = await kube.get(SERVICEACCOUNTS, namespace, CONTROLLER_SERVICE_ACCOUNT)
        assert lease["metadata"]["ownerReferences"] == [sa_reference(account)]
        await asyncio.sleep(4)  # a few renewals: the ServiceAccount is not read again
        renewed = await kube.get(LEASES, namespace, FULLNAME)
        assert renewed["metadata"]["uid"] == lease["metadata"]["uid"]
        assert renewed["spec"]["renewTime"] > lease["spec"]["renewTime"]
        assert renewed["metadata"]["ownerReferences"] == [sa_reference(account)]
        identity = service_account_user(namespace, CONTROLLER_SERVICE_ACCOUNT)
        assert service_account_reads(cluster, namespace, identity) == [200]
        assert not election_warnings(proc), proc.output()
    finally:
        assert proc.stop() == 0, proc.output()[-5000:]

    # What helm uninstall does: the ServiceAccount goes, the collector takes the Lease.
    await kube.delete(SERVICEACCOUNTS, namespace, CONTROLLER_SERVICE_ACCOUNT)

    async def collected() -> bool:
        try:
            await kube.get(LEASES, namespace, FULLNAME)
        except NotFound:
            return True
        return False

    await eventually(collected, within=60, what="the garbage collector to delete the Lease")


async def test_an_existing_lease_without_the_owner_gets_it_when_taken_over(
    kube: KubeClient, namespace: str
) -> None:
    account = await kube.create(
        SERVICEACCOUNTS,
        namespace,
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "lease-owner"}},
    )
    # Another, living owner (a dangling one would make the collector delete the Lease).
    keeper = await kube.create(
        CONFIGMAPS,
        namespace,
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "keeper"}},
    )
    keeper_reference = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "keeper",
        "uid": keeper["metadata"]["uid"],
    }
    # As an older controller version left it: released, no owner of ours.
    existing = await kube.create(
        LEASES,
        namespace,
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": "controller-lock",
                "labels": {"kept": "yes"},
                "annotations": {"note": "kept too"},
                "ownerReferences": [keeper_reference],
            },
            "spec": {"holderIdentity": "", "leaseDurationSeconds": 1, "leaseTransitions": 4},
        },
    )
    candidate = Candidate(kube, namespace, "new", owner="lease-owner").start()
    try:
        await eventually(lambda: asyncio.sleep(0, candidate.leading), within=30, what="take-over")
        await asyncio.sleep(2)  # and renewals
        lease = await kube.get(LEASES, namespace, "controller-lock")
        assert lease["metadata"]["uid"] == existing["metadata"]["uid"]  # taken over, not remade
        assert lease["metadata"]["ownerReferences"] == [keeper_reference, sa_reference(account)]
        assert lease["metadata"]["labels"] == {"kept": "yes"}
        assert lease["metadata"]["annotations"] == {"note": "kept too"}
        assert lease["spec"]["holderIdentity"] == "new"
        assert lease["spec"]["leaseTransitions"] == 5
    finally:
        await candidate.stop()


async def test_a_missing_owner_does_not_hold_up_the_election(
    kube: KubeClient, namespace: str
) -> None:
    with capture_logs() as logs:
        candidate = Candidate(kube, namespace, "ownerless", owner="no-such-account").start()
        try:
            await eventually(
                lambda: asyncio.sleep(0, candidate.leading), within=10, what="a leader"
            )
            await asyncio.sleep(3)  # renewals, none of them stopped by the missing owner
            assert candidate.leading
        finally:
            await candidate.stop()
    lease = await kube.get(LEASES, namespace, "controller-lock")
    assert "ownerReferences" not in lease["metadata"]
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert [(w["service_account"], w["reason"]) for w in warnings] == [
        ("no-such-account", "NotFound")
    ]


async def test_an_owner_the_controller_may_not_read_does_not_hold_up_the_election(
    cluster: LocalCluster, kube: KubeClient, namespace: str, tmp_path: Path
) -> None:
    # It exists, but the chart's Role lets the controller read only its own.
    await kube.create(
        SERVICEACCOUNTS,
        namespace,
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "someone-else"}},
    )
    proc = controller_for(
        cluster, namespace, tmp_path, env={**ELECTION, "POD_SERVICE_ACCOUNT": "someone-else"}
    )
    await asyncio.to_thread(proc.start)
    try:
        lease = await held_lease(kube, namespace, FULLNAME)
        assert "ownerReferences" not in lease["metadata"]
        await asyncio.sleep(4)  # renewals go on
        renewed = await kube.get(LEASES, namespace, FULLNAME)
        assert renewed["spec"]["holderIdentity"] == lease["spec"]["holderIdentity"]
        assert renewed["spec"]["renewTime"] > lease["spec"]["renewTime"]
        assert "leader_election_master_status{name=" in proc.metrics()
        assert f'leader_election_master_status{{name="{FULLNAME}"}} 1.0' in proc.metrics()
        warnings = election_warnings(proc)
        assert [(w["service_account"], w["reason"]) for w in warnings] == [
            ("someone-else", "Forbidden")
        ], proc.output()
        # Retried with a backoff (1 s, 2 s, ...), not at every renewal.
        identity = service_account_user(namespace, CONTROLLER_SERVICE_ACCOUNT)
        reads = service_account_reads(cluster, namespace, identity)
        assert set(reads) == {403}
        assert len(reads) <= 4, reads
    finally:
        assert proc.stop() == 0, proc.output()[-5000:]
