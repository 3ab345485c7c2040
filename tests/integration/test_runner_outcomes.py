"""How runner pods ended, on the real control plane: lost nodes, OOM kills, deadlines, retries.

The runner pods of these tests are bound, at admission, to a Node that no
agent runs (a MutatingAdmissionPolicy sets ``spec.nodeName``, as a scheduler's
webhook would): nobody answers for them, as for a node that is gone. The test
then writes what a kubelet, the node lifecycle controller and the taint
manager would write (the pod's status and conditions, its deletion), and the
real Job controller, pod garbage collector and controller do the rest.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from hack.cluster import SUCCESS_MESSAGE, mutating_policy
from hack.controllerproc import ControllerProcess
from tests.integration.test_health_tools import argo_health
from tests.kubehelpers import eventually, wait_for_events
from tests.runs import Runs, condition, inference_config, inference_run, status

Obj = dict[str, Any]
# Never run: the pods stay on the Node nobody runs.
IMAGE = "test.local/fake-slow:1"
OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"
STARTED = "2026-01-01T00:00:00Z"


@pytest.fixture
async def lost_node(api_client: client.ApiClient, namespace: str) -> AsyncIterator[str]:
    """A Node without a kubelet, where the namespace's Job pods are placed at admission."""
    name = f"lost-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(api_client)
    admission = client.AdmissionregistrationV1Api(api_client)
    await core.create_node({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}})
    policy, binding = mutating_policy(
        name,
        f'Object{{spec: Object.spec{{nodeName: "{name}"}}}}',
        namespaces={"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        conditions={
            "job-pod": 'has(object.metadata.labels) && "job-name" in object.metadata.labels'
        },
    )
    await admission.create_mutating_admission_policy(policy)
    await admission.create_mutating_admission_policy_binding(binding)
    try:
        await _wait_policy(core, namespace, name)
        yield name
    finally:
        await admission.delete_mutating_admission_policy_binding(name)
        await admission.delete_mutating_admission_policy(name)
        # Nobody confirms the deletion of pods there: force it, then drop the Node.
        for pod in (await core.list_namespaced_pod(namespace)).items:
            try:
                await core.delete_namespaced_pod(
                    pod.metadata.name, namespace, grace_period_seconds=0
                )
            except ApiException as exc:
                if exc.status != 404:
                    raise
        await core.delete_node(name)


async def _wait_policy(core: client.CoreV1Api, namespace: str, node: str) -> None:
    """Until the API server applies the new policy (its admission caches lag a moment)."""
    probe = {
        "metadata": {"name": "probe", "labels": {"job-name": "probe"}},
        "spec": {"containers": [{"name": "probe", "image": "probe"}]},
    }

    async def placed() -> bool:
        pod = await core.create_namespaced_pod(namespace, probe, dry_run="All")
        return bool(pod.spec.node_name == node)

    await eventually(placed, within=60, what="the placement policy in effect")


async def runner_pod(api: client.ApiClient, namespace: str, run_uid: str) -> Obj:
    core = client.CoreV1Api(api)

    async def found() -> Obj | None:
        pods = await core.list_namespaced_pod(
            namespace, label_selector=f"ai.krateo.io/run-uid={run_uid}"
        )
        live = [p for p in pods.items if p.metadata.deletion_timestamp is None]
        return api.sanitize_for_serialization(live[0]) if live else None

    return await eventually(found, within=60, what="the run's runner pod")


async def write_pod_status(core: client.CoreV1Api, pod: Obj, status_: Obj) -> None:
    meta = pod["metadata"]
    await core.patch_namespaced_pod_status(meta["name"], meta["namespace"], {"status": status_})


def kubelet_running(ready: bool = True) -> Obj:
    """What a kubelet reports of a running runner (``ready``: before the node is lost)."""
    return {
        "phase": "Running",
        "startTime": STARTED,
        "conditions": [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Initialized", "status": "True"},
            {"type": "ContainersReady", "status": "True"},
            {"type": "Ready", "status": "True" if ready else "False"},
        ],
        "containerStatuses": [
            {
                "name": "inference",
                "image": IMAGE,
                "imageID": "",
                "ready": ready,
                "restartCount": 0,
                "started": True,
                "state": {"running": {"startedAt": STARTED}},
            }
        ],
    }


