"""The Helm chart as users run it: leader failover between real pods, upgrade, test, uninstall."""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from hack import chart
from hack.cluster import LocalCluster
from tests.kubehelpers import namespace_objects
from tests.node.conftest import (
    RELEASE,
    RUNS_NAMESPACE,
    Storage,
    endpoint_secret,
    get,
    helm_install,
    iris_manifests,
    release_values,
    wait_for,
)
from tests.node.test_real_node import apply, running_pod, wait_phase

FULLNAME = f"{RELEASE}-kserve-inference-controller"
CONTROLLER_USER = f"system:serviceaccount:ksc-system:{FULLNAME}"


def controller_pods(kube: LocalCluster, namespace: str, instance: str) -> list[dict[str, Any]]:
    selector = f"app.kubernetes.io/instance={instance},app.kubernetes.io/component=controller"
    pods: list[dict[str, Any]] = get(kube, "pods", "-n", namespace, "-l", selector)["items"]
    return [p for p in pods if p["metadata"].get("deletionTimestamp") is None]


# The first test of the tier also builds both images and starts the nodes.
pytestmark = pytest.mark.timeout(900)


def holder(kube: LocalCluster, namespace: str, lease: str) -> str:
    got = kube.kubectl("get", "lease", lease, "-n", namespace, "-o", "json", check=False)
    if got.returncode != 0:
        return ""
    return str(json.loads(got.stdout)["spec"].get("holderIdentity") or "")


def job_creates(kube: LocalCluster, namespace: str) -> list[str]:
    """Names of the Jobs the chart's controller created in ``namespace`` (the audit log)."""
    names = []
    for event in kube.audit_events():
        ref = event.get("objectRef") or {}
        if (
            event.get("verb") == "create"
            and ref.get("resource") == "jobs"
            and ref.get("namespace") == namespace
            and event.get("user", {}).get("username") == CONTROLLER_USER
            and event.get("stage") == "ResponseComplete"
            and (event.get("responseStatus") or {}).get("code") == 201
        ):
            names.append(ref.get("name") or "")
    return names


def test_the_chart_runs_two_real_replicas_on_two_nodes(kube: LocalCluster, release: str) -> None:
    pods = controller_pods(kube, release, RELEASE)
    assert len(pods) == 2
    assert {p["spec"]["nodeName"] for p in pods} == {"ksc-node-1", "ksc-node-2"}
    for pod in pods:
        assert all(c["ready"] for c in pod["status"]["containerStatuses"])
        ctx = pod["spec"]["containers"][0]["securityContext"]
        assert ctx["readOnlyRootFilesystem"] is True
        assert ctx["runAsNonRoot"] is True
    assert holder(kube, release, FULLNAME).split("_")[0] in {p["metadata"]["name"] for p in pods}


def test_leader_pod_deleted_mid_run_the_other_replica_takes_over(
    kube: LocalCluster, release: str, model: str, storage: Storage
) -> None:
    endpoint_secret(kube, storage.url)
    storage.freeze()
    apply(kube, iris_manifests(model, "iris-failover"))
    running_pod(kube, "iris-failover")
    leader = holder(kube, release, FULLNAME)
    leader_pod = next(
        p["metadata"]["name"]
        for p in controller_pods(kube, release, RELEASE)
        if leader.startswith(p["metadata"]["name"])
    )
    others = {p["metadata"]["name"] for p in controller_pods(kube, release, RELEASE)} - {leader_pod}
    deleted_at = time.monotonic()
    kube.kubectl("delete", "pod", "-n", release, leader_pod, "--wait=false")

    def new_leader() -> str | None:
        now = holder(kube, release, FULLNAME)
        return now if now and not now.startswith(leader_pod) else None

    taken = wait_for(new_leader, within=90, what="another replica to take the Lease")
    # The deleted leader released the Lease on SIGTERM, so another replica
    # leads at once rather than after the lease duration (15 s). Which one is a
    # race: the standby polls every retry period (2 s) and the Deployment's
    # replacement pod, scheduled as soon as the old one freed its host ports,
    # tries at start; either is a live replica of the chart.
    assert time.monotonic() - deleted_at < 15, "the Lease was not released: it expired"
    pods_now = {p["metadata"]["name"] for p in controller_pods(kube, release, RELEASE)}
    assert any(taken.startswith(name) for name in pods_now), (taken, pods_now)
    assert others <= pods_now  # the standby was not disturbed
    storage.thaw()
    st = wait_phase(kube, "iris-failover", "Succeeded")
    assert st["result"]["predictions"] == 150
    assert len(storage.predictions()) == 150
    # Neither the old leader nor the new one made a second Job for the run.
    run_uid = get(kube, "infrun", "iris-failover", "-n", RUNS_NAMESPACE)["metadata"]["uid"]
    jobs = get(kube, "jobs", "-n", RUNS_NAMESPACE, "-l", f"ai.krateo.io/run-uid={run_uid}")["items"]
    assert [j["metadata"]["name"] for j in jobs] == [st["jobStatus"]["name"]]
    assert job_creates(kube, RUNS_NAMESPACE).count(st["jobStatus"]["name"]) == 1
    # The Deployment replaced the deleted pod: two replicas again.
    wait_for(
        lambda: (
            len(controller_pods(kube, release, RELEASE)) == 2
            and all(
                all(c["ready"] for c in p["status"].get("containerStatuses") or [{"ready": False}])
                for p in controller_pods(kube, release, RELEASE)
            )
        ),
        within=120,
        what="two ready replicas again",
    )


