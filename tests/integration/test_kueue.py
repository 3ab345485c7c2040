"""Runs in a Kueue queue, with Kueue's part played by real API machinery.

Kueue itself is not available here, so its two moves are made the way Kueue
makes them, through the real API server:

- its webhook suspends every Job carrying ``kueue.x-k8s.io/queue-name`` at
  creation: a MutatingAdmissionPolicy does the same, scoped to this test's
  namespace (so no other test is touched) and deleted at the end;
- its controller admits a Job by patching ``suspend: false`` once the queue
  has quota: the test does that, two Jobs at a time, for five runs.

What must hold: the waiting runs say Pending/Queued naming the queue; the
controller never writes a queued Job (the audit log has no patch or update of
a Job by the controller's user); admitted runs go on to Succeeded.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client

from hack.cluster import LocalCluster, mutating_policy
from hack.controllerproc import ControllerProcess, controller_user
from tests.kubehelpers import eventually
from tests.runs import Runs, condition, inference_config, inference_run, status

OK = "test.local/fake-ok:1"
QUEUE = "team-a"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
QUOTA = 2
RUNS = 5


def kueue_webhook_stand_in(namespace: str) -> list[dict[str, Any]]:
    """A MutatingAdmissionPolicy suspending queued Jobs at CREATE, in ``namespace`` only."""
    name = f"ksc-test-kueue-{namespace}"[:253]
    return mutating_policy(
        name,
        "Object{spec: Object.spec{suspend: true}}",
        group="batch",
        resource="jobs",
        namespaces={"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        conditions={
            "queued": f"has(object.metadata.labels) && '{QUEUE_LABEL}' in object.metadata.labels"
        },
    )


def probe_job(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "policy-probe", "namespace": namespace, "labels": {QUEUE_LABEL: "x"}},
        "spec": {
            "suspend": False,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "c", "image": OK}],
                }
            },
        },
    }


@pytest.fixture
def kueue_webhook(cluster: LocalCluster, namespace: str) -> Iterator[None]:
    manifest = yaml.safe_dump_all(kueue_webhook_stand_in(namespace))
    cluster.kubectl("apply", "-f", "-", input=manifest)
    try:
        yield
    finally:
        cluster.kubectl("delete", "--ignore-not-found", "-f", "-", input=manifest)


async def _policy_in_force(cluster: LocalCluster, namespace: str) -> None:
    """Admission policies take effect once the API server's informer has them: wait."""

    async def suspends() -> bool:
        done = cluster.kubectl(
            "create", "--dry-run=server", "-o", "json", "-f", "-",
            input=json.dumps(probe_job(namespace)),
        )  # fmt: skip
        return bool(json.loads(done.stdout)["spec"].get("suspend"))

    await eventually(suspends, within=30, interval=0.5, what="the Kueue stand-in policy")


async def _jobs(api: client.ApiClient, namespace: str) -> dict[str, Any]:
    """The runs' Jobs by run name."""
    found = await client.BatchV1Api(api).list_namespaced_job(namespace, label_selector=QUEUE_LABEL)
    return {j.metadata.labels["ai.krateo.io/inference-run"]: j for j in found.items}


def _queued(run: dict[str, Any]) -> bool:
    st = status(run)
    ready = condition(run, "Ready") or {}
    reconciling = condition(run, "Reconciling") or {}
    stalled = condition(run, "Stalled") or {}
    return (
        st.get("phase") == "Pending"
        and st.get("reason") == "Queued"
        and f"queue {QUEUE}" in (st.get("message") or "")
        and (ready.get("status"), ready.get("reason")) == ("False", "Queued")
        and (reconciling.get("status"), reconciling.get("reason")) == ("True", "Queued")
        and stalled.get("status") == "False"
    )


async def test_runs_wait_for_kueue_and_the_controller_never_unsuspends_them(
    api_client: client.ApiClient,
    namespace: str,
    cluster: LocalCluster,
    kueue_webhook: None,
    controller: ControllerProcess,
) -> None:
    await _policy_in_force(cluster, namespace)
    runs = Runs(api_client, namespace)
    created = await runs.create(inference_config("cfg", OK, queueName=QUEUE))
    assert created["spec"]["queueName"] == QUEUE  # kept by the CRD's schema, not pruned
    names = [f"r{i}" for i in range(RUNS)]
    for name in names:
        await runs.create(inference_run(name, "cfg", timeoutSeconds=120))

    for name in names:
        try:
            await runs.wait(name, _queued, within=90, what=f"{name} Pending/Queued in {QUEUE}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {status(await runs.get(name) or {})}") from None
    jobs = await _jobs(api_client, namespace)
    assert sorted(jobs) == names
    assert all(j.spec.suspend for j in jobs.values())
    assert all(j.metadata.labels[QUEUE_LABEL] == QUEUE for j in jobs.values())

    batch = client.BatchV1Api(api_client)
    waiting = list(names)
    while waiting:
        admitted, waiting = waiting[:QUOTA], waiting[QUOTA:]
        for name in admitted:  # as Kueue's controller admits a workload
            await batch.patch_namespaced_job(
                jobs[name].metadata.name, namespace, {"spec": {"suspend": False}}
            )
        for name in admitted:
            done = await runs.wait_phase(name, "Succeeded")
            assert status(done)["result"]["rows"] == 3
            assert condition(done, "Complete")["status"] == "True"  # type: ignore[index]
        # Quota in use until now: the others really waited, and still do.
        for name in waiting:
            run = await runs.get(name)
            assert run is not None
            assert _queued(run), status(run)
        current = await _jobs(api_client, namespace)
        assert all(current[name].spec.suspend for name in waiting)

    for name in names:
        assert status(await runs.get(name) or {})["phase"] == "Succeeded"

    # The controller never wrote a Job after creating it: suspend was only Kueue's (the test's).
    controller_username = controller_user(namespace)

    def job_writes(user: str) -> list[str]:
        return [
            (e.get("objectRef") or {}).get("name", "")
            for e in cluster.audit_events()
            if e.get("user", {}).get("username") == user
            and e.get("verb") in ("patch", "update")
            and (e.get("objectRef") or {}).get("resource") == "jobs"
            and (e.get("objectRef") or {}).get("namespace") == namespace
        ]

    async def admin_patches_logged() -> bool:
        # The audit log is written asynchronously: the test's own patches show it is complete.
        return len(job_writes(cluster.users["admin"].name)) >= RUNS

    await eventually(
        admin_patches_logged, within=30, what="the test's Job patches in the audit log"
    )
    assert job_writes(controller_username) == []
    creates = [
        e
        for e in cluster.audit_events()
        if e.get("user", {}).get("username") == controller_username
        and e.get("verb") == "create"
        and (e.get("objectRef") or {}).get("resource") == "jobs"
        and (e.get("objectRef") or {}).get("namespace") == namespace
    ]
    assert len(creates) == RUNS