async def setup(
    runs: Runs, api_client: client.ApiClient, *, unkeyed: str | None = None, **spec: Any
) -> tuple[Obj, Obj]:
    """A config (output not keyed) and run ``r``; the run's first runner pod."""
    config = inference_config("cfg", IMAGE)
    config["spec"]["resources"] = {"limits": {"memory": "96Mi"}}
    if unkeyed is not None:
        config["spec"]["unkeyedOutputRetries"] = unkeyed
    await runs.create(config)
    created = await runs.create(inference_run("r", "cfg", **spec))
    pod = await runner_pod(api_client, runs.namespace, created["metadata"]["uid"])
    return created, pod


@pytest.mark.timeout(300)
async def test_a_runner_on_a_lost_node_is_node_lost_until_the_out_of_service_taint(
    api_client: client.ApiClient,
    namespace: str,
    lost_node: str,
    controller: ControllerProcess,
    runs: Runs,
) -> None:
    core = client.CoreV1Api(api_client)
    created, pod = await setup(runs, api_client, backoffLimit=2)
    assert pod["spec"]["nodeName"] == lost_node

    # The kubelet said the runner runs; the run is Running (Ready only once it succeeds).
    await write_pod_status(core, pod, kubelet_running())
    running = await runs.wait_phase("r", "Running", within=60)
    ready = condition(running, "Ready") or {}
    assert (ready.get("status"), ready.get("reason")) == ("False", "Running")

    # The node stops reporting: the node lifecycle controller marks its pods not Ready.
    ready_false = {"type": "Ready", "status": "False", "lastTransitionTime": STARTED}
    await write_pod_status(core, pod, {"conditions": [ready_false]})
    not_ready = await runs.wait_reason("r", "NodeNotReady", within=60)
    assert lost_node in status(not_ready)["message"]

    # The taint manager evicts it after the toleration: DisruptionTarget, then a delete
    # that no kubelet confirms. The pod stays Terminating; the Job starts none other.
    evicted = {
        "type": "DisruptionTarget",
        "status": "True",
        "reason": "DeletionByTaintManager",
        "message": "Taint manager: deleting due to NoExecute taint",
        "lastTransitionTime": STARTED,
    }
    await write_pod_status(core, pod, {"conditions": [ready_false, evicted]})
    await core.delete_namespaced_pod(pod["metadata"]["name"], namespace, grace_period_seconds=30)
    lost = await runs.wait_reason("r", "NodeLost", within=60)
    message = status(lost)["message"]
    assert status(lost)["phase"] == "Running"
    assert pod["metadata"]["name"] in message
    assert f"kubectl taint node {lost_node} {OUT_OF_SERVICE}=nodeshutdown:NoExecute" in message
    ready = condition(lost, "Ready") or {}
    assert (ready.get("status"), ready.get("reason")) == ("False", "NodeLost")
    # It needs someone to act: Argo CD shows it Degraded, with the message.
    assert argo_health(lost) == ("Degraded", message)
    await wait_for_events(api_client, namespace, "r", "NodeLost", what="a NodeLost Event")

    # The operator marks the node out of service: the pod garbage collector deletes
    # the pod, the Job starts another, and the run is no longer NodeLost.
    await core.patch_node(
        lost_node,
        {
            "spec": {
                "taints": [{"key": OUT_OF_SERVICE, "value": "nodeshutdown", "effect": "NoExecute"}]
            }
        },
    )

    async def replaced() -> bool:
        pods = await core.list_namespaced_pod(
            namespace, label_selector=f"ai.krateo.io/run-uid={created['metadata']['uid']}"
        )
        uids = {p.metadata.uid for p in pods.items}
        return bool(uids) and pod["metadata"]["uid"] not in uids

    await eventually(replaced, within=120, what="the lost pod gone and another started")
    moved_on = await runs.wait(
        "r", lambda r: status(r).get("reason") != "NodeLost", within=60, what="not NodeLost"
    )
    assert status(moved_on)["phase"] in ("Pending", "Running")


@pytest.mark.timeout(180)
async def test_an_oom_killed_runner_fails_the_run_as_oom_killed_with_its_memory_limit(
    api_client: client.ApiClient,
    namespace: str,
    lost_node: str,
    controller: ControllerProcess,
    runs: Runs,
) -> None:
    core = client.CoreV1Api(api_client)
    _, pod = await setup(runs, api_client, backoffLimit=0)
    await write_pod_status(core, pod, kubelet_running())
    await runs.wait_phase("r", "Running", within=60)
    # What a kubelet reports of a container the kernel killed for its memory.
    killed = kubelet_running(ready=False)
    killed["phase"] = "Failed"
    killed["containerStatuses"][0]["state"] = {
        "terminated": {
            "exitCode": 137,
            "reason": "OOMKilled",
            "startedAt": STARTED,
            "finishedAt": STARTED,
        }
    }
    await write_pod_status(core, pod, killed)
    failed = await runs.wait_phase("r", "Failed", within=60)
    assert status(failed)["reason"] == "OOMKilled"
    assert "memory limit of 96Mi" in status(failed)["message"]
    assert (condition(failed, "Failed") or {}).get("reason") == "OOMKilled"


