"""The controller on the real control plane, under the chart's RBAC.

Runner pods are stand-ins (``test.local/fake-*`` images, see tests/conftest.py)
run by the node agent, so outcomes are real pod outcomes seen by the real Job
controller, without a model or storage service.
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from hack.cluster import LocalCluster
from hack.controllerproc import ControllerProcess, controller_for, controller_user, running
from tests import chart
from tests.kubehelpers import eventually, wait_for_events
from tests.runs import (
    MODEL_URL_PATCH,
    Runs,
    condition,
    inference_config,
    inference_run,
    status,
    without_model_url,
)

OK, FAIL, SLOW = "test.local/fake-ok:1", "test.local/fake-fail:1", "test.local/fake-slow:1"


async def children(api: client.ApiClient, namespace: str, uid: str) -> dict[str, list[Any]]:
    selector = f"ai.krateo.io/run-uid={uid}"
    core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
    return {
        "jobs": (await batch.list_namespaced_job(namespace, label_selector=selector)).items,
        "cronjobs": (
            await batch.list_namespaced_cron_job(namespace, label_selector=selector)
        ).items,
        "configmaps": (
            await core.list_namespaced_config_map(namespace, label_selector=selector)
        ).items,
        "pods": (await core.list_namespaced_pod(namespace, label_selector=selector)).items,
    }


async def no_children(api: client.ApiClient, namespace: str, uid: str) -> None:
    async def empty() -> bool:
        found = await children(api, namespace, uid)
        return not any(found.values())

    await eventually(empty, within=60, what="the run's Job, ConfigMap and pods to be deleted")


async def caught_up(runs: Runs, controller: ControllerProcess, marker: str) -> None:
    """Wait until the controller has handled every run event before now, and what they queued.

    Used before asserting that something did NOT happen, instead of sleeping
    "long enough". A marker run naming a config that does not exist is
    created; the controller writes its status only after its run informer
    (one ordered watch) has delivered every earlier run event, each of which
    queued its key then. Then the work queues are waited empty with no
    reconcile in flight, so every reconcile those events asked for is done.
    The marker makes no Job, ConfigMap or pod.
    """
    await runs.create(inference_run(marker, "no-such-config"))
    await runs.wait(marker, lambda r: bool(status(r).get("phase")), what=f"{marker} handled")

    async def idle() -> bool:
        return await asyncio.to_thread(controller.idle)

    await eventually(idle, within=60, what="the controller's work queues empty and idle")


async def test_one_shot_success(
    api_client: client.ApiClient,
    runs: Runs,
    namespace: str,
    controller: ControllerProcess,
    cluster: LocalCluster,
) -> None:
    await runs.create(inference_config("cfg", OK))
    created = await runs.create(inference_run("iris", "cfg", timeoutSeconds=60))
    done = await runs.wait_phase("iris", "Succeeded")
    st = status(done)
    assert st["result"] == {"rows": 3, "predictions": 3, "durationSeconds": 0.1, "attempts": 1}
    assert st["jobStatus"]["kind"] == "Job"
    assert st["jobStatus"]["name"].startswith("inf-iris-")
    assert st["contract"]["jobId"] == created["metadata"]["uid"]
    # status.contract is an object (the API server sorts its keys); the file keeps upstream's order.
    (configmap,) = (await children(api_client, namespace, created["metadata"]["uid"]))["configmaps"]
    assert configmap.data["contract.json"].startswith('{"jobId":"')
    assert st["startTime"]
    assert st["completionTime"]
    assert st["observedGeneration"] == 1
    assert condition(done, "Complete")["status"] == "True"  # type: ignore[index]
    assert condition(done, "Failed")["status"] == "False"  # type: ignore[index]
    # A one-shot run is Ready once it has succeeded.
    assert condition(done, "Ready")["status"] == "True"  # type: ignore[index]
    assert condition(done, "Ready")["reason"] == "Completed"  # type: ignore[index]
    waited = cluster.kubectl(
        "wait", "-n", namespace, "--for=condition=Complete", "infrun/iris", "--timeout=10s"
    )
    assert "condition met" in waited.stdout
    reasons = await wait_for_events(
        api_client, namespace, "iris", "Created", "Succeeded", what="Created and Succeeded events"
    )
    assert {"Created", "Succeeded"} <= set(reasons)
    shown = cluster.kubectl("get", "infrun", "-n", namespace).stdout
    assert "Succeeded" in shown
    assert "3/3 (100%)" in shown


async def test_one_shot_failure_reports_the_runner_message(
    api_client: client.ApiClient, runs: Runs, namespace: str, controller: ControllerProcess
) -> None:
    await runs.create(inference_config("cfg", FAIL))
    failed = await runs.create_and_wait(inference_run("bad", "cfg", backoffLimit=0), "Failed")
    st = status(failed)
    assert st["reason"] == "InferenceFailed"
    assert st["message"] == (
        "runner exited with code 4: inference: model answered 503 Service Unavailable"
    )
    failed_condition = condition(failed, "Failed")
    assert failed_condition is not None
    assert (failed_condition["status"], failed_condition["reason"]) == ("True", "InferenceFailed")
    assert condition(failed, "Complete")["status"] == "False"  # type: ignore[index]
    reasons = await wait_for_events(
        api_client,
        namespace,
        "bad",
        "InferenceFailed",
        what="a Warning event with the runner's reason",
    )
    assert "InferenceFailed" in reasons


async def test_timeout_fails_with_deadline_exceeded(
    runs: Runs, controller: ControllerProcess
) -> None:
    await runs.create(inference_config("cfg", SLOW))
    running = await runs.create_and_wait(inference_run("slow", "cfg", timeoutSeconds=3), "Running")
    assert status(running)["jobStatus"]["kind"] == "Job"
    failed = await runs.wait_phase("slow", "Failed", within=60)
    assert status(failed)["reason"] == "DeadlineExceeded"
    assert condition(failed, "Failed")["reason"] == "DeadlineExceeded"  # type: ignore[index]


async def test_live_progress_reaches_the_status(runs: Runs, controller: ControllerProcess) -> None:
    await runs.create(inference_config("cfg", SLOW))
    await runs.create(inference_run("progress", "cfg", timeoutSeconds=120))
    seen = await runs.wait(
        "progress",
        lambda r: (status(r).get("progress") or {}).get("rowsDone", 0) > 0,
        within=40,
        what="progress in status",
    )
    progress = status(seen)["progress"]
    assert progress["rowsTotal"] == 600
    assert progress["summary"].startswith(f"{progress['rowsDone']}/600")


async def test_missing_config_is_a_condition_then_recovers(
    api_client: client.ApiClient, runs: Runs, namespace: str, controller: ControllerProcess
) -> None:
    waiting = await runs.create_and_wait(inference_run("early", "later"), "Error")
    assert status(waiting)["reason"] == "ConfigNotFound"
    ready = condition(waiting, "Ready")
    assert ready is not None
    assert (ready["status"], ready["reason"]) == ("False", "ConfigNotFound")
    assert f"InferenceConfig {namespace}/later not found" in ready["message"]
    reasons = await wait_for_events(
        api_client, namespace, "early", "ConfigNotFound", what="a ConfigNotFound event"
    )
    assert reasons.count("ConfigNotFound") == 1  # one Event (aggregated), not one per retry
    await runs.create(inference_config("later", OK))
    await runs.wait_phase("early", "Succeeded")


async def test_invalid_config_is_reported_with_the_field(
    runs: Runs, controller: ControllerProcess
) -> None:
    await runs.create(without_model_url(inference_config("cfg", OK)))
    errored = await runs.create_and_wait(inference_run("r", "cfg"), "Error")
    assert status(errored)["reason"] == "MissingModelUrl"
    assert "modelUrl" in status(errored)["message"]
    await runs.patch("cfg", MODEL_URL_PATCH, "inferenceconfigs")
    await runs.wait_phase("r", "Succeeded")


@pytest.mark.parametrize(
    ("policy", "image", "deleted"),
    [
        ("DeleteOnSuccess", OK, True),
        ("DeleteOnSuccess", FAIL, False),
        ("DeleteOnCompletion", OK, True),
        ("DeleteOnCompletion", FAIL, True),
    ],
)
async def test_auto_delete_policies(
    api_client: client.ApiClient,
    runs: Runs,
    namespace: str,
    controller: ControllerProcess,
    policy: str,
    image: str,
    deleted: bool,
) -> None:
    await runs.create(inference_config("cfg", image, policy=policy))
    created = await runs.create(inference_run("r", "cfg", backoffLimit=0))
    uid = created["metadata"]["uid"]
    if deleted:
        await runs.wait_gone("r")
        await no_children(api_client, namespace, uid)
    else:
        await runs.wait_phase("r", "Failed")
        # A wrong deletion would come from reconciling the Failed run: wait for that.
        await caught_up(runs, controller, "marker")
        assert await runs.get("r") is not None
        assert (await children(api_client, namespace, uid))["jobs"]


async def test_deleting_a_run_removes_children_and_pods(
    api_client: client.ApiClient, runs: Runs, namespace: str, controller: ControllerProcess
) -> None:
    await runs.create(inference_config("cfg", SLOW))
    created = await runs.create(inference_run("r", "cfg", timeoutSeconds=300))
    uid = created["metadata"]["uid"]
    await runs.wait_phase("r", "Running")
    before = await children(api_client, namespace, uid)
    assert len(before["jobs"]) == 1
    assert len(before["configmaps"]) == 1
    assert before["pods"]
    await runs.delete("r")
    await no_children(api_client, namespace, uid)


async def test_job_deleted_out_of_band_is_recreated_only_while_unfinished(
    api_client: client.ApiClient, runs: Runs, namespace: str, controller: ControllerProcess
) -> None:
    batch = client.BatchV1Api(api_client)
    await runs.create(inference_config("slowcfg", SLOW))
    await runs.create(inference_config("okcfg", OK))

    running = await runs.create(inference_run("running", "slowcfg", timeoutSeconds=300))
    await runs.wait_phase("running", "Running")
    (job,) = (await children(api_client, namespace, running["metadata"]["uid"]))["jobs"]
    await batch.delete_namespaced_job(job.metadata.name, namespace, propagation_policy="Background")

    async def replaced() -> bool:
        jobs = (await children(api_client, namespace, running["metadata"]["uid"]))["jobs"]
        return any(j.metadata.uid != job.metadata.uid for j in jobs)

    await eventually(replaced, within=30, what="the Job of an unfinished run recreated")

    finished = await runs.create(inference_run("finished", "okcfg"))
    await runs.wait_phase("finished", "Succeeded")
    (done_job,) = (await children(api_client, namespace, finished["metadata"]["uid"]))["jobs"]
    deletes = controller.metric(
        "kserve_inference_informer_watch_events_total", resource="jobs.batch", type="DELETED"
    )
    await batch.delete_namespaced_job(
        done_job.metadata.name, namespace, propagation_policy="Background"
    )
    await eventually(
        lambda: _no_jobs(api_client, namespace, finished["metadata"]["uid"]),
        what="the finished run's Job gone",
    )

    # A wrong recreation would come from reconciling the run after the
    # controller's Job informer saw the delete: wait for both.
    async def delete_seen() -> bool:
        seen = await asyncio.to_thread(
            controller.metric,
            "kserve_inference_informer_watch_events_total",
            resource="jobs.batch",
            type="DELETED",
        )
        return seen > deletes

    await eventually(delete_seen, within=30, what="the controller to see the Job deleted")
    await caught_up(runs, controller, "marker")
    assert not (await children(api_client, namespace, finished["metadata"]["uid"]))["jobs"]
    assert status(await runs.get("finished") or {})["phase"] == "Succeeded"


async def _no_jobs(api: client.ApiClient, namespace: str, uid: str) -> bool:
    return not (await children(api, namespace, uid))["jobs"]


@pytest.mark.timeout(200)
async def test_scheduled_run_follows_edits_and_reports_executions(
    api_client: client.ApiClient, runs: Runs, namespace: str, controller: ControllerProcess
) -> None:
    core = client.CoreV1Api(api_client)
    await runs.create(inference_config("cfg", OK, policy="DeleteOnSuccess"))
    created = await runs.create(inference_run("tick", "cfg", schedule="* * * * *"))
    uid = created["metadata"]["uid"]
    scheduled = await runs.wait_phase("tick", "Scheduled")
    assert status(scheduled)["jobStatus"]["kind"] == "CronJob"
    warning = condition(scheduled, "Warning")
    assert warning is not None
    assert "AutoDeleteIgnored" in warning["reason"]
    (configmap,) = (await children(api_client, namespace, uid))["configmaps"]
    assert '"table":"iris"' in configmap.data["contract.json"]

    # Parameter and config edits reach the ConfigMap for the next execution.
    await runs.patch("tick", {"spec": {"parameters": {"table": "iris_v2"}}})
    await runs.patch("cfg", {"spec": {"batching": {"batchSize": 64}}}, "inferenceconfigs")

    async def contract_updated() -> bool:
        cm = await core.read_namespaced_config_map(configmap.metadata.name, namespace)
        text = cm.data["contract.json"]
        return '"table":"iris_v2"' in text and '"batchSize":64' in text

    await eventually(contract_updated, within=20, what="the scheduled run's contract updated")

    executed = await runs.wait_execution(
        "tick", "Succeeded", within=130, what="a successful execution"
    )
    st = status(executed)
    assert st["lastScheduleTime"]
    assert st["result"]["rows"] == 3
    assert st["phase"] in ("Scheduled", "Running")
    assert st["recentExecutions"][0] == st["lastExecution"]
    assert st["nextScheduleTime"] > st["lastScheduleTime"]
    assert await runs.get("tick") is not None  # auto-delete never applies to scheduled runs

    await runs.patch("tick", {"spec": {"suspend": True}})
    suspended = await runs.wait_phase("tick", "Suspended", within=20)
    (cron,) = (await children(api_client, namespace, uid))["cronjobs"]
    assert cron.spec.suspend is True
    assert status(suspended)["lastExecution"]["phase"] == "Succeeded"
    assert "nextScheduleTime" not in status(suspended)


@pytest.mark.timeout(180)
async def test_two_replicas_one_leader_and_takeover(
    api_client: client.ApiClient, namespace: str, cluster: LocalCluster, tmp_path: Path
) -> None:
    election = {
        "LEADER_ELECT": "true",
        "LEASE_NAME": "kserve-inference-controller",
        "LEASE_DURATION": "6s",
        "RENEW_DEADLINE": "4s",
        "RETRY_PERIOD": "1s",
    }
    first = controller_for(cluster, namespace, tmp_path, env=election, name="first")
    second = controller_for(cluster, namespace, tmp_path, env=election, name="second")
    first.start()
    second.start()  # a synced standby is ready too
    try:
        coordination = client.CoordinationV1Api(api_client)

        async def holder() -> str | None:
            try:
                lease = await coordination.read_namespaced_lease(
                    "kserve-inference-controller", namespace
                )
            except client.exceptions.ApiException:
                return None
            return str(lease.spec.holder_identity or "") or None

        leader_id = await eventually(holder, within=20, what="a leader")
        leader, standby = (first, second) if _is_leader(first) else (second, first)
        assert _is_leader(leader), leader_id
        assert not _is_leader(standby), leader_id

        runs = Runs(api_client, namespace)
        await runs.create(inference_config("cfg", OK))
        await runs.create_and_wait(inference_run("one", "cfg"), "Succeeded")
        assert _reconciles(leader) > 0
        assert _reconciles(standby) == 0

        leader.kill()
        await eventually(
            lambda: _async(_is_leader(standby)), within=30, what="the standby to take over"
        )
        await runs.create_and_wait(inference_run("two", "cfg"), "Succeeded")
        assert _reconciles(standby) > 0
    finally:
        for proc in (first, second):
            proc.stop()


async def _async(value: bool) -> bool:
    return value


def _metric(proc: ControllerProcess, name: str) -> float:
    total = 0.0
    for line in proc.metrics().splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _is_leader(proc: ControllerProcess) -> bool:
    return (
        proc.proc is not None
        and proc.proc.poll() is None
        and (_metric(proc, "leader_election_master_status") == 1)
    )


def _reconciles(proc: ControllerProcess) -> float:
    return _metric(proc, "controller_runtime_reconcile_total")


async def test_missing_permission_is_reported_not_looped(
    api_client: client.ApiClient, namespace: str, cluster: LocalCluster, tmp_path: Path
) -> None:
    with running(controller_for(cluster, namespace, tmp_path, omit=(("jobs", "create"),))):
        runs = Runs(api_client, namespace)
        await runs.create(inference_config("cfg", OK))
        errored = await runs.create_and_wait(inference_run("r", "cfg"), "Error")
        assert status(errored)["reason"] == "PermissionDenied"
        assert 'cannot create resource "jobs"' in status(errored)["message"]
        await asyncio.sleep(5)
        # The controller's own: the set-up's dry runs of the admission policies
        # (apply_controller_rbac) are Job creates in the namespace too.
        creates = [
            e
            for e in cluster.audit_events()
            if e.get("verb") == "create"
            and (e.get("user") or {}).get("username") == controller_user(namespace)
            and (e.get("objectRef") or {}).get("resource") == "jobs"
            and (e.get("objectRef") or {}).get("namespace") == namespace
        ]
        assert 1 <= len(creates) <= 3, f"{len(creates)} Job creates in 5 s: a hot loop"


def test_bad_settings_exit_with_a_clear_message() -> None:
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "controller"],
        env={"POLLING_INTERVAL": "1 minute", "PATH": "/usr/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert "POLLING_INTERVAL" in done.stderr


async def test_chart_alerts_and_dashboard_use_metrics_the_running_controller_exports(
    runs: Runs, controller: ControllerProcess
) -> None:
    await runs.create(inference_config("cfg", OK))
    await runs.create_and_wait(inference_run("r", "cfg"), "Succeeded")
    page = controller.metrics()
    served = chart.scraped_metric_names(page)
    ran = {"namespace": runs.namespace, "config": "cfg"}
    assert controller.metric("kserve_inference_runs", page, phase="Succeeded", **ran) == 1
    assert controller.metric("kserve_inference_runs", page, phase="Failed", **ran) == 0
    assert 'kserve_inference_runs{config="cfg",namespace=' in page
    used = chart.chart_metric_names(
        chart.render({"prometheusRule": {"enabled": True}, "grafanaDashboard": {"enabled": True}})
    )
    for where, names in used.items():
        assert names <= served, f"{where} uses {sorted(names - served)}, not on the live /metrics"


async def test_run_the_schema_accepts_but_the_controller_cannot_use_is_an_error(
    runs: Runs, controller: ControllerProcess
) -> None:
    await runs.create(inference_config("cfg", OK))
    # Valid cron syntax, but 31 February never comes: only the controller can tell.
    errored = await runs.create_and_wait(
        inference_run("never", "cfg", schedule="0 0 31 2 *"), "Error"
    )
    assert status(errored)["reason"] == "InvalidSchedule"
    assert "never fires" in status(errored)["message"]
    ready = condition(errored, "Ready")
    assert ready is not None
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSchedule")
    # A second write would come from reconciling after the controller's own Error write.
    await caught_up(runs, controller, "marker")
    again = await runs.get("never")
    assert again is not None
    assert again["metadata"]["resourceVersion"] == errored["metadata"]["resourceVersion"]


async def test_a_runs_log_reads_as_its_story(
    api_client: client.ApiClient, namespace: str, controller: ControllerProcess
) -> None:
    import json

    runs = Runs(api_client, namespace)
    await runs.create(inference_config("cfg", OK))
    created = await runs.create(inference_run("told", "cfg"))
    await runs.wait_phase("told", "Succeeded")
    key = f"{namespace}/told"

    async def story() -> list[dict[str, Any]] | None:
        lines = [json.loads(line) for line in controller.output().splitlines() if key in line]
        told = [e for e in lines if e.get("run") == key and e.get("level") == "info"]
        return told if any(e.get("phase") == "Succeeded" for e in told) else None

    told = await eventually(story, within=10, what="the run's story in the log")
    for line in told:
        assert {"msg", "level", "ts", "run", "uid", "generation", "reconcile"} <= line.keys(), line
        assert line["uid"] == created["metadata"]["uid"]
    said = [(e["msg"], e.get("kind") or e.get("phase")) for e in told]
    # Other info lines may come between, by timing: "config moved: planning from
    # the live one" when the config's own status write is not in the cache yet.
    steps = [s for s in said if s[0] in ("created child", "phase changed")]
    assert steps[:2] == [("created child", "ConfigMap"), ("created child", "Job")], said
    assert ("phase changed", "Succeeded") in steps[2:], said
