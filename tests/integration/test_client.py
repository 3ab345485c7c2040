"""KubeClient against the real API server: verbs, typed errors, watch parsing, metrics."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
from kubernetes_asyncio.client import Configuration

from controller.metrics import Metrics
from hack.cluster import LocalCluster
from kubeclient import incluster
from kubeclient.client import KubeClient
from kubeclient.errors import ApiError, NotFound, TransportError
from kubeclient.incluster import InClusterConfiguration
from kubeclient.resources import CONFIGMAPS, NAMESPACES, PODS
from kubeclient.transport import load_configuration
from tests.kubehelpers import eventually


def configmap(name: str, **data: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


@pytest.fixture
async def metrics() -> Metrics:
    return Metrics()


@pytest.fixture
async def kube(cluster: LocalCluster, metrics: Metrics) -> AsyncIterator[KubeClient]:
    client = await KubeClient.connect(kubeconfig=str(cluster.kubeconfig), metrics=metrics)
    async with client:
        yield client


async def test_create_get_list_replace_patch_delete(kube: KubeClient, namespace: str) -> None:
    created = await kube.create(CONFIGMAPS, namespace, configmap("one", a="1"))
    assert created["metadata"]["uid"]
    got = await kube.get(CONFIGMAPS, namespace, "one")
    assert got["data"] == {"a": "1"}
    await kube.create(
        CONFIGMAPS,
        namespace,
        {**configmap("two"), "metadata": {"name": "two", "labels": {"pick": "me"}}},
    )
    listed = await kube.list(CONFIGMAPS, namespace, label_selector="pick=me")
    assert [item["metadata"]["name"] for item in listed["items"]] == ["two"]
    assert listed["metadata"]["resourceVersion"]

    replaced = await kube.replace(CONFIGMAPS, namespace, "one", {**got, "data": {"a": "2"}})
    assert replaced["data"] == {"a": "2"}
    merged = await kube.patch(CONFIGMAPS, namespace, "one", {"data": {"b": "3"}})
    assert merged["data"] == {"a": "2", "b": "3"}
    json_patched = await kube.patch(
        CONFIGMAPS, namespace, "one", [{"op": "remove", "path": "/data/a"}], patch_type="json"
    )
    assert json_patched["data"] == {"b": "3"}
    applied = await kube.patch(
        CONFIGMAPS, namespace, "three", configmap("three", c="4"), patch_type="apply", force=True
    )
    assert applied["data"] == {"c": "4"}
    assert any(
        entry["manager"] == "kserve-inference-controller"
        for entry in applied["metadata"]["managedFields"]
    )

    await kube.delete(CONFIGMAPS, namespace, "one")
    with pytest.raises(NotFound) as missing:
        await kube.get(CONFIGMAPS, namespace, "one")
    assert missing.value.is_not_found
    assert missing.value.status == 404
    assert missing.value.reason == "NotFound"


async def test_races_come_back_as_typed_errors(kube: KubeClient, namespace: str) -> None:
    first = await kube.create(CONFIGMAPS, namespace, configmap("race", v="1"))
    with pytest.raises(ApiError) as exists:
        await kube.create(CONFIGMAPS, namespace, configmap("race"))
    assert exists.value.is_conflict
    assert exists.value.is_already_exists

    await kube.replace(CONFIGMAPS, namespace, "race", {**first, "data": {"v": "2"}})
    with pytest.raises(ApiError) as stale:  # first's resourceVersion is stale now
        await kube.replace(CONFIGMAPS, namespace, "race", {**first, "data": {"v": "3"}})
    assert stale.value.is_conflict
    assert not stale.value.is_already_exists
    assert (await kube.get(CONFIGMAPS, namespace, "race"))["data"] == {"v": "2"}

    with pytest.raises(ApiError) as precondition:  # on the uid of a replaced object
        await kube.delete(CONFIGMAPS, namespace, "race", uid="not-the-uid")
    assert precondition.value.is_conflict
    with pytest.raises(ApiError) as invalid:
        await kube.create(CONFIGMAPS, namespace, configmap("Not_Valid"))
    assert invalid.value.status == 422
    assert "Not_Valid" in invalid.value.message
    with pytest.raises(NotFound):
        await kube.delete(CONFIGMAPS, namespace, "never-was")


async def test_status_subresource_update_uses_the_resource_version(
    kube: KubeClient, namespace: str
) -> None:
    ns = await kube.get(NAMESPACES, None, namespace)
    updated = await kube.update_status(NAMESPACES, None, namespace, ns)
    assert updated["status"]["phase"] == "Active"
    await kube.patch(NAMESPACES, None, namespace, {"metadata": {"labels": {"touched": "yes"}}})
    with pytest.raises(ApiError) as stale:
        await kube.update_status(NAMESPACES, None, namespace, updated)
    assert stale.value.is_conflict


async def test_requests_are_counted_by_verb_method_and_code(
    kube: KubeClient, namespace: str, metrics: Metrics
) -> None:
    await kube.create(CONFIGMAPS, namespace, configmap("counted"))
    for _ in range(2):
        await kube.get(CONFIGMAPS, namespace, "counted")
    with pytest.raises(NotFound):
        await kube.get(CONFIGMAPS, namespace, "absent")

    host = urlparse(kube.host).netloc

    def count(**labels: str) -> float:
        labels["host"] = host
        return metrics.registry.get_sample_value("rest_client_requests_total", labels) or 0.0

    assert count(verb="create", method="POST", code="201") == 1
    assert count(verb="get", method="GET", code="200") == 2
    assert count(verb="get", method="GET", code="404") == 1


async def test_the_user_rbac_allows_is_enforced(cluster: LocalCluster, namespace: str) -> None:
    # The runner user has no permission on ConfigMaps in a fresh namespace.
    async with await KubeClient.connect(kubeconfig=str(cluster.kubeconfig_for("runner"))) as kube:
        with pytest.raises(ApiError) as forbidden:
            await kube.list(CONFIGMAPS, namespace)
    assert forbidden.value.is_forbidden


async def test_client_side_rate_limit(cluster: LocalCluster, namespace: str) -> None:
    async with await KubeClient.connect(kubeconfig=str(cluster.kubeconfig), qps=5, burst=1) as kube:
        await kube.list(CONFIGMAPS, namespace)  # spend the burst
        started = time.monotonic()
        for _ in range(5):
            await kube.list(CONFIGMAPS, namespace)
        # 5 more tokens at 5/s cannot arrive in under a second (a lower bound only).
        assert time.monotonic() - started >= 0.8


async def test_a_budget_of_its_own_shares_the_connection_not_the_tokens(
    cluster: LocalCluster, namespace: str
) -> None:
    """Events' client (with_budget) is never held up by a main budget that is spent."""
    # Refills so slowly that nothing comes back during the test: what the
    # buckets hold is exactly what was taken from them.
    async with await KubeClient.connect(
        kubeconfig=str(cluster.kubeconfig), qps=0.001, burst=1
    ) as kube:
        events = kube.with_budget(qps=0.001, burst=2)
        await kube.list(CONFIGMAPS, namespace)
        assert not kube.transport.limiter.has_capacity()  # the main budget is spent...
        for _ in range(2):  # ...and the other one still answers at once
            assert events.transport.limiter.has_capacity()
            await events.list(CONFIGMAPS, namespace)
        assert not events.transport.limiter.has_capacity()
        assert events.transport.session() is kube.transport.session()
    assert kube.transport.connection.session is None  # closing one closed the shared pool
    with pytest.raises(ValueError, match="qps > 0"):
        kube.with_budget(qps=0, burst=1)


