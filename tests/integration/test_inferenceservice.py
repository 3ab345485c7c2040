"""Configs that name their model by an InferenceService: what the controller says when it cannot.

The InferenceService CRD is the test stand-in of ``hack/kserve/`` (KServe's
own is not installed here); the tests write each service's status as
KServe's controller would. A run whose model cannot be resolved gets no
child at all: these tests need no runner.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from controller.isvc import Access
from controller.isvc_watch import ModelWatch
from hack.cluster import LocalCluster
from hack.controllerproc import ControllerProcess, controller_for, running
from hack.crds import install_inferenceservice_crd, remove_inferenceservice_crd
from kubeclient.client import KubeClient
from tests.integration.test_controller import children
from tests.isvc import InferenceServices, inference_service, not_ready_status, ready_status
from tests.kubehelpers import eventually, wait_for_events
from tests.runs import CONFIGS, Runs, condition, inference_config, inference_run, status

OK = "ghcr.io/krateoplatformops/kserve-krateo-runner:0.1.0"


def isvc_config(name: str, service: str) -> dict[str, object]:
    config = inference_config(name, OK)
    config["spec"]["kserve"] = {"inferenceServiceRef": {"name": service}}
    return config


@pytest.fixture
def isvc_crd(cluster: LocalCluster) -> None:
    install_inferenceservice_crd(cluster)


@pytest.fixture
def no_isvc_crd(cluster: LocalCluster) -> Iterator[None]:
    remove_inferenceservice_crd(cluster)
    yield
    install_inferenceservice_crd(cluster)


async def ready_reason(runs: Runs, name: str, reason: str, within: float = 60) -> dict[str, str]:
    return await runs.wait_condition(
        name,
        "Ready",
        lambda c: c["reason"] == reason,
        plural=CONFIGS,
        within=within,
        what=f"config {name} Ready reason {reason}",
    )


async def no_jobs(api: client.ApiClient, namespace: str) -> bool:
    jobs = await client.BatchV1Api(api).list_namespaced_job(namespace)
    return not jobs.items


@pytest.mark.usefixtures("isvc_crd", "controller")
async def test_a_missing_service_is_a_condition_until_it_exists_then_the_url_shows(
    runs: Runs, api_client: client.ApiClient, namespace: str, cluster: LocalCluster
) -> None:
    await runs.create(isvc_config("cfg", "iris"))
    ready = await ready_reason(runs, "cfg", "InferenceServiceNotFound")
    assert ready["status"] == "False"
    assert ready["message"] == f"InferenceService {namespace}/iris not found"
    await runs.create(inference_run("run", "cfg"))
    waiting = await runs.wait_reason("run", "InferenceServiceNotFound")
    assert status(waiting)["phase"] == "Pending"
    assert await no_jobs(api_client, namespace)

    services = InferenceServices(api_client, namespace)
    await services.create(inference_service("iris"))
    url = f"http://iris-predictor.{namespace}.svc.cluster.local"
    await services.set_status("iris", ready_status(url))
    await ready_reason(runs, "cfg", "Valid")
    config = await runs.get("cfg", CONFIGS)
    assert config is not None
    assert status(config)["model"] == {
        "url": f"{url}/v2/models/iris/infer",
        "protocol": "v2",
        "name": "iris",
        "inferenceService": f"{namespace}/iris",
    }
    wide = cluster.kubectl("get", "infcfg", "cfg", "-n", namespace, "-o", "wide").stdout
    header, row = wide.splitlines()[:2]
    assert "MODEL" in header.split()
    assert f"{url}/v2/models/iris/infer" in row.split()
    # The run waited: now it gets its Job, with the URL in its contract.
    started = await runs.wait(
        "run", lambda r: status(r).get("contract") is not None, what="the run's contract"
    )
    assert status(started)["contract"]["kserve"]["modelUrl"] == f"{url}/v2/models/iris/infer"


async def test_without_the_crd_there_is_no_informer_until_the_crd_exists(
    cluster: LocalCluster, namespace: str, runs: Runs, tmp_path: Path, no_isvc_crd: None
) -> None:
    with running(controller_for(cluster, namespace, tmp_path)) as proc:
        await runs.create(isvc_config("cfg", "iris"))
        ready = await ready_reason(runs, "cfg", "InferenceServiceCRDMissing")
        assert "no InferenceService CRD (serving.kserve.io/v1beta1)" in ready["message"]
        assert "the cluster has no InferenceService CRD" in proc.output()
        assert "watching InferenceServices" not in proc.output()
        # The CRD arrives: the controller finds it, starts watching, and says what it sees.
        install_inferenceservice_crd(cluster)
        await ready_reason(runs, "cfg", "InferenceServiceNotFound", within=90)
        assert "watching InferenceServices" in proc.output()


class CountingModelWatch(ModelWatch):
    """The controller's ModelWatch, counting its looks at discovery (the real API server's)."""

    looks = 0

    async def _crd_served(self) -> bool:
        self.looks += 1
        return await super()._crd_served()


async def test_without_the_crd_discovery_is_asked_less_and_less_and_sooner_when_wanted(
    cluster: LocalCluster, kube: KubeClient, no_isvc_crd: None
) -> None:
    # 0.05 s for the first wait: the controller's own 10 s, 200 times faster.
    watch = CountingModelWatch(kube, discovery_interval=0.05)
    task = asyncio.create_task(watch.run())
    try:

        async def looked(at_least: int) -> bool:
            return watch.looks >= at_least and watch.state().access is Access.CRD_MISSING

        await eventually(lambda: looked(1), what="discovery's first answer")
        # Every look answers "no CRD": each wait doubles (0.05, 0.1, 0.2, ... 3.2 s), so
        # 6 s see about 7 looks; one every 0.05 s would be about 120.
        await asyncio.sleep(6)
        assert 2 <= watch.looks <= 10, watch.looks
        # Looks 10 and 11 are 12.8 and 25.6 s apart: the CRD arrives after look 10, and
        # something wants it (recheck, as a reconcile of a config with a reference does).
        await eventually(lambda: looked(10), within=90, what="discovery's 10th look")
        await asyncio.to_thread(install_inferenceservice_crd, cluster)
        watch.recheck()

        async def found() -> bool:
            return watch.state().access is not Access.CRD_MISSING

        await eventually(found, within=15, what="the CRD found after recheck()")
        assert watch.informer is not None
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_missing_rbac_grant_is_a_condition_with_the_api_servers_words(
    cluster: LocalCluster, namespace: str, runs: Runs, tmp_path: Path, isvc_crd: None
) -> None:
    omit = tuple(("inferenceservices", verb) for verb in ("get", "list", "watch"))
    with running(controller_for(cluster, namespace, tmp_path, omit=omit)):
        await runs.create(isvc_config("cfg", "iris"))
        ready = await ready_reason(runs, "cfg", "InferenceServiceForbidden")
        assert "may not list inferenceservices" in ready["message"]
        assert "cannot list resource" in ready["message"]  # the API server's own words
        await runs.create(inference_run("run", "cfg"))
        await runs.wait_reason("run", "InferenceServiceForbidden")
        # Everything else still works: the controller is ready and other configs are fine.
        await runs.create(inference_config("plain", OK))
        await ready_reason(runs, "plain", "Valid")


async def test_turned_off_nothing_is_read_and_the_config_says_so(
    cluster: LocalCluster, namespace: str, runs: Runs, tmp_path: Path
) -> None:
    env = {"INFERENCESERVICES": "false"}
    proc: ControllerProcess
    with running(controller_for(cluster, namespace, tmp_path, env=env)) as proc:
        await runs.create(isvc_config("cfg", "iris"))
        ready = await ready_reason(runs, "cfg", "InferenceServicesDisabled")
        assert "inferenceServices.enabled" in ready["message"]
        assert "watching InferenceServices" not in proc.output()


async def test_kserves_words_reach_a_waiting_run(
    cluster: LocalCluster,
    namespace: str,
    runs: Runs,
    api_client: client.ApiClient,
    tmp_path: Path,
    isvc_crd: None,
) -> None:
    services = InferenceServices(api_client, namespace)
    await services.create(inference_service("iris"))
    said = "Revision iris-predictor-00001 failed with message: container exited with code 1"
    await services.set_status(
        "iris",
        {
            "conditions": [
                {"type": "Ready", "status": "False", "reason": "RevisionFailed", "message": said}
            ]
        },
    )
    with running(controller_for(cluster, namespace, tmp_path)):
        await runs.create(isvc_config("cfg", "iris"))
        await runs.create(inference_run("run", "cfg"))
        waiting = await runs.wait_reason("run", "ModelNotReady")
        assert status(waiting)["phase"] == "Pending"
        assert (
            status(waiting)["message"] == f"InferenceService {namespace}/iris is not Ready: {said}"
        )
        config = await ready_reason(runs, "cfg", "ModelNotReady")
        assert said in config["message"]

        async def quiet() -> bool:
            return await no_jobs(api_client, namespace)

        assert await eventually(quiet, what="no Job while the model is not Ready")


async def cronjobs_of(api: client.ApiClient, namespace: str, uid: str) -> list[Any]:
    return (await children(api, namespace, uid))["cronjobs"]


async def contract_url(api: client.ApiClient, namespace: str, uid: str) -> str:
    (configmap,) = (await children(api, namespace, uid))["configmaps"]
    return str(json.loads(configmap.data["contract.json"])["kserve"]["modelUrl"])


@pytest.mark.timeout(300)
@pytest.mark.usefixtures("isvc_crd", "controller")
async def test_a_scheduled_run_is_suspended_while_its_model_is_not_ready_and_resumed_after(
    runs: Runs, api_client: client.ApiClient, namespace: str
) -> None:
    # Its CronJob used to go on firing against the model that was down: the
    # run only carried a warning, and every execution burnt its retries.
    services = InferenceServices(api_client, namespace)
    await services.create(inference_service("iris"))
    first = f"http://iris-predictor.{namespace}.svc.cluster.local"
    await services.set_status("iris", ready_status(first))
    await runs.create(isvc_config("cfg", "iris"))
    # A tick that never comes during the test: only the CronJob's suspend is looked at.
    tick = await runs.create(inference_run("tick", "cfg", schedule="0 0 1 1 *"))
    uid = tick["metadata"]["uid"]
    await runs.wait_phase("tick", "Scheduled", within=60)
    (cron,) = await cronjobs_of(api_client, namespace, uid)
    assert cron.spec.suspend is False
    assert await contract_url(api_client, namespace, uid) == f"{first}/v2/models/iris/infer"

    # KServe's controller: the new revision fails.
    said = "Revision iris-predictor-00002 failed with message: container exited with code 1"
    await services.set_status("iris", not_ready_status("RevisionFailed", said))

    async def suspended() -> bool:
        return bool((await cronjobs_of(api_client, namespace, uid))[0].spec.suspend)

    await eventually(suspended, within=60, what="the CronJob suspended while its model is down")
    down = await runs.wait_reason("tick", "ModelNotReady", within=60)
    assert status(down)["phase"] == "Pending"
    assert status(down)["message"] == (
        f"InferenceService {namespace}/iris is not Ready: {said}; CronJob "
        f"{cron.metadata.name} is suspended until the model is Ready "
        "(an execution under way goes on)"
    )
    assert "nextScheduleTime" not in status(down)
    ready = condition(down, "Ready")
    assert ready is not None
    assert (ready["status"], ready["reason"]) == ("False", "ModelNotReady")
    assert said in ready["message"]
    await wait_for_events(
        api_client, namespace, "tick", "ModelNotReady", what="a ModelNotReady Warning Event"
    )
    # A scheduled run made while the model is down gets no CronJob at all.
    late = await runs.create(inference_run("late", "cfg", schedule="0 0 1 1 *"))
    waiting = await runs.wait_reason("late", "ModelNotReady", within=60)
    assert status(waiting)["phase"] == "Pending"
    assert said in status(waiting)["message"]
    assert await cronjobs_of(api_client, namespace, late["metadata"]["uid"]) == []

    # Ready again, at another address: both CronJobs fire there from now on.
    moved = f"http://iris-predictor-moved.{namespace}.svc.cluster.local"
    await services.set_status("iris", ready_status(moved))
    await runs.wait_phase("tick", "Scheduled", within=60)
    assert (await cronjobs_of(api_client, namespace, uid))[0].spec.suspend is False
    assert await contract_url(api_client, namespace, uid) == f"{moved}/v2/models/iris/infer"
    await runs.wait_phase("late", "Scheduled", within=60)
    (late_cron,) = await cronjobs_of(api_client, namespace, late["metadata"]["uid"])
    assert late_cron.spec.suspend is False
    late_url = await contract_url(api_client, namespace, late["metadata"]["uid"])
    assert late_url == f"{moved}/v2/models/iris/infer"
