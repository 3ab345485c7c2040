"""The only code that talks to the Kubernetes API server.

:class:`KubeClient` is a thin async wrapper over one aiohttp session built from
``kubernetes_asyncio``'s configuration (kubeconfig locally, the pod's service
account in-cluster). It moves raw dicts, addressed by a :class:`Resource`
(group, version, plural) plus namespace and name:

- ``get``, ``list``, ``create``, ``replace``, ``patch``, ``update_status``,
  ``delete`` return the API server's JSON as a dict; ``read_pod_log`` and
  ``follow_pod_log`` read a container's log;
- ``watch`` yields raw watch events, parsed with orjson line by line (no line
  length limit: big objects arrive as big lines);
- failures raise :class:`ApiError` subclasses carrying the HTTP status and the
  API's ``reason``, so callers treat :class:`NotFound`, :class:`Conflict` and
  :class:`AlreadyExists` as the normal races they are;
- every request waits for a token of a client-side limiter (``qps``/``burst``,
  aiolimiter) and is counted in ``rest_client_requests_total{verb,method,code}``.

Why raw dicts and not the typed client: the cache holds raw dicts (typed
models cost ~9x to parse and more memory), and the controller needs a handful
of verbs on a handful of resources.
"""

from __future__ import annotations

import asyncio
import copy
import os
import ssl
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import aiohttp
import aiohttp.helpers
import orjson
from aiolimiter import AsyncLimiter
from kubernetes_asyncio import config as kube_config
from kubernetes_asyncio.client import Configuration
from yarl import URL

from controller.metrics import api_host, labelled

if TYPE_CHECKING:
    from controller.metrics import Metrics

USER_AGENT = "kserve-inference-controller/0.1.0"
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

Obj = dict[str, Any]
# A JSON patch, or any JSON array body (named so KubeClient.list cannot shadow it).
JsonArray = list[Any]


