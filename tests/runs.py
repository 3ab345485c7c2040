"""Building (hack.manifests) and watching InferenceConfigs and InferenceRuns in tests."""

from __future__ import annotations

from collections.abc import Callable

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from hack.manifests import GROUP as GROUP
from hack.manifests import MODEL_URL_PATCH as MODEL_URL_PATCH
from hack.manifests import STORAGE as STORAGE
from hack.manifests import VERSION as VERSION
from hack.manifests import Obj as Obj
from hack.manifests import inference_config as inference_config
from hack.manifests import inference_run as inference_run
from hack.manifests import without_model_url as without_model_url
from tests.kubehelpers import eventually

# The configs' plural, for the methods below that take one.
CONFIGS = "inferenceconfigs"


class Runs:
    """InferenceConfigs and InferenceRuns of one namespace."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.namespace = namespace

    async def create(self, obj: Obj) -> Obj:
        plural = obj["kind"].lower() + "s"
        created: Obj = await self.custom.create_namespaced_custom_object(
            GROUP, VERSION, self.namespace, plural, obj
        )
        return created

    async def get(self, name: str, plural: str = "inferenceruns") -> Obj | None:
        try:
            found: Obj = await self.custom.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, plural, name
            )
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return found

    async def patch(self, name: str, patch: Obj, plural: str = "inferenceruns") -> Obj:
        patched: Obj = await self.custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            self.namespace,
            plural,
            name,
            patch,
            _content_type="application/merge-patch+json",  # type: ignore[call-arg]
        )
        return patched

    async def delete(self, name: str, plural: str = "inferenceruns") -> None:
        await self.custom.delete_namespaced_custom_object(
            GROUP, VERSION, self.namespace, plural, name
        )

    async def wait(
        self, name: str, predicate: Callable[[Obj], bool], *, within: float = 60, what: str = ""
    ) -> Obj:
        async def probe() -> Obj | None:
            run = await self.get(name)
            return run if run is not None and predicate(run) else None

        return await eventually(probe, within=within, interval=0.3, what=what or f"run {name}")

    async def wait_condition(
        self,
        name: str,
        type_: str,
        wanted: Callable[[Obj], bool] = lambda c: True,
        *,
        plural: str = "inferenceruns",
        within: float = 60,
        what: str,
    ) -> Obj:
        """Wait until ``name`` has a ``type_`` condition that is ``wanted``; that condition."""

        async def probe() -> Obj | None:
            obj = await self.get(name, plural)
            found = condition(obj, type_) if obj is not None else None
            return found if found is not None and wanted(found) else None

        return await eventually(probe, within=within, what=what)

    async def wait_config_condition(
        self, name: str, type_: str, value: str, *, within: float = 60
    ) -> Obj:
        """Wait until config ``name``'s ``type_`` condition has status ``value``; that condition."""
        return await self.wait_condition(
            name,
            type_,
            lambda c: c["status"] == value,
            plural=CONFIGS,
            within=within,
            what=f"config {name} {type_}={value}",
        )

    async def wait_phase(self, name: str, phase: str, *, within: float = 60) -> Obj:
        return await self.wait(
            name, lambda r: status(r).get("phase") == phase, within=within, what=f"{name} {phase}"
        )

    async def wait_execution(self, name: str, phase: str, *, within: float, what: str) -> Obj:
        """Wait until scheduled run ``name``'s last execution is in ``phase``."""
        return await self.wait(
            name, lambda r: last_execution(r).get("phase") == phase, within=within, what=what
        )

    async def wait_reason(self, name: str, reason: str, *, within: float = 60) -> Obj:
        """Wait until run ``name``'s status gives ``reason``."""
        return await self.wait(
            name, lambda r: status(r).get("reason") == reason, within=within, what=reason
        )

    async def create_and_wait(self, run: Obj, phase: str, *, within: float = 60) -> Obj:
        """Create ``run``, then wait until it is in ``phase``."""
        await self.create(run)
        return await self.wait_phase(run["metadata"]["name"], phase, within=within)

    async def wait_gone(self, name: str, *, within: float = 60) -> None:
        async def gone() -> bool:
            return await self.get(name) is None

        await eventually(gone, within=within, what=f"run {name} deleted")


def status(run: Obj) -> Obj:
    return run.get("status") or {}


def condition(run: Obj, type_: str) -> Obj | None:
    return next((c for c in status(run).get("conditions") or [] if c["type"] == type_), None)


def last_execution(run: Obj) -> Obj:
    """A scheduled run's ``status.lastExecution``; empty before its first execution."""
    return status(run).get("lastExecution") or {}