async def test_no_server_is_a_transport_error(cluster: LocalCluster) -> None:
    configuration = await load_configuration(kubeconfig=str(cluster.kubeconfig))
    assert isinstance(configuration, Configuration)
    configuration.host = "https://127.0.0.1:1"
    async with KubeClient(configuration) as kube:
        with pytest.raises(TransportError) as error:
            await kube.list(CONFIGMAPS, "default")
    assert error.value.status == 0
    assert error.value.is_transient


async def test_watch_streams_big_objects(kube: KubeClient, namespace: str) -> None:
    listed = await kube.list(CONFIGMAPS, namespace)
    big = "x" * 800_000  # one watch line far beyond aiohttp's 64 KiB line limit
    events: list[dict[str, Any]] = []

    async def watch() -> None:
        async for event in kube.watch(
            CONFIGMAPS,
            namespace,
            resource_version=listed["metadata"]["resourceVersion"],
            timeout_seconds=30,
        ):
            events.append(event)
            if event["type"] == "ADDED" and event["object"]["metadata"]["name"] == "big":
                return

    task = asyncio.create_task(watch())
    await asyncio.sleep(0.5)
    await kube.create(CONFIGMAPS, namespace, configmap("big", blob=big))
    await asyncio.wait_for(task, timeout=30)
    assert events[-1]["object"]["data"]["blob"] == big