@dataclass(frozen=True)
class Resource:
    """A kind of object on the API server: ``group``/``version``, REST ``plural``, ``kind``."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(
        self,
        namespace: str | None = None,
        name: str | None = None,
        subresource: str | None = None,
    ) -> str:
        """The REST path; ``namespace=None`` on a namespaced resource means all namespaces."""
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        elif not self.namespaced and namespace:
            raise ValueError(f"{self.kind} is cluster-scoped, got namespace {namespace!r}")
        elif self.namespaced and name is not None:
            raise ValueError(f"{self.kind} {name!r} needs a namespace")
        path = f"{base}/{self.plural}"
        if name is not None:
            if not name:
                raise ValueError(f"empty {self.kind} name")
            path += f"/{name}"
        if subresource:
            if name is None:
                raise ValueError("a subresource needs an object name")
            path += f"/{subresource}"
        return path

    def __str__(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


CONFIGMAPS = Resource("", "v1", "configmaps", "ConfigMap")
PODS = Resource("", "v1", "pods", "Pod")
EVENTS = Resource("", "v1", "events", "Event")
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
JOBS = Resource("batch", "v1", "jobs", "Job")
CRONJOBS = Resource("batch", "v1", "cronjobs", "CronJob")
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease")


# ----------------------------------------------------------------------------- errors


class ApiError(Exception):
    """The API server refused a request (or none could be made: ``status`` 0)."""

    def __init__(
        self,
        status: int,
        reason: str = "",
        message: str = "",
        *,
        verb: str = "",
        path: str = "",
        body: Mapping[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        self.status = status
        self.reason = reason
        self.message = message
        self.verb = verb
        self.path = path
        self.body = body
        self.retry_after = retry_after
        where = f"{verb} {path}".strip()
        what = " ".join(str(part) for part in (status or "", reason) if part)
        text = ": ".join(part for part in (where, what, message) if part)
        super().__init__(text or "API error")

    @property
    def is_not_found(self) -> bool:
        return self.status == 404

    @property
    def is_conflict(self) -> bool:
        """409 for a stale resourceVersion (Conflict) or an existing name (AlreadyExists)."""
        return self.status == 409

    @property
    def is_already_exists(self) -> bool:
        return self.status == 409 and self.reason == "AlreadyExists"

    @property
    def is_gone(self) -> bool:
        return self.status == 410

    @property
    def is_forbidden(self) -> bool:
        return self.status == 403

    @property
    def is_transient(self) -> bool:
        """Worth retrying as is: no answer, throttled, or a server-side failure."""
        return self.status in (0, 429) or self.status >= 500


class TransportError(ApiError):
    """No HTTP answer: connection refused or reset, TLS failure, timeout."""


class BadRequest(ApiError):
    """400."""


class Unauthorized(ApiError):
    """401."""


class Forbidden(ApiError):
    """403: RBAC says no."""


class NotFound(ApiError):
    """404: the object (or its namespace, or the resource type) does not exist."""


class Conflict(ApiError):
    """409 Conflict: the resourceVersion precondition failed; re-read and retry."""


class AlreadyExists(Conflict):
    """409 AlreadyExists: an object of that name exists already."""


class Gone(ApiError):
    """410: the resourceVersion is too old (watch or paginated list): relist."""


class Invalid(ApiError):
    """422: the object failed validation."""


class TooManyRequests(ApiError):
    """429: throttled by the API server (see ``retry_after``)."""


class ServerError(ApiError):
    """5xx."""


_ERRORS_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Gone,
    422: Invalid,
    429: TooManyRequests,
}


def api_error(
    status: int,
    body: bytes | Mapping[str, Any] | None,
    *,
    verb: str = "",
    path: str = "",
    retry_after: float | None = None,
) -> ApiError:
    """The typed error for an HTTP status and an API ``Status`` body (or any body)."""
    status_obj: Mapping[str, Any] | None = None
    if isinstance(body, Mapping):
        status_obj = body
    elif body:
        try:
            parsed = orjson.loads(body)
        except orjson.JSONDecodeError:
            parsed = None
        if isinstance(parsed, dict):
            status_obj = parsed
    if status_obj is not None:
        reason = str(status_obj.get("reason") or "")
        message = str(status_obj.get("message") or "")
    else:
        reason = ""
        message = body[:500].decode("utf-8", "replace") if isinstance(body, bytes) else ""
    cls: type[ApiError]
    if status == 409 and reason == "AlreadyExists":
        cls = AlreadyExists
    elif status >= 500:
        cls = ServerError
    else:
        cls = _ERRORS_BY_STATUS.get(status, ApiError)
    return cls(
        status,
        reason,
        message,
        verb=verb,
        path=path,
        body=status_obj,
        retry_after=retry_after,
    )


# ----------------------------------------------------------------------- configuration


async def load_configuration(
    *,
    kubeconfig: str | None = None,
    in_cluster: bool | None = None,
    context: str | None = None,
) -> Configuration:
    """kubernetes_asyncio's client configuration, found like controller-runtime does.

    An explicit kubeconfig wins; then the pod's service account when running
    in a pod (``in_cluster``, detected from ``KUBERNETES_SERVICE_HOST`` when
    not given); then ``$KUBECONFIG`` or ``~/.kube/config``.
    """
    configuration = Configuration()
    if in_cluster is None:
        in_cluster = kubeconfig is None and bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    if kubeconfig is None and in_cluster:
        # Re-reads the projected token as the kubelet rotates it.
        kube_config.load_incluster_config(  # type: ignore[no-untyped-call]
            client_configuration=configuration
        )
    else:
        await kube_config.load_kube_config(
            config_file=kubeconfig,
            context=context,
            client_configuration=configuration,
            persist_config=False,
        )
    return configuration


def ssl_context_for(configuration: Configuration) -> ssl.SSLContext:
    """The TLS settings of ``configuration`` (as kubernetes_asyncio's REST client builds them)."""
    context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, keyfile=configuration.key_file)
    if not configuration.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if configuration.disable_strict_ssl_verification:
        context.verify_flags &= ~ssl.VERIFY_X509_STRICT
    return context


# ------------------------------------------------------------------------------ client


