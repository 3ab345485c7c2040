"""The API connections carry TCP keepalive (a dead peer is noticed within the bound).

A real connection from the controller's transport to an HTTP server on
loopback: the socket it was given has SO_KEEPALIVE and the probe timings of
:func:`kubeclient.transport.keepalive_options`.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from kubernetes_asyncio.client import Configuration

from kubeclient.client import KubeClient
from kubeclient.transport import KEEPALIVE, keepalive_options


async def watch(request: web.Request) -> web.StreamResponse:
    """A watch-like answer: one event, then the connection stays open."""
    response = web.StreamResponse()
    await response.prepare(request)
    await response.write(b'{"type": "BOOKMARK", "object": {}}\n')
    await request.app[DONE].wait()  # open until the test ends
    return response


DONE = web.AppKey("done", asyncio.Event)


@pytest.fixture
async def server() -> AsyncIterator[str]:
    app = web.Application()
    app[DONE] = asyncio.Event()
    app.router.add_get("/watch", watch)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield f"http://127.0.0.1:{port}"
    app[DONE].set()
    await runner.cleanup()


async def keepalive_of(client: KubeClient) -> tuple[int, dict[str, int]]:
    timeout = aiohttp.ClientTimeout(total=30)
    async with client.transport.open("watch", "GET", "/watch", timeouts=timeout) as response:
        await response.content.readline()
        assert response.connection is not None
        assert response.connection.transport is not None
        sock = response.connection.transport.get_extra_info("socket")
        assert sock is not None
        on = sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE)
        options = {
            name: sock.getsockopt(socket.IPPROTO_TCP, getattr(socket, name))
            for name in keepalive_options(KEEPALIVE)
        }
    return on, options


@pytest.mark.parametrize("bound", [KEEPALIVE, 30.0])
async def test_api_connections_carry_tcp_keepalive(server: str, bound: float) -> None:
    configuration = Configuration(host=server)
    async with KubeClient(configuration, keepalive=bound) as client:
        on, options = await keepalive_of(client)
    assert on == 1
    assert options == keepalive_options(bound)
    assert options  # Linux: idle, interval, count and user timeout, all set
