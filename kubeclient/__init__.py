"""The Kubernetes API client: the code that talks to the API server.

A package of its own, beside ``controller`` and ``kubectl_infer``, because
both use it: the controller for its informers, work queues, writes, Events and
leader election, the kubectl plugin for its reads and writes. It imports
nothing of either, nor of the runner or ``contract`` (the import-linter
contract "kube-is-a-library" in pyproject.toml); the controller passes in what
it records with (``instruments``).

Modules, each a noun for what it holds:

- ``resources``: what is addressed, ``Resource`` (group, version, plural) and
  the descriptors (``JOBS``, ``CONFIGMAPS``...), and the ``Obj`` alias; pure;
- ``objects``: what is read of a raw object, pure: its key, its controlling
  owner, how a Job ended, Kubernetes times;
- ``errors``: ``ApiError`` (HTTP status, the API's reason) and its subclasses;
- ``transport``: the connection (configuration, TLS, proxies, auth, the
  client-side token bucket, request metrics);
- ``client``: ``KubeClient``, raw-dict verbs over a transport (and a
  container's log);
- ``informer``: the reflector (list, then watch) that keeps a cache true, with
  event handlers and ``assume`` (a write is seen by the next read before its
  watch event comes); its cache is ``store`` (objects by key and named
  indexes), its waits between attempts ``backoff``;
- ``workqueue``: client-go's rate-limited work queue (contract in its docstring),
  its rate limiters in ``ratelimit``;
- ``workers``: the loop that drains a queue into ``reconcile(key)``;
- ``leaderelection``: Lease-based leader election;
- ``events``: the Kubernetes Events recorder.

The wiring (which informers, which handlers, which queues) is
``controller/controller.py``'s ``Controller``; ``controller/__main__.py``
builds the client and runs it. The plugin builds its own in
``kubectl_infer/cli.py``.
"""