async def test_follow_pod_log_streams_lines_as_the_container_writes_them(
    kube: KubeClient, namespace: str
) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "talker"},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": "test.local/talker:1",
                    "command": ["sh", "-c", "echo first; sleep 3; echo second"],
                }
            ],
        },
    }
    await kube.create(PODS, namespace, pod)

    async def running() -> bool:
        pod = await kube.get(PODS, namespace, "talker")
        return (pod.get("status") or {}).get("phase") == "Running"

    await eventually(running, within=30, interval=0.1, what="the pod running")
    lines: list[tuple[str, str]] = []
    async with asyncio.timeout(30):
        async for line in kube.follow_pod_log(namespace, "talker", container="main"):
            # The phase at the moment each line arrives: the first comes while
            # the container is still writing, so this is a stream, not a read
            # at the end.
            phase = (await kube.get(PODS, namespace, "talker"))["status"]["phase"]
            lines.append((line, phase))
    assert [line for line, _ in lines] == ["first", "second"]
    assert lines[0][1] == "Running"


async def test_the_pods_service_account_connects_and_its_rotated_token_is_read_again(
    cluster: LocalCluster, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What the kubelet gives a pod: the service address in the environment,
    # the cluster CA and a projected token in one directory.
    cluster.kubectl("create", "serviceaccount", "reader", "-n", namespace)
    cluster.kubectl(
        "create", "rolebinding", "reader", "--clusterrole=view",
        f"--serviceaccount={namespace}:reader", "-n", namespace,
    )  # fmt: skip
    token = cluster.kubectl("create", "token", "reader", "-n", namespace).stdout.strip()
    assert token
    shutil.copy(cluster.ca_path, tmp_path / "ca.crt")
    (tmp_path / "token").write_text(token + "\n")  # the newline is not part of the token
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(cluster.api_port)}
    configuration = InClusterConfiguration.from_pod(environ=env, directory=tmp_path)
    assert configuration.host == f"https://127.0.0.1:{cluster.api_port}"
    async with KubeClient(configuration) as kube:
        # The RoleBinding reaches the informer-less authorizer within a moment.
        async def listed() -> bool:
            try:
                await kube.list(CONFIGMAPS, namespace)
            except ApiError as exc:
                if exc.status != 403:
                    raise
                return False
            return True

        await eventually(listed, within=30, what="the service account's list allowed")
        # The kubelet rotates the file: the next read after TOKEN_RELOAD uses it.
        monkeypatch.setattr(incluster, "TOKEN_RELOAD", 0.0)
        (tmp_path / "token").write_text("not-a-token")
        with pytest.raises(ApiError) as refused:
            await kube.list(CONFIGMAPS, namespace)
        assert refused.value.status == 401
        (tmp_path / "token").write_text(token)
        await kube.list(CONFIGMAPS, namespace)
