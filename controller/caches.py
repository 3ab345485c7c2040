"""The controller's caches: what it watches and how it finds things.

- the index functions and their names (``BY_RUN_UID``...): a child by its
  run's or its config's uid label, a run by its config, a config by the
  InferenceService it references, runs by phase for the gauge;
- :class:`Caches` and :func:`build_caches`: the six informers (runs,
  configs, Jobs, CronJobs, ConfigMaps, pods), each kept as its projection and
  indexed as the reconcilers and handlers read them, narrowed to a shard.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from controller.naming import CONFIG_UID_LABEL, RUN_UID_LABEL, managed_selector
from controller.projection import projection
from controller.sharding import Shard, compose
from kubeclient.informer import WATCH_IDLE_TIMEOUT, Informer
from kubeclient.resources import CONFIGMAPS, CONFIGS, CRONJOBS, JOBS, PODS, RUNS, Obj, Resource

if TYPE_CHECKING:
    from controller.metrics import Metrics
    from kubeclient.client import KubeClient

# The indexes build_caches registers, by name: runs by their config, by uid and
# by phase; configs by uid and by the InferenceService they reference; children
# (ConfigMaps, Jobs, CronJobs, pods) by their run's uid and by their config's.
BY_RUN_UID = "run-uid"
BY_CONFIG = "config"
BY_INFERENCESERVICE = "inferenceservice"
BY_CONFIG_UID = "config-uid"
BY_UID = "uid"
BY_PHASE = "phase"


def run_uid_index(obj: Obj) -> list[str]:
    """Index function: the run a child belongs to (its ``ai.krateo.io/run-uid`` label)."""
    uid = (obj["metadata"].get("labels") or {}).get(RUN_UID_LABEL)
    return [uid] if uid else []


def inferenceservice_index(obj: Obj) -> list[str]:
    """Index function for configs: ``namespace/name`` of the InferenceService they reference."""
    ref = ((obj.get("spec") or {}).get("kserve") or {}).get("inferenceServiceRef") or {}
    name = ref.get("name") if isinstance(ref, dict) else None
    if not name:
        return []
    return [f"{ref.get('namespace') or obj['metadata'].get('namespace')}/{name}"]


def config_index(obj: Obj) -> list[str]:
    """Index function for runs: ``namespace/name`` of the config they use."""
    spec = obj.get("spec") or {}
    ref = spec.get("configRef") or {}
    name = ref.get("name")
    if not name:
        return []
    return [f"{ref.get('namespace') or obj['metadata'].get('namespace')}/{name}"]


def config_uid_index(obj: Obj) -> list[str]:
    """Index function: the config a probe Job, pod or ConfigMap belongs to."""
    uid = (obj["metadata"].get("labels") or {}).get(CONFIG_UID_LABEL)
    return [uid] if uid else []


def uid_index(obj: Obj) -> list[str]:
    """Index function: the object's own uid."""
    uid = obj["metadata"].get("uid")
    return [uid] if uid else []


def phase_index(obj: Obj) -> list[str]:
    """Index function for runs: ``namespace``, config name and phase ("" for none), NUL-joined.

    What the runs gauge counts by, so a scrape reads the index, not every run.
    """
    namespace = str(obj["metadata"].get("namespace") or "")
    config = str(((obj.get("spec") or {}).get("configRef") or {}).get("name") or "")
    phase = (obj.get("status") or {}).get("phase")
    return [f"{namespace}\0{config}\0{phase if isinstance(phase, str) else ''}"]


@dataclass
class Caches:
    runs: Informer
    configs: Informer
    jobs: Informer
    cronjobs: Informer
    configmaps: Informer
    pods: Informer

    def all(self) -> list[Informer]:
        """Every cache, in the order they start (runs first)."""
        return [self.runs, self.configs, self.jobs, self.cronjobs, self.configmaps, self.pods]

    def of(self, resource: Resource) -> Informer:
        return {CONFIGMAPS: self.configmaps, JOBS: self.jobs, CRONJOBS: self.cronjobs}[resource]


def build_caches(
    client: KubeClient,
    namespaces: Sequence[str] = (),
    *,
    shard: Shard | None = None,
    metrics: Metrics | None = None,
    idle_timeout: float = WATCH_IDLE_TIMEOUT,
) -> Caches:
    """The controller's caches (not yet running) of ``namespaces`` (empty: all namespaces).

    Runs and configs whole, children (ConfigMaps, Jobs, CronJobs, pods) by the
    managed-by label, each kept as its projection with the indexes the
    reconcilers and handlers read. Tests that drive the reconcilers by hand
    build the same caches with this.
    """
    shard = shard or Shard()
    selector = managed_selector()

    def informer(resource: Any, *, all_shards: bool = False, **kwargs: Any) -> Informer:
        # Each cache keeps only what the controller reads of its kind, and
        # only this shard's objects: the shard's filter drops first.
        return Informer(
            client,
            resource,
            namespaces=namespaces if all_shards else shard.narrow(namespaces),
            metrics=metrics,
            idle_timeout=idle_timeout,
            transform=compose(None if all_shards else shard.keep, projection(resource.kind)),
            # Kept as JSON: a third of the memory of parsed dicts (Store).
            packed=True,
            **kwargs,
        )

    children = {BY_RUN_UID: run_uid_index, BY_CONFIG_UID: config_uid_index}
    return Caches(
        runs=informer(
            RUNS, indexers={BY_CONFIG: config_index, BY_UID: uid_index, BY_PHASE: phase_index}
        ),
        # Every shard's: a run may use a config of another namespace.
        configs=informer(
            CONFIGS,
            all_shards=True,
            indexers={BY_UID: uid_index, BY_INFERENCESERVICE: inferenceservice_index},
        ),
        jobs=informer(JOBS, label_selector=selector, indexers=children),
        cronjobs=informer(CRONJOBS, label_selector=selector, indexers=children),
        configmaps=informer(CONFIGMAPS, label_selector=selector, indexers=children),
        pods=informer(PODS, label_selector=selector, indexers=children),
    )
