"""The reconcilers' one error policy, against a small fake of the API server.

How a pass that the API server answers with an error goes on (controller-
runtime's Result + error): a race comes back rate-limited, an outage is
raised for the worker's backoff, a refused write becomes the run's status and
a requeue_after that doubles, a namespace being deleted ends the run's passes,
and a run the controller cannot use is a terminal error, said once.
"""

from __future__ import annotations

import copy
import itertools
from collections import defaultdict, deque
from collections.abc import Mapping
from typing import Any

import pytest

from controller.api import InferenceConfig, InferenceRun
from controller.caches import Caches, build_caches
from controller.config_reconcile import ConfigReconciler
from controller.reconcile import ReconcileClient, Reconciler, _refusal
from kubeclient.errors import ApiError, api_error
from kubeclient.events import EventRecorder
from kubeclient.resources import CONFIGS, RUNS, Obj, Resource
from kubeclient.workers import Result, TerminalError
from tests.unit.helpers import NOW, make_config, make_run

pytestmark = pytest.mark.unit

TERMINATING = {
    "kind": "Status",
    "reason": "Forbidden",
    "message": 'configmaps "inf-r-5be07ada" is forbidden: unable to create new content in '
    "namespace ns because it is being terminated",
    "details": {"causes": [{"reason": "NamespaceTerminating"}]},
}


