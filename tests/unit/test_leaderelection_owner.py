"""The Lease's owner: the pod's ServiceAccount, so that uninstalling deletes the Lease.

The pure part (:func:`with_owner`, :func:`owner_reference`), the setting
(``POD_SERVICE_ACCOUNT``) and the elector's requests, counted against an
in-memory stand-in for the API server (the real one is in
tests/integration/test_leaderelection.py).
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import pytest
from structlog.testing import capture_logs

from controller.settings import Settings, SettingsError, load_settings
from kubeclient.errors import ApiError, NotFound
from kubeclient.leaderelection import (
    SERVICEACCOUNTS,
    LeaderElector,
    owner_reference,
    with_owner,
)
from kubeclient.resources import Resource

pytestmark = pytest.mark.unit

SA_UID = "7f1c2b9e-0000-4000-8000-000000000001"
OWNER = {"apiVersion": "v1", "kind": "ServiceAccount", "name": "ctl", "uid": SA_UID}
OTHER = {
    "apiVersion": "v1",
    "kind": "ConfigMap",
    "name": "keeper",
    "uid": "other-uid",
    "controller": True,
}


# ----------------------------------------------------------------------------- pure


def test_owner_reference_names_the_service_account_by_uid_and_blocks_nothing() -> None:
    account = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": "ctl", "namespace": "ns", "uid": SA_UID, "resourceVersion": "9"},
    }
    # Neither controller nor blockOwnerDeletion: blocking would need extra RBAC
    # (OwnerReferencesPermissionEnforcement) and the Lease controls nothing.
    assert owner_reference(account) == OWNER


def test_with_owner_adds_the_reference_to_metadata_without_one() -> None:
    metadata = {"name": "lock", "namespace": "ns", "resourceVersion": "41"}
    assert with_owner(metadata, OWNER) == {**metadata, "ownerReferences": [OWNER]}
    assert "ownerReferences" not in metadata  # the input is left alone


def test_with_owner_keeps_other_references_and_everything_else() -> None:
    metadata: dict[str, Any] = {
        "name": "lock",
        "namespace": "ns",
        "uid": "lease-uid",
        "resourceVersion": "41",
        "labels": {"team": "a"},
        "annotations": {"note": "kept"},
        "managedFields": [{"manager": "someone"}],
        "ownerReferences": [OTHER],
    }
    before = copy.deepcopy(metadata)
    updated = with_owner(metadata, OWNER)
    assert updated == {**before, "ownerReferences": [OTHER, OWNER]}
    assert metadata == before


@pytest.mark.parametrize(
    "present",
    [
        OWNER,
        # Same uid, written differently (by an operator, or a later version): still there.
        {**OWNER, "blockOwnerDeletion": True},
        {**OWNER, "name": "renamed-in-the-reference"},
    ],
)
def test_with_owner_changes_nothing_when_the_uid_is_already_an_owner(
    present: dict[str, Any],
) -> None:
    assert with_owner({"name": "lock", "ownerReferences": [OTHER, present]}, OWNER) is None


def test_a_reference_to_a_former_service_account_of_the_same_name_is_kept() -> None:
    # The garbage collector drops a dangling reference itself while another owner lives.
    stale = {**OWNER, "uid": "deleted-account-uid"}
    updated = with_owner({"name": "lock", "ownerReferences": [stale]}, OWNER)
    assert updated == {"name": "lock", "ownerReferences": [stale, OWNER]}


# ----------------------------------------------------------------------------- setting

NO_FILE = Path("/nonexistent/namespace")


def load(argv: list[str] | None = None, **env: str) -> Settings:
    return load_settings(argv or [], env, namespace_file=NO_FILE)


def test_pod_service_account_is_optional() -> None:
    assert load().pod_service_account is None
    assert load(POD_SERVICE_ACCOUNT="").pod_service_account is None
    assert load(LEADER_ELECT="1", POD_NAMESPACE="p").lease_owner is None


def test_pod_service_account_from_the_downward_api_or_a_flag() -> None:
    assert load(POD_SERVICE_ACCOUNT="ctl").pod_service_account == "ctl"
    flag = load(["--pod-service-account", "from-flag"], POD_SERVICE_ACCOUNT="ctl")
    assert flag.pod_service_account == "from-flag"


def test_a_bad_pod_service_account_is_refused_by_name() -> None:
    with pytest.raises(SettingsError, match="POD_SERVICE_ACCOUNT='Not_A_Name'"):
        load(POD_SERVICE_ACCOUNT="Not_A_Name")


def test_the_lease_owner_is_the_pods_service_account_in_the_pods_namespace() -> None:
    in_pod = load(
        LEADER_ELECT="1",
        POD_NAMESPACE="ksc",
        POD_SERVICE_ACCOUNT="ctl",
        KUBERNETES_SERVICE_HOST="10.0.0.1",
    )
    assert (in_pod.lease_namespace, in_pod.lease_owner) == ("ksc", "ctl")
    # A kubeconfig user that names one (no POD_NAMESPACE): the Lease's namespace.
    local = load(LEADER_ELECT="1", WATCH_NAMESPACE="team-a", POD_SERVICE_ACCOUNT="ctl")
    assert (local.lease_namespace, local.lease_owner) == ("team-a", "ctl")
    # The Lease elsewhere: an owner must be in its namespace, and the pod's is not.
    elsewhere = load(
        LEADER_ELECT="1", POD_NAMESPACE="ksc", LEASE_NAMESPACE="locks", POD_SERVICE_ACCOUNT="ctl"
    )
    assert elsewhere.lease_owner is None


def test_help_says_why_the_setting_exists() -> None:
    description = Settings.model_fields["pod_service_account"].description or ""
    assert "owns the Lease" in description


# ----------------------------------------------------------------------------- elector I/O


class FakeApi:
    """Leases and ServiceAccounts in memory, with resourceVersion preconditions."""

    def __init__(self, namespace: str = "ns") -> None:
        self.namespace = namespace
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []  # (verb, plural)
        self.refuse: dict[str, ApiError] = {}  # plural -> error for every GET
        self._version = 0

    def add_account(self, name: str = "ctl", uid: str = SA_UID) -> None:
        self.objects[("serviceaccounts", name)] = {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": name, "namespace": self.namespace, "uid": uid},
        }

    def lease(self, name: str = "lock") -> dict[str, Any]:
        return self.objects[("leases", name)]

    def _next(self) -> str:
        self._version += 1
        return str(self._version)

    async def get(self, resource: Resource, namespace: str | None, name: str) -> dict[str, Any]:
        self.requests.append(("get", resource.plural))
        if resource.plural in self.refuse:
            raise self.refuse[resource.plural]
        try:
            return copy.deepcopy(self.objects[(resource.plural, name)])
        except KeyError:
            raise NotFound(404, "NotFound", f"{resource.plural} {name!r} not found") from None

    async def create(
        self, resource: Resource, namespace: str | None, body: Mapping[str, Any]
    ) -> dict[str, Any]:
        self.requests.append(("create", resource.plural))
        key = (resource.plural, body["metadata"]["name"])
        if key in self.objects:
            raise ApiError(409, "AlreadyExists")
        stored = copy.deepcopy(dict(body))
        stored["metadata"].update(uid=f"uid-{key[1]}", resourceVersion=self._next())
        self.objects[key] = stored
        return copy.deepcopy(stored)

    async def replace(
        self, resource: Resource, namespace: str | None, name: str, body: Mapping[str, Any]
    ) -> dict[str, Any]:
        self.requests.append(("update", resource.plural))
        key = (resource.plural, name)
        if key not in self.objects:
            raise NotFound(404, "NotFound")
        current = self.objects[key]["metadata"]["resourceVersion"]
        if body["metadata"].get("resourceVersion") != current:
            raise ApiError(409, "Conflict")
        stored = copy.deepcopy(dict(body))
        stored["metadata"]["resourceVersion"] = self._next()
        self.objects[key] = stored
        return copy.deepcopy(stored)

    def count(self, verb: str, plural: str) -> int:
        return self.requests.count((verb, plural))


# Tiny timings: a failed owner read is retried after retry_period, doubling.
TIMING = {"lease_duration": 0.5, "renew_deadline": 0.3, "retry_period": 0.05}


def elector(api: FakeApi, owner: str | None = "ctl", identity: str = "me") -> LeaderElector:
    return LeaderElector(
        cast(Any, api),
        name="lock",
        namespace=api.namespace,
        identity=identity,
        owner_service_account=owner,
        **TIMING,
    )


async def test_without_an_owner_nothing_reads_a_service_account() -> None:
    api = FakeApi()
    api.add_account()
    candidate = elector(api, owner=None)
    for _ in range(3):
        assert await candidate.try_acquire_or_renew()
    assert api.count("get", "serviceaccounts") == 0
    assert "ownerReferences" not in api.lease()["metadata"]


async def test_the_created_lease_is_owned_and_renewals_cost_nothing_extra() -> None:
    api = FakeApi()
    api.add_account()
    candidate = elector(api)
    assert await candidate.try_acquire_or_renew()  # create
    assert api.lease()["metadata"]["ownerReferences"] == [OWNER]
    before = list(api.requests)
    for _ in range(5):
        assert await candidate.try_acquire_or_renew()  # fast-path renewals
    assert api.requests[len(before) :] == [("update", "leases")] * 5
    assert api.count("get", "serviceaccounts") == 1
    assert api.lease()["metadata"]["ownerReferences"] == [OWNER]


async def test_a_standby_reads_no_service_account_until_it_writes() -> None:
    api = FakeApi()
    api.add_account()
    leader, standby = elector(api, identity="leader"), elector(api, identity="standby")
    assert await leader.try_acquire_or_renew()
    for _ in range(3):
        assert not await standby.try_acquire_or_renew()
    assert api.count("get", "serviceaccounts") == 1  # the leader's


@pytest.mark.parametrize("holder", ["me", "", "someone-gone"])
async def test_an_existing_lease_gets_the_reference_on_renew_or_acquire(holder: str) -> None:
    api = FakeApi()
    api.add_account()
    api.objects[("leases", "lock")] = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": "lock",
            "namespace": "ns",
            "uid": "lease-uid",
            "resourceVersion": "1",
            "labels": {"kept": "yes"},
            "ownerReferences": [OTHER],
        },
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 1, "leaseTransitions": 2},
    }
    candidate = elector(api)
    if holder == "someone-gone":
        assert not await candidate.try_acquire_or_renew()  # first sight: wait out the lease
        await asyncio.sleep(1.05)
    assert await candidate.try_acquire_or_renew()
    metadata = api.lease()["metadata"]
    assert metadata["ownerReferences"] == [OTHER, OWNER]
    assert (metadata["uid"], metadata["labels"]) == ("lease-uid", {"kept": "yes"})
    assert api.lease()["spec"]["holderIdentity"] == "me"


@pytest.mark.parametrize(
    "error",
    [
        ApiError(403, "Forbidden", 'serviceaccounts "ctl" is forbidden'),
        NotFound(404, "NotFound", 'serviceaccounts "ctl" not found'),
    ],
)
async def test_an_unreadable_owner_warns_once_and_never_stops_the_election(
    error: ApiError,
) -> None:
    api = FakeApi()
    api.refuse["serviceaccounts"] = error
    with capture_logs() as logs:
        candidate = elector(api)
        assert await candidate.try_acquire_or_renew()  # created all the same
        for _ in range(20):
            await asyncio.sleep(0.01)
            assert await candidate.try_acquire_or_renew()
    assert "ownerReferences" not in api.lease()["metadata"]
    warnings = [entry for entry in logs if entry["log_level"] == "warning"]
    assert len(warnings) == 1, logs
    assert warnings[0]["reason"] == error.reason
    assert warnings[0]["service_account"] == "ctl"
    # Retried with a backoff, not on every renewal (21 rounds in ~0.3 s).
    reads = api.count("get", "serviceaccounts")
    assert 2 <= reads <= 7, api.requests


async def test_an_owner_readable_later_is_added_by_a_later_renewal() -> None:
    api = FakeApi()
    api.refuse["serviceaccounts"] = ApiError(403, "Forbidden")
    with capture_logs() as logs:
        candidate = elector(api)
        assert await candidate.try_acquire_or_renew()
        assert "ownerReferences" not in api.lease()["metadata"]
        del api.refuse["serviceaccounts"]  # RBAC granted
        api.add_account()
        for _ in range(10):
            await asyncio.sleep(0.02)
            assert await candidate.try_acquire_or_renew()
    assert api.lease()["metadata"]["ownerReferences"] == [OWNER]
    assert api.count("get", "serviceaccounts") == 2  # failed once, then read once
    assert [e["event"] for e in logs if e["log_level"] == "info"] == ["read the lease's owner"]


async def test_a_slow_owner_read_is_cut_short() -> None:
    api = FakeApi()

    async def hang(resource: Resource, namespace: str | None, name: str) -> dict[str, Any]:
        if resource == SERVICEACCOUNTS:
            await asyncio.sleep(60)
        return await FakeApi.get(api, resource, namespace, name)

    api.get = hang  # type: ignore[method-assign]
    with capture_logs() as logs:
        candidate = elector(api)
        started = asyncio.get_running_loop().time()
        assert await candidate.try_acquire_or_renew()
    assert asyncio.get_running_loop().time() - started < 0.5
    (warning,) = [e for e in logs if e["log_level"] == "warning"]
    assert warning["reason"] == "Timeout"


async def test_a_recreated_lease_reads_its_owner_again() -> None:
    # The ServiceAccount was deleted and made again (serviceAccount.create=false):
    # the collector took the Lease with the old one, the new Lease names the new one.
    api = FakeApi()
    api.add_account()
    candidate = elector(api)
    assert await candidate.try_acquire_or_renew()
    del api.objects[("leases", "lock")]
    api.add_account(uid="new-account-uid")
    assert await candidate.try_acquire_or_renew()  # fast path 404, read, create
    assert api.lease()["metadata"]["ownerReferences"] == [{**OWNER, "uid": "new-account-uid"}]
    assert api.count("get", "serviceaccounts") == 2
