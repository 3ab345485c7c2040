"""Events recorded on the real API server: what kubectl shows, aggregated."""

from __future__ import annotations

import asyncio
from typing import Any

from hack.cluster import LocalCluster
from kubeclient.client import KubeClient
from kubeclient.events import EventRecorder
from kubeclient.resources import CONFIGMAPS, EVENTS
from tests.kubehelpers import eventually


async def events_about(kube: KubeClient, namespace: str, name: str) -> list[dict[str, Any]]:
    listed = await kube.list(EVENTS, namespace, field_selector=f"involvedObject.name={name}")
    return list(listed["items"])


async def test_repeated_events_are_one_event_with_a_count(
    cluster: LocalCluster, kube: KubeClient, namespace: str
) -> None:
    subject = await kube.create(
        CONFIGMAPS,
        namespace,
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "subject"}},
    )
    recorder = EventRecorder(kube, instance="ctl-test", aggregate_interval=1.0)
    task = asyncio.create_task(recorder.run())
    try:
        for _ in range(20):
            recorder.warning(subject, "ConfigMissing", "InferenceConfig iris not found")
            await asyncio.sleep(0.1)
        recorder.normal(subject, "Created", "created something")
        await recorder.flush()

        async def aggregated() -> list[dict[str, Any]] | None:
            events = await events_about(kube, namespace, "subject")
            warnings = [e for e in events if e["reason"] == "ConfigMissing"]
            return events if len(warnings) == 1 and warnings[0]["count"] == 20 else None

        events = await eventually(aggregated, within=30, what="one event counting 20")
        assert len(events) == 2
        (warning,) = [e for e in events if e["type"] == "Warning"]
        assert warning["involvedObject"]["uid"] == subject["metadata"]["uid"]
        assert warning["source"]["component"] == "kserve-inference-controller"
        assert warning["reportingInstance"] == "ctl-test"
        assert warning["firstTimestamp"] <= warning["lastTimestamp"]
        # ... and this is what an operator sees.
        described = cluster.kubectl("describe", "configmap", "subject", "-n", namespace).stdout
        assert "ConfigMissing" in described
        assert "InferenceConfig iris not found" in described
    finally:
        task.cancel()