LIFE = "ksc-life"


def release_objects(kube: LocalCluster, instance: str) -> list[str]:
    """Every object (any kind, any namespace) labelled as part of release ``instance``."""
    kinds = kube.kubectl("api-resources", "--verbs=list", "-o", "name").stdout.split()
    wanted = [k for k in kinds if not k.startswith(("events", "componentstatuses"))]
    got = kube.kubectl(
        "get", ",".join(wanted), "-A", "-l", f"app.kubernetes.io/instance={instance}",
        "-o", "name",
    ).stdout  # fmt: skip
    return [line for line in got.splitlines() if line.strip()]


def test_helm_test_upgrade_and_uninstall(kube: LocalCluster, release: str, tmp_path: Path) -> None:
    """A second release, watching its own namespace: its test hook, a rolling upgrade, removal."""
    kube.kubectl("create", "namespace", "ksc-life-runs")
    values = release_values(
        watchNamespaces=["ksc-life-runs"],
        runner={"namespaces": []},
        replicaCount=1,
        leaderElection={"enabled": True},
        crds={"install": False},  # the first release owns them
    )
    helm_install(kube, LIFE, LIFE, values, tmp_path)
    kubeconfig = kube.kubeconfig

    # helm test fails (non-zero) unless the hook pod succeeds: the self-check passed.
    tested = chart.helm("test", LIFE, "--namespace", LIFE, "--logs", kubeconfig=kubeconfig)
    assert re.search(r"Phase:\s+Succeeded", tested.stdout), tested.stdout
    assert "FAIL" not in tested.stdout, tested.stdout

    before = controller_pods(kube, LIFE, LIFE)
    assert len(before) == 1
    values["settings"] = {**values["settings"], "logLevel": "DEBUG"}
    path = tmp_path / "upgrade.yaml"
    path.write_text(yaml.safe_dump(values))
    chart.helm(
        "upgrade", LIFE, str(chart.CHART_DIR), "--namespace", LIFE, "--values", str(path),
        "--wait", "--timeout", "5m", kubeconfig=kubeconfig, timeout=400,
    )  # fmt: skip

    def rolled() -> list[dict[str, Any]] | None:
        pods = controller_pods(kube, LIFE, LIFE)
        new = [p for p in pods if p["metadata"]["uid"] != before[0]["metadata"]["uid"]]
        return new if len(pods) == 1 and new else None

    (pod,) = wait_for(rolled, within=120, what="the upgrade to replace the controller pod")
    settings = get(kube, "configmap", f"{LIFE}-kserve-inference-controller-settings", "-n", LIFE)
    assert settings["data"]["LOG_LEVEL"] == "DEBUG"
    assert (
        pod["metadata"]["annotations"]["checksum/settings"]
        != before[0]["metadata"]["annotations"]["checksum/settings"]
    )

    chart.helm("uninstall", LIFE, "--namespace", LIFE, "--wait", kubeconfig=kubeconfig)
    # Nothing labelled as the release anywhere, and nothing at all in its
    # namespaces: the Lease the controller wrote goes with its ServiceAccount.
    wait_for(
        lambda: (
            not release_objects(kube, LIFE)
            and not namespace_objects(kube, LIFE)
            and not namespace_objects(kube, "ksc-life-runs")
        ),
        within=120,
        what=f"nothing of release {LIFE} left",
    )
    # The CRDs stay (the first release owns them): its runs are safe.
    kube.kubectl("get", "crd", "inferenceruns.ai.krateo.io")


def test_the_release_owns_the_crds_and_helm_upgrade_updates_them(
    kube: LocalCluster, release: str, tmp_path: Path
) -> None:
    """CRDs are chart templates: installed with the first release, upgraded with it, kept."""
    runs_crd = "inferenceruns.ai.krateo.io"
    crd = get(kube, "crd", runs_crd)
    assert crd["metadata"]["annotations"]["meta.helm.sh/release-name"] == RELEASE
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"

    # A new chart version whose CRD changed (here: the schema's description).
    newer = tmp_path / "chart"
    shutil.copytree(chart.CHART_DIR, newer)
    crd_file = newer / "files" / "crds" / f"{runs_crd}.yaml"
    document = yaml.safe_load(crd_file.read_text())
    marker = "Upgraded by helm upgrade (test)."
    document["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["description"] = marker
    crd_file.write_text(yaml.safe_dump(document))

    def upgrade(chart_dir: Path) -> None:
        chart.helm(
            "upgrade", RELEASE, str(chart_dir), "--namespace", release, "--reuse-values",
            "--wait", "--timeout", "5m", kubeconfig=kube.kubeconfig, timeout=400,
        )  # fmt: skip

    def description() -> str:
        served = get(kube, "crd", runs_crd)
        return str(served["spec"]["versions"][0]["schema"]["openAPIV3Schema"].get("description"))

    upgrade(newer)
    assert description() == marker
    upgrade(chart.CHART_DIR)  # and back, for whatever runs after
    assert description() != marker
