"""The chart's ValidatingAdmissionPolicy on the real API server.

RBAC lets the controller write every ConfigMap, Job and CronJob where it
watches; the policy lets it write only those labelled as its own. Every other
controller test runs under the same policy (``chart.controller_rbac_objects``
includes it), which shows the controller never needs more.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.naming import MANAGED_BY_LABEL, MANAGED_BY_VALUE
from hack.cluster import LocalCluster
from hack.crds import install_crds
from kubeclient.client import KubeClient
from kubeclient.errors import ApiError, NotFound
from kubeclient.resources import CONFIGMAPS, CRONJOBS, JOBS, RUNS
from tests import chart
from tests.chart import Obj
from tests.kubehelpers import controller_ref, eventually
from tests.runs import inference_run

OWN = {MANAGED_BY_LABEL: MANAGED_BY_VALUE}


def configmap(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, **({"labels": labels} if labels else {})},
        "data": {"a": "1"},
    }


def job(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    container = {"name": "c", "image": "test.local/fake-ok:1"}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, **({"labels": labels} if labels else {})},
        "spec": {
            "suspend": True,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    # The one account the chart lets the controller's Jobs run as.
                    "serviceAccountName": chart.RUNNER_SERVICE_ACCOUNT,
                    "containers": [container],
                }
            },
        },
    }


def cronjob(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": name, **({"labels": labels} if labels else {})},
        "spec": {
            "schedule": "0 0 1 1 *",
            "suspend": True,
            "jobTemplate": {"spec": job(name)["spec"]},
        },
    }


@pytest.fixture
def all_namespaces_release(cluster: LocalCluster, namespace: str) -> Iterator[list[Any]]:
    """The chart's default mode: the controller may write anywhere (a ClusterRole)."""
    objects = chart.controller_rbac_objects(namespace, [])
    chart.apply(cluster, objects)
    try:
        yield objects
    finally:
        chart.delete_cluster_scoped(cluster, objects)


@pytest.fixture
async def as_controller(
    cluster: LocalCluster, namespace: str, tmp_path: Path, all_namespaces_release: list[Any]
) -> Any:
    kubeconfig = chart.service_account_kubeconfig(
        cluster, namespace, path=tmp_path / "controller.kubeconfig"
    )
    async with await KubeClient.connect(kubeconfig=str(kubeconfig)) as kube:
        yield kube


@pytest.fixture
async def as_admin(cluster: LocalCluster) -> Any:
    async with await KubeClient.connect(kubeconfig=str(cluster.kubeconfig)) as kube:
        yield kube


async def wait_enforced(as_controller: KubeClient, as_admin: KubeClient, namespace: str) -> None:
    """A new policy takes a moment to reach the API server's admission chain."""
    name = "policy-probe"

    async def enforced() -> bool:
        try:
            await as_controller.create(CONFIGMAPS, namespace, configmap(name))
        except ApiError as exc:
            return exc.status == 403
        await as_admin.delete(CONFIGMAPS, namespace, name)
        return False

    await eventually(enforced, within=30, interval=0.5, what="the admission policy in force")


async def refused(write: Any) -> ApiError:
    with pytest.raises(ApiError) as caught:
        await write
    assert caught.value.status == 403, caught.value
    assert "kserve-inference-controller may only" in caught.value.message, caught.value
    return caught.value


