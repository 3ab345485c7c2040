"""Regression tests for what broke when operators were hostile (issue: never act on a stale view).

Each test reproduces one defect on the real control plane, with the
controller under the chart's RBAC, and reads what the controller did from the
API server's audit log rather than from its own words.
"""

from __future__ import annotations

from typing import Any

from kubernetes_asyncio import client

from hack.cluster import LocalCluster
from hack.controllerproc import ControllerProcess
from tests import chart
from tests.integration.test_controller import OK, SLOW
from tests.kubehelpers import eventually, job_manifest, wait_for_events
from tests.runs import Runs, condition, inference_config, inference_run, status

REJECTED = "test.local/fake-rejected:1"
# 55 characters: long enough that parallelism changes the name the spec alone gives.
LONG = "a-run-name-that-is-long-enough-to-be-cut-by-parallelism"


def controller_writes(cluster: LocalCluster, namespace: str, resource: str) -> dict[str, int]:
    """Successful writes of the controller to ``resource`` in ``namespace``, by verb."""
    counts: dict[str, int] = {}
    for event in cluster.audit_events():
        ref = event.get("objectRef") or {}
        user = (event.get("user") or {}).get("username", "")
        if (
            ref.get("namespace") == namespace
            and ref.get("resource") == resource
            and not ref.get("subresource")
            and "kserve-inference-controller" in user
            and event.get("verb") in ("create", "update", "patch", "delete")
            and (event.get("responseStatus") or {}).get("code", 0) < 300
        ):
            counts[event["verb"]] = counts.get(event["verb"], 0) + 1
    return counts


async def run_waiting_for_its_config(runs: Runs) -> tuple[str, str]:
    """Run ``r`` of config ``cfg``, which does not exist yet: its uid and its children's name."""
    created = await runs.create(inference_run("r", "cfg"))
    await runs.wait_phase("r", "Error")  # ConfigNotFound: nothing is made
    uid = created["metadata"]["uid"]
    return uid, f"inf-r-{''.join(c for c in uid if c.isalnum())[:8]}"


def no_tracebacks(proc: ControllerProcess) -> None:
    assert "Traceback" not in proc.output(), proc.output()[-4000:]


def warning(run: dict[str, Any]) -> str:
    found = condition(run, "Warning")
    return found["reason"] if found else ""


async def _edit_parallelism_and_check(
    runs: Runs,
    cluster: LocalCluster,
    namespace: str,
    batch: client.BatchV1Api,
    before: dict[str, Any],
) -> None:
    job_name = status(before)["jobStatus"]["name"]
    job = await batch.read_namespaced_job(job_name, namespace)
    await runs.patch(LONG, {"spec": {"parallelism": 2}})
    edited = await runs.wait(
        LONG,
        lambda r: "SpecChangeNotApplied" in warning(r),
        within=30,
        what="a SpecChangeNotApplied warning",
    )
    assert status(edited)["jobStatus"]["name"] == job_name
    same = await batch.read_namespaced_job(job_name, namespace)
    assert same.metadata.uid == job.metadata.uid
    assert same.metadata.deletion_timestamp is None
    jobs = await batch.list_namespaced_job(namespace)
    assert [j.metadata.name for j in jobs.items] == [job_name]
    writes = controller_writes(cluster, namespace, "jobs")
    assert writes.get("create") == 1, writes
    assert "delete" not in writes, writes


async def test_a_parallelism_edit_never_replaces_a_running_job(
    api_client: client.ApiClient,
    runs: Runs,
    namespace: str,
    controller: ControllerProcess,
    cluster: LocalCluster,
) -> None:
    await runs.create(inference_config("cfg", SLOW))
    running = await runs.create_and_wait(inference_run(LONG, "cfg", timeoutSeconds=120), "Running")
    await _edit_parallelism_and_check(
        runs, cluster, namespace, client.BatchV1Api(api_client), running
    )
    assert status(await runs.get(LONG))["phase"] == "Running"
    no_tracebacks(controller)


async def test_a_parallelism_edit_never_deletes_a_finished_job_or_its_pods(
    api_client: client.ApiClient,
    runs: Runs,
    namespace: str,
    controller: ControllerProcess,
    cluster: LocalCluster,
) -> None:
    await runs.create(inference_config("cfg", OK))
    done = await runs.create_and_wait(inference_run(LONG, "cfg"), "Succeeded")
    core = client.CoreV1Api(api_client)
    pods = (await core.list_namespaced_pod(namespace)).items
    await _edit_parallelism_and_check(runs, cluster, namespace, client.BatchV1Api(api_client), done)
    after = (await core.list_namespaced_pod(namespace)).items
    assert {p.metadata.uid for p in after} == {p.metadata.uid for p in pods}
    assert status(await runs.get(LONG))["phase"] == "Succeeded"
    no_tracebacks(controller)


