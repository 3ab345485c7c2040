"""NoExecute taints on real kubelets: the control plane evicts what does not tolerate them.

Lost nodes, drains by taint and the ``out-of-service`` taint all go through
kube-controller-manager's taint-eviction-controller; without it a NoExecute
taint evicts nothing and no test of tolerations or of a lost node means
anything. Two pause pods on one node, one tolerating the test's taint: after
the taint, the first is deleted and the second keeps running.

Every other pod on the node (the chart's controller replica, when another test
of the session installed it) is given the toleration first, so the taint
disturbs nothing else of the tier; the taint is removed at the end.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from hack.cluster import LocalCluster
from hack.realnode import PAUSE_IMAGE, RealCluster
from tests.node.conftest import get, wait_for

NAMESPACE = "ksc-taints"
TAINT_KEY = "ksc.test/evict"
TOLERATION = {"key": TAINT_KEY, "operator": "Exists", "effect": "NoExecute"}

pytestmark = pytest.mark.timeout(900)


def pause_pod(name: str, node: str, tolerations: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": tolerations,
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "pause", "image": PAUSE_IMAGE, "imagePullPolicy": "Never"}],
        },
    }


@pytest.fixture
def node(real: RealCluster, kube: LocalCluster) -> Iterator[str]:
    """A node of the session whose pods all tolerate the test's taint; untainted afterwards."""
    name = real.node_names()[0]
    kube.kubectl("create", "namespace", NAMESPACE)
    try:
        yield name
    finally:
        kube.kubectl("taint", "node", name, f"{TAINT_KEY}-", check=False)
        kube.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)


def tolerate_everywhere(kube: LocalCluster, node: str) -> list[str]:
    """Give every pod already on ``node`` the test's toleration (adding one is a valid update)."""
    pods = get(kube, "pods", "-A", "--field-selector", f"spec.nodeName={node}")["items"]
    done = []
    for pod in pods:
        meta = pod["metadata"]
        if pod["status"].get("phase") in ("Succeeded", "Failed") or meta.get("deletionTimestamp"):
            continue
        tolerations = [*(pod["spec"].get("tolerations") or []), TOLERATION]
        patch = {"spec": {"tolerations": tolerations}}
        kube.kubectl(
            "patch", "pod", meta["name"], "-n", meta["namespace"], "--type=strategic",
            "-p", json.dumps(patch),
        )  # fmt: skip
        done.append(f"{meta['namespace']}/{meta['name']}")
    return done


def pod_or_none(kube: LocalCluster, name: str) -> dict[str, Any] | None:
    found = kube.kubectl("get", "pod", name, "-n", NAMESPACE, "-o", "json", check=False)
    if found.returncode != 0:
        if "NotFound" in found.stderr:
            return None
        raise AssertionError(f"kubectl get pod {name}: {found.stderr}")
    pod: dict[str, Any] = json.loads(found.stdout)
    return pod


def test_no_execute_taint_evicts_the_pod_that_does_not_tolerate_it(
    kube: LocalCluster, node: str
) -> None:
    tolerate_everywhere(kube, node)
    docs = [pause_pod("intolerant", node, []), pause_pod("tolerant", node, [TOLERATION])]
    for doc in docs:
        kube.kubectl("apply", "-f", "-", input=json.dumps(doc))

    def both_running() -> list[dict[str, Any]] | None:
        pods = [pod_or_none(kube, d["metadata"]["name"]) for d in docs]
        running = [p for p in pods if p and p["status"].get("phase") == "Running"]
        return running if len(running) == 2 else None

    before = wait_for(both_running, within=180, what="both pause pods Running")
    uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in before}
    assert {p["spec"]["nodeName"] for p in before} == {node}

    kube.kubectl("taint", "node", node, f"{TAINT_KEY}=yes:NoExecute")

    def evicted() -> bool | None:
        pod = pod_or_none(kube, "intolerant")
        gone = pod is None or pod["metadata"]["uid"] != uids["intolerant"]
        return gone or bool(pod and pod["metadata"].get("deletionTimestamp")) or None

    wait_for(evicted, within=120, what="the pod without the toleration to be evicted")
    tolerant = pod_or_none(kube, "tolerant")
    assert tolerant is not None, "the pod tolerating the taint was deleted too"
    assert tolerant["metadata"]["uid"] == uids["tolerant"]
    assert tolerant["metadata"].get("deletionTimestamp") is None, tolerant["metadata"]
    assert tolerant["status"].get("phase") == "Running", tolerant["status"]

    # The eviction came from the taint manager, which says so on the pod.
    def told() -> set[str] | None:
        events = get(
            kube, "events", "-n", NAMESPACE, "--field-selector", "involvedObject.name=intolerant"
        )
        reasons = {str(e.get("reason")) for e in events["items"]}
        return reasons if "TaintManagerEviction" in reasons else None

    wait_for(told, within=60, what="a TaintManagerEviction Event on the evicted pod")
