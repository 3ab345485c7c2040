"""The whole system as a user meets it, on the local control plane.

The controller runs under the chart's RBAC; the node agent runs the real
runner (``python -m runner``) for the runner image, with a TokenRequest token
of the chart's runner ServiceAccount, so the runner reads its endpoint Secret
through the API exactly as in a cluster; KServe's own model server and the
finops-database-handler look-alike serve on loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

import pytest
from kubernetes_asyncio import client

from hack.cluster import LocalCluster
from hack.model_server import ttm_forecast
from hack.storage_service import StorageService
from tests import chart
from tests.e2e.conftest import E2E, PASSWORD, iris_config, iris_run, krateo
from tests.kubehelpers import eventually
from tests.runs import condition, status
from tests.servers import free_port


def table_exists(storage: StorageService, table: str) -> bool:
    with contextlib.closing(storage.connect()) as db:
        found = db.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
        ).fetchone()
    return found is not None


async def runner_pod_uids(e2e: E2E, run_uid: str) -> set[str]:
    pods = await client.CoreV1Api(e2e.api).list_namespaced_pod(
        e2e.namespace, label_selector=f"ai.krateo.io/run-uid={run_uid}"
    )
    return {p.metadata.uid for p in pods.items}


@pytest.mark.usefixtures("controller")
async def test_iris_one_shot_stores_one_prediction_per_row(
    e2e: E2E, cluster: LocalCluster, iris: list[list[float]]
) -> None:
    done = await e2e.finish(
        iris_config("iris-config", e2e.model_url()),
        iris_run("iris-run", "iris-config"),
        "Succeeded",
    )
    st = status(done)
    assert st["result"]["rows"] == len(iris) == 150
    assert st["result"]["predictions"] == 150
    assert st["startTime"]
    assert st["completionTime"]
    assert condition(done, "Complete")["status"] == "True"  # type: ignore[index]
    waited = cluster.kubectl(
        "wait", "-n", e2e.namespace, "--for=condition=Complete", "infrun/iris-run", "--timeout=5s"
    )
    assert waited.returncode == 0

    stored = e2e.storage.predictions("predictions")
    assert len(stored) == 150
    # One pod of this run wrote every prediction. Under load the Job may have
    # started a second pod (a first one failed before storing anything), so
    # the writer is one of the run's pods, not whichever the listing gives first.
    writers = {(job, pod) for job, pod, _, _ in stored}
    assert len(writers) == 1
    [(writer_job, writer_pod)] = writers
    assert writer_job == done["metadata"]["uid"]
    assert writer_pod in await runner_pod_uids(e2e, done["metadata"]["uid"])
    assert sorted(counter for *_, counter in stored) == list(range(150))
    # The decision tree learned iris: three classes, in the data's order.
    assert {value for _, _, value, _ in stored} == {0.0, 1.0, 2.0}


@pytest.mark.usefixtures("controller")
async def test_ttm_shaped_run_through_the_same_runner_image(e2e: E2E) -> None:
    points = [("vm-1", float(i % 23), 60.0 * i) for i in range(520)]
    e2e.storage.seed_series("usage", "average", "resourceid", points)
    config = iris_config("ttm-config", e2e.model_url("ttm"))
    config["spec"]["kserve"] = {"modelName": "ttm", "modelUrl": e2e.model_url("ttm")}
    config["spec"]["storage"] = {
        "input": krateo("/compute/tritoninput"),
        "output": krateo("/compute/tritonoutput"),
    }
    run = iris_run("ttm-run", "ttm-config")
    run["spec"]["parameters"] = {
        "input_table_name": "usage",
        "input_data_length": "512",
        "input_table_column_name": "average",
        "key_name": "resourceid",
        "key_value": "vm-1",
        "output_table_name": "forecast",
    }
    done = await e2e.finish(config, run, "Succeeded")
    assert status(done)["result"]["predictions"] == 96
    series = [float(i % 23) for i in range(520)][-512:]
    expected = [float(v) for v in ttm_forecast([series]).ravel()]
    assert [v for _, _, v, _ in e2e.storage.predictions("forecast")] == pytest.approx(expected)


@pytest.mark.timeout(240)
@pytest.mark.usefixtures("controller", "iris")
async def test_iris_scheduled_executions_and_suspend(e2e: E2E) -> None:
    runs = e2e.runs
    await runs.create(iris_config("iris-config", e2e.model_url()))
    created = await runs.create(iris_run("hourly", "iris-config", schedule="* * * * *"))
    executed = await runs.wait_execution(
        "hourly", "Succeeded", within=150, what="a successful scheduled execution"
    )
    st = status(executed)
    assert st["lastScheduleTime"]
    assert st["result"]["predictions"] == 150
    stored = e2e.storage.predictions("predictions")
    pods = {pod for _, pod, _, _ in stored}
    assert pods  # each execution stores under its own pod_uid
    assert len(stored) == 150 * len(pods)
    assert {job for job, _, _, _ in stored} == {created["metadata"]["uid"]}

    await runs.patch("hourly", {"spec": {"suspend": True}})
    await runs.wait_phase("hourly", "Suspended", within=20)
    batch = client.BatchV1Api(e2e.api)
    before = len((await batch.list_namespaced_job(e2e.namespace)).items)
    # A minute boundary (when "* * * * *" fires) passes while suspended, and the
    # CronJob controller gets 10 s after it to create a Job it should not: the
    # same check as a fixed 65 s wait, without waiting out the rest of a minute.
    await asyncio.sleep(60 - time.time() % 60 + 10)
    after = len((await batch.list_namespaced_job(e2e.namespace)).items)
    assert after <= before


@pytest.mark.usefixtures("controller", "iris")
async def test_auto_delete_on_success_removes_everything(e2e: E2E) -> None:
    await e2e.runs.create(iris_config("cfg", e2e.model_url(), policy="DeleteOnSuccess"))
    created = await e2e.runs.create(iris_run("gone", "cfg"))
    await e2e.runs.wait_gone("gone", within=90)
    assert len(e2e.storage.predictions("predictions")) == 150

    async def no_children() -> bool:
        uid = created["metadata"]["uid"]
        return not await runner_pod_uids(e2e, uid) and (
            not (
                await client.BatchV1Api(e2e.api).list_namespaced_job(
                    e2e.namespace, label_selector=f"ai.krateo.io/run-uid={uid}"
                )
            ).items
        )

    await eventually(no_children, within=60, what="Job and pods of the deleted run gone")


@pytest.mark.usefixtures("controller", "iris")
async def test_model_down_fails_with_the_runner_message_and_an_event(e2e: E2E) -> None:
    closed = f"127.0.0.1:{free_port()}/v2/models/sklearn-iris/infer"
    config = iris_config(
        "cfg",
        closed,
        policy="DeleteOnSuccess",  # a failed run is kept
        batching={"maxRetries": 1, "requestTimeoutSeconds": 2},
    )
    failed = await e2e.finish(config, iris_run("down", "cfg", backoffLimit=0), "Failed")
    st = status(failed)
    assert st["reason"] == "InferenceFailed"
    assert st["message"].startswith("runner exited with code 4: ")
    assert "127.0.0.1" in st["message"]
    assert not table_exists(e2e.storage, "predictions")

    async def warning() -> list[Any] | None:
        events = await client.CoreV1Api(e2e.api).list_namespaced_event(
            e2e.namespace, field_selector="involvedObject.name=down,type=Warning"
        )
        return [e for e in events.items if e.reason == "InferenceFailed"] or None

    (event,) = await eventually(warning, what="a Warning event with the runner's reason")
    assert "runner exited with code 4" in event.message


@pytest.mark.usefixtures("controller", "iris")
async def test_storage_200_with_error_is_a_failure(e2e: E2E) -> None:
    # The output notebook fails on this table name; the handler still answers 200.
    run = iris_run("lost", "cfg", output="bad name;", backoffLimit=0)
    failed = await e2e.finish(iris_config("cfg", e2e.model_url()), run, "Failed")
    # The storage answered the write with an error text: no retry can fix that.
    assert status(failed)["reason"] == "OutputRejected"
    assert "runner exited with code 8" in status(failed)["message"]


@pytest.mark.usefixtures("controller", "iris")
async def test_bad_secret_reference_fails_clearly(e2e: E2E) -> None:
    config = iris_config("cfg", e2e.model_url(), secret="no-such-secret")
    failed = await e2e.finish(config, iris_run("nosecret", "cfg", backoffLimit=0), "Failed")
    st = status(failed)
    assert st["reason"] == "InputFailed"
    assert "no-such-secret" in st["message"]
    assert PASSWORD not in json.dumps(failed)


@pytest.mark.usefixtures("controller", "iris")
async def test_timeout_is_deadline_exceeded(e2e: E2E) -> None:
    run = iris_run("late", "cfg", timeoutSeconds=1)
    failed = await e2e.finish(iris_config("cfg", e2e.model_url()), run, "Failed", within=60)
    assert status(failed)["reason"] == "DeadlineExceeded"


@pytest.mark.usefixtures("controller")
async def test_runner_service_account_reads_secrets_but_cannot_list_them(
    cluster: LocalCluster, namespace: str
) -> None:
    sa = chart.service_account_user(namespace, chart.RUNNER_SERVICE_ACCOUNT)

    def can_i(verb: str, in_namespace: str) -> str:
        answer = cluster.kubectl(
            "auth", "can-i", verb, "secrets", "-n", in_namespace, "--as", sa, check=False
        )
        return str(answer.stdout.strip())

    assert can_i("get", namespace) == "yes"
    for verb in ("list", "watch"):
        assert can_i(verb, namespace) == "no"
    assert can_i("get", "default") == "no"
