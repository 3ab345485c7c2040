"""The runner's HTTP sessions: the environment's proxy, read once; ``~/.netrc`` never.

A loopback server stands for the model or the storage and records what each
request carried; a logging proxy (``tests.httpproxy``) is named in the
environment. ``NETRC`` names a file with credentials for the server: aiohttp's
``trust_env=True`` read it again on every request (in a worker thread) and
sent them, the runner's sessions never open it.
"""

from __future__ import annotations

import ssl
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from yarl import URL

from contract.document import ModelTransport
from hack.pki import make_pki
from runner.proxy import EnvProxies, client_session
from runner.transport import model_session
from tests.httpproxy import LoggingProxy

PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "REQUEST_METHOD")
REQUESTS = 3

# Files opened by this process, per path, while a test watches them (an audit
# hook cannot be removed, so one hook for the module, armed per test).
_WATCHED: dict[str, int] = {}


def _count_opens(event: str, args: tuple[Any, ...]) -> None:
    if event == "open" and _WATCHED and args and str(args[0]) in _WATCHED:
        _WATCHED[str(args[0])] += 1


sys.addaudithook(_count_opens)


@dataclass
class Server:
    url: str = ""
    authorizations: list[str | None] = field(default_factory=list)


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[pytest.MonkeyPatch]:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login netrc-user password netrc-password\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    _WATCHED[str(netrc)] = 0
    try:
        yield monkeypatch
    finally:
        _WATCHED.clear()


def netrc_opens() -> int:
    assert len(_WATCHED) == 1
    return next(iter(_WATCHED.values()))


async def serve(tls: ssl.SSLContext | None = None) -> AsyncIterator[Server]:
    server = Server()

    async def answer(request: web.Request) -> web.Response:
        server.authorizations.append(request.headers.get("Authorization"))
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls)
    await site.start()
    port = runner.addresses[0][1]
    server.url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    try:
        yield server
    finally:
        await runner.cleanup()


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    async for running in serve():
        yield running


async def call(session: aiohttp.ClientSession, url: str, **options: Any) -> None:
    async with session:
        for index in range(REQUESTS):
            async with session.get(f"{url}/v2/{index}", **options) as response:
                assert response.status == 200, await response.text()


async def test_the_model_session_never_reads_netrc(env: pytest.MonkeyPatch, server: Server) -> None:
    # Fails on trust_env=True: aiohttp opened NETRC twice per request and sent
    # its credentials to the model.
    await call(model_session(None), server.url)
    assert server.authorizations == [None] * REQUESTS
    assert netrc_opens() == 0


async def test_the_storage_session_never_reads_netrc(
    env: pytest.MonkeyPatch, server: Server
) -> None:
    await call(client_session(), server.url)
    assert server.authorizations == [None] * REQUESTS
    assert netrc_opens() == 0


async def test_http_proxy_from_the_environment_is_used(
    env: pytest.MonkeyPatch, server: Server
) -> None:
    async with LoggingProxy() as proxy:
        env.setenv("http_proxy", proxy.url)
        await call(model_session(None), server.url)
        await call(client_session(), server.url)
    target = server.url.removeprefix("http://")
    assert proxy.seen, "the proxy saw no request"
    assert proxy.targets() == {target}, proxy.seen
    assert server.authorizations == [None] * (2 * REQUESTS)
    # The proxy's own credentials (aiohttp's rule) are looked up once per session.
    assert netrc_opens() == 2


async def test_https_goes_through_https_proxy_with_connect(
    env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pki = make_pki(tmp_path / "pki")
    tls = pki.loopback_server_context()
    async for server in serve(tls):
        async with LoggingProxy() as proxy:
            env.setenv("HTTPS_PROXY", proxy.url)
            await call(model_session(ModelTransport(ca_file=str(pki.ca_cert))), server.url)
        target = server.url.removeprefix("https://")
        assert proxy.seen == [("CONNECT", target)], proxy.seen
        assert len(server.authorizations) == REQUESTS


async def test_no_proxy_is_honoured(env: pytest.MonkeyPatch, server: Server) -> None:
    async with LoggingProxy() as proxy:
        env.setenv("HTTP_PROXY", proxy.url)
        env.setenv("NO_PROXY", "example.internal,127.0.0.1")
        await call(model_session(None), server.url)
        await call(client_session(), server.url)
    assert proxy.seen == []
    assert server.authorizations == [None] * (2 * REQUESTS)


async def test_a_requests_own_proxy_wins(env: pytest.MonkeyPatch, server: Server) -> None:
    # A storage Secret's proxy-url is passed with each request.
    async with LoggingProxy() as from_env, LoggingProxy() as own:
        env.setenv("HTTP_PROXY", from_env.url)
        await call(client_session(), server.url, proxy=own.url)
    assert from_env.seen == []
    assert own.targets() == {server.url.removeprefix("http://")}


@pytest.mark.parametrize(
    ("no_proxy", "url", "proxied"),
    [
        ("", "http://model.svc:8080/v2", True),
        ("", "ftp://model.svc/v2", False),
        (".svc,.cluster.local", "http://model.ns.svc:8080/v2", False),
        (".svc,.cluster.local", "http://model.ns.svc.cluster.local/v2", False),
        (".svc,.cluster.local", "http://models.example.com/v2", True),
        ("models.example.com", "http://models.example.com:9000/v2", False),
        ("example.com", "http://a.example.com/v2", False),
        ("example.com", "http://notexample.com/v2", True),
        ("*", "http://anything/v2", False),
    ],
)
def test_no_proxy_rules(env: pytest.MonkeyPatch, no_proxy: str, url: str, proxied: bool) -> None:
    env.setenv("HTTP_PROXY", "http://proxy.internal:3128")
    if no_proxy:
        env.setenv("NO_PROXY", no_proxy)
    info = EnvProxies().for_url(URL(url))
    assert (info is not None) is proxied
    if info is not None:
        assert str(info.proxy) == "http://proxy.internal:3128"


def test_proxy_credentials_in_the_url_become_proxy_auth(env: pytest.MonkeyPatch) -> None:
    env.setenv("HTTPS_PROXY", "http://alice:s3cret@proxy.internal:3128")
    info = EnvProxies().for_url(URL("https://bucket.example.com/key"))
    assert info is not None
    assert str(info.proxy) == "http://proxy.internal:3128"
    assert info.proxy_auth is not None
    assert (info.proxy_auth.login, info.proxy_auth.password) == ("alice", "s3cret")


def test_without_proxy_variables_nothing_is_proxied(env: pytest.MonkeyPatch) -> None:
    proxies = EnvProxies()
    assert not proxies
    assert proxies.for_url(URL("http://model.svc/v2")) is None
