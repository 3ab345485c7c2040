"""A TCP proxy in front of the API server whose link the test can cut: a network fault.

Plain mode: the client speaks TLS straight through it to the real API server;
cutting it aborts every open connection (watches included) and refuses new
ones until ``restore()``, as a partition between the controller and the API
server would.

Freezing (plain mode): ``freeze()`` stops forwarding bytes, both ways, on
every open connection and keeps them all open, as a stalled link does (a
NAT or a middlebox that drops a flow without telling either end): nothing is
reset, nothing arrives. New connections still work, unless
``freeze(new_connections=True)``: then they are accepted and never forwarded
either. ``unfreeze()`` lets everything held through, in order.
``held_bytes`` and ``held_connections`` count what a freeze held up.

Watch-delay mode (``tls=`` and ``watch_delay=``): the proxy ends the client's
TLS with the API server's own certificate (so the client's CA still verifies
it) and opens its own TLS connection upstream, reads each HTTP/1.1 request
head, and delays every byte of the answer to a watch request
(``?watch=true``) by ``watch_delay`` seconds, spacing kept, while every other
answer passes at once: a client whose caches lag while its writes land.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

_MAX_HEAD = 1 << 20


@dataclass(frozen=True)
class Tls:
    """TLS ended at the proxy: ``server`` faces the client, ``client`` the upstream."""

    server: ssl.SSLContext
    client: ssl.SSLContext

    @classmethod
    def impersonating(cls, cert: Path, key: Path, ca: Path) -> Tls:
        """Present the upstream's own ``cert``/``key``; verify the upstream against ``ca``."""
        server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server.load_cert_chain(cert, key)
        server.set_alpn_protocols(["http/1.1"])  # request heads are read as HTTP/1.1
        client = ssl.create_default_context(cafile=str(ca))
        client.set_alpn_protocols(["http/1.1"])
        return cls(server=server, client=client)


