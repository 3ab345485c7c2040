"""The connection to the API server: configuration, TLS, proxies, auth, throttling, metrics.

:class:`Transport` owns one aiohttp session (shared with its
:meth:`Transport.with_budget` siblings) and sends requests on it: each waits
for a token of a client-side limiter (``qps``/``burst``, aiolimiter), carries
the configuration's credentials (re-read per request, so rotated tokens are
picked up), is counted in ``rest_client_requests_total{verb,method,code}``,
and a non-2xx answer raises the typed :class:`~kubeclient.errors.ApiError`.
What is sent where (the verbs) is ``kubeclient.client``'s.

Every connection has TCP keepalive on (:func:`keepalive_socket`): a peer that
died without closing (a host gone, a NAT or firewall that dropped the flow) is
noticed within ``keepalive`` seconds instead of the kernel's two hours, so a
long-lived connection (a watch, a followed log) on it fails and is made again.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import os
import socket
import ssl
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypedDict, Unpack

import aiohttp
import aiohttp.helpers
import orjson
from aiolimiter import AsyncLimiter
from yarl import URL

from kubeclient.errors import TransportError, api_error
from kubeclient.incluster import InClusterConfigError, InClusterConfiguration
from kubeclient.instruments import NO_METRICS, KubeMetrics, api_host, labelled

USER_AGENT = "kserve-inference-controller/0.1.0"
# Within how long a silent dead peer is noticed (seconds): the controller's
# WATCH_IDLE_TIMEOUT, the bound a stalled watch is noticed within.
KEEPALIVE = 75.0
KEEPALIVE_PROBES = 3
# A JSON patch, or any JSON array body (named so KubeClient.list cannot shadow it).
JsonArray = list[Any]
Body = Mapping[str, Any] | JsonArray


class RequestOptions(TypedDict, total=False):
    """What a request carries besides its verb, method and path (all optional)."""

    params: Mapping[str, str] | None
    body: Body | None
    # Of the body; application/json unless said otherwise.
    content_type: str


class ConfigurationError(Exception):
    """No connection can be configured from the kubeconfig or the pod's service account."""


class ApiConfiguration(Protocol):
    """What :class:`Transport` reads of a configuration: kubernetes_asyncio's
    ``Configuration`` (from a kubeconfig) or :class:`InClusterConfiguration`."""

    # Read-only (properties), so that an attribute of a narrower type matches.
    @property
    def host(self) -> str | None: ...
    @property
    def ssl_ca_cert(self) -> str | None: ...
    @property
    def cert_file(self) -> str | None: ...
    @property
    def key_file(self) -> str | None: ...
    @property
    def verify_ssl(self) -> bool: ...
    @property
    def disable_strict_ssl_verification(self) -> bool: ...
    @property
    def proxy(self) -> str | None: ...
    @property
    def tls_server_name(self) -> str | None: ...

    async def auth_settings(self) -> dict[str, dict[str, Any]]: ...


async def load_configuration(
    *,
    kubeconfig: str | None = None,
    in_cluster: bool | None = None,
    context: str | None = None,
) -> ApiConfiguration:
    """The connection's configuration, found like controller-runtime does.

    An explicit kubeconfig wins; then the pod's service account when running
    in a pod (``in_cluster``, detected from ``KUBERNETES_SERVICE_HOST`` when
    not given); then ``$KUBECONFIG`` or ``~/.kube/config``. A configuration
    that cannot be made raises :class:`ConfigurationError` (or ``OSError``
    for a file that cannot be read).

    Only a kubeconfig loads kubernetes_asyncio (its loader handles exec
    plugins, auth providers and merged files); importing it loads its whole
    generated client, which a controller in a pod never needs.
    """
    if in_cluster is None:
        in_cluster = kubeconfig is None and bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    if kubeconfig is None and in_cluster:
        try:
            return InClusterConfiguration.from_pod()
        except InClusterConfigError as exc:
            raise ConfigurationError(str(exc)) from None
    from kubernetes_asyncio import config as kube_config
    from kubernetes_asyncio.client import Configuration

    configuration = Configuration()
    try:
        await kube_config.load_kube_config(
            config_file=kubeconfig,
            context=context,
            client_configuration=configuration,
            persist_config=False,
        )
    except kube_config.ConfigException as exc:
        raise ConfigurationError(str(exc)) from None
    loaded: ApiConfiguration = configuration
    return loaded


def ssl_context_for(configuration: ApiConfiguration) -> ssl.SSLContext:
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


@contextlib.contextmanager
def no_answer_raises(verb: str, path: str) -> Iterator[None]:
    """Turn a failure to send a request or read its answer into :class:`TransportError`.

    Connection refused or reset, TLS failures and timeouts (``TimeoutError`` is
    an ``OSError``) all mean the same to callers: no answer, worth retrying.
    """
    try:
        yield
    except (aiohttp.ClientError, OSError) as exc:
        raise TransportError(0, type(exc).__name__, str(exc), verb=verb, path=path) from exc


