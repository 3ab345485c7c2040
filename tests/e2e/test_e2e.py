"""The whole system as a user meets it, on the local control plane.

The controller runs under the chart's RBAC; the node agent runs the real
runner (``python -m runner``) for the runner image, with a TokenRequest token
of the chart's runner ServiceAccount, so the runner reads its endpoint Secret
through the API exactly as in a cluster; KServe's own model server and the
finops-database-handler look-alike serve on loopback.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from hack.cluster import LocalCluster
from hack.model_server import ttm_forecast
from hack.storage_service import StorageService
from tests import chart
from tests.controllerproc import ControllerProcess
from tests.kubehelpers import eventually
from tests.runs import Runs, condition, status
from tests.servers import ModelServer, free_port

RUNNER_IMAGE = "ghcr.io/krateoplatformops/kserve-krateo-runner:0.1.0"
SECRET = "finops-database-handler-endpoint"
USER, PASSWORD = "finops", "e2e-storage-pw-91c2"


@pytest.fixture
async def storage(tmp_path: Path) -> AsyncIterator[StorageService]:
    service = StorageService(tmp_path / "storage.sqlite", USER, PASSWORD)
    await service.start()
    try:
        yield service
    finally:
        await service.stop()


async def endpoint_secret(api: client.ApiClient, namespace: str, url: str) -> None:
    def b64(text: str) -> str:
        return base64.b64encode(text.encode()).decode()

    await client.CoreV1Api(api).create_namespaced_secret(
        namespace,
        {
            "metadata": {"name": SECRET},
            "data": {"server-url": b64(url), "username": b64(USER), "password": b64(PASSWORD)},
        },
    )


def krateo(path: str, secret: str = SECRET, namespace: str | None = None) -> dict[str, Any]:
    ref: dict[str, str] = {"name": secret}
    if namespace:
        ref["namespace"] = namespace
    return {
        "krateo": {
            "api": {
                "endpointRef": ref,
                "path": path,
                "verb": "POST",
                "headers": ["Accept: application/json", "Content-Type: application/json"],
            }
        }
    }


def iris_config(
    name: str, model_url: str, *, policy: str = "None", secret: str = SECRET, **spec: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "ai.krateo.io/v1",
        "kind": "InferenceConfig",
        "metadata": {"name": name},
        "spec": {
            "image": RUNNER_IMAGE,
            "autoDeletePolicy": policy,
            "kserve": {
                "modelName": "sklearn-iris",
                "modelUrl": model_url,
                "modelVersion": "v2",
                "modelInputName": "input-0",
            },
            "storage": {
                "input": krateo("/compute/sklearninput", secret),
                "output": krateo("/compute/sklearnoutput", secret),
            },
            **spec,
        },
    }


def iris_run(name: str, config: str, output: str = "predictions", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "ai.krateo.io/v1",
        "kind": "InferenceRun",
        "metadata": {"name": name},
        "spec": {
            "configRef": {"name": config},
            "timeoutSeconds": 120,
            "parameters": {"input_table_name": "iris", "output_table_name": output},
            **spec,
        },
    }


def model_url(model_server: ModelServer, model: str = "sklearn-iris") -> str:
    # No scheme, like upstream's examples: the runner adds http://.
    return model_server.infer_url(model).removeprefix("http://")


@pytest.fixture
async def iris(
    api_client: client.ApiClient, namespace: str, storage: StorageService
) -> list[list[float]]:
    await endpoint_secret(api_client, namespace, storage.url)
    return storage.seed_iris("iris")


def table_exists(storage: StorageService, table: str) -> bool:
    with contextlib.closing(storage.connect()) as db:
        found = db.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
        ).fetchone()
    return found is not None


async def runner_pod_uids(api: client.ApiClient, namespace: str, run_uid: str) -> set[str]:
    pods = await client.CoreV1Api(api).list_namespaced_pod(
        namespace, label_selector=f"ai.krateo.io/run-uid={run_uid}"
    )
    return {p.metadata.uid for p in pods.items}


async def test_iris_one_shot_stores_one_prediction_per_row(
    api_client: client.ApiClient,
    namespace: str,
    controller: ControllerProcess,
    cluster: LocalCluster,
    model_server: ModelServer,
    storage: StorageService,
    iris: list[list[float]],
) -> None:
    runs = Runs(api_client, namespace)
    await runs.create(iris_config("iris-config", model_url(model_server)))
    created = await runs.create(iris_run("iris-run", "iris-config"))
    done = await runs.wait_phase("iris-run", "Succeeded", within=90)
    st = status(done)
    assert st["result"]["rows"] == len(iris) == 150
    assert st["result"]["predictions"] == 150
    assert st["startTime"]
    assert st["completionTime"]
    assert condition(done, "Complete")["status"] == "True"  # type: ignore[index]
    waited = cluster.kubectl(
        "wait", "-n", namespace, "--for=condition=Complete", "infrun/iris-run", "--timeout=5s"
    )
    assert waited.returncode == 0

    stored = storage.predictions("predictions")
    assert len(stored) == 150
    pod_uids = await runner_pod_uids(api_client, namespace, created["metadata"]["uid"])
    assert {(job, pod) for job, pod, _, _ in stored} == {
        (created["metadata"]["uid"], next(iter(pod_uids)))
    }
    assert sorted(counter for *_, counter in stored) == list(range(150))
    # The decision tree learned iris: three classes, in the data's order.
    assert {value for _, _, value, _ in stored} == {0.0, 1.0, 2.0}


async def test_ttm_shaped_run_through_the_same_runner_image(
    api_client: client.ApiClient,
    namespace: str,
    controller: ControllerProcess,
    model_server: ModelServer,
    storage: StorageService,
) -> None:
    await endpoint_secret(api_client, namespace, storage.url)
    points = [("vm-1", float(i % 23), 60.0 * i) for i in range(520)]
    storage.seed_series("usage", "average", "resourceid", points)
    config = iris_config("ttm-config", model_url(model_server, "ttm"))
    config["spec"]["kserve"] = {"modelName": "ttm", "modelUrl": model_url(model_server, "ttm")}
    config["spec"]["storage"] = {
        "input": krateo("/compute/tritoninput"),
        "output": krateo("/compute/tritonoutput"),
    }
    runs = Runs(api_client, namespace)
    await runs.create(config)
    run = iris_run("ttm-run", "ttm-config")
    run["spec"]["parameters"] = {
        "input_table_name": "usage",
        "input_data_length": "512",
        "input_table_column_name": "average",
        "key_name": "resourceid",
        "key_value": "vm-1",
        "output_table_name": "forecast",
    }
    await runs.create(run)
    done = await runs.wait_phase("ttm-run", "Succeeded", within=90)
    assert status(done)["result"]["predictions"] == 96
    series = [float(i % 23) for i in range(520)][-512:]
    expected = [float(v) for v in ttm_forecast([series]).ravel()]
    assert [v for _, _, v, _ in storage.predictions("forecast")] == pytest.approx(expected)


@pytest.mark.timeout(240)
async def test_iris_scheduled_executions_and_suspend(
    api_client: client.ApiClient,
    namespace: str,
    controller: ControllerProcess,
    model_server: ModelServer,
    storage: StorageService,
    iris: list[list[float]],
) -> None:
    runs = Runs(api_client, namespace)
    await runs.create(iris_config("iris-config", model_url(model_server)))
    created = await runs.create(iris_run("hourly", "iris-config", schedule="* * * * *"))
    executed = await runs.wait(
        "hourly",
        lambda r: (status(r).get("lastExecution") or {}).get("phase") == "Succeeded",
        within=150,
        what="a successful scheduled execution",
    )
    st = status(executed)
    assert st["lastScheduleTime"]
    assert st["result"]["predictions"] == 150
    stored = storage.predictions("predictions")
    pods = {pod for _, pod, _, _ in stored}
    assert pods  # each execution stores under its own pod_uid
    assert len(stored) == 150 * len(pods)
    assert {job for job, _, _, _ in stored} == {created["metadata"]["uid"]}

    await runs.patch("hourly", {"spec": {"suspend": True}})
    await runs.wait_phase("hourly", "Suspended", within=20)
    batch = client.BatchV1Api(api_client)
    before = len((await batch.list_namespaced_job(namespace)).items)
    await asyncio.sleep(65)  # a full minute boundary passes while suspended
    after = len((await batch.list_namespaced_job(namespace)).items)
    assert after <= before


async def test_auto_delete_on_success_removes_everything(
    api_client: client.ApiClient,
    namespace: str,
    controller: ControllerProcess,
    model_server: ModelServer,
    storage: StorageService,
    iris: list[list[float]],
) -> None:
    runs = Runs(api_client, namespace)
    await runs.create(iris_config("cfg", model_url(model_server), policy="DeleteOnSuccess"))
    created = await runs.create(iris_run("gone", "cfg"))
    await runs.wait_gone("gone", within=90)
    assert len(storage.predictions("predictions")) == 150

    async def no_children() -> bool:
        return not await runner_pod_uids(api_client, namespace, created["metadata"]["uid"]) and (
            not (
                await client.BatchV1Api(api_client).list_namespaced_job(
                    namespace, label_selector=f"ai.krateo.io/run-uid={created['metadata']['uid']}"
                )
            ).items
        )

    await eventually(no_children, within=60, what="Job and pods of the deleted run gone")


async def test_model_down_fails_with_the_runner_message_and_an_event(
    api_client: client.ApiClient,
    namespace: str,
    controller: ControllerProcess,
    storage: StorageService,
    iris: list[list[float]],
) -> None:
    runs = Runs(api_client, namespace)
    closed = f"127.0.0.1:{free_port()}/v2/models/sklearn-iris/infer"
    config = iris_config(
        "cfg",
        closed,
        policy="DeleteOnSuccess",  # a failed run is kept
        batching={"maxRetries": 1, "requestTimeoutSeconds": 2},
    )
    await runs.create(config)
    await runs.create(iris_run("down", "cfg", backoffLimit=0))
    failed = await runs.wait_phase("down", "Failed", within=90)
    st = status(failed)
    assert st["reason"] == "InferenceFailed"
    assert st["message"].startswith("runner exited with code 4: ")
    assert "127.0.0.1" in st["message"]
    assert not table_exists(storage, "predictions")

    async def warning() -> list[Any] | None:
        events = await client.CoreV1Api(api_client).list_namespaced_event(
            namespace, field_selector="involvedObject.name=down,type=Warning"
        )
        return [e for e in events.items if e.reason == "InferenceFailed"] or None

    (event,) = await eventually(warning, what="a Warning event with the runner's reason")
    assert "runner exited with code 4" in event.message


async def test_storage_200_with_error_is_a_failure(
    api_client: client.ApiClient,
    namespace: str,
    controller: ControllerProcess,
    model_server: ModelServer,
    storage: StorageService,
    iris: list[list[float]],
) -> None:
    runs = Runs(api_client, namespace)
    await runs.create(iris_config("cfg", model_url(model_server)))
    # The output notebook fails on this table name; the handler still answers 200.
    await runs.create(iris_run("lost", "cfg", output="bad name;", backoffLimit=0))
    failed = await runs.wait_phase("lost", "Failed", within=90)
    # The storage answered the write with an error text: no retry can fix that.
    assert status(failed)["reason"] == "OutputRejected"
    assert "runner exited with code 8" in status(failed)["message"]


async def test_bad_secret_reference_fails_clearly(
    api_client: client.ApiClient,
    namespace: str,
    controller: ControllerProcess,
    model_server: ModelServer,
    storage: StorageService,
    iris: list[list[float]],
) -> None:
    runs = Runs(api_client, namespace)
    await runs.create(iris_config("cfg", model_url(model_server), secret="no-such-secret"))
    await runs.create(iris_run("nosecret", "cfg", backoffLimit=0))
    failed = await runs.wait_phase("nosecret", "Failed", within=90)
    st = status(failed)
    assert st["reason"] == "InputFailed"
    assert "no-such-secret" in st["message"]
    assert PASSWORD not in json.dumps(failed)


async def test_timeout_is_deadline_exceeded(
    api_client: client.ApiClient,
    namespace: str,
    controller: ControllerProcess,
    model_server: ModelServer,
    storage: StorageService,
    iris: list[list[float]],
) -> None:
    runs = Runs(api_client, namespace)
    await runs.create(iris_config("cfg", model_url(model_server)))
    await runs.create(iris_run("late", "cfg", timeoutSeconds=1))
    failed = await runs.wait_phase("late", "Failed", within=60)
    assert status(failed)["reason"] == "DeadlineExceeded"


async def test_runner_service_account_reads_secrets_but_cannot_list_them(
    cluster: LocalCluster, namespace: str, controller: ControllerProcess
) -> None:
    sa = f"system:serviceaccount:{namespace}:{chart.RUNNER_SERVICE_ACCOUNT}"
    can = cluster.kubectl(
        "auth", "can-i", "get", "secrets", "-n", namespace, "--as", sa, check=False
    )
    assert can.stdout.strip() == "yes"
    for verb in ("list", "watch"):
        cannot = cluster.kubectl(
            "auth", "can-i", verb, "secrets", "-n", namespace, "--as", sa, check=False
        )
        assert cannot.stdout.strip() == "no"
    other = cluster.kubectl(
        "auth", "can-i", "get", "secrets", "-n", "default", "--as", sa, check=False
    )
    assert other.stdout.strip() == "no"