async def test_the_controller_may_write_only_what_it_labelled_as_its_own(
    cluster: LocalCluster, namespace: str, as_controller: KubeClient, as_admin: KubeClient
) -> None:
    await wait_enforced(as_controller, as_admin, namespace)

    # Create: only with the label.
    error = await refused(as_controller.create(CONFIGMAPS, namespace, configmap("theirs")))
    assert f"{namespace}/theirs would not be" in error.message
    await refused(as_controller.create(JOBS, namespace, job("theirs")))
    await refused(as_controller.create(CRONJOBS, namespace, cronjob("theirs")))
    await as_controller.create(CONFIGMAPS, namespace, configmap("mine", OWN))
    await as_controller.create(JOBS, namespace, job("mine", OWN))
    await as_controller.create(CRONJOBS, namespace, cronjob("mine", OWN))

    # Update: never taking the label off, nor putting it on someone else's object.
    await as_controller.patch(CONFIGMAPS, namespace, "mine", {"data": {"a": "2"}})
    await refused(
        as_controller.patch(CONFIGMAPS, namespace, "mine", {"metadata": {"labels": None}})
    )
    await as_admin.create(CONFIGMAPS, namespace, configmap("users"))
    await as_admin.create(JOBS, namespace, job("users"))
    await refused(
        as_controller.patch(CONFIGMAPS, namespace, "users", {"metadata": {"labels": OWN}})
    )
    await refused(as_controller.patch(JOBS, namespace, "users", {"spec": {"suspend": False}}))

    # Delete: only its own.
    await refused(as_controller.delete(CONFIGMAPS, namespace, "users"))
    await refused(as_controller.delete(JOBS, namespace, "users"))
    await as_controller.delete(CONFIGMAPS, namespace, "mine")
    await as_controller.delete(CRONJOBS, namespace, "mine")
    with pytest.raises(NotFound):
        await as_admin.get(CONFIGMAPS, namespace, "mine")

    # Everyone else is untouched by the policy.
    await as_admin.patch(CONFIGMAPS, namespace, "users", {"data": {"a": "3"}})
    await as_admin.delete(CONFIGMAPS, namespace, "users")


async def test_kube_system_is_out_of_the_controllers_reach(
    as_controller: KubeClient, as_admin: KubeClient
) -> None:
    """The default all-namespaces RBAC reaches kube-system; the policy does not let it."""

    # Probed harmlessly (a create), never by deleting kube-system's objects.
    await wait_enforced(as_controller, as_admin, "kube-system")
    await refused(as_controller.delete(CONFIGMAPS, "kube-system", "kube-root-ca.crt"))
    await refused(
        as_controller.patch(
            CONFIGMAPS, "kube-system", "kube-root-ca.crt", {"metadata": {"labels": OWN}}
        )
    )
    assert await as_admin.get(CONFIGMAPS, "kube-system", "kube-root-ca.crt")


async def test_a_child_an_inference_run_controls_may_be_adopted_and_nothing_else(
    cluster: LocalCluster, namespace: str, as_controller: KubeClient, as_admin: KubeClient
) -> None:
    """What the upstream controller left (owned by a run, unlabelled) may get the label."""
    install_crds(cluster)
    await wait_enforced(as_controller, as_admin, namespace)
    run = await as_admin.create(RUNS, namespace, inference_run("upstream", "cfg"))
    owner = controller_ref(run)
    child = configmap("inf-upstream-12345678")
    child["metadata"]["ownerReferences"] = [owner]
    await as_admin.create(CONFIGMAPS, namespace, child)
    stranger = configmap("not-a-child")
    stranger["metadata"]["ownerReferences"] = [{**owner, "controller": False}]
    await as_admin.create(CONFIGMAPS, namespace, stranger)

    # Adoption: the label goes on; the policy's first rule keeps it on.
    await as_controller.patch(
        CONFIGMAPS, namespace, "inf-upstream-12345678", {"metadata": {"labels": OWN}}
    )
    # An object a run does not control stays out of reach, and so do deletes.
    await refused(
        as_controller.patch(CONFIGMAPS, namespace, "not-a-child", {"metadata": {"labels": OWN}})
    )
    await refused(as_controller.delete(CONFIGMAPS, namespace, "not-a-child"))


# --------------------------------------------------------------------------------------------
# What the controller's Jobs and CronJobs may run: the label says whose a Job is,
# not what it runs. Each refusal is tried with `kubectl --as` the controller's
# ServiceAccount and a server-side dry run, so a policy that let one through
# would still create nothing.


def runner_job(name: str, account: str | None = chart.RUNNER_SERVICE_ACCOUNT, **pod: Any) -> Obj:
    body = job(name, OWN)
    spec = body["spec"]["template"]["spec"]
    spec.pop("serviceAccountName")
    if account is not None:
        spec["serviceAccountName"] = account
    spec.update(pod)
    return body


def runner_cronjob(name: str, account: str) -> Obj:
    body = cronjob(name, OWN)
    body["spec"]["jobTemplate"]["spec"]["template"]["spec"]["serviceAccountName"] = account
    return body