class KubeClient:
    """Raw-dict access to the API server over one aiohttp session."""

    def __init__(
        self,
        configuration: Configuration,
        *,
        qps: float = 20.0,
        burst: int = 30,
        metrics: Metrics | None = None,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        field_manager: str = FIELD_MANAGER,
    ) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError(f"need qps > 0 and burst >= 1, got qps={qps} burst={burst}")
        self.configuration = configuration
        self.host = str(configuration.host).rstrip("/")
        self.field_manager = field_manager
        self.request_timeout = request_timeout
        self._metrics = metrics
        # aiolimiter leaks max_rate tokens per time_period: burst tokens per
        # burst/qps seconds is a bucket of size `burst` refilled at `qps`.
        self._limiter = AsyncLimiter(max_rate=burst, time_period=burst / qps)
        self._ssl = ssl_context_for(configuration) if self.host.startswith("https") else None
        self._connection = _Connection()

    def with_budget(self, qps: float, burst: int) -> KubeClient:
        """This client with a token bucket of its own, on the same connection pool.

        Requests that must never wait behind others (or hold others up) draw
        from their own budget: the controller gives Events one, so a burst of
        Events cannot delay a create or a status write. Closing either closes
        the shared connection.
        """
        if qps <= 0 or burst < 1:
            raise ValueError(f"need qps > 0 and burst >= 1, got qps={qps} burst={burst}")
        sibling = copy.copy(self)
        sibling._limiter = AsyncLimiter(max_rate=burst, time_period=burst / qps)
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
        metrics: Metrics | None = None,
    ) -> KubeClient:
        """A client for the cluster named by the kubeconfig (or the pod's own cluster)."""
        configuration = await load_configuration(
            kubeconfig=kubeconfig, in_cluster=in_cluster, context=context
        )
        return cls(configuration, qps=qps, burst=burst, metrics=metrics)

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._connection.session is not None:
            await self._connection.session.close()
            self._connection.session = None

    # ------------------------------------------------------------------- verbs

    async def get(self, resource: Resource, namespace: str | None, name: str) -> Obj:
        return await self.request("get", "GET", resource.path(namespace, name))

    async def list(
        self,
        resource: Resource,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
        resource_version: str | None = None,
    ) -> Obj:
        """One page of a list (``metadata.continue`` names the next one)."""
        params = _params(
            labelSelector=label_selector,
            fieldSelector=field_selector,
            limit=limit,
            resourceVersion=resource_version,
        )
        if continue_token:
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
        self, namespace: str, name: str, *, container: str, tail_lines: int
    ) -> str:
        """The last ``tail_lines`` lines a pod's container wrote (``pods/log``)."""
        path = PODS.path(namespace, name, "log")
        params = {"container": container, "tailLines": str(tail_lines)}
        timeout = aiohttp.ClientTimeout(total=self.request_timeout)
        async with self._open("get", "GET", path, params=params, timeout=timeout) as response:
            try:
                data = await response.read()
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise TransportError(
                    0, type(exc).__name__, str(exc), verb="get", path=path
                ) from exc
        return data.decode("utf-8", errors="replace")

    async def follow_pod_log(
        self, namespace: str, name: str, *, container: str, since_seconds: int | None = None
    ) -> AsyncIterator[str]:
        """A container's log lines as it writes them (``pods/log?follow=true``), until it ends."""
        path = PODS.path(namespace, name, "log")
        params = _params(container=container, follow="true", sinceSeconds=since_seconds)
        timeout = aiohttp.ClientTimeout(total=None, connect=self.request_timeout)
        async with self._open("get", "GET", path, params=params, timeout=timeout) as response:
            try:
                async for raw in response.content:
                    yield raw.decode("utf-8", errors="replace").rstrip("\n")
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise TransportError(
                    0, type(exc).__name__, str(exc), verb="get", path=path
                ) from exc

    async def delete(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        *,
        propagation_policy: Literal["Background", "Foreground", "Orphan"] | None = "Background",
        uid: str | None = None,
    ) -> Obj:
        """Delete; dependents go too (Background) unless told otherwise.

        ``uid`` is a precondition: the delete fails with :class:`Conflict` if
        the object was replaced meanwhile.
        """
        options: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if propagation_policy is not None:
            options["propagationPolicy"] = propagation_policy
        preconditions = _params(uid=uid)
        if preconditions:
            options["preconditions"] = preconditions
        return await self.request("delete", "DELETE", resource.path(namespace, name), body=options)

    async def watch(
        self,
        resource: Resource,
        namespace: str | None = None,
        *,
        resource_version: str | None = None,
        timeout_seconds: int | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        allow_bookmarks: bool = True,
    ) -> AsyncIterator[Obj]:
        """Raw watch events (``{"type": ..., "object": {...}}``) until the server ends the watch.

        An HTTP error (410 for a too-old ``resource_version`` included) raises
        :class:`ApiError` before the first event; ``ERROR`` events are yielded
        as they come, for the caller to judge.
        """
        params = _params(
            watch="true",
            resourceVersion=resource_version,
            timeoutSeconds=timeout_seconds,
            labelSelector=label_selector,
            fieldSelector=field_selector,
            allowWatchBookmarks="true" if allow_bookmarks else None,
        )
        read_timeout = (timeout_seconds or 1800) + WATCH_READ_SLACK
        timeout = aiohttp.ClientTimeout(
            total=None, connect=self.request_timeout, sock_read=read_timeout
        )
        path = resource.path(namespace)
        async with self._open("watch", "GET", path, params=params, timeout=timeout) as response:
            # One event per line, and a line can be megabytes: gather the parts
            # of an unfinished line and join them once, when its newline comes.
            partial: list[bytes] = []
            try:
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
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise TransportError(
                    0, type(exc).__name__, str(exc), verb="watch", path=path
                ) from exc
            rest = b"".join(partial)
            if rest.strip():
                yield orjson.loads(rest)

    # ---------------------------------------------------------------- plumbing

    async def request(
        self,
        verb: str,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | JsonArray | None = None,
        content_type: str = "application/json",
    ) -> Obj:
        """One request; the JSON answer as a dict, or a typed :class:`ApiError`."""
        timeout = aiohttp.ClientTimeout(total=self.request_timeout)
        async with self._open(
            verb, method, path, params=params, body=body, content_type=content_type, timeout=timeout
        ) as response:
            try:
                data = await response.read()
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise TransportError(0, type(exc).__name__, str(exc), verb=verb, path=path) from exc
        if not data:
            return {}
        parsed = orjson.loads(data)
        if not isinstance(parsed, dict):
            raise ApiError(
                response.status, "BadResponse", "expected a JSON object", verb=verb, path=path
            )
        return parsed

    def _open(
        self,
        verb: str,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | JsonArray | None = None,
        content_type: str = "application/json",
        timeout: aiohttp.ClientTimeout,
    ) -> _Response:
        return _Response(self, verb, method, path, params, body, content_type, timeout)

    def _session_for_request(self) -> aiohttp.ClientSession:
        connection = self._connection
        if connection.session is None or connection.session.closed:
            connector = aiohttp.TCPConnector(ssl=self._ssl if self._ssl is not None else False)
            # HTTPS_PROXY/NO_PROXY are honoured, as client-go does, and so is a
            # .netrc entry for the API server (what aiohttp's trust_env reads);
            # a kubeconfig proxy-url is passed per request and wins. They are
            # read once per session: with trust_env aiohttp reads both again for
            # every request, in two threads, which cost more CPU than the rest
            # of the request.
            connection.env_proxy, connection.env_proxy_auth = _env_proxy(self.host)
            connection.netrc_auth = _netrc_auth(self.host)
            connection.session = aiohttp.ClientSession(
                connector=connector,
                headers={"User-Agent": USER_AGENT, "Accept": "application/json"},
                trust_env=False,
                # Big objects in watch streams exceed aiohttp's 64 KiB default.
                read_bufsize=2**21,
            )
        return connection.session

    async def _headers(self, content_type: str | None) -> dict[str, str]:
        headers: dict[str, str] = {}
        # auth_settings() runs the configuration's refresh hook, so a rotated
        # service-account token is picked up without restarting.
        for auth in (await self.configuration.auth_settings()).values():
            if auth.get("in") == "header" and auth.get("value"):
                headers[str(auth["key"])] = str(auth["value"])
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    def _count(self, verb: str, method: str, code: str, seconds: float) -> None:
        if self._metrics is not None:
            host = api_host(self.host)
            labelled(
                self._metrics.rest_client_requests_total,
                verb=verb,
                method=method,
                code=code,
                host=host,
            ).inc()
            labelled(
                self._metrics.rest_client_request_duration_seconds, verb=method, host=host
            ).observe(seconds)

    async def _throttle(self, verb: str) -> None:
        loop_time = _loop_time()
        await self._limiter.acquire()
        if self._metrics is not None:
            labelled(self._metrics.rest_client_rate_limiter_wait_seconds, verb=verb).observe(
                _loop_time() - loop_time
            )


