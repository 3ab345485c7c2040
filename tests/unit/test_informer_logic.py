"""The informer's pure parts and its list/watch loop, driven by a scripted fake source.

The fake stands in for the API server only here, in unit tests; the same
loop runs against the real API server in tests/integration/test_informer.py.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import tracemalloc
from collections import deque
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from structlog.testing import capture_logs

from controller.metrics import Metrics
from kubeclient.backoff import Backoff
from kubeclient.errors import ApiError, TransportError
from kubeclient.informer import (
    LAST_APPLIED,
    WATCH_IDLE_TIMEOUT,
    Informer,
    WatchExpired,
    WatchFailed,
    slim,
)
from kubeclient.objects import controller_of, is_controlled_by, object_key
from kubeclient.resources import Resource
from kubeclient.store import Store

pytestmark = pytest.mark.unit

RUNS = Resource("ai.krateo.io", "v1", "inferenceruns", "InferenceRun")


def obj(name: str, rv: str, namespace: str = "ns", **extra: Any) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "resourceVersion": rv}
    metadata.update(extra.pop("metadata", {}))
    return {"apiVersion": "ai.krateo.io/v1", "kind": "InferenceRun", "metadata": metadata, **extra}


def page(items: list[dict[str, Any]], rv: str, cont: str | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"resourceVersion": rv}
    if cont:
        metadata["continue"] = cont
    return {"kind": "InferenceRunList", "metadata": metadata, "items": items}


def ev(kind: str, o: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "object": o}


def bookmark(rv: str) -> dict[str, Any]:
    return ev("BOOKMARK", {"kind": "InferenceRun", "metadata": {"resourceVersion": rv}})


def error_event(code: int) -> dict[str, Any]:
    return ev("ERROR", {"kind": "Status", "code": code, "reason": "Expired", "message": "too old"})


# A watch script; an alias because FakeSource.list shadows the builtin in the class.
Steps = list[Any]
HANG = "hang"  # a watch step: stay open until cancelled
END = "end"  # the server closes the watch (after MIN_HEALTHY_WATCH of loop time)


@dataclass(frozen=True)
class Pause:
    """A watch step: nothing for ``seconds``, then the next step."""

    seconds: float


class FakeSource:
    """Scripted list pages and watch streams, per namespace; exhausted scripts hang."""

    def __init__(self) -> None:
        self.lists: dict[str | None, deque[Any]] = {}
        self.watches: dict[str | None, deque[list[Any]]] = {}
        self.list_calls: list[dict[str, Any]] = []
        self.watch_calls: list[dict[str, Any]] = []
        self.closed_streams = 0

    def script_list(self, namespace: str | None, *responses: Any) -> None:
        self.lists.setdefault(namespace, deque()).extend(responses)

    def script_watch(self, namespace: str | None, *streams: list[Any]) -> None:
        self.watches.setdefault(namespace, deque()).extend(streams)

    # KubeClient.list and .watch, scripted. Each call is recorded with the
    # options the informer passed (by KubeClient's keyword names) and its loop time.

    async def list(
        self, resource: Resource, namespace: str | None = None, **options: Any
    ) -> dict[str, Any]:
        self.list_calls.append(self._call(namespace, options))
        script = self.lists.get(namespace)
        if not script:
            await asyncio.Future()  # hang
        response = script.popleft()  # type: ignore[union-attr]
        if isinstance(response, Exception):
            raise response
        return response  # type: ignore[no-any-return]

    def watch(
        self, resource: Resource, namespace: str | None = None, **options: Any
    ) -> AsyncIterator[dict[str, Any]]:
        self.watch_calls.append(self._call(namespace, options))
        script = self.watches.get(namespace)
        steps = script.popleft() if script else [HANG]
        return self._stream(steps)

    @staticmethod
    def _call(namespace: str | None, options: dict[str, Any]) -> dict[str, Any]:
        return {"namespace": namespace, **options, "at": asyncio.get_running_loop().time()}

    async def _stream(self, steps: Steps) -> AsyncIterator[dict[str, Any]]:
        try:
            for step in steps:
                if isinstance(step, Exception):
                    raise step
                if isinstance(step, Pause):
                    await asyncio.sleep(step.seconds)
                elif step == HANG:
                    await asyncio.Future()
                elif step == END:
                    await asyncio.sleep(5)
                    return
                else:
                    yield step
        finally:
            self.closed_streams += 1


class Recorder:
    def __init__(self, informer: Informer) -> None:
        self.calls: list[tuple[str, ...]] = []
        informer.add_event_handler(
            on_add=lambda o: self.calls.append(("add", object_key(o), _rv(o))),
            on_update=lambda old, new: self.calls.append(
                ("update", object_key(new), _rv(old), _rv(new))
            ),
            on_delete=lambda o: self.calls.append(("delete", object_key(o), _rv(o))),
        )


def _rv(o: dict[str, Any]) -> str:
    return str(o["metadata"].get("resourceVersion"))


@pytest.fixture
def source() -> FakeSource:
    return FakeSource()


def start(informer: Informer, tasks: list[asyncio.Task[None]]) -> None:
    tasks.append(asyncio.create_task(informer.run()))


def gaps(times: Sequence[float]) -> list[float]:
    """The time between each call and the next."""
    return [b - a for a, b in itertools.pairwise(times)]


def backoff_steps(waits: Iterable[float]) -> list[int | None]:
    """The step of the jittered 0.8 s doubling backoff each wait falls in.

    Step n is ``0.8 * 2**n <= wait < 1.6 * 2**n`` (0.8-1.6 s, 1.6-3.2 s,
    3.2-6.4 s...); None for a wait in none of the first ten.
    """
    steps: list[int | None] = []
    for wait in waits:
        lows = (0.8 * 2**n for n in range(10))
        steps.append(next((n for n, low in enumerate(lows) if low <= wait < 2 * low), None))
    return steps


# ------------------------------------------------------------------ pure helpers


def test_slim_drops_managed_fields_and_last_applied_without_touching_the_original() -> None:
    original = obj(
        "a",
        "1",
        metadata={
            "managedFields": [{"manager": "kubectl"}],
            "annotations": {LAST_APPLIED: "{...}", "keep": "me"},
            "labels": {"x": "y"},
        },
        spec={"p": 1},
    )
    slimmed = slim(original)
    assert "managedFields" not in slimmed["metadata"]
    assert slimmed["metadata"]["annotations"] == {"keep": "me"}
    assert slimmed["metadata"]["labels"] == {"x": "y"}
    assert slimmed["spec"] == {"p": 1}
    assert "managedFields" in original["metadata"]
    assert LAST_APPLIED in original["metadata"]["annotations"]


def test_slim_removes_annotations_left_empty_and_keeps_lean_objects_as_they_are() -> None:
    only_last_applied = obj("a", "1", metadata={"annotations": {LAST_APPLIED: "{}"}})
    assert "annotations" not in slim(only_last_applied)["metadata"]
    lean = obj("b", "1")
    assert slim(lean) is lean


def test_object_keys() -> None:
    assert object_key(obj("a", "1", namespace="ns")) == "ns/a"
    assert object_key({"metadata": {"name": "node-1"}}) == "node-1"
    with pytest.raises(ValueError, match=r"no metadata\.name"):
        object_key({"metadata": {}})


def test_owner_helpers() -> None:
    child = obj(
        "job",
        "1",
        metadata={
            "ownerReferences": [
                {"uid": "u1", "kind": "Other"},
                {"uid": "u2", "kind": "InferenceRun", "controller": True},
            ]
        },
    )
    assert controller_of(child) == {"uid": "u2", "kind": "InferenceRun", "controller": True}
    assert is_controlled_by(child, "u2")
    assert not is_controlled_by(child, "u1")  # an owner, not the controlling one
    assert controller_of(obj("lonely", "1")) is None
    assert not is_controlled_by(obj("lonely", "1"), "u2")


@pytest.mark.parametrize("packed", [False, True])
def test_store_indexes_follow_adds_updates_and_removals(packed: bool) -> None:
    def by_config(o: dict[str, Any]) -> list[str]:
        ref = o.get("spec", {}).get("configRef")
        return [f"{o['metadata']['namespace']}/{ref}"] if ref else []

    store = Store({"by-config": by_config}, packed=packed)
    store.upsert(obj("r1", "1", spec={"configRef": "iris"}))
    store.upsert(obj("r2", "1", spec={"configRef": "iris"}))
    store.upsert(obj("r3", "1", spec={"configRef": "ttm"}))
    assert store.index_keys("by-config", "ns/iris") == ["ns/r1", "ns/r2"]
    assert store.index_count("by-config", "ns/iris") == 2
    assert store.index_count("by-config", "ns/ttm") == 1
    assert store.index_count("by-config", "nowhere") == 0
    store.upsert(obj("r2", "2", spec={"configRef": "ttm"}))
    assert store.index_keys("by-config", "ns/iris") == ["ns/r1"]
    assert [o["metadata"]["name"] for o in store.by_index("by-config", "ns/ttm")] == ["r2", "r3"]
    store.remove("ns/r1")
    assert store.index_keys("by-config", "ns/iris") == []
    assert store.index_keys("by-config", "nowhere") == []
    # built over what is there already
    store.add_indexer("by-namespace", lambda o: [o["metadata"]["namespace"]])
    assert store.index_keys("by-namespace", "ns") == ["ns/r2", "ns/r3"]
    with pytest.raises(KeyError, match="no index named"):
        store.index_keys("missing", "x")
    with pytest.raises(ValueError, match="exists already"):
        store.add_indexer("by-config", by_config)


@pytest.mark.parametrize("packed", [False, True])
def test_store_lists_by_namespace(packed: bool) -> None:
    store = Store(packed=packed)
    store.upsert(obj("a", "1", namespace="one"))
    store.upsert(obj("b", "1", namespace="two"))
    assert [o["metadata"]["name"] for o in store.list("one")] == ["a"]
    assert len(store.list()) == 2
    assert "two/b" in store
    assert len(store) == 2


def test_a_packed_store_keeps_json_and_hands_out_a_new_copy_on_every_read() -> None:
    store = Store({"by-config": lambda o: [o["spec"]["configRef"]]}, packed=True)
    kept = obj("r1", "1", spec={"configRef": "iris", "n": 1}, status={"phase": "Running"})
    assert store.upsert(kept) is None
    kept["status"]["phase"] = "changed by the writer afterwards"
    first = store.get("ns/r1")
    assert first == obj("r1", "1", spec={"configRef": "iris", "n": 1}, status={"phase": "Running"})
    first["spec"]["n"] = 2  # a reader changing its copy
    assert store.get("ns/r1") == store.list()[0] == store.by_index("by-config", "iris")[0]
    assert store.get("ns/r1")["spec"]["n"] == 1  # type: ignore[index]
    assert store.get("ns/r1") is not store.get("ns/r1")
    # The replaced and the removed object come back whole, and unindexed.
    old = store.upsert(obj("r1", "2", spec={"configRef": "ttm", "n": 3}))
    assert old is not None
    assert old["spec"] == {"configRef": "iris", "n": 1}
    assert store.index_keys("by-config", "iris") == []
    removed = store.remove("ns/r1")
    assert removed is not None
    assert removed["metadata"]["resourceVersion"] == "2"
    assert store.index_keys("by-config", "ttm") == []
    assert len(store) == 0
    assert store.remove("ns/r1") is None


def test_a_packed_store_keeps_each_object_in_bytes_of_its_json_size() -> None:
    store = Store(packed=True)
    objects = [obj(f"r{i}", "1", spec={"text": "x" * 1500}) for i in range(200)]
    size = len(orjson.dumps(objects[0]))
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for o in objects:
            store.upsert(o)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert all(isinstance(v, bytes) for v in store._items.values())
    # The JSON, the bytes header, the key and the dict's slot: not orjson's
    # whole output buffer (16 KB for such an object).
    assert grown / len(objects) < size + 400, (grown / len(objects), size)


def test_backoff_doubles_from_0_8s_jittered_and_capped_at_30s() -> None:
    backoff = Backoff(rng=random.Random(1))
    delays = [backoff.next() for _ in range(10)]
    bases = [0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30, 30, 30, 30]
    for delay, base in zip(delays, bases, strict=True):
        assert min(base, 30) <= delay <= min(2 * base, 30)
    assert len(set(delays[:5])) == 5  # jittered, not fixed steps
    backoff.reset()
    assert 0.8 <= backoff.next() < 1.6
    with pytest.raises(ValueError, match="initial"):
        Backoff(initial=0)


# ------------------------------------------------------------ events and relists


def test_watch_events_update_the_cache_and_call_the_handlers(source: FakeSource) -> None:
    informer = Informer(source, RUNS)
    seen = Recorder(informer)
    assert informer.handle_event(ev("ADDED", obj("a", "5"))) == "5"
    assert informer.handle_event(ev("MODIFIED", obj("a", "6", spec={"x": 1}))) == "6"
    assert informer.get("ns", "a")["spec"] == {"x": 1}  # type: ignore[index]
    assert informer.handle_event(bookmark("9")) == "9"
    assert informer.handle_event(ev("DELETED", obj("a", "10"))) == "10"
    assert informer.get_by_key("ns/a") is None
    assert seen.calls == [
        ("add", "ns/a", "5"),
        ("update", "ns/a", "5", "6"),
        ("delete", "ns/a", "10"),
    ]


def test_watch_events_are_slimmed_before_caching(source: FakeSource) -> None:
    informer = Informer(source, RUNS)
    informer.handle_event(ev("ADDED", obj("a", "1", metadata={"managedFields": [{}]})))
    assert "managedFields" not in informer.get("ns", "a")["metadata"]  # type: ignore[index]


def test_own_writes_are_assumed_into_the_cache_without_a_second_notification(
    source: FakeSource,
) -> None:
    informer = Informer(source, RUNS)
    seen = Recorder(informer)
    created = obj("job", "5", metadata={"managedFields": [{}]})
    informer.assume(created)
    assert informer.get("ns", "job") == slim(created)
    assert seen.calls == []
    informer.handle_event(ev("ADDED", created))  # the watch catches up: nothing new
    assert seen.calls == []
    informer.handle_event(ev("MODIFIED", obj("job", "6")))  # someone else's change
    assert seen.calls == [("update", "ns/job", "5", "6")]
    informer.assume(obj("job", "5"))  # a late answer never rolls the cache back
    assert informer.get("ns", "job")["metadata"]["resourceVersion"] == "6"  # type: ignore[index]
    informer.assume_deleted("ns/job")
    assert informer.get("ns", "job") is None
    informer.handle_event(ev("DELETED", obj("job", "7")))
    assert seen.calls[-1] == ("delete", "ns/job", "7")


@pytest.mark.parametrize("namespaces", [(), ("ns", "other")], ids=["cluster-wide", "by-namespace"])
def test_a_late_answer_never_brings_a_deleted_object_back(
    source: FakeSource, namespaces: tuple[str, ...]
) -> None:
    informer = Informer(source, RUNS, namespaces=namespaces)
    seen = Recorder(informer)
    informer.handle_event(ev("ADDED", obj("run", "5")))
    # A status write the API server answered at 6, then the run deleted at 7,
    # whose DELETED event is applied before the write's answer is assumed.
    informer.handle_event(ev("DELETED", obj("run", "7")))
    informer.assume(obj("run", "6"))
    assert informer.get("ns", "run") is None
    informer.refresh(obj("run", "6"))  # a live read answered before the delete, too
    assert informer.get("ns", "run") is None
    # Cluster-wide, the cache was complete as of 7 in every namespace, so
    # other/run at 6 would be in it: it was deleted. By namespace, "other" has
    # a watch of its own, which has said nothing yet: it is cached.
    informer.assume(obj("run", "6", namespace="other"))
    assert (informer.get("other", "run") is None) == (namespaces == ())
    # A run created again under the same name is newer: cached.
    informer.assume(obj("run", "8"))
    assert informer.get("ns", "run")["metadata"]["resourceVersion"] == "8"  # type: ignore[index]
    assert seen.calls == [("add", "ns/run", "5"), ("delete", "ns/run", "7")]


def _project(o: dict[str, Any]) -> dict[str, Any] | None:
    """A transform: drops namespace "other", keeps only metadata and spec.x."""
    if o["metadata"].get("namespace") == "other" or (o.get("spec") or {}).get("skip"):
        return None
    return {"metadata": o["metadata"], "spec": {"x": (o.get("spec") or {}).get("x")}}


def test_a_transform_shapes_every_path_into_the_cache(source: FakeSource) -> None:
    informer = Informer(source, RUNS, transform=_project)
    seen = Recorder(informer)
    big = obj("a", "1", spec={"x": 1, "y": "big"}, metadata={"managedFields": [{}]})
    informer.handle_event(ev("ADDED", big))
    assert informer.get("ns", "a") == {
        "metadata": {"name": "a", "namespace": "ns", "resourceVersion": "1"},
        "spec": {"x": 1},
    }
    informer.assume(obj("b", "2", spec={"x": 2, "y": "big"}))
    assert informer.get("ns", "b") == {
        "metadata": {"name": "b", "namespace": "ns", "resourceVersion": "2"},
        "spec": {"x": 2},
    }
    informer.replace(None, [obj("c", "3", spec={"y": 1}), obj("d", "3", namespace="other")])
    assert informer.get("ns", "c") == {
        "metadata": {"name": "c", "namespace": "ns", "resourceVersion": "3"},
        "spec": {"x": None},
    }
    assert informer.get("other", "d") is None
    # The relist replaced the scope: a and b were not in it.
    assert seen.calls == [
        ("add", "ns/a", "1"),
        ("add", "ns/c", "3"),
        ("delete", "ns/a", "1"),
        ("delete", "ns/b", "2"),
    ]


def test_objects_the_transform_rejects_are_never_cached_nor_delivered(
    source: FakeSource,
) -> None:
    informer = Informer(source, RUNS, transform=_project)
    seen = Recorder(informer)
    informer.handle_event(ev("ADDED", obj("d", "1", namespace="other")))
    informer.assume(obj("e", "2", namespace="other"))
    informer.handle_event(ev("DELETED", obj("d", "3", namespace="other")))
    assert informer.list() == []
    assert seen.calls == []
    # An object that stops passing the transform leaves the cache as a delete.
    informer.handle_event(ev("ADDED", obj("a", "4")))
    informer.handle_event(ev("MODIFIED", obj("a", "5", spec={"skip": True})))
    assert informer.get("ns", "a") is None
    assert seen.calls == [("add", "ns/a", "4"), ("delete", "ns/a", "4")]


def test_error_events_expire_or_fail_the_watch(source: FakeSource) -> None:
    informer = Informer(source, RUNS)
    with pytest.raises(WatchExpired):
        informer.handle_event(error_event(410))
    with pytest.raises(WatchFailed, match="500"):
        informer.handle_event(error_event(500))
    with pytest.raises(WatchFailed, match="without an object"):
        informer.handle_event({"type": "ADDED"})


def test_a_failing_handler_neither_stops_the_others_nor_the_informer(source: FakeSource) -> None:
    informer = Informer(source, RUNS)

    def boom(o: dict[str, Any]) -> None:
        raise RuntimeError("handler bug")

    informer.add_event_handler(on_add=boom)
    seen = Recorder(informer)
    informer.handle_event(ev("ADDED", obj("a", "1")))
    assert seen.calls == [("add", "ns/a", "1")]
    assert informer.get("ns", "a") is not None


def test_replace_turns_a_relist_into_adds_updates_and_deletes(source: FakeSource) -> None:
    informer = Informer(source, RUNS)
    informer.replace(None, [obj("same", "1"), obj("changed", "1"), obj("vanished", "1")])
    seen = Recorder(informer)
    seen.calls.clear()  # the replay of cached objects to on_add
    informer.replace(None, [obj("same", "1"), obj("changed", "2"), obj("new", "3")])
    assert sorted(seen.calls) == [
        ("add", "ns/new", "3"),
        ("delete", "ns/vanished", "1"),
        ("update", "ns/changed", "1", "2"),
    ]


def test_replace_of_one_namespace_leaves_the_others_alone(source: FakeSource) -> None:
    informer = Informer(source, RUNS, namespaces=["a", "b"])
    informer.replace("a", [obj("x", "1", namespace="a")])
    assert not informer.has_synced()
    informer.replace("b", [obj("y", "1", namespace="b")])
    assert informer.has_synced()
    informer.replace("a", [])
    assert informer.get("a", "x") is None
    assert informer.get("b", "y") is not None


def test_add_event_handler_replays_the_cache(source: FakeSource) -> None:
    informer = Informer(source, RUNS)
    informer.replace(None, [obj("a", "1"), obj("b", "2")])
    seen = Recorder(informer)
    assert sorted(seen.calls) == [("add", "ns/a", "1"), ("add", "ns/b", "2")]


def test_cluster_scoped_resources_take_no_namespaces(source: FakeSource) -> None:
    nodes = Resource("", "v1", "nodes", "Node", namespaced=False)
    with pytest.raises(ValueError, match="cluster-scoped"):
        Informer(source, nodes, namespaces=["a"])


# ---------------------------------------------------------------- the loop itself


@pytest.mark.looptime
async def test_lists_every_page_then_watches_from_the_list_version(
    source: FakeSource, tasks: list[asyncio.Task[None]]
) -> None:
    source.script_list(
        None,
        page([obj("a", "3")], "10", cont="next"),
        page([obj("b", "4")], "10"),
    )
    informer = Informer(source, RUNS, label_selector="app=x", rng=random.Random(5), page_size=1)
    seen = Recorder(informer)
    start(informer, tasks)
    await informer.wait_for_sync()
    await asyncio.sleep(1)
    assert informer.has_synced()
    assert [c["continue_token"] for c in source.list_calls] == [None, "next"]
    assert all(c["label_selector"] == "app=x" and c["limit"] == 1 for c in source.list_calls)
    assert sorted(seen.calls) == [("add", "ns/a", "3"), ("add", "ns/b", "4")]
    (watch,) = source.watch_calls
    assert watch["resource_version"] == "10"
    assert watch["allow_bookmarks"] is True
    assert watch["label_selector"] == "app=x"
    assert 300 <= watch["timeout_seconds"] <= 600


@pytest.mark.looptime
async def test_listed_items_get_the_type_that_lists_leave_out(
    source: FakeSource, tasks: list[asyncio.Task[None]]
) -> None:
    bare = {"metadata": {"name": "a", "namespace": "ns", "resourceVersion": "3"}}
    source.script_list(None, page([bare], "10"))
    informer = Informer(source, RUNS)
    start(informer, tasks)
    await informer.wait_for_sync()
    cached = informer.get("ns", "a")
    assert cached is not None
    assert (cached["apiVersion"], cached["kind"]) == ("ai.krateo.io/v1", "InferenceRun")


@pytest.mark.looptime
async def test_watch_timeouts_are_randomised_between_5_and_10_minutes(
    source: FakeSource, tasks: list[asyncio.Task[None]]
) -> None:
    source.script_list(None, page([], "10"))
    source.script_watch(None, *([END] for _ in range(20)))
    informer = Informer(source, RUNS, rng=random.Random(11))
    start(informer, tasks)
    await asyncio.sleep(150)
    timeouts = [c["timeout_seconds"] for c in source.watch_calls]
    assert len(timeouts) == 21
    assert all(300 <= t <= 600 for t in timeouts)
    assert len(set(timeouts)) > 10


@pytest.mark.looptime
async def test_a_watch_the_server_ends_is_reopened_from_the_last_version_without_a_list(
    source: FakeSource, tasks: list[asyncio.Task[None]]
) -> None:
    source.script_list(None, page([], "10"))
    source.script_watch(
        None,
        [ev("ADDED", obj("a", "11")), bookmark("15"), END],
        [ev("MODIFIED", obj("a", "16")), END],
    )
    informer = Informer(source, RUNS)
    start(informer, tasks)
    await asyncio.sleep(30)
    assert [c["resource_version"] for c in source.watch_calls] == ["10", "15", "16"]
    assert len(source.list_calls) == 1
    # reopened at once, not after a backoff
    assert source.watch_calls[1]["at"] == source.watch_calls[0]["at"] + 5
    assert source.closed_streams == 2


@pytest.mark.looptime
@pytest.mark.parametrize(
    "expiry",
    [
        pytest.param([error_event(410)], id="error-event"),
        pytest.param([ApiError(410)], id="http-410"),
    ],
)
async def test_410_gone_relists_and_reports_what_changed_meanwhile(
    source: FakeSource, tasks: list[asyncio.Task[None]], expiry: list[Any]
) -> None:
    metrics = Metrics()
    source.script_list(
        None,
        page([obj("stays", "1"), obj("goes", "2"), obj("changes", "3")], "10"),
        page([obj("stays", "1"), obj("changes", "20"), obj("arrives", "21")], "30"),
    )
    source.script_watch(None, [ev("ADDED", obj("early", "11")), *expiry])
    informer = Informer(source, RUNS, metrics=metrics)
    seen = Recorder(informer)
    start(informer, tasks)
    await asyncio.sleep(1)
    assert len(source.list_calls) == 2
    assert [c["resource_version"] for c in source.watch_calls] == ["10", "30"]
    assert seen.calls[3:] == [
        ("add", "ns/early", "11"),
        # the relist, diffed against the cache
        ("update", "ns/changes", "3", "20"),
        ("add", "ns/arrives", "21"),
        ("delete", "ns/goes", "2"),
        ("delete", "ns/early", "11"),
    ]
    assert sorted(o["metadata"]["name"] for o in informer.list()) == ["arrives", "changes", "stays"]
    assert (
        metrics.registry.get_sample_value(
            "kserve_inference_informer_watch_errors_total",
            {"resource": "inferenceruns.ai.krateo.io", "reason": "gone"},
        )
        == 1
    )
    assert (
        metrics.registry.get_sample_value(
            "kserve_inference_informer_lists_total", {"resource": "inferenceruns.ai.krateo.io"}
        )
        == 2
    )


@pytest.mark.looptime
async def test_repeated_410s_back_off_instead_of_relisting_in_a_loop(
    source: FakeSource, tasks: list[asyncio.Task[None]]
) -> None:
    source.script_list(None, *(page([], str(10 * i)) for i in range(1, 6)))
    source.script_watch(None, *([ApiError(410)] for _ in range(4)))
    informer = Informer(source, RUNS, rng=random.Random(2))
    start(informer, tasks)
    await asyncio.sleep(120)
    times = [c["at"] for c in source.list_calls]
    assert len(times) == 5
    waits = gaps(times)
    assert waits[0] == 0  # the first relist is immediate
    assert backoff_steps(waits[1:3]) == [0, 1]


@pytest.mark.looptime
async def test_errors_back_off_jittered_and_resume_from_the_same_version(
    source: FakeSource, tasks: list[asyncio.Task[None]]
) -> None:
    source.script_list(None, page([], "10"))
    source.script_watch(
        None,
        [ApiError(500, "InternalError")],
        [ApiError(403, "Forbidden")],
        [error_event(500)],
        [ev("ADDED", obj("a", "12")), error_event(500)],
        [ApiError(503, "ServiceUnavailable")],
    )
    # No idle bound: the last watch stays open and stays the last (see the idle tests).
    informer = Informer(source, RUNS, rng=random.Random(3), idle_timeout=None)
    start(informer, tasks)
    await asyncio.sleep(200)
    calls = source.watch_calls
    assert [c["resource_version"] for c in calls] == ["10", "10", "10", "10", "12", "12"]
    # The fourth wait is back at the first step: an event reset the backoff.
    assert backoff_steps(gaps([c["at"] for c in calls])[:5]) == [0, 1, 2, 0, 1]
    assert len(source.list_calls) == 1


@pytest.mark.looptime
async def test_a_server_that_does_not_answer_is_retried_every_second_without_growing_the_backoff(
    source: FakeSource, tasks: list[asyncio.Task[None]]
) -> None:
    metrics = Metrics()
    source.script_list(None, page([], "10"))
    refused = [[TransportError(0, "ClientConnectorError")] for _ in range(60)]
    source.script_watch(
        None,
        [ev("ADDED", obj("a", "11")), TransportError(0, "ClientPayloadError")],
        *refused,
        [ev("MODIFIED", obj("a", "12")), HANG],
    )
    informer = Informer(source, RUNS, rng=random.Random(7), metrics=metrics)
    start(informer, tasks)
    await asyncio.sleep(120)
    calls = source.watch_calls
    assert len(calls) == 62
    assert [c["resource_version"] for c in calls[1:]] == ["11"] * 61
    waits = gaps([c["at"] for c in calls])
    assert all(0.5 <= wait <= 1.0 for wait in waits)
    assert len(set(waits)) > 50  # jittered
    assert informer.get("ns", "a")["metadata"]["resourceVersion"] == "12"  # type: ignore[index]
    assert len(source.list_calls) == 1
    errors = metrics.registry.get_sample_value(
        "kserve_inference_informer_watch_errors_total",
        {"resource": "inferenceruns.ai.krateo.io", "reason": "transport"},
    )
    assert errors == 61


@pytest.mark.looptime
async def test_an_api_server_restart_is_followed_by_a_relist_within_a_second_of_it_answering(
    source: FakeSource, tasks: list[asyncio.Task[None]]
) -> None:
    # Down for a minute (the watch breaks, connections are refused), then
    # warming up (403 while RBAC loads, 503, 404 while the CRD is served),
    # then the watch's version is gone from the new server's cache.
    outage = [[TransportError(0, "ClientConnectorError")] for _ in range(100)]
    warming = [[ApiError(403, "Forbidden")], [ApiError(503, "Unavailable")], [ApiError(404)]]
    source.script_list(None, page([obj("a", "1")], "10"), page([obj("b", "30")], "30"))
    source.script_watch(
        None,
        [ev("ADDED", obj("z", "11")), TransportError(0, "ClientPayloadError")],
        *outage,
        *warming,
        [ApiError(410)],
    )
    # No idle bound: the last watch stays open and stays the last (see the idle tests).
    informer = Informer(source, RUNS, rng=random.Random(8), idle_timeout=None)
    seen = Recorder(informer)
    start(informer, tasks)
    await asyncio.sleep(300)
    calls = source.watch_calls
    assert len(calls) == 1 + 100 + 3 + 1 + 1
    broke, answered = calls[0]["at"], calls[101]["at"]
    assert answered - broke > 60  # the outage lasted over a minute
    assert max(gaps([c["at"] for c in calls[:-1]])) <= 1.0  # never more than a second between tries
    relisted = source.list_calls[1]["at"]
    assert relisted - answered <= 4 * 1.0  # three warm-up answers, each retried within 1 s
    assert relisted == calls[-2]["at"]  # the 410 relisted at once
    assert informer.last_sync == relisted
    assert seen.calls[-3:] == [
        ("add", "ns/b", "30"),
        ("delete", "ns/a", "1"),
        ("delete", "ns/z", "11"),
    ]


@pytest.mark.looptime
async def test_after_the_recovery_window_errors_back_off_exponentially_again(
    source: FakeSource, tasks: list[asyncio.Task[None]]
) -> None:
    source.script_list(None, page([], "10"))
    source.script_watch(
        None,
        [TransportError(0, "ClientConnectorError")],
        *([ApiError(500, "InternalError")] for _ in range(100)),
    )
    informer = Informer(source, RUNS, rng=random.Random(9))
    start(informer, tasks)
    await asyncio.sleep(120)
    times = [c["at"] for c in source.watch_calls]
    unanswered = times[0]
    within = [b - a for a, b in itertools.pairwise(times) if a - unanswered < 60]
    assert len(within) > 60
    assert all(0.5 <= gap <= 1.0 for gap in within)
    after = [b - a for a, b in itertools.pairwise(times) if a - unanswered >= 60]
    assert backoff_steps(after[:3]) == [0, 1, 2]  # the outage did not grow the backoff


@pytest.mark.looptime
async def test_a_410_after_a_broken_watch_relists_at_once(
    source: FakeSource, tasks: list[asyncio.Task[None]]
) -> None:
    source.script_list(None, page([], "10"), page([], "20"), page([], "30"), page([], "40"))
    source.script_watch(
        None,
        [ApiError(410)],  # relisted at once
        [ev("ADDED", obj("a", "21")), TransportError(0, "reset")],  # the watch breaks
        [ApiError(410)],  # so this 410 is a first one again
        [ApiError(500, "InternalError")],
        [ApiError(410)],  # and so is this one
    )
    informer = Informer(source, RUNS, rng=random.Random(10))
    start(informer, tasks)
    await asyncio.sleep(60)
    lists = [c["at"] for c in source.list_calls]
    watches = [c["at"] for c in source.watch_calls]
    assert len(lists) == 4
    assert lists[1] == watches[0]
    assert lists[2] == watches[2]
    assert lists[3] == watches[4]
    assert informer.lists == 4


@pytest.mark.looptime
async def test_a_successful_list_resets_the_backoff(
    source: FakeSource, tasks: list[asyncio.Task[None]]
) -> None:
    forbidden = [ApiError(403, "Forbidden") for _ in range(5)]
    source.script_list(None, *forbidden, page([], "10"))
    source.script_watch(None, [ApiError(500, "InternalError")], [ApiError(500, "InternalError")])
    informer = Informer(source, RUNS, rng=random.Random(12))
    start(informer, tasks)
    await asyncio.sleep(120)
    lists = [c["at"] for c in source.list_calls]
    assert lists[-1] - lists[-2] >= 12.8  # five failures grew the backoff
    watches = [c["at"] for c in source.watch_calls]
    assert watches[0] == lists[-1]
    assert backoff_steps(gaps(watches)[:2]) == [0, 1]  # from the start again


@pytest.mark.looptime
@pytest.mark.parametrize(
    ("retry_after", "low", "high"),
    [
        pytest.param(7.0, 7.0, 8.4, id="as-asked"),
        pytest.param(0.0, 0.1, 0.12, id="at-least-0.1s"),
        pytest.param(3600.0, 30.0, 30.0, id="at-most-30s"),
    ],
)
async def test_429_waits_what_retry_after_asks_within_bounds(
    source: FakeSource,
    tasks: list[asyncio.Task[None]],
    retry_after: float,
    low: float,
    high: float,
) -> None:
    throttled = ApiError(429, "TooManyRequests", retry_after=retry_after)
    source.script_list(None, throttled, page([], "10"))
    source.script_watch(
        None,
        [ApiError(429, "TooManyRequests", retry_after=retry_after)],
        [ApiError(500, "InternalError")],
    )
    informer = Informer(source, RUNS, rng=random.Random(13))
    start(informer, tasks)
    await asyncio.sleep(100)
    lists = [c["at"] for c in source.list_calls]
    watches = [c["at"] for c in source.watch_calls]
    assert low <= lists[1] - lists[0] <= high
    assert low <= watches[1] - watches[0] <= high
    assert 0.8 <= watches[2] - watches[1] < 1.6  # Retry-After did not grow the backoff


@pytest.mark.looptime
async def test_a_watch_that_ends_at_once_without_events_backs_off(
    source: FakeSource, tasks: list[asyncio.Task[None]]
) -> None:
    source.script_list(None, page([], "10"))
    source.script_watch(None, [], [], [])
    informer = Informer(source, RUNS, rng=random.Random(4))
    start(informer, tasks)
    await asyncio.sleep(60)
    times = [c["at"] for c in source.watch_calls]
    assert len(times) == 4
    assert times[1] - times[0] >= 0.8
    assert times[2] - times[1] >= 1.6


@pytest.mark.looptime
async def test_list_failures_back_off_and_sync_waits_for_a_list(
    source: FakeSource, tasks: list[asyncio.Task[None]]
) -> None:
    source.script_list(
        None,
        ApiError(403, "Forbidden"),
        TransportError(0, "refused"),
        page([obj("a", "1")], "10"),
    )
    informer = Informer(source, RUNS, rng=random.Random(6))
    start(informer, tasks)
    await asyncio.sleep(0.5)
    assert not informer.has_synced()
    await asyncio.wait_for(informer.wait_for_sync(), timeout=10)
    times = [c["at"] for c in source.list_calls]
    assert 0.8 <= times[1] - times[0] < 1.6
    assert 0.5 <= times[2] - times[1] <= 1.0  # no answer at all: retried within a second
    assert informer.get("ns", "a") is not None
    assert informer.last_sync == times[2]
    assert informer.lists == 1


@pytest.mark.looptime
async def test_several_namespaces_get_one_watch_each_and_one_cache(
    source: FakeSource, tasks: list[asyncio.Task[None]]
) -> None:
    source.script_list("a", page([obj("x", "1", namespace="a")], "10"))
    source.script_list("b", page([obj("y", "2", namespace="b")], "20"))
    source.script_watch("b", [ev("ADDED", obj("z", "21", namespace="b")), HANG])
    informer = Informer(source, RUNS, namespaces=["a", "b", "a"])
    start(informer, tasks)
    await asyncio.wait_for(informer.wait_for_sync(), timeout=5)
    await asyncio.sleep(1)
    assert sorted(c["namespace"] for c in source.list_calls) == ["a", "b"]
    assert sorted((c["namespace"], c["resource_version"]) for c in source.watch_calls) == [
        ("a", "10"),
        ("b", "20"),
    ]
    assert sorted(object_key(o) for o in informer.list()) == ["a/x", "b/y", "b/z"]
    assert [object_key(o) for o in informer.list("b")] == ["b/y", "b/z"]


@pytest.mark.looptime
async def test_not_synced_until_every_namespace_listed(
    source: FakeSource, tasks: list[asyncio.Task[None]]
) -> None:
    source.script_list("a", page([], "10"))
    informer = Informer(source, RUNS, namespaces=["a", "b"])  # b's list hangs
    start(informer, tasks)
    await asyncio.sleep(60)
    assert not informer.has_synced()
    assert informer.last_sync is None  # not every scope has listed
    assert informer.lists == 1


@pytest.mark.looptime
async def test_cancelling_the_informer_closes_its_watch(source: FakeSource) -> None:
    source.script_list(None, page([], "10"))
    informer = Informer(source, RUNS)
    task = asyncio.create_task(informer.run())
    await asyncio.sleep(1)
    assert len(source.watch_calls) == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert source.closed_streams == 1


# ------------------------------------------------------------------ watch liveness


def idle_errors(metrics: Metrics) -> float | None:
    return metrics.registry.get_sample_value(
        "kserve_inference_informer_watch_errors_total",
        {"resource": "inferenceruns.ai.krateo.io", "reason": "idle"},
    )


@pytest.mark.looptime
async def test_a_watch_that_goes_quiet_is_reopened_from_its_version_without_a_list(
    source: FakeSource, tasks: list[asyncio.Task[None]]
) -> None:
    # Bookmarks a minute apart keep the watch; then the connection stalls.
    metrics = Metrics()
    source.script_list(None, page([], "10"))
    source.script_watch(
        None,
        [ev("ADDED", obj("a", "11")), Pause(60), bookmark("15"), Pause(60), bookmark("16"), HANG],
        [ev("MODIFIED", obj("a", "17")), HANG],
    )
    with capture_logs() as logs:
        informer = Informer(source, RUNS, metrics=metrics, rng=random.Random(12))
        start(informer, tasks)
        await asyncio.sleep(190)
        assert len(source.watch_calls) == 1  # 70 s since the last bookmark: still open
        assert idle_errors(metrics) is None
        await asyncio.sleep(10)
    calls = source.watch_calls
    assert [c["resource_version"] for c in calls] == ["10", "16"]
    assert len(source.list_calls) == 1  # no relist
    assert source.closed_streams == 1  # the stalled stream was closed
    # Closed at the bound after the last bookmark, reopened after 0.5-1 s.
    assert 120 + WATCH_IDLE_TIMEOUT + 0.5 <= calls[1]["at"] <= 120 + WATCH_IDLE_TIMEOUT + 1.0
    assert informer.get("ns", "a")["metadata"]["resourceVersion"] == "17"  # type: ignore[index]
    assert idle_errors(metrics) == 1
    (warning,) = [entry for entry in logs if entry["log_level"] == "warning"]
    assert warning["resource"] == "inferenceruns.ai.krateo.io"
    assert (warning["resource_version"], warning["idle_timeout"]) == ("16", WATCH_IDLE_TIMEOUT)
    assert "stalled" in warning["event"]


@pytest.mark.looptime
async def test_a_watch_request_that_is_never_answered_counts_as_stalled(
    source: FakeSource, tasks: list[asyncio.Task[None]]
) -> None:
    # A stalled connection may not even answer the request: the bound runs from it.
    metrics = Metrics()
    source.script_list(None, page([], "10"))
    source.script_watch(None, [HANG], [HANG], [ev("ADDED", obj("a", "11")), HANG])
    informer = Informer(source, RUNS, metrics=metrics, idle_timeout=30)
    start(informer, tasks)
    await asyncio.sleep(70)
    calls = source.watch_calls
    assert [c["resource_version"] for c in calls] == ["10", "10", "10"]
    assert all(30.5 <= gap <= 31 for gap in gaps([c["at"] for c in calls]))
    assert idle_errors(metrics) == 2
    assert informer.get("ns", "a") is not None
    assert len(source.list_calls) == 1


@pytest.mark.looptime
async def test_a_stalled_watch_whose_version_is_gone_meanwhile_relists(
    source: FakeSource, tasks: list[asyncio.Task[None]]
) -> None:
    source.script_list(None, page([obj("a", "1")], "10"), page([obj("b", "40")], "40"))
    source.script_watch(None, [ev("ADDED", obj("z", "11")), HANG], [ApiError(410)])
    informer = Informer(source, RUNS)
    seen = Recorder(informer)
    start(informer, tasks)
    await asyncio.sleep(WATCH_IDLE_TIMEOUT + 5)
    assert [c["resource_version"] for c in source.watch_calls] == ["10", "11", "40"]
    assert len(source.list_calls) == 2
    assert seen.calls[-3:] == [
        ("add", "ns/b", "40"),
        ("delete", "ns/a", "1"),
        ("delete", "ns/z", "11"),
    ]


@pytest.mark.looptime
async def test_without_an_idle_bound_a_quiet_watch_stays_open(
    source: FakeSource, tasks: list[asyncio.Task[None]]
) -> None:
    source.script_list(None, page([], "10"))
    informer = Informer(source, RUNS, idle_timeout=None)
    start(informer, tasks)
    await asyncio.sleep(10 * WATCH_IDLE_TIMEOUT)
    assert len(source.watch_calls) == 1


@pytest.mark.parametrize("bound", [0, -1.0])
def test_the_idle_bound_must_be_positive(source: FakeSource, bound: float) -> None:
    with pytest.raises(ValueError, match="idle_timeout must be positive"):
        Informer(source, RUNS, idle_timeout=bound)


def test_live_reads_refresh_the_cache_and_notify_once(source: FakeSource) -> None:
    informer = Informer(source, RUNS)
    seen = Recorder(informer)
    informer.handle_event(ev("ADDED", obj("cfg", "5")))
    informer.refresh(obj("cfg", "8", spec={"x": 2}, metadata={"managedFields": [{}]}))
    assert informer.get("ns", "cfg") == slim(obj("cfg", "8", spec={"x": 2}))
    assert seen.calls == [("add", "ns/cfg", "5"), ("update", "ns/cfg", "5", "8")]
    informer.handle_event(ev("MODIFIED", obj("cfg", "8", spec={"x": 2})))  # the watch catches up
    informer.refresh(obj("cfg", "8"))  # the same version again: nothing new
    informer.refresh(obj("cfg", "6"))  # an older read never rolls the cache back
    assert informer.get("ns", "cfg")["metadata"]["resourceVersion"] == "8"  # type: ignore[index]
    assert len(seen.calls) == 2
    informer.refresh(obj("new", "9"))
    assert seen.calls[-1] == ("add", "ns/new", "9")
    informer.refresh_deleted("ns/cfg")
    assert informer.get("ns", "cfg") is None
    assert seen.calls[-1] == ("delete", "ns/cfg", "8")
    informer.refresh_deleted("ns/cfg")  # not cached: nothing to say
    assert len(seen.calls) == 4
