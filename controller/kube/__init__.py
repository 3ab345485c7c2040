"""The Kubernetes side of the controller: the code that talks to the API server.

Modules, each a noun for what it holds:

- ``client``: ``KubeClient``, raw-dict verbs over one aiohttp session (and a
  container's log), and typed ``ApiError`` subclasses (``NotFound``,
  ``Conflict``, ``AlreadyExists``...);
- ``informer``: list-then-watch caches with indexes, event handlers and
  ``assume`` (a write is seen by the next read before its watch event comes);
- ``workqueue``: client-go's rate-limited work queue (contract in its docstring);
- ``workers``: the loop that drains a queue into ``reconcile(key)``;
- ``leaderelection``: Lease-based leader election;
- ``events``: the Kubernetes Events recorder.

The wiring (which informers, which handlers, which queues) is
``controller/controller.py``'s ``Controller``; ``controller/__main__.py``
builds the client and runs it.
"""