def try_as_controller(
    cluster: LocalCluster, release: str, target: str, body: Obj
) -> subprocess.CompletedProcess[str]:
    user = chart.service_account_user(release, chart.CONTROLLER_SERVICE_ACCOUNT)
    return cluster.kubectl(
        "create",
        "--dry-run=server",
        "-n",
        target,
        f"--as={user}",
        "-o",
        "name",
        "-f",
        "-",
        input=json.dumps(body),
        check=False,
    )


def assert_refused(done: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert done.returncode != 0, f"accepted: {done.stdout}"
    assert "kserve-inference-controller may" in done.stderr, done.stderr
    for fragment in fragments:
        assert fragment in done.stderr, done.stderr


def assert_accepted(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip(), "the dry run named no object"


async def wait_pods_policy(cluster: LocalCluster, release: str, target: str) -> None:
    """The pods policy in force (a new policy takes a moment to reach admission)."""

    async def enforced() -> bool:
        done = try_as_controller(cluster, release, target, runner_job("probe", account="nobody"))
        return done.returncode != 0 and "may only run jobs as" in done.stderr

    await eventually(enforced, within=30, interval=0.5, what="the runner-pods policy in force")


async def test_jobs_run_only_as_the_runner_service_account(
    cluster: LocalCluster, namespace: str, all_namespaces_release: list[Any]
) -> None:
    await wait_pods_policy(cluster, namespace, namespace)
    assert_accepted(try_as_controller(cluster, namespace, namespace, runner_job("ok")))
    assert_accepted(
        try_as_controller(
            cluster, namespace, namespace, runner_cronjob("ok", chart.RUNNER_SERVICE_ACCOUNT)
        )
    )
    for account in ("default", "admin-ish", chart.CONTROLLER_SERVICE_ACCOUNT):
        assert_refused(
            try_as_controller(cluster, namespace, namespace, runner_job("j", account=account)),
            f"would run as {account}",
            chart.RUNNER_SERVICE_ACCOUNT,
        )
    # No serviceAccountName is the namespace's "default" account: refused too.
    assert_refused(
        try_as_controller(cluster, namespace, namespace, runner_job("j", account=None)),
        "would run as default",
    )
    # The deprecated alias (serviceAccount) cannot smuggle another account in.
    sneaky = runner_job("j", account=None, serviceAccount="admin-ish")
    assert_refused(try_as_controller(cluster, namespace, namespace, sneaky), "admin-ish")
    assert_refused(
        try_as_controller(cluster, namespace, namespace, runner_cronjob("c", "admin-ish")),
        "may only run cronjobs as",
    )


async def test_updates_are_judged_only_when_they_change_what_runs(
    cluster: LocalCluster, namespace: str, all_namespaces_release: list[Any]
) -> None:
    # Adopting a Job that upstream's controller left, which runs as the
    # namespace's default account, is a label and owner patch: its pod does
    # not change, and the refusal used to keep such a run from ever finishing.
    await wait_pods_policy(cluster, namespace, namespace)
    user = chart.service_account_user(namespace, chart.CONTROLLER_SERVICE_ACCOUNT)
    left = runner_job("left-by-upstream", account=None)
    left["spec"]["suspend"] = True
    cron = runner_cronjob("cron", chart.RUNNER_SERVICE_ACCOUNT)
    for body in (left, cron):
        cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(body))

    adopted = cluster.kubectl(
        "label", "job", "left-by-upstream", "adopted=yes", "-n", namespace, f"--as={user}",
        check=False,
    )  # fmt: skip
    assert adopted.returncode == 0, adopted.stderr
    rescheduled = cluster.kubectl(
        "patch", "cronjob", "cron", "-n", namespace, f"--as={user}", "--type=merge",
        "-p", json.dumps({"spec": {"schedule": "5 * * * *"}}), check=False,
    )  # fmt: skip
    assert rescheduled.returncode == 0, rescheduled.stderr
    borrowed = {"serviceAccountName": "admin-ish"}
    changed = cluster.kubectl(
        "patch", "cronjob", "cron", "-n", namespace, f"--as={user}", "--type=merge",
        "-p", json.dumps({"spec": {"jobTemplate": {"spec": {"template": {"spec": borrowed}}}}}),
        check=False,
    )  # fmt: skip
    assert_refused(changed, "may only run cronjobs as", "would run as admin-ish")


async def test_kube_system_accounts_cannot_be_borrowed(
    cluster: LocalCluster, namespace: str, all_namespaces_release: list[Any]
) -> None:
    """All-namespaces mode: RBAC lets the controller create Jobs in kube-system."""
    await wait_pods_policy(cluster, namespace, "kube-system")
    # The attack: a labelled Job running as a kube-system controller's account.
    borrowed = runner_job("escalate", account="clusterrole-aggregation-controller")
    assert_refused(try_as_controller(cluster, namespace, "kube-system", borrowed))
    # Even as the runner's account name, nothing runs in kube-system.
    assert_refused(
        try_as_controller(cluster, namespace, "kube-system", runner_job("j")),
        "may not run jobs in kube-system",
    )


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        ({"hostNetwork": True}, "network, PID or IPC namespace"),
        ({"hostPID": True}, "network, PID or IPC namespace"),
        ({"hostIPC": True}, "network, PID or IPC namespace"),
        (
            {"volumes": [{"name": "root", "hostPath": {"path": "/"}}]},
            "may not mount hostPath volumes",
        ),
        (
            {
                "containers": [
                    {
                        "name": "c",
                        "image": "x:1",
                        "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}},
                    }
                ]
            },
            "may not run privileged containers or add",
        ),
        (
            {
                "initContainers": [
                    {
                        "name": "i",
                        "image": "x:1",
                        "securityContext": {"capabilities": {"add": ["NET_ADMIN"]}},
                    }
                ]
            },
            "may not run privileged containers or add",
        ),
    ],
)
async def test_jobs_never_reach_the_node(
    cluster: LocalCluster,
    namespace: str,
    all_namespaces_release: list[Any],
    pod: dict[str, Any],
    expected: str,
) -> None:
    await wait_pods_policy(cluster, namespace, namespace)
    assert_refused(
        try_as_controller(cluster, namespace, namespace, runner_job("j", **pod)), expected
    )


