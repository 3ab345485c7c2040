"""The local control plane behaves like a real cluster for everything the controller relies on."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from hack.cluster import LocalCluster, spawn, stop_process
from tests.kubehelpers import eventually, job_condition, job_manifest


def shell_job(name: str, script: str, **pod: Any) -> dict[str, Any]:
    return job_manifest(
        name, [{"name": "main", "image": "busybox", "command": ["sh", "-c", script]}], **pod
    )


async def job_pods(api: client.ApiClient, namespace: str, job: str) -> list[Any]:
    pods = await client.CoreV1Api(api).list_namespaced_pod(
        namespace, label_selector=f"job-name={job}"
    )
    return list(pods.items)


async def wait_job(api: client.ApiClient, namespace: str, name: str, condition: str) -> Any:
    batch = client.BatchV1Api(api)

    async def done() -> Any:
        job = await batch.read_namespaced_job(name, namespace)
        raw = api.sanitize_for_serialization(job)
        return raw if job_condition(raw, condition) else None

    return await eventually(done, within=60, what=f"Job {name} {condition}")


async def test_job_exit_zero_completes(api_client: client.ApiClient, namespace: str) -> None:
    await client.BatchV1Api(api_client).create_namespaced_job(
        namespace, shell_job("ok", "echo hello; exit 0")
    )
    job = await wait_job(api_client, namespace, "ok", "Complete")
    assert job["status"]["succeeded"] == 1
    (pod,) = await job_pods(api_client, namespace, "ok")
    terminated = pod.status.container_statuses[0].state.terminated
    assert terminated.exit_code == 0
    assert terminated.reason == "Completed"


async def test_job_exit_three_fails_with_exit_code_and_message(
    api_client: client.ApiClient, namespace: str
) -> None:
    # The termination message is written where the pod sees /dev/termination-log.
    script = 'printf "input table missing" > "$NODE_AGENT_ROOT/dev/termination-log"; exit 3'
    await client.BatchV1Api(api_client).create_namespaced_job(namespace, shell_job("bad", script))
    job = await wait_job(api_client, namespace, "bad", "Failed")
    assert job["status"]["failed"] == 1
    (pod,) = await job_pods(api_client, namespace, "bad")
    assert pod.status.phase == "Failed"
    terminated = pod.status.container_statuses[0].state.terminated
    assert terminated.exit_code == 3
    assert terminated.reason == "Error"
    assert terminated.message == "input table missing"


async def test_pod_sees_downward_api_uid_and_configmap_volume(
    api_client: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(api_client)
    await core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "contract"}, "data": {"contract.json": '{"jobId":"x"}'}}
    )
    script = (
        'test "$(cat "$NODE_AGENT_ROOT/tmp/contract.json")" = \'{"jobId":"x"}\' || exit 7; '
        'printf "%s" "$pod_uid" > "$NODE_AGENT_ROOT/dev/termination-log"'
    )
    job = shell_job(
        "env",
        script,
        volumes=[
            {"name": "contract", "configMap": {"name": "contract"}},
            {"name": "tmp", "emptyDir": {}},
        ],
    )
    container = job["spec"]["template"]["spec"]["containers"][0]
    container["env"] = [
        {"name": "pod_uid", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}
    ]
    container["volumeMounts"] = [
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "contract", "mountPath": "/tmp/contract.json", "subPath": "contract.json"},
    ]
    await client.BatchV1Api(api_client).create_namespaced_job(namespace, job)
    await wait_job(api_client, namespace, "env", "Complete")
    (pod,) = await job_pods(api_client, namespace, "env")
    assert pod.status.container_statuses[0].state.terminated.message == pod.metadata.uid


async def test_pod_logs_are_served_through_the_api(
    api_client: client.ApiClient, namespace: str, cluster: LocalCluster
) -> None:
    await client.BatchV1Api(api_client).create_namespaced_job(
        namespace, shell_job("logs", "echo first; echo second")
    )
    await wait_job(api_client, namespace, "logs", "Complete")
    (pod,) = await job_pods(api_client, namespace, "logs")
    tail = await client.CoreV1Api(api_client).read_namespaced_pod_log(
        pod.metadata.name, namespace, tail_lines=1
    )
    assert tail == "second\n"
    out = cluster.kubectl("logs", "-n", namespace, pod.metadata.name)
    assert out.stdout == "first\nsecond\n"


@pytest.mark.timeout(150)
async def test_cronjob_every_minute_produces_a_job(
    api_client: client.ApiClient, namespace: str
) -> None:
    cron = {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": "tick"},
        "spec": {
            "schedule": "* * * * *",
            "jobTemplate": {"spec": shell_job("x", "exit 0")["spec"]},
        },
    }
    created = await client.BatchV1Api(api_client).create_namespaced_cron_job(namespace, cron)

    async def owned_job() -> Any:
        jobs = await client.BatchV1Api(api_client).list_namespaced_job(namespace)
        return [
            j
            for j in jobs.items
            if any(o.uid == created.metadata.uid for o in j.metadata.owner_references or [])
        ]

    # The first minute boundary is at most 60 s away; the controller syncs every 10 s.
    (job,) = await eventually(owned_job, within=80, interval=1, what="a Job from the CronJob")
    await wait_job(api_client, namespace, job.metadata.name, "Complete")


async def test_deleting_owner_garbage_collects_owned_configmap(
    api_client: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(api_client)
    owner = await core.create_namespaced_config_map(namespace, {"metadata": {"name": "owner"}})
    ref = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "owner",
        "uid": owner.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }
    await core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "owned", "ownerReferences": [ref]}}
    )
    await core.delete_namespaced_config_map("owner", namespace)

    async def gone() -> bool:
        try:
            await core.read_namespaced_config_map("owned", namespace)
        except ApiException as e:
            return e.status == 404
        return False

    await eventually(gone, within=30, what="owned ConfigMap garbage-collected")


async def test_restricted_namespace_rejects_privileged_pod(
    api_client: client.ApiClient, restricted_namespace: str
) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "root"},
        "spec": {"containers": [{"name": "c", "image": "busybox", "command": ["true"]}]},
    }
    with pytest.raises(ApiException) as raised:
        await client.CoreV1Api(api_client).create_namespaced_pod(restricted_namespace, pod)
    assert raised.value.status == 403
    message = json.loads(raised.value.body)["message"]
    assert 'violates PodSecurity "restricted:latest"' in message
    assert "runAsNonRoot != true" in message


async def test_users_are_authenticated_and_audited(cluster: LocalCluster, namespace: str) -> None:
    # The controller user has no RBAC yet: its request is authenticated, then forbidden.
    denied = cluster.kubectl("get", "pods", "-n", namespace, user="controller", check=False)
    assert denied.returncode != 0
    assert 'User "kserve-inference-controller" cannot list resource "pods"' in denied.stderr
    events = cluster.audit_events("controller")
    assert any(e["verb"] == "list" and e["objectRef"]["namespace"] == namespace for e in events)


def test_a_child_spawned_from_a_short_lived_thread_outlives_that_thread(tmp_path: Path) -> None:
    """PR_SET_PDEATHSIG follows the forking thread: an API server restarted from
    asyncio.to_thread died with the event loop's executor and took the suite down."""

    async def start() -> subprocess.Popen[bytes]:
        return await asyncio.to_thread(spawn, ["sleep", "30"], tmp_path / "sleep.log")

    child = asyncio.run(start())  # the loop's executor thread ends here
    try:
        time.sleep(0.5)
        assert child.poll() is None, f"the child died with its thread: {child.returncode}"
    finally:
        stop_process(child, grace=0)
