"""The only code that talks to the Kubernetes API server.

:class:`KubeClient` is a thin async wrapper over one aiohttp session built from
a kubeconfig (through ``kubernetes_asyncio``'s loader) or from the pod's
service account in-cluster (``kubeclient.incluster``). It moves raw
dicts, addressed by a :class:`Resource` (group, version, plural) plus
namespace and name:

- ``get``, ``list``, ``create``, ``replace``, ``patch``, ``update_status``,
  ``delete`` return the API server's JSON as a dict; ``read_pod_log`` and
  ``follow_pod_log`` read a container's log;
- ``watch`` yields raw watch events, parsed with orjson line by line (no line
  length limit: big objects arrive as big lines);
- failures raise :class:`ApiError` carrying the HTTP status and the API's
  ``reason``, so callers treat not found, conflict and already exists as the
  normal races they are;
- every request goes through a :class:`~kubeclient.transport.Transport`:
  it waits for a token of a client-side limiter (``qps``/``burst``, aiolimiter)
  and is counted in ``rest_client_requests_total{verb,method,code}``.

What is addressed lives in ``kubeclient.resources`` (pure), the errors in
``kubeclient.errors``, the connection in ``kubeclient.transport``.

Why raw dicts and not the typed client: the cache holds raw dicts (typed
models cost ~9x to parse and more memory), and the controller needs a handful
of verbs on a handful of resources.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Mapping
from typing import Any, Literal, TypedDict, Unpack

import aiohttp
import orjson

from kubeclient.errors import ApiError
from kubeclient.instruments import KubeMetrics
from kubeclient.resources import PODS, Obj, Resource
from kubeclient.transport import (
    KEEPALIVE,
    ApiConfiguration,
    JsonArray,
    RequestOptions,
    Transport,
    load_configuration,
    no_answer_raises,
)

FIELD_MANAGER = "kserve-inference-controller"
DEFAULT_REQUEST_TIMEOUT = 30.0
# A watch's read guard beyond the server-side timeoutSeconds.
WATCH_READ_SLACK = 30.0

PatchType = Literal["merge", "strategic", "json", "apply"]
_PATCH_CONTENT_TYPES: dict[str, str] = {
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "json": "application/json-patch+json",
    "apply": "application/apply-patch+yaml",
}


class Selection(TypedDict, total=False):
    """Which objects a list or a watch is about (part of the API's ListOptions)."""

    label_selector: str | None
    field_selector: str | None
    # A list: at least this recent ("0": any cached state). A watch: changes after it.
    resource_version: str | None


class ListOptions(Selection, total=False):
    # A page of at most ``limit`` objects; ``continue_token`` asks for the next one.
    limit: int | None
    continue_token: str | None


class WatchOptions(Selection, total=False):
    # The server ends the watch after this long (client-go picks 5-10 minutes).
    timeout_seconds: int | None
    # BOOKMARK events carry the resourceVersion forward; on unless False.
    allow_bookmarks: bool


class KubeClient:
    """Raw-dict access to the API server over one aiohttp session."""

    def __init__(
        self,
        configuration: ApiConfiguration,
        *,
        qps: float = 20.0,
        burst: int = 30,
        metrics: KubeMetrics | None = None,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        field_manager: str = FIELD_MANAGER,
        keepalive: float = KEEPALIVE,
    ) -> None:
        self.transport = Transport(
            configuration, qps=qps, burst=burst, metrics=metrics, keepalive=keepalive
        )
        self.field_manager = field_manager
        self.request_timeout = request_timeout

    @property
    def configuration(self) -> ApiConfiguration:
        return self.transport.configuration

    @property
    def host(self) -> str:
        """The API server's URL (``https://host:port``, no trailing slash)."""
        return self.transport.host

    def with_budget(self, qps: float, burst: int) -> KubeClient:
        """This client with a token bucket of its own, on the same connection pool.

        Requests that must never wait behind others (or hold others up) draw
        from their own budget: the controller gives Events one, so a burst of
        Events cannot delay a create or a status write. Closing either closes
        the shared connection.
        """
        sibling = copy.copy(self)
        sibling.transport = self.transport.with_budget(qps, burst)
        return sibling

    @classmethod
    async def connect(
        cls,
        *,
        kubeconfig: str | None = None,
        in_cluster: bool | None = None,
        context: str | None = None,
        qps: float = 20.0,
        burst: int = 30,
        metrics: KubeMetrics | None = None,
        keepalive: float = KEEPALIVE,
    ) -> KubeClient:
        """A client for the cluster named by the kubeconfig (or the pod's own cluster).

        ``keepalive``: a silent dead peer is noticed within this many seconds.
        """
        configuration = await load_configuration(
            kubeconfig=kubeconfig, in_cluster=in_cluster, context=context
        )
        return cls(configuration, qps=qps, burst=burst, metrics=metrics, keepalive=keepalive)

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.transport.close()

    # ------------------------------------------------------------------- verbs

    async def get(self, resource: Resource, namespace: str | None, name: str) -> Obj:
        return await self.request("get", "GET", resource.path(namespace, name))

    async def list(
        self, resource: Resource, namespace: str | None = None, **options: Unpack[ListOptions]
    ) -> Obj:
        """One page of a list (``metadata.continue`` names the next one)."""
        params = _selection_params(options) | _params(limit=options.get("limit"))
        if continue_token := options.get("continue_token"):
            params["continue"] = continue_token
        return await self.request("list", "GET", resource.path(namespace), params=params)

    async def create(
        self, resource: Resource, namespace: str | None, body: Mapping[str, Any]
    ) -> Obj:
        params = {"fieldManager": self.field_manager}
        return await self.request(
            "create", "POST", resource.path(namespace), params=params, body=body
        )

    async def replace(
        self, resource: Resource, namespace: str | None, name: str, body: Mapping[str, Any]
    ) -> Obj:
        """PUT the whole object; its ``metadata.resourceVersion`` is the precondition."""
        params = {"fieldManager": self.field_manager}
        return await self.request(
            "update", "PUT", resource.path(namespace, name), params=params, body=body
        )

    async def update_status(
        self, resource: Resource, namespace: str | None, name: str, body: Mapping[str, Any]
    ) -> Obj:
        """PUT the status subresource; ``metadata.resourceVersion`` is the precondition."""
        params = {"fieldManager": self.field_manager}
        return await self.request(
            "update", "PUT", resource.path(namespace, name, "status"), params=params, body=body
        )

    async def patch(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        patch: Mapping[str, Any] | JsonArray,
        *,
        patch_type: PatchType = "merge",
        force: bool = False,
    ) -> Obj:
        params: dict[str, str] = {"fieldManager": self.field_manager}
        if patch_type == "apply" and force:
            params["force"] = "true"
        return await self.request(
            "patch",
            "PATCH",
            resource.path(namespace, name),
            params=params,
            body=patch,
            content_type=_PATCH_CONTENT_TYPES[patch_type],
        )

    async def read_pod_log(
        self, namespace: str, name: str, *, container: str, tail_lines: int | None
    ) -> str:
        """The last ``tail_lines`` lines a pod's container wrote (``pods/log``); None: all."""
        path = PODS.path(namespace, name, "log")
        params = _params(container=container, tailLines=tail_lines)
        timeout = aiohttp.ClientTimeout(total=self.request_timeout)
        async with self.transport.open(
            "get", "GET", path, params=params, timeouts=timeout
        ) as answer:
            with no_answer_raises("get", path):
                data = await answer.read()
        return data.decode("utf-8", errors="replace")

    async def follow_pod_log(
        self, namespace: str, name: str, *, container: str, since_seconds: int | None = None
    ) -> AsyncIterator[str]:
        """A container's log lines as it writes them (``pods/log?follow=true``), until it ends."""
        path = PODS.path(namespace, name, "log")
        params = _params(container=container, follow="true", sinceSeconds=since_seconds)
        timeout = aiohttp.ClientTimeout(total=None, connect=self.request_timeout)
        async with self.transport.open(
            "get", "GET", path, params=params, timeouts=timeout
        ) as answer:
            with no_answer_raises("get", path):
                async for raw in answer.content:
                    yield raw.decode("utf-8", errors="replace").rstrip("\n")

    async def delete(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        *,
        propagation_policy: Literal["Background", "Foreground", "Orphan"] | None = "Background",
        uid: str | None = None,
        resource_version: str | None = None,
    ) -> Obj:
        """Delete; dependents go too (Background) unless told otherwise.

        ``uid`` and ``resource_version`` are preconditions: the delete fails
        with a 409 Conflict if the object was replaced (or, with
        ``resource_version``, changed at all) meanwhile.
        """
        options: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if propagation_policy is not None:
            options["propagationPolicy"] = propagation_policy
        preconditions = _params(uid=uid, resourceVersion=resource_version)
        if preconditions:
            options["preconditions"] = preconditions
        return await self.request("delete", "DELETE", resource.path(namespace, name), body=options)

    async def watch(
        self, resource: Resource, namespace: str | None = None, **options: Unpack[WatchOptions]
    ) -> AsyncIterator[Obj]:
        """Raw watch events (``{"type": ..., "object": {...}}``) until the server ends the watch.

        An HTTP error (410 for a too-old ``resource_version`` included) raises
        :class:`ApiError` before the first event; ``ERROR`` events are yielded
        as they come, for the caller to judge.
        """
        timeout_seconds = options.get("timeout_seconds")
        params = _params(watch="true", timeoutSeconds=timeout_seconds) | _selection_params(options)
        if options.get("allow_bookmarks", True):
            params["allowWatchBookmarks"] = "true"
        read_timeout = (timeout_seconds or 1800) + WATCH_READ_SLACK
        timeout = aiohttp.ClientTimeout(
            total=None, connect=self.request_timeout, sock_read=read_timeout
        )
        path = resource.path(namespace)
        async with self.transport.open(
            "watch", "GET", path, params=params, timeouts=timeout
        ) as response:
            # One event per line, and a line can be megabytes: gather the parts
            # of an unfinished line and join them once, when its newline comes.
            partial: list[bytes] = []
            with no_answer_raises("watch", path):
                async for chunk in response.content.iter_any():
                    start = 0
                    while (end := chunk.find(b"\n", start)) != -1:
                        partial.append(chunk[start:end])
                        line = b"".join(partial)
                        partial.clear()
                        start = end + 1
                        if line.strip():
                            yield orjson.loads(line)
                    if start < len(chunk):
                        partial.append(chunk[start:])
            rest = b"".join(partial)
            if rest.strip():
                yield orjson.loads(rest)

    # ---------------------------------------------------------------- plumbing

    async def request(
        self,
        verb: str,
        method: str,
        path: str,
        **options: Unpack[RequestOptions],
    ) -> Obj:
        """One request; the JSON answer as a dict, or a typed :class:`ApiError`."""
        timeout = aiohttp.ClientTimeout(total=self.request_timeout)
        async with self.transport.open(verb, method, path, timeouts=timeout, **options) as response:
            with no_answer_raises(verb, path):
                data = await response.read()
        if not data:
            return {}
        parsed = orjson.loads(data)
        if not isinstance(parsed, dict):
            raise ApiError(
                response.status, "BadResponse", "expected a JSON object", verb=verb, path=path
            )
        return parsed


def _selection_params(options: Selection) -> dict[str, str]:
    return _params(
        labelSelector=options.get("label_selector"),
        fieldSelector=options.get("field_selector"),
        resourceVersion=options.get("resource_version"),
    )


def _params(**values: str | int | None) -> dict[str, str]:
    return {key: str(value) for key, value in values.items() if value is not None}
