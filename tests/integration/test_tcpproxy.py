"""The loopback TCP proxy's freeze (tests/integration/tcpproxy.py), against an echo server.

The fault tier trusts the proxy to stall a link without closing it; this is
what that means, checked on bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator

import pytest

from tests.integration.tcpproxy import TcpProxy, Tls

QUIET = 0.5  # how long a frozen connection is watched for a byte that must not come


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.close()


@pytest.fixture
async def proxy() -> AsyncIterator[TcpProxy]:
    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    proxy = TcpProxy("127.0.0.1", server.sockets[0].getsockname()[1])
    await proxy.start()
    yield proxy
    await proxy.stop()
    server.close()
    await server.wait_closed()


async def connect(proxy: TcpProxy) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", proxy.port)


async def roundtrip(
    conn: tuple[asyncio.StreamReader, asyncio.StreamWriter], data: bytes, within: float = 10
) -> bytes:
    reader, writer = conn
    writer.write(data)
    await writer.drain()
    return await asyncio.wait_for(reader.readexactly(len(data)), within)


async def silent(conn: tuple[asyncio.StreamReader, asyncio.StreamWriter], data: bytes) -> bool:
    """True when ``data`` sent on ``conn`` brings nothing back for QUIET seconds."""
    reader, writer = conn
    writer.write(data)
    await writer.drain()
    try:
        await asyncio.wait_for(reader.read(1), QUIET)
    except TimeoutError:
        return True
    return False


@pytest.mark.parametrize("new_connections", [False, True])
async def test_a_frozen_proxy_keeps_connections_open_and_forwards_nothing(
    proxy: TcpProxy, new_connections: bool
) -> None:
    old = await connect(proxy)
    assert await roundtrip(old, b"before") == b"before"

    proxy.freeze(new_connections=new_connections)
    assert await silent(old, b"held")
    assert not old[0].at_eof()  # open, not reset
    assert proxy.held_bytes == len(b"held")

    new = await connect(proxy)  # accepted either way
    if new_connections:
        assert await silent(new, b"new")
        assert proxy.held_connections == 1
    else:
        assert await roundtrip(new, b"new") == b"new"
        assert proxy.held_connections == 0

    proxy.unfreeze()
    assert await asyncio.wait_for(old[0].readexactly(4), 10) == b"held"
    if new_connections:
        assert await asyncio.wait_for(new[0].readexactly(3), 10) == b"new"
    assert await roundtrip(old, b"after") == b"after"
    assert await roundtrip(new, b"again") == b"again"
    for _, writer in (old, new):
        writer.close()


async def test_freezing_needs_plain_forwarding() -> None:
    tls = Tls(ssl.create_default_context(ssl.Purpose.CLIENT_AUTH), ssl.create_default_context())
    proxy = TcpProxy("127.0.0.1", 1, watch_delay=1.0, tls=tls)
    with pytest.raises(ValueError, match="plain forwarding"):
        proxy.freeze()
