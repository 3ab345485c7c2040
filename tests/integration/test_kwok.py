"""The simulated-node harness of the scale bench (hack/kwok.py) on the shared control plane.

Two kwok instances beside the suite's node agent, each with its own labelled
Nodes and namespaces: one whose pods all succeed, one whose configured failure
share is 1 (pods fail). Job pods of a labelled namespace are placed on that
instance's Nodes at admission, so the node agent never binds them.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from hack.cluster import SUCCESS_MESSAGE, LocalCluster
from hack.controllerproc import ControllerProcess
from hack.kwok import FAILURE_EXIT_CODE, FAILURE_MESSAGE, Kwok
from kubeclient.client import KubeClient
from kubeclient.resources import JOBS, PODS
from tests.kubehelpers import job_manifest
from tests.runs import Runs, inference_config, inference_run, status

Obj = dict[str, Any]


@pytest.fixture
def kwok_ok(cluster: LocalCluster, tmp_path: Path) -> Iterator[Kwok]:
    with Kwok(cluster, tmp_path / "kwok-ok", nodes=2, pending_seconds=0.3, run_seconds=0.5) as kwok:
        yield kwok


@pytest.fixture
def kwok_failing(cluster: LocalCluster, tmp_path: Path) -> Iterator[Kwok]:
    with Kwok(
        cluster, tmp_path / "kwok-failing", nodes=1, run_seconds=0.3, failure_share=1.0
    ) as kwok:
        yield kwok


async def label(api: client.ApiClient, namespace: str, kwok: Kwok) -> None:
    patch = {"metadata": {"labels": kwok.namespace_labels()}}
    await client.CoreV1Api(api).patch_namespace(namespace, patch)


async def pod_phases(kube: KubeClient, namespace: str, selector: str) -> tuple[list[str], Obj]:
    """Phases of the first pod matching ``selector`` as a watch sees them, until it ends."""
    phases: list[str] = []
    while True:
        listed = await kube.list(PODS, namespace, label_selector=selector)
        if listed["items"]:
            pod = listed["items"][0]
            phases.append(pod["status"].get("phase", ""))
            if phases[-1] in ("Succeeded", "Failed"):
                return phases, pod
        rv = listed["metadata"]["resourceVersion"]
        async for event in kube.watch(
            PODS, namespace, resource_version=rv, label_selector=selector, timeout_seconds=30
        ):
            if event["type"] not in ("ADDED", "MODIFIED"):
                continue
            pod = event["object"]
            phase = pod["status"].get("phase", "")
            if not phases or phases[-1] != phase:
                phases.append(phase)
            if phase in ("Succeeded", "Failed"):
                return phases, pod


def job(name: str) -> Obj:
    return job_manifest(name, [{"name": "inference", "image": "kwok.invalid/none:1"}])


def terminated(pod: Obj) -> Obj:
    return dict(pod["status"]["containerStatuses"][0]["state"]["terminated"])


async def test_job_pods_run_on_kwok_nodes_and_a_failure_share_fails_them(
    api_client: client.ApiClient,
    kube: KubeClient,
    namespace: str,
    kwok_ok: Kwok,
    kwok_failing: Kwok,
) -> None:
    await label(api_client, namespace, kwok_ok)
    other = f"kwok-failing-{uuid.uuid4().hex[:6]}"
    await client.CoreV1Api(api_client).create_namespace(
        {
            "metadata": {
                "name": other,
                "labels": {"ksc-test": "true", **kwok_failing.namespace_labels()},
            }
        }
    )
    try:
        await kube.create(JOBS, namespace, job("ok"))
        await kube.create(JOBS, other, job("bad"))
        (ok_phases, ok_pod), (bad_phases, bad_pod) = await asyncio.wait_for(
            asyncio.gather(
                pod_phases(kube, namespace, "batch.kubernetes.io/job-name=ok"),
                pod_phases(kube, other, "batch.kubernetes.io/job-name=bad"),
            ),
            60,
        )
    finally:
        await client.CoreV1Api(api_client).delete_namespace(other)

    assert ok_phases == ["Pending", "Running", "Succeeded"], ok_phases
    assert ok_pod["spec"]["nodeName"] in kwok_ok.node_names
    assert terminated(ok_pod)["exitCode"] == 0
    assert terminated(ok_pod)["message"] == SUCCESS_MESSAGE

    assert bad_phases[-1] == "Failed", bad_phases
    assert bad_pod["spec"]["nodeName"] in kwok_failing.node_names
    assert terminated(bad_pod)["exitCode"] == FAILURE_EXIT_CODE
    assert terminated(bad_pod)["message"] == FAILURE_MESSAGE


async def test_an_inference_run_succeeds_on_a_kwok_node(
    api_client: client.ApiClient,
    kube: KubeClient,
    namespace: str,
    kwok_ok: Kwok,
    controller: ControllerProcess,
) -> None:
    await label(api_client, namespace, kwok_ok)
    runs = Runs(api_client, namespace)
    await runs.create(inference_config("cfg", "kwok.invalid/runner:1"))
    created = await runs.create(inference_run("simulated", "cfg"))
    uid = created["metadata"]["uid"]

    done = await runs.wait_phase("simulated", "Succeeded", within=60)

    pods = (await kube.list(PODS, namespace, label_selector=f"ai.krateo.io/run-uid={uid}"))["items"]
    assert [p["spec"]["nodeName"] in kwok_ok.node_names for p in pods] == [True]
    # The result the controller read from the simulated runner's termination message.
    assert status(done)["result"] == {
        "rows": 3,
        "predictions": 3,
        "durationSeconds": 0.1,
        "attempts": 1,
    }