def refuse_jobs(cluster: LocalCluster, namespace: str) -> str:
    """A ValidatingAdmissionPolicy that makes the API server refuse Jobs in ``namespace``."""
    name = f"refuse-jobs-{namespace}"[:63]
    manifest = f"""
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {{name: {name}}}
spec:
  failurePolicy: Fail
  matchConstraints:
    namespaceSelector: {{matchLabels: {{kubernetes.io/metadata.name: {namespace}}}}}
    resourceRules:
      - {{apiGroups: [batch], apiVersions: [v1], operations: [CREATE], resources: [jobs]}}
  validations:
    - expression: "false"
      message: Jobs are not allowed in this namespace by policy
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {{name: {name}}}
spec: {{policyName: {name}, validationActions: [Deny]}}
"""
    cluster.kubectl("apply", "-f", "-", input=manifest)
    return name


async def test_a_job_the_api_server_refuses_is_reported_with_its_words_then_created(
    api_client: client.ApiClient,
    namespace: str,
    controller: ControllerProcess,
    cluster: LocalCluster,
) -> None:
    policy = refuse_jobs(cluster, namespace)
    try:
        # The policy takes effect once the API server has loaded it: wait for a refusal.
        probe = {
            "metadata": {"name": "probe"},
            "spec": {
                "template": {
                    "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}
                }
            },
        }
        batch = client.BatchV1Api(api_client)

        async def refused() -> bool:
            try:
                await batch.create_namespaced_job(namespace, probe)
            except client.ApiException as exc:
                return exc.status == 422
            await batch.delete_namespaced_job("probe", namespace)
            return False

        await eventually(refused, within=30, what="the admission policy to refuse Jobs")
        runs = Runs(api_client, namespace)
        await runs.create(inference_config("cfg", OK))
        errored = await runs.create_and_wait(inference_run("r", "cfg"), "Error", within=30)
        st = status(errored)
        assert st["reason"] == "JobRefused"
        assert "Jobs are not allowed in this namespace by policy" in st["message"]
        ready = condition(errored, "Ready")
        assert ready is not None
        assert (ready["status"], ready["reason"]) == ("False", "JobRefused")
        # Complete and Failed as for any Error: both False, Complete saying why.
        complete, failed = condition(errored, "Complete"), condition(errored, "Failed")
        assert complete is not None
        assert failed is not None
        assert (complete["status"], complete["reason"]) == ("False", "JobRefused")
        assert (failed["status"], failed["reason"]) == ("False", "NotFailed")
        await wait_for_events(
            api_client, namespace, "r", "JobRefused", what="a JobRefused Warning event"
        )
        # Retried with a backoff of its own (5 s, 10 s, ...), not in a hot loop.
        attempts = [
            e
            for e in cluster.audit_events()
            if (e.get("objectRef") or {}).get("namespace") == namespace
            and (e.get("objectRef") or {}).get("resource") == "jobs"
            and e.get("verb") == "create"
            and "kserve-inference-controller" in (e.get("user") or {}).get("username", "")
        ]
        assert 1 <= len(attempts) <= 4, f"{len(attempts)} Job creates: a hot loop"
    finally:
        cluster.kubectl(
            "delete",
            "validatingadmissionpolicybinding,validatingadmissionpolicy",
            policy,
            "--ignore-not-found",
        )
    await runs.wait_phase("r", "Succeeded", within=90)
    no_tracebacks(controller)


async def test_a_job_that_cannot_create_pods_says_why(
    api_client: client.ApiClient, runs: Runs, namespace: str, controller: ControllerProcess
) -> None:
    # The runner's ServiceAccount gone (the chart made it): the Job is created,
    # its pods never are.
    await client.CoreV1Api(api_client).delete_namespaced_service_account(
        chart.RUNNER_SERVICE_ACCOUNT, namespace
    )
    await runs.create(inference_config("cfg", OK))
    await runs.create(inference_run("r", "cfg"))
    stuck = await runs.wait_reason("r", "FailedCreate", within=40)
    assert status(stuck)["phase"] == "Pending"
    assert chart.RUNNER_SERVICE_ACCOUNT in status(stuck)["message"]
    no_tracebacks(controller)


async def test_a_service_account_the_chart_does_not_allow_is_refused(
    runs: Runs, controller: ControllerProcess
) -> None:
    # The chart's admission policy pins the accounts the controller's Jobs run as
    # (the runner's, and admissionPolicy.runnerServiceAccounts).
    await runs.create(inference_config("cfg", OK, serviceAccountName="another-account"))
    errored = await runs.create_and_wait(inference_run("r", "cfg"), "Error")
    assert status(errored)["reason"] == "JobRefused"
    assert "would run as another-account" in status(errored)["message"]
    no_tracebacks(controller)


