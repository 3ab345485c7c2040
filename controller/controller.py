"""The controller: informers -> handlers -> work queue -> workers -> reconcile.

sample-controller's shape in asyncio. :class:`Controller` builds the caches
for runs, configs and the children it owns (label-selected, so the cache holds
only what this controller made), wires their events into two work queues,
one of run keys and one of config keys, and runs both queues' workers, behind
leader election when enabled.

``Controller._watches`` is the one table of what is watched and which
handler each informer's events go to:

- ``enqueue_run`` / ``forget_run``: a run's own events enqueue the run;
- ``Cleanup.run_changed`` / ``run_deleted`` (controller/cleanup.py): a run
  deleted or being deleted has its Jobs and CronJobs deleted at once, and
  ``Cleanup.workload_changed``: a Job or CronJob of a run already gone goes too;
- ``handle_owned_change`` / ``handle_owned_object`` (sample-controller's
  ``handleObject``): a child's events (ConfigMap, Job, CronJob, pod) enqueue
  the run whose uid is its ``ai.krateo.io/run-uid`` label, found through the
  runs cache: its additions and changes batched (one pass for the burst of
  changes a pod and its Job go through within a second), its deletion at once;
- an update that changed nothing the cache keeps (a projection equal but for
  its resourceVersion) enqueues nothing;
- ``enqueue_runs_of_config``: a config's events enqueue the config and every
  run that uses it (an index, not a scan);
- ``enqueue_probed_config``: a probe's events (its Job, pod, ConfigMap:
  ``ai.krateo.io/config-uid``) enqueue the config;
- every key comes back every ``POLLING_INTERVAL`` at low priority (resync).

Informers run on a standby replica too, so it is ready (and ``/readyz`` says
so) the moment it takes the lease over. The leader's work is the two queues'
workers and the cleanup's (its queue of deleted runs, and the sweep for what
was deleted while nobody led, which runs first).

Sharded (``SHARD_COUNT`` > 1, controller/sharding.py), the caches of runs and
their children keep only this shard's namespaces (the shard's filter is the
informers' first transform), configs are cached everywhere (a run may use one
of another namespace) but reconciled only by their namespace's shard, and the
leader is elected on the shard's own Lease.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, get_args

import structlog

from controller.api import Phase
from controller.caches import (
    BY_CONFIG,
    BY_INFERENCESERVICE,
    BY_PHASE,
    BY_UID,
    build_caches,
    config_uid_index,
    inferenceservice_index,
    run_uid_index,
)
from controller.cleanup import Cleanup
from controller.config_reconcile import ConfigReconciler
from controller.isvc_watch import ModelWatch
from controller.metrics import Metrics
from controller.projection import unchanged
from controller.reconcile import Reconciler
from controller.server import Servers, start_servers
from controller.settings import Settings
from kubeclient.client import KubeClient
from kubeclient.events import EventRecorder
from kubeclient.informer import (
    Informer,
    OnAdd,
    OnDelete,
    OnUpdate,
)
from kubeclient.leaderelection import LeaderElector, make_identity
from kubeclient.objects import object_key
from kubeclient.ratelimit import default_rate_limiter
from kubeclient.resources import Obj
from kubeclient.workers import Workers
from kubeclient.workqueue import WorkQueue

log = structlog.stdlib.get_logger(__name__)

# A child's changes (a pod Pending, Running, then Succeeded; its Job counting
# it, then Complete) come in bursts: they reach the run's queue this long
# after the first of them, so that one pass reads them all. The Kubernetes Job
# controller batches its pods' events the same way (syncJobBatchPeriod, 1 s).
# A child's deletion is not batched: the run must recreate it or say so.
CHILD_EVENTS_BATCH = 1.0
PHASES = get_args(Phase)


def _ignore(_obj: Obj) -> None:
    """No handler for this event."""


def _with_new(handler: OnAdd) -> OnUpdate:
    """An update handler that hands the new object to ``handler``.

    Not when the update changed nothing the cache keeps but the
    resourceVersion (``controller.projection.unchanged``): a pod's IP or a
    Job's ``active`` count is read by nobody, so it is no reason for work.
    """

    def on_update(old: Obj, new: Obj) -> None:
        if not unchanged(old, new):
            handler(new)

    return on_update


class Controller:
    def __init__(self, settings: Settings, client: KubeClient, metrics: Metrics) -> None:
        self.settings = settings
        self.client = client
        self.metrics = metrics
        namespaces = settings.watch_namespaces

        # SHARD_COUNT > 1: only this shard's namespaces (controller/sharding.py).
        self.shard = settings.shard
        self.caches = build_caches(
            client,
            namespaces,
            shard=self.shard,
            metrics=metrics,
            idle_timeout=settings.watch_idle_timeout,
        )
        self.informers = self.caches.all()
        self.queue: WorkQueue[str] = WorkQueue(
            "inferenceruns",
            metrics=metrics,
            rate_limiter=default_rate_limiter(
                settings.effective_queue_qps, settings.effective_queue_burst
            ),
        )
        self.identity = make_identity(settings.pod_name)
        # Events draw from their own token bucket: after a burst of runs they
        # must not queue in front of the creates and status writes.
        self.events = EventRecorder(
            client.with_budget(settings.events_qps, settings.events_burst),
            instance=self.identity,
            metrics=metrics,
        )
        # InferenceServices, for configs that reference one: not a cache of the
        # readiness gate (a cluster without KServe runs every other config).
        self.models = ModelWatch(
            client,
            namespaces,
            enabled=settings.inferenceservices,
            metrics=metrics,
            idle_timeout=settings.watch_idle_timeout,
            wanted=self.uses_inferenceservices,
        )
        self.models.on_service(self.enqueue_users_of_service)
        self.models.on_state(self.enqueue_users_of_services)
        # What both reconcilers are given: the client, the caches, the one Event
        # recorder, and the controller's defaults for the runner pods they render.
        shared: dict[str, Any] = {
            "client": client,
            "caches": self.caches,
            "events": self.events,
            "models": self.models,
            "runner_service_account": settings.runner_service_account,
            "pod_defaults": settings.runner_pod_defaults,
            "watch_namespaces": tuple(namespaces),
        }
        self.reconciler = Reconciler(
            **shared, metrics=metrics, pod_start_timeout=settings.pod_start_timeout
        )
        self.workers = Workers(
            self.queue,
            self.reconciler.reconcile,
            workers=settings.workers,
            metrics=metrics,
            resync_period=settings.polling_interval,
            should_resync=self.caches.runs.has_key,
        )
        # Configs have their own queue: a burst of runs never delays a config's
        # status, and a config's probe never holds a run's worker.
        self.config_queue: WorkQueue[str] = WorkQueue(
            "inferenceconfigs",
            metrics=metrics,
            rate_limiter=default_rate_limiter(
                settings.effective_queue_qps, settings.effective_queue_burst
            ),
        )
        self.config_reconciler = ConfigReconciler(**shared, probe_interval=settings.probe_interval)
        self.config_workers = Workers(
            self.config_queue,
            self.config_reconciler.reconcile,
            workers=1,
            name="inferenceconfig",
            metrics=metrics,
            resync_period=settings.polling_interval,
            should_resync=self.caches.configs.has_key,
            log_key="config",
        )
        # A deleted run's Jobs and CronJobs go at once (controller/cleanup.py).
        self.cleanup = Cleanup(
            client,
            self.caches,
            lambda uid: self.caches.runs.by_index(BY_UID, uid),
            metrics=metrics,
            sweep_interval=settings.polling_interval,
        )
        # Counted from the cache at scrape time: never stale, costs no request
        # (and, from the runs' phase index, parses no run).
        metrics.inference_runs.count(self._runs_by_phase, PHASES)
        self.elector: LeaderElector | None = None
        self.servers: Servers | None = None
        self._wire()

    def _runs_by_phase(self) -> Iterator[Obj]:
        """Per cached run, what the runs gauge reads of it (namespace, config, phase)."""
        store = self.caches.runs.store
        for value in store.index_values(BY_PHASE):
            namespace, config, phase = value.split("\0")
            run: Obj = {
                "metadata": {"namespace": namespace},
                "spec": {"configRef": {"name": config}},
            }
            if phase:
                run["status"] = {"phase": phase}
            for _ in range(store.index_count(BY_PHASE, value)):
                yield run

    # ----------------------------------------------------------------- events

    def _watches(self) -> list[tuple[Informer, OnAdd, OnDelete]]:
        """What is watched, in one place: each informer, and what its events enqueue.

        A row is ``(informer, on add or update, on delete)``; an update hands
        the new object to the first handler.
        """
        c = self.caches
        return [
            (c.runs, self.enqueue_run, self.forget_run),
            # A run deleted or being deleted: its Jobs and CronJobs go now.
            (c.runs, self.cleanup.run_changed, self.cleanup.run_deleted),
            (c.jobs, self.cleanup.workload_changed, _ignore),
            (c.cronjobs, self.cleanup.workload_changed, _ignore),
            # A child's events enqueue the run that owns it (handleObject),
            # its changes batched for CHILD_EVENTS_BATCH.
            (c.jobs, self.handle_owned_change, self.handle_owned_object),
            (c.cronjobs, self.handle_owned_change, self.handle_owned_object),
            (c.configmaps, self.handle_owned_change, self.handle_owned_object),
            (c.pods, self.handle_owned_change, self.handle_owned_object),
            # A probe's Job, pod and ConfigMap enqueue the config they probe.
            (c.jobs, self.enqueue_probed_config, self.enqueue_probed_config),
            (c.configmaps, self.enqueue_probed_config, self.enqueue_probed_config),
            (c.pods, self.enqueue_probed_config, self.enqueue_probed_config),
            (c.configs, self.enqueue_runs_of_config, self.enqueue_runs_of_config),
        ]

    def _wire(self) -> None:
        for informer, on_change, on_delete in self._watches():
            informer.add_event_handler(
                on_add=on_change, on_update=_with_new(on_change), on_delete=on_delete
            )
        # A relist that finds a new run under an old name: the old one was deleted.
        self.caches.runs.add_event_handler(on_update=self.cleanup.run_replaced)

    def enqueue_run(self, run: Obj) -> None:
        """A run was added or changed: reconcile it."""
        self.queue.add(object_key(run))

    def forget_run(self, run: Obj) -> None:
        """A run was deleted: no more resyncs, and one last pass drops its per-run state."""
        key = object_key(run)
        self.queue.cancel_resync(key)
        self.queue.add(key)

    def handle_owned_object(self, obj: Obj) -> None:
        """A child is gone: enqueue the run named by its ``ai.krateo.io/run-uid`` label."""
        for key in self._owner_keys(obj):
            self.queue.add(key)

    def handle_owned_change(self, obj: Obj) -> None:
        """A child was added or changed: its run within ``CHILD_EVENTS_BATCH``, once."""
        for key in self._owner_keys(obj):
            self.queue.add_batched(key, CHILD_EVENTS_BATCH)

    def _owner_keys(self, obj: Obj) -> list[str]:
        return [
            key for uid in run_uid_index(obj) for key in self.caches.runs.index_keys(BY_UID, uid)
        ]

    def enqueue_runs_of_config(self, config: Obj) -> None:
        """A config changed: reconcile it (on its shard) and every run that uses it."""
        if self.shard.owns(config["metadata"].get("namespace")):
            self.config_queue.add(object_key(config))
        for key in self.caches.runs.index_keys(BY_CONFIG, object_key(config)):
            self.queue.add(key)

    def enqueue_users_of_service(self, key: str) -> None:
        """An InferenceService changed: the configs that reference it, and their runs."""
        for config in self.caches.configs.by_index(BY_INFERENCESERVICE, key):
            self.enqueue_runs_of_config(config)

    def uses_inferenceservices(self) -> bool:
        """Whether some cached config references an InferenceService (index keys only)."""
        return bool(self.caches.configs.store.index_values(BY_INFERENCESERVICE))

    def enqueue_users_of_services(self) -> None:
        """What the controller can read of InferenceServices changed: every config using one."""
        for config in self.caches.configs.list():
            if inferenceservice_index(config):
                self.enqueue_runs_of_config(config)

    def enqueue_probed_config(self, obj: Obj) -> None:
        """A probe's child changed: enqueue the config named by its ``ai.krateo.io/config-uid``."""
        for uid in config_uid_index(obj):
            for key in self.caches.configs.index_keys(BY_UID, uid):
                self.config_queue.add(key)

    # -------------------------------------------------------------------- run

    async def _work(self) -> None:
        """The leader's work: the cleanup, the runs' and the configs' workers."""
        async with asyncio.TaskGroup() as tasks:
            # First: the sweep of what was deleted while this replica did not lead.
            tasks.create_task(self.cleanup.run(), name="cleanup")
            tasks.create_task(self.workers.run(), name="run workers")
            tasks.create_task(self.config_workers.run(), name="config workers")

    def synced(self) -> bool:
        return all(i.has_synced() for i in self.informers)

    async def run(self, on_ready: Callable[[], Awaitable[None]] | None = None) -> None:
        """Run until cancelled (graceful shutdown) or until leadership is lost (raises)."""
        settings = self.settings
        self.servers = await start_servers(
            registry=self.metrics.registry,
            bind_address=settings.bind_address,
            metrics_port=settings.metrics_port,
            health_port=settings.health_port,
            readiness={"informers-synced": self.synced},
        )
        log.info(
            "serving",
            metrics_port=self.servers.metrics_port,
            health_port=self.servers.health_port,
            identity=self.identity,
        )
        try:
            async with asyncio.TaskGroup() as tasks:
                for informer in self.informers:
                    tasks.create_task(informer.run(), name=f"informer {informer.name}")
                tasks.create_task(self.events.run(), name="events")
                tasks.create_task(self.models.run(), name="inferenceservices")
                for informer in self.informers:  # the has-synced gate
                    await informer.wait_for_sync()
                log.info("caches synced", runs=len(self.caches.runs.store))
                if on_ready is not None:
                    await on_ready()
                if settings.leader_election:
                    assert settings.lease_namespace is not None  # checked by Settings
                    self.elector = LeaderElector(
                        self.client,
                        name=settings.effective_lease_name,
                        namespace=settings.lease_namespace,
                        identity=self.identity,
                        lease_duration=settings.lease_duration,
                        renew_deadline=settings.renew_deadline,
                        retry_period=settings.retry_period,
                        # Owns the Lease, so uninstalling (deleting it) deletes the Lease.
                        owner_service_account=settings.lease_owner,
                        metrics=self.metrics,
                    )
                    tasks.create_task(self.elector.run(self._work), name="leader")
                else:
                    # One replica, no election: it leads (alerts and dashboards
                    # read this gauge either way).
                    self.metrics.leader_election_disabled(settings.effective_lease_name)
                    tasks.create_task(self._work(), name="workers")
        finally:
            self.queue.shut_down()
            self.config_queue.shut_down()
            self.cleanup.shut_down()
            await self.servers.stop()
