"""A logging HTTP(S) forward proxy on loopback, as a corporate egress proxy is.

``CONNECT host:port`` opens a tunnel (HTTPS through the proxy); any other
request must be in absolute form (``GET http://host:port/path``), as clients
send them to an HTTP proxy: it is forwarded in origin form and the
connection is then piped both ways (a client keeps one proxied connection per
target). ``seen`` lists ``(method, "host:port")`` for every request the proxy
got, in order (the first request of each connection: later ones on a kept-alive
connection go to the same target): what went through it, and what did not.
"""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlsplit

_MAX_HEAD = 64 * 1024


class LoggingProxy:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self.url = ""
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def __aenter__(self) -> LoggingProxy:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.stop()

    def targets(self) -> set[str]:
        return {target for _, target in self.seen}

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            if len(head) > _MAX_HEAD:
                return
            request_line, _, rest = head.partition(b"\r\n")
            method, target, version = request_line.decode("latin-1").split(" ", 2)
            if method == "CONNECT":
                host, _, connect_port = target.rpartition(":")
                self.seen.append((method, target))
                up_reader, up_writer = await asyncio.open_connection(host, int(connect_port))
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                await writer.drain()
            else:
                url = urlsplit(target)
                if not url.hostname:
                    writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                    return
                port = url.port or 80
                self.seen.append((method, f"{url.hostname}:{port}"))
                up_reader, up_writer = await asyncio.open_connection(url.hostname, port)
                path = url.path or "/"
                if url.query:
                    path += f"?{url.query}"
                up_writer.write(f"{method} {path} {version}\r\n".encode("latin-1") + rest)
                await up_writer.drain()
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        except (
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            ConnectionError,
            ValueError,
        ):
            pass
        finally:
            self._tasks.discard(task)
            with contextlib.suppress(Exception):
                writer.close()


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    try:
        while data := await source.read(65536):
            sink.write(data)
            await sink.drain()
    except ConnectionError:
        pass
    finally:
        with contextlib.suppress(Exception):
            sink.close()
