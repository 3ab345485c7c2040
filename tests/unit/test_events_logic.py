"""The Events recorder's aggregation and spam filter, on fake loop time.

A recording fake stands in for the API client here (unit tests only); the real
API server takes these Events in tests/integration/test_events.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from controller.metrics import Metrics
from kubeclient.errors import ApiError, NotFound
from kubeclient.events import EventRecorder, event_name
from kubeclient.resources import Resource

pytestmark = [pytest.mark.unit, pytest.mark.looptime]

RUN: dict[str, Any] = {
    "apiVersion": "ai.krateo.io/v1",
    "kind": "InferenceRun",
    "metadata": {"name": "iris", "namespace": "team-a", "uid": "u-1", "resourceVersion": "7"},
}


class FakeEventsApi:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str | None, str, dict[str, Any]]] = []
        self.fail_next: list[ApiError] = []

    async def create(
        self, resource: Resource, namespace: str | None, body: dict[str, Any]
    ) -> dict[str, Any]:
        self.calls.append(("create", namespace, body["metadata"]["name"], body))
        if self.fail_next:
            raise self.fail_next.pop(0)
        return body

    async def patch(
        self, resource: Resource, namespace: str | None, name: str, patch: dict[str, Any]
    ) -> dict[str, Any]:
        self.calls.append(("patch", namespace, name, patch))
        if self.fail_next:
            raise self.fail_next.pop(0)
        return patch


class Clock:
    """Wall time that follows the (fake) loop time from its first reading on."""

    def __init__(self) -> None:
        self.start = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
        self.t0: float | None = None

    def __call__(self) -> datetime:
        now = asyncio.get_running_loop().time()
        if self.t0 is None:
            self.t0 = now
        return self.start + timedelta(seconds=now - self.t0)


@pytest.fixture
async def api() -> FakeEventsApi:
    return FakeEventsApi()


@pytest.fixture
async def recorder(api: FakeEventsApi) -> AsyncIterator[EventRecorder]:
    rec = EventRecorder(api, instance="ctl-1", metrics=Metrics(), wall_clock=Clock())
    task = asyncio.create_task(rec.run())
    yield rec
    task.cancel()


async def test_a_new_event_is_created_with_the_involved_object(
    api: FakeEventsApi, recorder: EventRecorder
) -> None:
    recorder.normal(RUN, "JobCreated", "created Job inf-iris-u1", action="Create")
    await recorder.flush()
    ((verb, namespace, name, body),) = api.calls
    assert (verb, namespace) == ("create", "team-a")
    assert name.startswith("iris.")
    assert body["involvedObject"] == {
        "apiVersion": "ai.krateo.io/v1",
        "kind": "InferenceRun",
        "name": "iris",
        "namespace": "team-a",
        "uid": "u-1",
        "resourceVersion": "7",
    }
    assert body["type"] == "Normal"
    assert body["reason"] == "JobCreated"
    assert body["count"] == 1
    assert body["firstTimestamp"] == body["lastTimestamp"] == "2026-05-01T12:00:00Z"
    assert body["source"] == {"component": "kserve-inference-controller"}
    assert body["reportingInstance"] == "ctl-1"
    assert body["action"] == "Create"


async def test_repeats_become_one_event_patched_at_most_once_a_minute(
    api: FakeEventsApi, recorder: EventRecorder
) -> None:
    for _ in range(10):  # a failing run, every 5 s for 50 s
        recorder.warning(RUN, "ConfigMissing", "InferenceConfig team-a/iris not found")
        await asyncio.sleep(5)
    await recorder.flush()
    assert [c[0] for c in api.calls] == ["create"]
    await asyncio.sleep(15)  # the deferred patch is due 60 s after the create
    await recorder.flush()
    assert [c[0] for c in api.calls] == ["create", "patch"]
    _, _, name, patch = api.calls[1]
    assert name == api.calls[0][2]
    assert patch == {"count": 10, "lastTimestamp": "2026-05-01T12:00:45Z"}
    await asyncio.sleep(600)
    assert len(api.calls) == 2  # nothing new, nothing written


@pytest.mark.parametrize(
    ("apart", "expired", "calls"),
    [
        pytest.param(
            120,
            False,
            [("create", 1), ("patch", 2)],
            id="a-repeat-after-the-interval-is-written-at-once",
        ),
        pytest.param(
            3700,
            True,
            [("create", 1), ("patch", 2), ("create", 2)],
            id="an-expired-event-is-created-again-with-the-total",
        ),
    ],
)
async def test_a_repeat_later_on(
    api: FakeEventsApi,
    recorder: EventRecorder,
    apart: float,
    expired: bool,
    calls: list[tuple[str, int]],
) -> None:
    recorder.warning(RUN, "Failed", "boom")
    await recorder.flush()
    await asyncio.sleep(apart)
    if expired:  # gone from the API server: the patch of the repeat finds nothing
        api.fail_next.append(NotFound(404, "NotFound"))
    recorder.warning(RUN, "Failed", "boom")
    await recorder.flush()
    assert [(c[0], c[3].get("count")) for c in api.calls] == calls


async def test_distinct_messages_objects_and_types_are_distinct_events(
    api: FakeEventsApi, recorder: EventRecorder
) -> None:
    other = {**RUN, "metadata": {**RUN["metadata"], "name": "ttm", "uid": "u-2"}}
    recorder.warning(RUN, "Failed", "one")
    recorder.warning(RUN, "Failed", "two")
    recorder.normal(RUN, "Failed", "one")
    recorder.warning(other, "Failed", "one")
    await recorder.flush()
    assert [c[0] for c in api.calls] == ["create"] * 4


async def test_spam_filter_caps_distinct_events_per_object(
    api: FakeEventsApi, recorder: EventRecorder
) -> None:
    for i in range(40):
        recorder.warning(RUN, "Progress", f"step {i}")
    await recorder.flush()
    assert len(api.calls) == 25
    await asyncio.sleep(300)  # one token back
    recorder.warning(RUN, "Progress", "later")
    recorder.warning(RUN, "Progress", "later still")
    await recorder.flush()
    assert len(api.calls) == 26
    metrics = recorder._metrics
    assert isinstance(metrics, Metrics)
    assert (
        metrics.registry.get_sample_value(
            "kserve_inference_controller_events_total", {"outcome": "dropped"}
        )
        == 16
    )


async def test_api_failures_never_reach_the_caller(
    api: FakeEventsApi, recorder: EventRecorder
) -> None:
    api.fail_next.append(ApiError(403, "Forbidden", "events is forbidden"))
    recorder.warning(RUN, "Failed", "boom")
    await recorder.flush()
    recorder.warning(RUN, "Failed", "boom")  # retried as a create
    await recorder.flush()
    assert [c[0] for c in api.calls] == ["create", "create"]


async def test_long_messages_are_truncated_and_bad_input_is_rejected(
    api: FakeEventsApi, recorder: EventRecorder
) -> None:
    recorder.warning(RUN, "Failed", "x" * 5000)
    await recorder.flush()
    assert len(api.calls[0][3]["message"]) == 1024
    with pytest.raises(ValueError, match="Normal or Warning"):
        recorder.record(RUN, "Error", "r", "m")
    with pytest.raises(ValueError, match=r"kind and metadata\.name"):
        recorder.warning({"metadata": {}}, "r", "m")


async def test_a_full_queue_drops_instead_of_blocking(api: FakeEventsApi) -> None:
    rec = EventRecorder(api, queue_size=2, spam_burst=100)
    for i in range(5):
        rec.warning(RUN, "Failed", f"m{i}")
    task = asyncio.create_task(rec.run())
    await rec.flush()
    task.cancel()
    assert len(api.calls) == 2


def test_event_names_follow_client_go() -> None:
    at = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
    assert event_name("iris", at) == f"iris.{int(at.timestamp() * 1e9):x}"
    assert len(event_name("x" * 300, at)) <= 253


def terminating(namespace: str) -> ApiError:
    return ApiError(
        403,
        "Forbidden",
        f"unable to create new content in namespace {namespace} because it is being terminated",
        body={"details": {"causes": [{"reason": "NamespaceTerminating"}]}},
    )


async def test_a_namespace_being_deleted_gets_one_refused_create_a_minute(
    api: FakeEventsApi, recorder: EventRecorder
) -> None:
    api.fail_next = [terminating("team-a")]
    recorder.warning(RUN, "Failed", "runner exited with code 4")
    await recorder.flush()
    # Told once: nothing more is sent there for a while, other namespaces go on.
    other = {**RUN, "metadata": {**RUN["metadata"], "name": "b", "uid": "u-2"}}
    recorder.warning(other, "Failed", "again")
    recorder.normal(RUN, "Created", "created Job inf-iris-u1")
    elsewhere = {**RUN, "metadata": {**RUN["metadata"], "namespace": "team-b"}}
    recorder.normal(elsewhere, "Created", "created Job inf-iris-u1")
    await recorder.flush()
    assert [(verb, ns) for verb, ns, _, _ in api.calls] == [
        ("create", "team-a"),
        ("create", "team-b"),
    ]
    await asyncio.sleep(61)
    recorder.normal(RUN, "Created", "created Job inf-iris-u1 again")
    await recorder.flush()
    assert [(verb, ns) for verb, ns, _, _ in api.calls][-1] == ("create", "team-a")
