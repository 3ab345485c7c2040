"""The runner's HTTP sessions: ``HTTP(S)_PROXY`` and ``NO_PROXY``, read once.

The model and storage calls honour ``HTTP_PROXY``, ``HTTPS_PROXY`` and
``NO_PROXY`` (either case), as curl, requests and every HTTP client users know
do. aiohttp does this with ``trust_env=True``, at a price paid on *every*
request: it looks up ``~/.netrc`` and the proxy variables again, in the event
loop's thread pool (two thread hops, a failed ``open()`` and a self-pipe
wake-up per request, 3-7% of a streaming run's CPU). A pod's environment does
not change while it runs, so :func:`client_session` reads the variables once
and a client middleware gives each request its proxy (:class:`EnvProxies`);
the sessions themselves never trust the environment.

``~/.netrc`` is not read for the model or the storage: their credentials come
from the contract and its Secrets, nothing else. A request that names its own
proxy (a storage Secret's ``proxy-url``) keeps it.
"""

from __future__ import annotations

from typing import Any
from urllib.request import getproxies_environment, proxy_bypass

import aiohttp
from aiohttp.helpers import ProxyInfo, proxies_from_env
from yarl import URL


class EnvProxies:
    """The proxy each URL takes, from the environment as it was when made."""

    def __init__(self) -> None:
        self._variables = getproxies_environment()
        # aiohttp's own reading (user:password in the proxy URL or ~/.netrc for
        # the proxy's host, https:// proxies refused with a warning), done once
        # instead of once per request, and not at all without a proxy.
        self.proxies: dict[str, ProxyInfo] = (
            proxies_from_env() if {"http", "https"} & self._variables.keys() else {}
        )
        self._bypass: dict[str, bool] = {}

    def __bool__(self) -> bool:
        return bool(self.proxies)

    def for_url(self, url: URL) -> ProxyInfo | None:
        """The proxy for ``url``, or None: no proxy for its scheme, or NO_PROXY names its host."""
        info = self.proxies.get(url.scheme)
        if info is None:
            return None
        host = url.host or ""
        bypass = self._bypass.get(host)
        if bypass is None:
            # The standard library's NO_PROXY rules (proxy_bypass_environment on
            # Linux), as aiohttp applies them: host names and domain suffixes,
            # matched against the host only.
            bypass = self._bypass[host] = bool(host and proxy_bypass(host, self._variables))
        return None if bypass else info

    async def middleware(
        self, request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
    ) -> aiohttp.ClientResponse:
        if request.proxy is None:
            info = self.for_url(request.url)
            if info is not None:
                request.update_proxy(info.proxy, info.proxy_auth, None)
        return await handler(request)


def client_session(
    *, middlewares: tuple[aiohttp.ClientMiddlewareType, ...] = (), **options: Any
) -> aiohttp.ClientSession:
    """An aiohttp session whose requests take the environment's proxy, read once.

    ``options`` are :class:`aiohttp.ClientSession`'s; ``trust_env`` is always False.
    """
    proxies = EnvProxies()
    chain = (proxies.middleware, *middlewares) if proxies else middlewares
    return aiohttp.ClientSession(middlewares=chain, trust_env=False, **options)