@pytest.fixture
def other_namespace(cluster: LocalCluster, namespace: str) -> Iterator[str]:
    name = f"{namespace}-other"
    cluster.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false")


async def test_privileged_containers_are_refused(
    cluster: LocalCluster, namespace: str, all_namespaces_release: list[Any]
) -> None:
    """The policy refuses them; this control plane (--allow-privileged=false, as
    many managed clusters) refuses them earlier, in validation. Either way none runs:
    the policy's rule is for the clusters that allow privileged pods."""
    await wait_pods_policy(cluster, namespace, namespace)
    privileged = {"name": "c", "image": "x:1", "securityContext": {"privileged": True}}
    done = try_as_controller(
        cluster, namespace, namespace, runner_job("j", containers=[privileged])
    )
    assert done.returncode != 0, f"accepted: {done.stdout}"
    assert (
        "may not run privileged containers" in done.stderr
        or "privileged: Forbidden: disallowed by cluster policy" in done.stderr
    ), done.stderr


async def test_configured_accounts_and_watched_namespaces(
    cluster: LocalCluster, namespace: str, other_namespace: str
) -> None:
    """runnerServiceAccounts widens the accounts; watchNamespaces bounds where, even
    where some other grant gives the controller RBAC beyond them."""
    objects = chart.controller_rbac_objects(
        namespace, [namespace], values={"admissionPolicy": {"runnerServiceAccounts": ["team-a"]}}
    )
    chart.apply(cluster, objects)
    user = chart.service_account_user(namespace, chart.CONTROLLER_SERVICE_ACCOUNT)
    grant = f"extra-{namespace}"[:63]
    cluster.kubectl(
        "create",
        "rolebinding",
        grant,
        "-n",
        other_namespace,
        "--clusterrole=edit",
        f"--user={user}",
    )
    try:
        await wait_pods_policy(cluster, namespace, namespace)
        assert_accepted(
            try_as_controller(cluster, namespace, namespace, runner_job("a", account="team-a"))
        )
        assert_refused(
            try_as_controller(cluster, namespace, namespace, runner_job("b", account="team-b")),
            "would run as team-b",
        )
        # RBAC (the extra grant) allows it; the policy does not.
        assert_refused(
            try_as_controller(cluster, namespace, other_namespace, runner_job("c")),
            f"{other_namespace} is not one",
        )
    finally:
        chart.delete_cluster_scoped(cluster, objects)
