"""A streaming run's runner killed mid-run through the node agent, resumed by the Job's next pod.

On the local control plane: the controller renders the Job, the node agent runs
the real runner (``python -m runner``) for its pod, reading the endpoint Secret
through the API. The storage look-alike holds the fifth prediction write, so the
runner is certainly mid-run when its pod is deleted (grace 0: the node agent
kills the process group at once). The Job controller starts another pod; it asks
the storage what the run already stored and predicts only the rest.
"""

from __future__ import annotations

import asyncio
import base64

import orjson
import pytest
from kubernetes_asyncio import client

from hack.cluster import LocalCluster
from hack.controllerproc import ControllerProcess
from hack.storage_service import IRIS_COLUMNS, StorageService
from tests.kubehelpers import eventually
from tests.runner.conftest import (
    STORAGE_PASSWORD,
    STORAGE_SECRET,
    STORAGE_USER,
    direct_iris,
    krateo_entry,
    random_iris_rows,
)
from tests.runs import Runs, inference_config, inference_run, status
from tests.servers import ModelServer

RUNNER_IMAGE = "ghcr.io/krateoplatformops/kserve-krateo-runner:0.1.0"
ROWS, PAGE = 3000, 250


def entry(path: str, **extra: object) -> dict[str, object]:
    krateo = krateo_entry(path, **extra)["krateo"]
    del krateo["api"]["endpointRef"]["namespace"]  # the run's own namespace
    return {"krateo": krateo}


async def runner_pods(api: client.ApiClient, namespace: str, run_uid: str) -> list[client.V1Pod]:
    pods = await client.CoreV1Api(api).list_namespaced_pod(
        namespace, label_selector=f"ai.krateo.io/run-uid={run_uid}"
    )
    return list(pods.items)


@pytest.mark.timeout(240)
async def test_a_runner_pod_deleted_mid_run_is_resumed_by_the_next_pod(
    api_client: client.ApiClient,
    namespace: str,
    controller: ControllerProcess,
    cluster: LocalCluster,
    model_server: ModelServer,
    storage: StorageService,
) -> None:
    rows = random_iris_rows(ROWS)
    storage.seed_table("big", IRIS_COLUMNS, rows)

    def b64(text: str) -> str:
        return base64.b64encode(text.encode()).decode()

    await client.CoreV1Api(api_client).create_namespaced_secret(
        namespace,
        {
            "metadata": {"name": STORAGE_SECRET},
            "data": {
                "server-url": b64(storage.url),
                "username": b64(STORAGE_USER),
                "password": b64(STORAGE_PASSWORD),
            },
        },
    )
    config = inference_config(
        "paged",
        RUNNER_IMAGE,
        storage={
            "input": entry("/compute/sklearninput", paging={"pageSize": PAGE}),
            "output": entry("/compute/sklearnoutput", resumePath="/compute/sklearnoutput"),
        },
    )
    config["spec"]["kserve"]["modelUrl"] = model_server.infer_url()
    runs = Runs(api_client, namespace)
    await runs.create(config)
    storage.hold_writes_after(4)
    run = inference_run("paged-run", "paged", timeoutSeconds=180, backoffLimit=2)
    run["spec"]["parameters"] = {"input_table_name": "big", "output_table_name": "out"}
    created = await runs.create(run)
    run_uid = created["metadata"]["uid"]

    await asyncio.wait_for(storage.writes_held.wait(), 90)
    (first,) = await runner_pods(api_client, namespace, run_uid)
    await client.CoreV1Api(api_client).delete_namespaced_pod(
        first.metadata.name, namespace, grace_period_seconds=0
    )

    async def first_gone() -> bool:
        pods = await runner_pods(api_client, namespace, run_uid)
        return all(p.metadata.uid != first.metadata.uid for p in pods)

    await eventually(first_gone, within=60, what="the killed pod gone")
    storage.release_writes()
    stored_when_killed = len(storage.keyed_predictions("out"))

    done = await runs.wait_phase("paged-run", "Succeeded", within=150)

    stored = storage.keyed_predictions("out")
    assert [counter for _, _, counter, _, _ in stored] == list(range(ROWS))
    assert len({key for _, _, _, key, _ in stored}) == ROWS
    assert {job for job, *_ in stored} == {run_uid}
    assert [value for *_, value in stored] == direct_iris(rows)
    assert status(done)["result"]["rows"] == ROWS
    assert status(done)["result"]["predictions"] == ROWS
    (second,) = [
        p
        for p in await runner_pods(api_client, namespace, run_uid)
        if p.status.phase == "Succeeded"
    ]
    assert second.metadata.uid != first.metadata.uid
    message = second.status.container_statuses[0].state.terminated.message
    result = orjson.loads(message)
    # The held write may have landed after the kill: resumed at 4 or 5 pages.
    assert result["resumedRows"] in (4 * PAGE, 5 * PAGE)
    assert result["resumedRows"] >= stored_when_killed - PAGE
    assert result["rows"] == ROWS
