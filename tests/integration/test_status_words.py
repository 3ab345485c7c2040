"""The status words users act on, on the real control plane with the real controller.

Runner pods are stand-ins run by the node agent (``test.local/fake-*``, see
``hack/cluster.py``): real pod outcomes seen by the real Job controller.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio import client, watch

from hack.cluster import LocalCluster
from hack.controllerproc import ControllerProcess
from tests.kubehelpers import eventually, wait_for_events
from tests.runs import GROUP, VERSION, Runs, condition, inference_config, inference_run, status

Obj = dict[str, Any]
REJECTED = "test.local/fake-rejected:1"


class StatusLog:
    """Every (phase, reason) a run's status showed, from a watch started before the run."""

    def __init__(self) -> None:
        self.seen: list[tuple[str | None, str | None]] = []

    def reasons(self) -> list[str | None]:
        return [reason for _, reason in self.seen]


@contextlib.asynccontextmanager
async def status_log(api: client.ApiClient, namespace: str, name: str) -> AsyncIterator[StatusLog]:
    custom = client.CustomObjectsApi(api)
    listed = await custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "inferenceruns")
    log = StatusLog()

    async def follow() -> None:
        version = listed["metadata"]["resourceVersion"]
        while True:  # a watch the API server ends is started again where it stopped
            stream = watch.Watch().stream(
                custom.list_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                "inferenceruns",
                field_selector=f"metadata.name={name}",
                resource_version=version,
                timeout_seconds=300,
            )
            async for event in stream:
                obj = event["object"]
                version = obj["metadata"]["resourceVersion"]
                seen = (status(obj).get("phase"), status(obj).get("reason"))
                if not log.seen or log.seen[-1] != seen:
                    log.seen.append(seen)

    task = asyncio.create_task(follow())
    try:
        yield log
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


# ------------------------------------------------------------------- exit 7: no Retrying


@pytest.mark.timeout(180)
async def test_a_runner_that_exits_7_is_failed_without_ever_retrying(
    api_client: client.ApiClient, runs: Runs, namespace: str, controller: ControllerProcess
) -> None:
    await runs.create(inference_config("cfg", REJECTED))
    async with status_log(api_client, namespace, "r") as log:
        await runs.create(inference_run("r", "cfg", backoffLimit=3))
        failed = await runs.wait_phase("r", "Failed", within=90)
        # The Failed Event is out: every Event of the run before it is there too.
        reasons = await wait_for_events(
            api_client, namespace, "r", "InferenceRejected", what="the Failed Event"
        )
        # The status as the watch saw it settle after the Job's own Failed.
        job_failed = await runs.wait(
            "r",
            lambda r: (condition(r, "Failed") or {}).get("status") == "True",
            what="the run's Failed condition",
        )
    assert (status(failed)["reason"], status(job_failed)["reason"]) == (
        "InferenceRejected",
        "InferenceRejected",
    )
    assert log.seen, "the watch saw no status"
    assert log.seen[-1] == ("Failed", "InferenceRejected"), log.seen
    assert "Retrying" not in log.reasons(), log.seen
    assert "Retrying" not in reasons, reasons
    # One Warning for the failure, said once.
    assert reasons.count("InferenceRejected") == 1, reasons


# ------------------------------------------------------- a probe pod that cannot start

MISSING_IMAGE = "test.local/no-such-image:1"  # the node agent answers ErrImagePull
CONFIGS = "inferenceconfigs"


@pytest.mark.timeout(180)
async def test_a_probe_whose_image_cannot_be_pulled_says_err_image_pull_at_once(
    api_client: client.ApiClient,
    runs: Runs,
    namespace: str,
    probing_controller: ControllerProcess,
    cluster: LocalCluster,
) -> None:
    await runs.create(inference_config("cfg", MISSING_IMAGE))
    # Well before the probe Job's 120 s deadline, which would say ProbeTimedOut.
    probed = await runs.wait_condition(
        "cfg", "Probed", plural=CONFIGS, within=60, what="a Probed condition"
    )
    assert (probed["status"], probed["reason"]) == ("False", "ErrImagePull"), probed
    assert probed["message"].startswith("probe pod could not start: "), probed
    assert MISSING_IMAGE in probed["message"]
    reasons = await wait_for_events(
        api_client, namespace, "cfg", "ErrImagePull", what="the ErrImagePull Warning Event"
    )
    assert "ProbeTimedOut" not in reasons
    batch = client.BatchV1Api(api_client)

    async def probe_gone() -> bool:
        return not (await batch.list_namespaced_job(namespace)).items

    await eventually(probe_gone, within=60, what="the stuck probe's Job to be deleted")
    shown = cluster.kubectl("get", "infcfg", "cfg", "-n", namespace, check=False)
    assert shown.returncode == 0, shown.stderr
    header, row = (line.split() for line in shown.stdout.strip().splitlines())
    assert header[:3] == ["NAME", "READY", "PROBED"]
    assert row[:3] == ["cfg", "True", "False"]


# ------------------------------------------------------- a run pod that cannot start


@pytest.mark.timeout(240)
async def test_a_run_whose_pod_cannot_pull_its_image_fails_after_its_pod_start_timeout(
    api_client: client.ApiClient,
    runs: Runs,
    namespace: str,
    controller: ControllerProcess,
    cluster: LocalCluster,
) -> None:
    # No timeoutSeconds: before the pod-start timeout such a run waited for ever.
    await runs.create(inference_config("cfg", MISSING_IMAGE))
    await runs.create(inference_run("r", "cfg", podStartTimeoutSeconds=5))
    pending = await runs.wait_reason("r", "ErrImagePull", within=60)
    assert status(pending)["phase"] == "Pending"
    failed = await runs.wait_phase("r", "Failed", within=90)
    st = status(failed)
    assert st["reason"] == "ErrImagePull", st
    assert "could not start within 5s" in st["message"], st
    assert MISSING_IMAGE in st["message"], st
    done = cluster.kubectl(
        "wait", "-n", namespace, "--for=condition=Failed", "infrun/r", "--timeout=30s", check=False
    )
    assert done.returncode == 0, done.stderr
    failed_cond = condition(failed, "Failed") or {}
    assert (failed_cond.get("status"), failed_cond.get("reason")) == ("True", "ErrImagePull")
    # The Job is ended, its pods gone: nothing keeps pulling.
    batch, core = client.BatchV1Api(api_client), client.CoreV1Api(api_client)

    async def job_failed() -> Any:
        (job,) = (await batch.list_namespaced_job(namespace)).items
        conditions = {c.type: c for c in job.status.conditions or [] if c.status == "True"}
        return conditions.get("Failed")

    ended = await eventually(job_failed, within=60, what="the Job to fail")
    assert ended.reason == "DeadlineExceeded"

    async def pods_gone() -> bool:
        return not (await core.list_namespaced_pod(namespace)).items

    await eventually(pods_gone, within=60, what="the stuck runner pod to be deleted")
    again = await runs.get("r")
    assert again is not None
    assert (status(again)["phase"], status(again)["reason"]) == ("Failed", "ErrImagePull")
    reasons = await wait_for_events(
        api_client, namespace, "r", "ErrImagePull", what="the ErrImagePull Warning Event"
    )
    assert "DeadlineExceeded" not in reasons