class FakeApi:
    """Objects by (plural, namespace, name), and errors scripted per verb: the next call fails."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str | None, str], Obj] = {}
        self.errors: dict[str, deque[ApiError]] = defaultdict(deque)
        self.calls: list[tuple[str, str, str]] = []
        self._versions = itertools.count(100)

    def put(self, resource: Resource, obj: Obj) -> Obj:
        meta = obj["metadata"]
        meta.setdefault("uid", f"uid-{meta['name']}")
        meta["resourceVersion"] = str(next(self._versions))
        self.objects[(resource.plural, meta.get("namespace"), meta["name"])] = obj
        return copy.deepcopy(obj)

    def fail(self, verb: str, *errors: ApiError) -> None:
        self.errors[verb].extend(errors)

    def _call(self, verb: str, resource: Resource, name: str) -> None:
        self.calls.append((verb, resource.kind, name))
        if self.errors[verb]:
            raise self.errors[verb].popleft()

    def _stored(self, resource: Resource, namespace: str | None, name: str) -> Obj:
        found = self.objects.get((resource.plural, namespace, name))
        if found is None:
            raise api_error(404, {"reason": "NotFound", "message": f'"{name}" not found'})
        return found

    async def get(self, resource: Resource, namespace: str | None, name: str) -> Obj:
        self._call("get", resource, name)
        return copy.deepcopy(self._stored(resource, namespace, name))

    async def list(self, resource: Resource, namespace: str | None = None, **_: Any) -> Obj:
        self._call("list", resource, "")
        return {"items": []}

    async def create(
        self, resource: Resource, namespace: str | None, body: Mapping[str, Any]
    ) -> Obj:
        self._call("create", resource, body["metadata"]["name"])
        return self.put(resource, copy.deepcopy(dict(body)))

    async def patch(
        self, resource: Resource, namespace: str | None, name: str, patch: Mapping[str, Any]
    ) -> Obj:
        self._call("patch", resource, name)
        return self.put(resource, self._stored(resource, namespace, name))

    async def update_status(
        self, resource: Resource, namespace: str | None, name: str, body: Mapping[str, Any]
    ) -> Obj:
        self._call("update_status", resource, name)
        stored = self._stored(resource, namespace, name)
        return self.put(resource, {**stored, "status": copy.deepcopy(body["status"])})

    async def delete(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        *,
        uid: str | None = None,
        resource_version: str | None = None,
    ) -> Obj:
        self._call("delete", resource, name)
        return self.objects.pop((resource.plural, namespace, name))

    async def read_pod_log(
        self, namespace: str, name: str, *, container: str, tail_lines: int | None
    ) -> str:
        return ""


def raw(model: InferenceConfig | InferenceRun, **spec: Any) -> Obj:
    """The object as the API server would serve it (no status yet), ``spec`` added unchecked."""
    served = model.model_dump(mode="json", by_alias=True, exclude_none=True, exclude={"status"})
    served["spec"].update(spec)
    return served


class World:
    """A fake API server holding a config and a run, and the caches that have seen both."""

    def __init__(self, api: FakeApi | None = None, **run_spec: Any) -> None:
        self.api = api or FakeApi()
        fake: ReconcileClient = self.api
        self.caches: Caches = build_caches(fake)  # never run
        self.caches.configs.assume(self.api.put(CONFIGS, raw(make_config())))
        self.caches.runs.assume(self.api.put(RUNS, raw(make_run(), **run_spec)))
        events = EventRecorder(fake)  # never run: nothing is sent
        self.runs = Reconciler(client=fake, caches=self.caches, events=events, clock=lambda: NOW)
        self.configs = ConfigReconciler(
            client=fake, caches=self.caches, events=events, probe_interval=600, clock=lambda: NOW
        )

    def status(self) -> Obj:
        return dict(self.api.objects[("inferenceruns", "ns", "r")].get("status") or {})

    def writes(self) -> list[tuple[str, str, str]]:
        return [c for c in self.api.calls if c[0] not in ("get", "list")]


def refused(status: int, reason: str, message: str) -> ApiError:
    return api_error(status, {"reason": reason, "message": message})


async def test_a_run_planned_through_the_fake_gets_its_children_and_its_status() -> None:
    world = World()
    result = await world.runs.reconcile("ns/r")
    assert result.requeue is False
    assert [c[:2] for c in world.writes()] == [
        ("create", "ConfigMap"),
        ("create", "Job"),
        ("update_status", "InferenceRun"),
    ]
    assert world.status()["phase"] == "Pending"


@pytest.mark.parametrize(
    "race",
    [
        refused(409, "Conflict", "the object has been modified"),
        refused(404, "NotFound", 'namespaces "ns" not found'),
    ],
)
async def test_a_write_that_races_comes_back_rate_limited(race: ApiError) -> None:
    world = World()
    world.api.fail("create", race)
    assert await world.runs.reconcile("ns/r") == Result(requeue=True)
    assert world.status() == {}  # nothing said: the next pass looks again


async def test_a_status_write_that_races_comes_back_rate_limited() -> None:
    world = World()
    world.api.fail("update_status", refused(409, "Conflict", "the object has been modified"))
    assert await world.runs.reconcile("ns/r") == Result(requeue=True)


@pytest.mark.parametrize(
    "outage",
    [
        api_error(503, {"reason": "ServiceUnavailable", "message": "etcd is down"}),
        api_error(429, {"reason": "TooManyRequests", "message": "slow down"}),
        api_error(0, None),
    ],
)
async def test_an_outage_is_raised_for_the_workers_backoff(outage: ApiError) -> None:
    world = World()
    world.api.fail("create", outage)
    with pytest.raises(ApiError) as raised:
        await world.runs.reconcile("ns/r")
    assert raised.value is outage
    assert world.status() == {}


async def test_a_refused_write_becomes_the_status_and_backs_off_doubling() -> None:
    world = World()
    invalid = refused(422, "Invalid", 'ConfigMap "inf-r-5be07ada" is invalid: data: too long')
    world.api.fail("create", invalid, invalid, invalid)
    delays = []
    for _ in range(3):
        result = await world.runs.reconcile("ns/r")
        assert result.requeue is False
        delays.append(result.requeue_after)
        world.caches.runs.assume(world.api.objects[("inferenceruns", "ns", "r")])
    assert delays == [5.0, 10.0, 20.0]
    status = world.status()
    assert status["reason"] == "ConfigMapRefused"
    assert "data: too long" in status["message"]
    # Accepted at last: the children are created and the run's backoff is forgotten.
    settled = await world.runs.reconcile("ns/r")
    assert settled.requeue_after != 40.0
    assert [c[:2] for c in world.writes()][-3:] == [
        ("create", "ConfigMap"),
        ("create", "Job"),
        ("update_status", "InferenceRun"),
    ]
    assert world.status()["phase"] == "Pending"
    assert world.runs._refusal_backoff.num_requeues("ns/r") == 0


async def test_a_forbidden_create_says_the_controller_is_not_allowed() -> None:
    world = World()
    world.api.fail(
        "create",
        refused(403, "Forbidden", 'configmaps is forbidden: User "x" cannot create resource'),
    )
    result = await world.runs.reconcile("ns/r")
    assert result.requeue_after == 5.0
    assert world.status()["reason"] == "PermissionDenied"


async def test_a_namespace_being_deleted_ends_the_runs_passes() -> None:
    world = World()
    world.api.fail("create", api_error(403, TERMINATING))
    assert await world.runs.reconcile("ns/r") == Result()
    assert world.status() == {}  # no status write, no retry
    calls = len(world.api.calls)
    assert await world.runs.reconcile("ns/r") == Result()
    assert len(world.api.calls) == calls  # left alone until it is gone


async def test_a_run_gone_before_its_children_are_created_gets_none() -> None:
    world = World()
    del world.api.objects[("inferenceruns", "ns", "r")]
    # The live read before the creates finds it gone (NotFound): nothing created.
    assert await world.runs.reconcile("ns/r") == Result()
    assert world.writes() == []
    assert world.caches.runs.get_by_key("ns/r") is None


async def test_a_status_write_that_finds_the_run_gone_ends_the_key() -> None:
    world = World()
    world.api.fail("update_status", refused(404, "NotFound", 'inferenceruns "r" not found'))
    assert await world.runs.reconcile("ns/r") == Result()
    assert world.caches.runs.get_by_key("ns/r") is None


async def test_an_invalid_run_is_a_terminal_error_said_once() -> None:
    world = World(parallelism=0)
    with pytest.raises(TerminalError, match=r"spec\.parallelism"):
        await world.runs.reconcile("ns/r")
    status = world.status()
    assert (status["phase"], status["reason"]) == ("Error", "InvalidSpec")
    world.caches.runs.assume(world.api.objects[("inferenceruns", "ns", "r")])
    writes = len(world.writes())
    assert await world.runs.reconcile("ns/r") == Result()  # said already: nothing more
    assert len(world.writes()) == writes


async def test_the_config_reconciler_maps_errors_the_same_way() -> None:
    world = World()
    world.api.fail("update_status", refused(409, "Conflict", "the object has been modified"))
    assert await world.configs.reconcile("ns/cfg") == Result(requeue=True)
    outage = api_error(500, {"reason": "InternalError", "message": "etcd"})
    world.api.fail("update_status", outage)
    with pytest.raises(ApiError) as raised:
        await world.configs.reconcile("ns/cfg")
    assert raised.value is outage
    result = await world.configs.reconcile("ns/cfg")
    assert result.requeue is False
    assert ("create", "Job") in [c[:2] for c in world.writes()]


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (refused(409, "Conflict", "modified"), None),
        (refused(404, "NotFound", "gone"), None),
        (api_error(503, None), None),
        (api_error(0, None), None),
        (api_error(403, TERMINATING), None),
        (refused(422, "Invalid", "bad"), "JobRefused"),
        (refused(413, "RequestEntityTooLarge", "too large"), "JobRefused"),
        (refused(403, "Forbidden", 'User "x" cannot create jobs'), "PermissionDenied"),
        (refused(403, "Forbidden", "exceeded quota: compute"), "JobRefused"),
    ],
)
def test_refusal_is_pure_and_never_raises(error: ApiError, reason: str | None) -> None:
    refusal = _refusal(error, "Job", "r-5be07ada", "create")
    assert (refusal.reason if refusal is not None else None) == reason
    if refusal is not None:
        assert refusal.message.endswith(error.message)