class TcpProxy:
    def __init__(
        self,
        target_host: str,
        target_port: int,
        *,
        tls: Tls | None = None,
        watch_delay: float = 0.0,
    ) -> None:
        if watch_delay and tls is None:
            raise ValueError("telling watches from requests needs the proxy to end TLS (tls=)")
        self.target_host = target_host
        self.target_port = target_port
        self.tls = tls
        self.watch_delay = watch_delay
        self.port = 0
        self.watches = 0  # watch requests seen (delay mode)
        self.requests = 0  # other requests seen (delay mode)
        self._server: asyncio.Server | None = None
        self._transports: set[asyncio.WriteTransport] = set()
        self._deliveries: set[asyncio.Task[None]] = set()
        self._cut = False
        # One gate per connection: set while its bytes flow (see freeze()).
        self._gates: set[asyncio.Event] = set()
        self._freeze_new = False
        self.held_bytes = 0  # bytes a freeze held up (read, not yet forwarded)
        self.held_connections = 0  # connections accepted while new ones were frozen

    async def start(self) -> int:
        server_ssl = self.tls.server if self.tls else None
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0, ssl=server_ssl)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    def cut(self) -> None:
        self._cut = True
        for transport in list(self._transports):
            transport.abort()
        self._transports.clear()

    def restore(self) -> None:
        self._cut = False

    def freeze(self, *, new_connections: bool = False) -> None:
        """Stop forwarding on every open connection (kept open); new ones too if asked."""
        if self.watch_delay:
            raise ValueError("freeze() works on plain forwarding, not in watch-delay mode")
        for gate in self._gates:
            gate.clear()
        self._freeze_new = new_connections

    def unfreeze(self) -> None:
        """Forward again, everything held first."""
        self._freeze_new = False
        for gate in self._gates:
            gate.set()

    async def stop(self) -> None:
        self.cut()
        self.unfreeze()  # held copies end on the aborted connections
        for task in list(self._deliveries):
            task.cancel()  # delayed bytes for connections that are gone
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._cut:
            writer.transport.abort()
            return
        gate = asyncio.Event()
        if self._freeze_new:
            self.held_connections += 1
        else:
            gate.set()
        self._gates.add(gate)
        try:
            await self._forward(reader, writer, gate)
        finally:
            self._gates.discard(gate)

    async def _forward(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, gate: asyncio.Event
    ) -> None:
        self._transports.add(writer.transport)
        try:
            # A connection accepted while frozen reaches nothing until unfrozen.
            await gate.wait()
        finally:
            self._transports.discard(writer.transport)
        if self._cut:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(
                self.target_host,
                self.target_port,
                ssl=self.tls.client if self.tls else None,
                server_hostname=self.target_host if self.tls else None,
            )
        except OSError:
            writer.transport.abort()
            return
        self._transports.update({writer.transport, up_writer.transport})
        try:
            if self.watch_delay:
                exchange = _Exchange()
                await asyncio.gather(
                    self._requests(reader, up_writer, exchange),
                    self._delayed(up_reader, writer, exchange),
                    return_exceptions=True,
                )
            else:
                await asyncio.gather(
                    self._pipe(reader, up_writer, gate),
                    self._pipe(up_reader, writer, gate),
                    return_exceptions=True,
                )
        finally:
            self._transports.discard(writer.transport)
            self._transports.discard(up_writer.transport)
            for w in (writer, up_writer):
                with contextlib.suppress(Exception):
                    w.close()

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, gate: asyncio.Event
    ) -> None:
        with _until_broken(writer):
            while data := await reader.read(65536):
                if not gate.is_set():
                    # Frozen: hold this, and read no more (the sender's
                    # buffers fill up, as on a stalled link).
                    self.held_bytes += len(data)
                    await gate.wait()
                writer.write(data)
                await writer.drain()

    # ------------------------------------------------------------ delay mode

    async def _requests(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, exchange: _Exchange
    ) -> None:
        """Forward HTTP/1.1 requests one by one, noting whether each is a watch."""
        with _until_broken(writer, asyncio.IncompleteReadError, ValueError):
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return
                if len(head) > _MAX_HEAD:
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, target, _version = [*lines[0].split(" ", 2), "", ""][:3]
                headers = {
                    k.strip().lower(): v.strip()
                    for k, _, v in (line.partition(":") for line in lines[1:] if line)
                }
                # No pipelining in HTTP/1.1 clients: the answer bytes that come
                # next belong to this request.
                exchange.watch = method == "GET" and _is_watch(target)
                if exchange.watch:
                    self.watches += 1
                else:
                    self.requests += 1
                writer.write(head)
                if headers.get("transfer-encoding", "").lower() == "chunked":
                    await _copy_chunked(reader, writer)
                else:
                    length = int(headers.get("content-length") or 0)
                    if length:
                        writer.write(await reader.readexactly(length))
                await writer.drain()

    async def _delayed(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, exchange: _Exchange
    ) -> None:
        """Answers to the client, in order: a watch's bytes ``watch_delay`` late, others at once."""
        loop = asyncio.get_running_loop()
        line: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()

        async def deliver() -> None:
            with _until_broken(writer):
                while (item := await line.get()) is not None:
                    due, data = item
                    if (wait := due - loop.time()) > 0:
                        await asyncio.sleep(wait)
                    writer.write(data)
                    await writer.drain()

        delivering = asyncio.create_task(deliver())
        self._deliveries.add(delivering)
        delivering.add_done_callback(self._deliveries.discard)
        try:
            while data := await reader.read(65536):
                line.put_nowait((loop.time() + (self.watch_delay if exchange.watch else 0), data))
        except (ConnectionError, OSError, ssl.SSLError):
            pass
        finally:
            line.put_nowait(None)
            await asyncio.wait({delivering})  # cancelled by stop(): no error here


@contextlib.contextmanager
def _until_broken(writer: asyncio.StreamWriter, *more: type[Exception]) -> Iterator[None]:
    """The end of a copy loop: a broken connection (or ``more``) ends it quietly.

    ``writer`` is closed either way, so that the other side sees the end too.
    """
    caught: tuple[type[Exception], ...] = (ConnectionError, OSError, ssl.SSLError, *more)
    try:
        yield
    except caught:
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


@dataclass
class _Exchange:
    watch: bool = False


def _is_watch(target: str) -> bool:
    query = parse_qs(urlsplit(target).query)
    return any(v.lower() in ("true", "1") for v in query.get("watch", []))


async def _copy_chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        size_line = await reader.readuntil(b"\r\n")
        writer.write(size_line)
        size = int(size_line.split(b";", 1)[0].strip(), 16)
        if size == 0:
            # Trailers, then the empty line.
            while (trailer := await reader.readuntil(b"\r\n")) != b"\r\n":
                writer.write(trailer)
            writer.write(b"\r\n")
            return
        writer.write(await reader.readexactly(size + 2))