@dataclass
class _Connection:
    """The aiohttp session, shared by a client and its :meth:`KubeClient.with_budget` siblings."""

    session: aiohttp.ClientSession | None = None
    # What the environment says for the API server (see _session_for_request).
    env_proxy: str | None = None
    env_proxy_auth: aiohttp.BasicAuth | None = None
    netrc_auth: aiohttp.BasicAuth | None = None


def _env_proxy(host: str) -> tuple[str | None, aiohttp.BasicAuth | None]:
    """The proxy HTTPS_PROXY/HTTP_PROXY name for ``host`` unless NO_PROXY exempts it."""
    try:
        proxy, auth = aiohttp.helpers.get_env_proxy_for_url(URL(host))
    except LookupError:
        return None, None
    return str(proxy), auth


def _netrc_auth(host: str) -> aiohttp.BasicAuth | None:
    """The .netrc ($NETRC or ~/.netrc) credentials for ``host``'s name, if any."""
    name = URL(host).host
    if name is None:
        return None
    try:
        return aiohttp.helpers.basicauth_from_netrc(aiohttp.helpers.netrc_from_env(), name)
    except LookupError:
        return None


class _Response:
    """``async with``: one throttled, counted request whose non-2xx answer raises ApiError."""

    def __init__(
        self,
        client: KubeClient,
        verb: str,
        method: str,
        path: str,
        params: Mapping[str, str] | None,
        body: Mapping[str, Any] | JsonArray | None,
        content_type: str,
        timeout: aiohttp.ClientTimeout,
    ) -> None:
        self._client = client
        self._verb = verb
        self._method = method
        self._path = path
        self._params = params
        self._body = body
        self._content_type = content_type
        self._timeout = timeout
        self._response: aiohttp.ClientResponse | None = None

    async def __aenter__(self) -> aiohttp.ClientResponse:
        client = self._client
        await client._throttle(self._verb)
        data = orjson.dumps(self._body) if self._body is not None else None
        headers = await client._headers(self._content_type if data is not None else None)
        sent = _loop_time()
        session = client._session_for_request()
        connection = client._connection
        proxy, proxy_auth = client.configuration.proxy, None
        if proxy is None:
            proxy, proxy_auth = connection.env_proxy, connection.env_proxy_auth
        try:
            response = await session.request(
                self._method,
                client.host + self._path,
                params=self._params,
                data=data,
                headers=headers,
                timeout=self._timeout,
                proxy=proxy,
                proxy_auth=proxy_auth,
                auth=connection.netrc_auth,
                server_hostname=client.configuration.tls_server_name,
            )
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            client._count(self._verb, self._method, "<error>", _loop_time() - sent)
            raise TransportError(
                0, type(exc).__name__, str(exc), verb=self._verb, path=self._path
            ) from exc
        client._count(self._verb, self._method, str(response.status), _loop_time() - sent)
        if response.status >= 400:
            try:
                payload = await response.read()
            except (aiohttp.ClientError, TimeoutError):
                payload = b""
            finally:
                response.release()
            raise api_error(
                response.status,
                payload,
                verb=self._verb,
                path=self._path,
                retry_after=_retry_after(response.headers.get("Retry-After")),
            )
        self._response = response
        return response

    async def __aexit__(self, *_: object) -> None:
        if self._response is not None:
            # A watch left mid-stream must drop its connection; release() on a
            # fully read answer returns the connection to the pool.
            if self._response.content.is_eof():
                self._response.release()
            else:
                self._response.close()
            self._response = None


def _params(**values: str | int | None) -> dict[str, str]:
    return {key: str(value) for key, value in values.items() if value is not None}


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def _loop_time() -> float:
    return asyncio.get_running_loop().time()
