"""The Kubernetes side of the controller; the only package that talks to the API server.

Modules, each a noun for what it holds:

- ``client``: ``KubeClient``, raw-dict verbs over one aiohttp session, and
  typed ``ApiError`` subclasses (``NotFound``, ``Conflict``, ``AlreadyExists``...);
- ``informer``: list-then-watch caches with indexes and event handlers;
- ``workqueue``: client-go's rate-limited work queue (contract in its docstring);
- ``workers``: the loop that drains the queue into ``reconcile(key)``;
- ``leaderelection``: Lease-based leader election;
- ``events``: the Kubernetes Events recorder.

How ``controller/__main__.py`` wires them (sample-controller's shape: informers
-> handlers -> queue -> workers -> reconcile(key); the handlers below are the
only ways work enters the queue)::

    settings = load_settings(sys.argv[1:])          # SettingsError -> print, exit 2
    configure_logging(settings.log_level, settings.log_format)
    metrics = Metrics()
    client = await KubeClient.connect(
        kubeconfig=settings.kubeconfig, in_cluster=settings.in_cluster,
        qps=settings.kube_api_qps, burst=settings.kube_api_burst, metrics=metrics)

    ns = settings.watch_namespaces                  # () = all namespaces
    runs = Informer(client, RUNS, namespaces=ns, metrics=metrics,
                    indexers={"by-config": runs_by_config})
    configs = Informer(client, CONFIGS, namespaces=ns, metrics=metrics)
    children = [Informer(client, r, namespaces=ns, metrics=metrics,
                         label_selector="app.kubernetes.io/managed-by=...",
                         indexers={"by-owner": owner_uids})
                for r in (JOBS, CRONJOBS, CONFIGMAPS, PODS)]

    queue: WorkQueue[str] = WorkQueue("inferenceruns", metrics=metrics,
        rate_limiter=default_rate_limiter(settings.effective_queue_qps,
                                          settings.effective_queue_burst))

    def enqueue(obj): queue.add(object_key(obj))
    runs.add_event_handler(on_add=enqueue, on_update=lambda old, new: enqueue(new),
                           on_delete=lambda obj: queue.cancel_resync(object_key(obj)))

    def enqueue_owner(obj):                         # sample-controller's handleObject
        key = owner_key(obj, kind="InferenceRun", api_group="ai.krateo.io")
        if key is not None and runs.get_by_key(key) is not None:
            queue.add(key)
    for informer in children:
        informer.add_event_handler(on_add=enqueue_owner,
                                   on_update=lambda old, new: enqueue_owner(new),
                                   on_delete=enqueue_owner)

    def enqueue_runs_of(config):                    # a config change -> its runs
        for run in runs.by_index("by-config", object_key(config)):
            queue.add(object_key(run))
    configs.add_event_handler(on_add=enqueue_runs_of,
                              on_update=lambda old, new: enqueue_runs_of(new),
                              on_delete=enqueue_runs_of)

    recorder = EventRecorder(client, instance=identity, metrics=metrics)
    informers = [runs, configs, *children]
    servers = await start_servers(
        registry=metrics.registry, bind_address=settings.bind_address,
        metrics_port=settings.metrics_port, health_port=settings.health_port,
        readiness={"informers-synced": lambda: all(i.has_synced() for i in informers)})
    workers = Workers(queue, reconciler.reconcile, workers=settings.workers,
                      metrics=metrics, resync_period=settings.polling_interval,
                      should_resync=lambda key: runs.get_by_key(key) is not None)

    async with asyncio.TaskGroup() as tasks:        # SIGTERM: cancel this task
        for informer in informers:
            tasks.create_task(informer.run())
        tasks.create_task(recorder.run())
        for informer in informers:                  # the has-synced gate
            await informer.wait_for_sync()
        if settings.leader_election:                # informers run on standbys too
            elector = LeaderElector(client, name=settings.lease_name,
                namespace=settings.lease_namespace, identity=make_identity(settings.pod_name),
                lease_duration=settings.lease_duration, renew_deadline=settings.renew_deadline,
                retry_period=settings.retry_period, metrics=metrics)
            tasks.create_task(elector.run(workers.run))   # LeadershipLost -> exit non-zero
        else:
            tasks.create_task(workers.run())
    # then: await servers.stop(); await client.close()

Cancelling the main task is the graceful shutdown: the elector cancels the
workers and releases the Lease, informers close their watches, the recorder
stops. ``reconcile(key)`` reads only informer caches and returns a
``workers.Result`` (or raises; see ``workers``). After a write it hands the
API server's answer to ``informer.assume(obj)`` (or ``assume_deleted(key)``),
so the next reconcile reads its own write even before the watch event comes.
"""