async def test_an_image_that_does_not_exist_says_why(
    api_client: client.ApiClient, runs: Runs, namespace: str, controller: ControllerProcess
) -> None:
    await runs.create(inference_config("cfg", "test.local/no-such-image:1"))
    await runs.create(inference_run("r", "cfg"))
    stuck = await runs.wait_reason("r", "ErrImagePull", within=30)
    assert status(stuck)["phase"] == "Pending"
    assert status(stuck)["message"]
    await wait_for_events(
        api_client, namespace, "r", "ErrImagePull", what="an ErrImagePull Warning event"
    )


async def test_a_name_taken_by_another_object_is_a_name_conflict(
    api_client: client.ApiClient,
    runs: Runs,
    namespace: str,
    controller: ControllerProcess,
    cluster: LocalCluster,
) -> None:
    _, name = await run_waiting_for_its_config(runs)
    # What the upstream controller would have left: a ConfigMap of the child's name, unlabelled.
    core = client.CoreV1Api(api_client)
    await core.create_namespaced_config_map(
        namespace, {"metadata": {"name": name}, "data": {"contract.json": "{}"}}
    )
    await runs.create(inference_config("cfg", OK))
    conflict = await runs.wait_reason("r", "NameConflict", within=30)
    assert f"ConfigMap {namespace}/{name}" in status(conflict)["message"]
    await wait_for_events(
        api_client, namespace, "r", "NameConflict", what="a NameConflict Warning event"
    )
    existing = await core.read_namespaced_config_map(name, namespace)
    assert existing.data == {"contract.json": "{}"}  # someone else's object is left alone
    assert controller_writes(cluster, namespace, "jobs") == {}
    no_tracebacks(controller)
    # Once the other object is gone the run proceeds.
    await core.delete_namespaced_config_map(name, namespace)
    await runs.wait_phase("r", "Succeeded", within=90)


async def test_a_config_in_a_namespace_the_controller_does_not_watch_says_so(
    runs: Runs, namespace: str, controller: ControllerProcess
) -> None:
    run = inference_run("r", "cfg")
    run["spec"]["configRef"]["namespace"] = "kube-system"
    await runs.create(run)
    errored = await runs.wait_phase("r", "Error")
    assert status(errored)["reason"] == "ConfigOutOfReach"
    assert "does not watch" in status(errored)["message"]
    assert namespace in status(errored)["message"]


async def test_a_failure_that_can_never_succeed_is_not_retried(
    api_client: client.ApiClient, runs: Runs, namespace: str, controller: ControllerProcess
) -> None:
    await runs.create(inference_config("cfg", REJECTED))
    failed = await runs.create_and_wait(
        inference_run("r", "cfg", backoffLimit=3), "Failed", within=60
    )
    assert status(failed)["reason"] == "InferenceRejected"
    assert "422" in status(failed)["message"]
    pods = await client.CoreV1Api(api_client).list_namespaced_pod(namespace)
    assert len(pods.items) == 1  # one attempt: the pod failure policy failed the Job at once


async def test_children_left_by_the_upstream_controller_are_adopted_not_duplicated(
    api_client: client.ApiClient,
    runs: Runs,
    namespace: str,
    controller: ControllerProcess,
    cluster: LocalCluster,
) -> None:
    uid, name = await run_waiting_for_its_config(runs)
    # What upstream made: the same name, a controller reference to the run, no labels.
    owner = {
        "apiVersion": "ai.krateo.io/v1",
        "kind": "InferenceRun",
        "name": "r",
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }
    core, batch = client.CoreV1Api(api_client), client.BatchV1Api(api_client)
    await core.create_namespaced_config_map(
        namespace,
        {
            "metadata": {"name": name, "ownerReferences": [owner]},
            "binaryData": {"contract.json": "e30="},
        },
    )
    mount = {"name": "contract", "mountPath": "/tmp"}
    job = job_manifest(
        name,
        [{"name": "inference", "image": OK, "volumeMounts": [mount]}],
        volumes=[{"name": "contract", "configMap": {"name": name}}],
    )
    job["metadata"]["ownerReferences"] = [owner]
    upstream_job = await batch.create_namespaced_job(namespace, job)
    await runs.create(inference_config("cfg", OK))
    done = await runs.wait(
        "r", lambda r: status(r).get("phase") in ("Succeeded", "Failed"), within=60
    )
    assert status(done)["phase"] == "Succeeded", status(done)
    assert status(done)["jobStatus"]["uid"] == upstream_job.metadata.uid
    adopted = await batch.read_namespaced_job(name, namespace)
    assert adopted.metadata.labels["ai.krateo.io/run-uid"] == uid
    writes = controller_writes(cluster, namespace, "jobs")
    assert "create" not in writes, writes
    assert "delete" not in writes, writes
    no_tracebacks(controller)
