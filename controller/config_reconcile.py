"""The reconcile of one InferenceConfig: observe the caches, plan (``controller.probe``), apply.

The writes: the config's status (only when it differs, with the cached
resourceVersion as precondition), a probe's ConfigMap and Job, and the
deletion of probe Jobs whose result is in the status. Races end the pass and
the key comes back rate-limited, as for runs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import structlog
from pydantic import ValidationError

from controller.api import InferenceConfig, RunnerPodDefaults
from controller.caches import BY_CONFIG_UID, Caches
from controller.invalid import describe_invalid
from controller.isvc_watch import ModelWatch
from controller.modelcache import ModelCache
from controller.probe import ConfigView, plan_config
from controller.reconcile import ReconcileClient, model_of, on_api_error
from kubeclient.errors import ApiError
from kubeclient.events import EventRecorder
from kubeclient.objects import is_controlled_by
from kubeclient.resources import CONFIGMAPS, CONFIGS, JOBS, Obj
from kubeclient.workers import Result

log = structlog.stdlib.get_logger(__name__)


@dataclass
class ConfigReconciler:
    client: ReconcileClient
    # The run reconciler's caches: of them, configs and (by BY_CONFIG_UID) probe Jobs, pods
    # and ConfigMaps.
    caches: Caches
    events: EventRecorder
    probe_interval: float = 0.0
    runner_service_account: str | None = None
    pod_defaults: RunnerPodDefaults | None = None
    # InferenceServices (controller.isvc_watch), for configs that reference one.
    models: ModelWatch | None = None
    watch_namespaces: tuple[str, ...] = ()
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    # Parsed configs, reused while their resourceVersion is the same.
    _models: ModelCache[InferenceConfig] = field(
        default_factory=lambda: ModelCache(InferenceConfig, size=64)
    )

    async def reconcile(self, key: str) -> Result:
        raw = self.caches.configs.get_by_key(key)
        if raw is None or raw["metadata"].get("deletionTimestamp"):
            self._models.forget(key)
            return Result()
        config: InferenceConfig | None = None
        invalid: tuple[str, str] | None = None
        try:
            config = self._models.parse(key, raw)
        except ValidationError as exc:
            invalid = describe_invalid(exc)
        uid = raw["metadata"].get("uid", "")
        view = ConfigView(
            raw=raw,
            now=self.clock(),
            config=config,
            invalid=invalid,
            probe_interval=self.probe_interval,
            probe_jobs=[
                j for j in self.caches.jobs.by_index(BY_CONFIG_UID, uid) if is_controlled_by(j, uid)
            ],
            probe_pods=self.caches.pods.by_index(BY_CONFIG_UID, uid),
            runner_service_account=self.runner_service_account,
            pod_defaults=self.pod_defaults,
            model=model_of(config, self.models, self.watch_namespaces),
        )
        plan = plan_config(view)
        try:
            if plan.status_changed:
                meta = raw["metadata"]
                updated = await self.client.update_status(
                    CONFIGS,
                    meta["namespace"],
                    meta["name"],
                    {**raw, "status": plan.status.to_api()},
                )
                self.caches.configs.assume(updated)
            for event in plan.events:
                self.events.record(raw, event.type, event.reason, event.message)
            if plan.probed is not None:
                job_name, passed, reason, message = plan.probed
                log.log(
                    logging.INFO if passed else logging.WARNING,
                    "probe passed" if passed else "probe failed",
                    job=job_name,
                    reason=reason,
                    message=message,
                )
            for job in plan.delete:
                await self._delete_probe(job)
            if plan.create is not None:
                configmap, job = plan.create
                namespace = raw["metadata"]["namespace"]
                self.caches.configmaps.assume(
                    await self.client.create(CONFIGMAPS, namespace, configmap)
                )
                self.caches.jobs.assume(await self.client.create(JOBS, namespace, job))
                log.info("probing config", job=job["metadata"]["name"])
        except ApiError as exc:
            return on_api_error(exc)
        return Result(requeue_after=plan.requeue_after)

    async def _delete_probe(self, job: Obj) -> None:
        meta = job["metadata"]
        for resource, informer in ((JOBS, self.caches.jobs), (CONFIGMAPS, self.caches.configmaps)):
            try:
                await self.client.delete(resource, meta["namespace"], meta["name"])
            except ApiError as exc:
                if not exc.is_not_found:
                    raise
            informer.assume_deleted(f"{meta['namespace']}/{meta['name']}")