def keepalive_options(within: float) -> dict[str, int]:
    """TCP socket options that notice a silent dead peer within ``within`` seconds.

    Probes go every ``within / 6`` seconds, starting after about half of
    ``within`` of silence, so that the third unanswered one (which ends the
    connection) comes no later than ``within``. ``TCP_USER_TIMEOUT`` (Linux)
    does the same for data sent and never acknowledged, where keepalive
    probes are not sent. Options the platform lacks are left out.
    """
    if within < 1 + KEEPALIVE_PROBES:
        raise ValueError(
            f"a keepalive bound needs at least {1 + KEEPALIVE_PROBES} seconds, got {within}"
        )
    interval = max(1, int(within / 6))
    idle = int(within) - KEEPALIVE_PROBES * interval
    wanted = {
        "TCP_KEEPIDLE": idle,
        "TCP_KEEPINTVL": interval,
        "TCP_KEEPCNT": KEEPALIVE_PROBES,
        "TCP_USER_TIMEOUT": int(within * 1000),
    }
    return {name: value for name, value in wanted.items() if hasattr(socket, name)}


def keepalive_socket(within: float) -> Callable[[tuple[Any, ...]], socket.socket]:
    """A socket factory for aiohttp's connector: sockets with :func:`keepalive_options`."""
    options = keepalive_options(within)

    def make(addr_info: tuple[Any, ...]) -> socket.socket:
        family, kind, proto = addr_info[:3]
        sock = socket.socket(family=family, type=kind, proto=proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            for name, value in options.items():
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
        except OSError:
            sock.close()
            raise
        return sock

    return make


def token_bucket(qps: float, burst: int) -> AsyncLimiter:
    """A bucket of ``burst`` tokens refilled at ``qps`` a second."""
    if qps <= 0 or burst < 1:
        raise ValueError(f"need qps > 0 and burst >= 1, got qps={qps} burst={burst}")
    # aiolimiter leaks max_rate tokens per time_period: burst tokens per
    # burst/qps seconds is a bucket of size `burst` refilled at `qps`.
    return AsyncLimiter(max_rate=burst, time_period=burst / qps)


class Transport:
    """Throttled, counted, authenticated requests to one API server over one aiohttp session."""

    def __init__(
        self,
        configuration: ApiConfiguration,
        *,
        qps: float,
        burst: int,
        metrics: KubeMetrics | None = None,
        keepalive: float = KEEPALIVE,
    ) -> None:
        self.configuration = configuration
        self.keepalive = keepalive
        self._socket_factory = keepalive_socket(keepalive)
        self.host = str(configuration.host).rstrip("/")
        self.limiter = token_bucket(qps, burst)
        self._metrics = NO_METRICS if metrics is None else metrics
        self._ssl = ssl_context_for(configuration) if self.host.startswith("https") else None
        self.connection = _Connection()

    def with_budget(self, qps: float, burst: int) -> Transport:
        """This transport with a token bucket of its own, on the same connection pool."""
        limiter = token_bucket(qps, burst)
        sibling = copy.copy(self)
        sibling.limiter = limiter
        return sibling

    async def close(self) -> None:
        if self.connection.session is not None:
            await self.connection.session.close()
            self.connection.session = None

    @contextlib.asynccontextmanager
    async def open(
        self,
        verb: str,
        method: str,
        path: str,
        *,
        timeouts: aiohttp.ClientTimeout,
        **options: Unpack[RequestOptions],
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """``async with``: the answer to one request, a 2xx one (else ApiError is raised)."""
        await self._throttle(verb)
        body = options.get("body")
        data = orjson.dumps(body) if body is not None else None
        content_type = options.get("content_type", "application/json")
        headers = await self._headers(content_type if data is not None else None)
        sent = _loop_time()
        session = self.session()
        connection = self.connection
        proxy, proxy_auth = self.configuration.proxy, None
        if proxy is None:
            proxy, proxy_auth = connection.env_proxy, connection.env_proxy_auth
        try:
            response = await session.request(
                method,
                self.host + path,
                params=options.get("params"),
                data=data,
                headers=headers,
                timeout=timeouts,
                proxy=proxy,
                proxy_auth=proxy_auth,
                auth=connection.netrc_auth,
                server_hostname=self.configuration.tls_server_name,
            )
        except (aiohttp.ClientError, OSError) as exc:
            self._count(verb, method, "<error>", _loop_time() - sent)
            raise TransportError(0, type(exc).__name__, str(exc), verb=verb, path=path) from exc
        self._count(verb, method, str(response.status), _loop_time() - sent)
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
                verb=verb,
                path=path,
                retry_after=_retry_after(response.headers.get("Retry-After")),
            )
        try:
            yield response
        finally:
            # A watch left mid-stream must drop its connection; release() on a
            # fully read answer returns the connection to the pool.
            if response.content.is_eof():
                response.release()
            else:
                response.close()

    def session(self) -> aiohttp.ClientSession:
        """The shared session, opened on first use (and again after :meth:`close`)."""
        connection = self.connection
        if connection.session is None or connection.session.closed:
            connector = aiohttp.TCPConnector(
                ssl=self._ssl if self._ssl is not None else False,
                socket_factory=self._socket_factory,
            )
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
        await self.limiter.acquire()
        labelled(self._metrics.rest_client_rate_limiter_wait_seconds, verb=verb).observe(
            _loop_time() - loop_time
        )


@dataclass
class _Connection:
    """The aiohttp session, shared by a transport and its :meth:`Transport.with_budget` siblings."""

    session: aiohttp.ClientSession | None = None
    # What the environment says for the API server (see Transport.session).
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


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def _loop_time() -> float:
    return asyncio.get_running_loop().time()