@pytest.mark.timeout(180)
async def test_a_deadline_that_ends_a_pending_run_keeps_why_it_was_pending(
    namespace: str, controller: ControllerProcess, runs: Runs
) -> None:
    # The node agent has no command for this image: the pod waits in ErrImagePull.
    await runs.create(inference_config("cfg", "test.local/no-such-image:1"))
    await runs.create(inference_run("r", "cfg", timeoutSeconds=8))
    pending = await runs.wait_reason("r", "ErrImagePull", within=60)
    assert status(pending)["phase"] == "Pending"
    failed = await runs.wait_phase("r", "Failed", within=90)
    assert status(failed)["reason"] == "DeadlineExceeded"
    assert "it was pending: ErrImagePull" in status(failed)["message"]
    assert "it was pending: ErrImagePull" in (condition(failed, "Failed") or {}).get("message", "")


def kubelet_ended(code: int, message: str) -> Obj:
    """What a kubelet reports of a runner that exited with ``code``, leaving ``message``."""
    ended = kubelet_running(ready=False)
    ended["phase"] = "Succeeded" if code == 0 else "Failed"
    ended["containerStatuses"][0]["state"] = {
        "terminated": {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "message": message,
            "startedAt": STARTED,
            "finishedAt": STARTED,
        }
    }
    return ended


async def next_runner_pod(api: client.ApiClient, namespace: str, run_uid: str, after: Obj) -> Obj:
    """The run's runner pod that the Job started after ``after``."""
    core = client.CoreV1Api(api)

    async def found() -> Obj | None:
        pods = await core.list_namespaced_pod(
            namespace, label_selector=f"ai.krateo.io/run-uid={run_uid}"
        )
        new = [p for p in pods.items if p.metadata.uid != after["metadata"]["uid"]]
        return api.sanitize_for_serialization(new[0]) if new else None

    return await eventually(found, within=60, what="the Job's next runner pod")


@pytest.mark.timeout(240)
async def test_a_run_whose_output_two_attempts_wrote_warns_of_duplicates(
    api_client: client.ApiClient,
    namespace: str,
    lost_node: str,
    controller: ControllerProcess,
    runs: Runs,
) -> None:
    core = client.CoreV1Api(api_client)
    created, first = await setup(runs, api_client, backoffLimit=2)
    # The first attempt stored part of its output, then failed: the Job tries again.
    await write_pod_status(core, first, kubelet_ended(5, "output: storage answered 503"))
    await runs.wait_reason("r", "Retrying", within=60)
    second = await next_runner_pod(api_client, namespace, created["metadata"]["uid"], first)
    await write_pod_status(core, second, kubelet_ended(0, SUCCESS_MESSAGE))
    done = await runs.wait_phase("r", "Succeeded", within=60)
    assert status(done)["result"]["attempts"] == 2
    assert status(done)["result"]["rows"] == 3
    warning = condition(done, "Warning") or {}
    assert (warning.get("status"), warning.get("reason")) == ("True", "OutputMayHoldDuplicates")
    assert "output may hold rows twice: attempt 2 restarted from row 0" in warning["message"]
    await wait_for_events(
        api_client, namespace, "r", "OutputMayHoldDuplicates", what="the duplicates Warning Event"
    )


@pytest.mark.timeout(180)
async def test_unkeyed_output_retries_never_fails_the_run_at_its_first_failed_attempt(
    api_client: client.ApiClient,
    namespace: str,
    lost_node: str,
    controller: ControllerProcess,
    runs: Runs,
) -> None:
    core = client.CoreV1Api(api_client)
    created, first = await setup(runs, api_client, unkeyed="Never", backoffLimit=2)
    job = (
        await client.BatchV1Api(api_client).list_namespaced_job(
            namespace, label_selector=f"ai.krateo.io/run-uid={created['metadata']['uid']}"
        )
    ).items[0]
    assert job.spec.backoff_limit == 0
    await write_pod_status(core, first, kubelet_ended(5, "output: storage answered 503"))
    failed = await runs.wait_phase("r", "Failed", within=60)
    assert status(failed)["reason"] == "OutputFailed"
    assert "storage answered 503" in status(failed)["message"]
