"""Informers against the real API server: list+watch, selectors, scopes, indexes, faults.

The one thing not provoked here is a 410 Gone: a fresh control plane keeps
every resourceVersion in its watch cache, so the relist path is covered by
tests/unit/test_informer_logic.py with a scripted stream.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from controller.caches import BY_RUN_UID, run_uid_index
from controller.metrics import Metrics
from controller.naming import RUN_UID_LABEL
from hack.cluster import LocalCluster
from kubeclient.client import KubeClient
from kubeclient.informer import Informer
from kubeclient.objects import object_key
from kubeclient.resources import CONFIGMAPS, NAMESPACES
from tests.integration.partition import behind_a_proxy
from tests.kubehelpers import controller_ref, eventually


def configmap(name: str, labels: dict[str, str] | None = None, **data: str) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if labels:
        metadata["labels"] = labels
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data}


class Seen:
    """Handler calls, as (kind, key) pairs."""

    def __init__(self, informer: Informer) -> None:
        self.calls: list[tuple[str, str]] = []
        informer.add_event_handler(
            on_add=lambda o: self.calls.append(("add", object_key(o))),
            on_update=lambda old, new: self.calls.append(("update", object_key(new))),
            on_delete=lambda o: self.calls.append(("delete", object_key(o))),
        )

    async def wait_for(self, *expected: tuple[str, str]) -> None:
        async def all_seen() -> bool:
            return all(call in self.calls for call in expected)

        await eventually(all_seen, within=30, what=f"handler calls {expected}")


@pytest.fixture
async def other_namespace(kube: KubeClient) -> AsyncIterator[str]:
    name = f"informer-other-{uuid.uuid4().hex[:6]}"
    await kube.create(
        NAMESPACES, None, {"metadata": {"name": name, "labels": {"ksc-test": "true"}}}
    )
    yield name
    await kube.delete(NAMESPACES, None, name)


async def started(informer: Informer, tasks: list[asyncio.Task[None]]) -> Informer:
    tasks.append(asyncio.create_task(informer.run()))
    await asyncio.wait_for(informer.wait_for_sync(), timeout=30)
    return informer


async def test_list_then_watch_follows_a_label_selector(
    kube: KubeClient, namespace: str, tasks: list[asyncio.Task[None]]
) -> None:
    label = {"app": "informer-test"}
    await kube.create(CONFIGMAPS, namespace, configmap("a", label, v="1"))
    await kube.create(CONFIGMAPS, namespace, configmap("unlabelled"))
    informer = Informer(
        kube, CONFIGMAPS, namespaces=[namespace], label_selector="app=informer-test"
    )
    seen = Seen(informer)
    await started(informer, tasks)

    assert [object_key(o) for o in informer.list()] == [f"{namespace}/a"]
    cached = informer.get(namespace, "a")
    assert cached is not None
    assert "managedFields" not in cached["metadata"]  # slimmed
    assert (cached["apiVersion"], cached["kind"]) == ("v1", "ConfigMap")
    assert seen.calls == [("add", f"{namespace}/a")]

    await kube.create(CONFIGMAPS, namespace, configmap("b", label))
    await kube.patch(CONFIGMAPS, namespace, "a", {"data": {"v": "2"}})
    await seen.wait_for(("add", f"{namespace}/b"), ("update", f"{namespace}/a"))
    assert informer.get(namespace, "a")["data"] == {"v": "2"}  # type: ignore[index]

    # Leaving the selector is a delete for this informer; so is a real delete.
    await kube.patch(CONFIGMAPS, namespace, "a", {"metadata": {"labels": None}})
    await kube.delete(CONFIGMAPS, namespace, "b")
    await seen.wait_for(("delete", f"{namespace}/a"), ("delete", f"{namespace}/b"))
    assert informer.list() == []
    assert ("add", f"{namespace}/unlabelled") not in seen.calls


async def test_a_big_list_arrives_in_pages(
    kube: KubeClient, namespace: str, tasks: list[asyncio.Task[None]]
) -> None:
    metrics = Metrics()
    for i in range(7):
        await kube.create(CONFIGMAPS, namespace, configmap(f"cm-{i}", {"paged": "yes"}))
    informer = Informer(
        kube,
        CONFIGMAPS,
        namespaces=[namespace],
        label_selector="paged=yes",
        page_size=3,
        metrics=metrics,
    )
    await started(informer, tasks)
    assert sorted(o["metadata"]["name"] for o in informer.list()) == [f"cm-{i}" for i in range(7)]
    assert (
        metrics.registry.get_sample_value(
            "kserve_inference_informer_lists_total", {"resource": "configmaps"}
        )
        == 1
    )


async def test_several_namespaces_share_one_cache_and_all_namespaces_sees_everything(
    kube: KubeClient, namespace: str, other_namespace: str, tasks: list[asyncio.Task[None]]
) -> None:
    selector = f"scope-test={namespace}"
    labels = {"scope-test": namespace}
    await kube.create(CONFIGMAPS, namespace, configmap("one", labels))
    await kube.create(CONFIGMAPS, other_namespace, configmap("two", labels))
    several = Informer(
        kube, CONFIGMAPS, namespaces=[namespace, other_namespace], label_selector=selector
    )
    only_one = Informer(kube, CONFIGMAPS, namespaces=[namespace], label_selector=selector)
    everywhere = Informer(kube, CONFIGMAPS, label_selector=selector)
    for informer in (several, only_one, everywhere):
        await started(informer, tasks)
    expected = sorted([f"{namespace}/one", f"{other_namespace}/two"])
    assert sorted(object_key(o) for o in several.list()) == expected
    assert sorted(object_key(o) for o in everywhere.list()) == expected
    assert [object_key(o) for o in only_one.list()] == [f"{namespace}/one"]

    await kube.create(CONFIGMAPS, other_namespace, configmap("three", labels))

    async def arrived() -> bool:
        return all(i.get(other_namespace, "three") for i in (several, everywhere))

    await eventually(arrived, within=30, what="the new object in both informers")
    assert only_one.get(other_namespace, "three") is None


async def test_children_by_owner_and_garbage_collection(
    kube: KubeClient, namespace: str, tasks: list[asyncio.Task[None]]
) -> None:
    parent = await kube.create(CONFIGMAPS, namespace, configmap("parent", {"family": "x"}))
    # Indexed as the controller indexes its children: by the owner's uid label.
    child = configmap("child", {"family": "x", RUN_UID_LABEL: parent["metadata"]["uid"]})
    child["metadata"]["ownerReferences"] = [controller_ref(parent)]
    await kube.create(CONFIGMAPS, namespace, child)
    informer = Informer(
        kube,
        CONFIGMAPS,
        namespaces=[namespace],
        label_selector="family=x",
        indexers={BY_RUN_UID: run_uid_index},
    )
    seen = Seen(informer)
    await started(informer, tasks)
    children = informer.by_index(BY_RUN_UID, parent["metadata"]["uid"])
    assert [o["metadata"]["name"] for o in children] == ["child"]

    # The real garbage collector removes the child once its owner is gone.
    await kube.delete(CONFIGMAPS, namespace, "parent", propagation_policy="Background")
    await seen.wait_for(("delete", f"{namespace}/parent"), ("delete", f"{namespace}/child"))
    assert informer.by_index(BY_RUN_UID, parent["metadata"]["uid"]) == []


async def test_watches_that_time_out_are_reopened_without_a_list_or_a_lost_event(
    cluster: LocalCluster, kube: KubeClient, namespace: str, tasks: list[asyncio.Task[None]]
) -> None:
    metrics = Metrics()
    informer = Informer(
        kube,
        CONFIGMAPS,
        namespaces=[namespace],
        label_selector="reopen=yes",
        watch_timeout=(1, 1),
        metrics=metrics,
    )
    seen = Seen(informer)
    await started(informer, tasks)
    for i in range(6):
        await kube.create(CONFIGMAPS, namespace, configmap(f"r{i}", {"reopen": "yes"}))
        await asyncio.sleep(0.7)
    await seen.wait_for(*[("add", f"{namespace}/r{i}") for i in range(6)])
    assert (
        metrics.registry.get_sample_value(
            "kserve_inference_informer_lists_total", {"resource": "configmaps"}
        )
        == 1
    )
    watches = [
        event
        for event in cluster.audit_events("admin")
        if event.get("verb") == "watch"
        and namespace in str(event.get("requestURI"))
        and event.get("stage") == "ResponseComplete"
    ]
    assert len(watches) >= 2  # the server ended watches and the informer reopened them


async def test_recovers_from_a_network_partition_and_catches_up(
    cluster: LocalCluster, kube: KubeClient, namespace: str, tasks: list[asyncio.Task[None]]
) -> None:
    proxy, configuration = await behind_a_proxy(cluster)
    metrics = Metrics()
    behind_proxy = KubeClient(configuration, metrics=metrics)
    try:
        await kube.create(CONFIGMAPS, namespace, configmap("before", {"fault": "yes"}))
        await kube.create(CONFIGMAPS, namespace, configmap("doomed", {"fault": "yes"}))
        informer = Informer(
            behind_proxy,
            CONFIGMAPS,
            namespaces=[namespace],
            label_selector="fault=yes",
            metrics=metrics,
        )
        seen = Seen(informer)
        await started(informer, tasks)

        proxy.cut()
        await kube.create(CONFIGMAPS, namespace, configmap("during", {"fault": "yes"}))
        await kube.delete(CONFIGMAPS, namespace, "doomed")
        await asyncio.sleep(3)
        assert informer.get(namespace, "during") is None  # nothing gets through
        proxy.restore()

        await seen.wait_for(("add", f"{namespace}/during"), ("delete", f"{namespace}/doomed"))
        assert sorted(o["metadata"]["name"] for o in informer.list()) == ["before", "during"]
        errors = metrics.registry.get_sample_value(
            "kserve_inference_informer_watch_errors_total",
            {"resource": "configmaps", "reason": "transport"},
        )
        assert errors is not None
        assert errors >= 1
    finally:
        await behind_proxy.close()
        await proxy.stop()
