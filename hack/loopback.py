"""Small aiohttp servers on free loopback ports, for the runner's tests and benchmarks.

- :func:`serve`: an application on a free ``127.0.0.1`` port (its runner and URL).
- :class:`LoopbackApp`: a server object with ``start``/``stop`` around :func:`serve`;
  subclasses say what it serves (:meth:`LoopbackApp.application`).
- :class:`ForwardingProxy`: forwards every request to a target, body and answer
  unchanged; subclasses step in on the way (:meth:`ForwardingProxy.handle`).
- :class:`FaultProxy`: a forwarding proxy that answers a share of requests itself
  with a fault (500, 503, 429, a reset connection, any status), and counts the
  rows it forwarded to a model.

One definition of each, so the tests' proxies and the runner benchmark's
counting proxy cannot drift apart in how they forward.
"""

from __future__ import annotations

import random
import socket
import ssl
from collections import Counter
from collections.abc import Callable

import aiohttp
import orjson
from aiohttp import web


async def serve(
    app: web.Application, ssl_context: ssl.SSLContext | None = None
) -> tuple[web.AppRunner, str]:
    """``app`` on a free loopback port: its runner (to clean up) and ``http://127.0.0.1:<port>``
    (``https://`` with ``ssl_context``)."""
    # A handler still running at shutdown (one a test holds on purpose, for a
    # client it then kills) is cancelled after 2 s, not aiohttp's default 60.
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
    await runner.setup()
    # Binding the socket here tells us the port the kernel chose.
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    await web.SockSite(runner, sock, ssl_context=ssl_context).start()
    scheme = "https" if ssl_context is not None else "http"
    return runner, f"{scheme}://127.0.0.1:{sock.getsockname()[1]}"


class LoopbackApp:
    """An aiohttp application on a free loopback port; ``url`` is set by :meth:`start`.

    ``base_path`` is appended to the server's address in ``url`` (a service
    whose API lives under ``/api``, say).
    """

    base_path = ""
    # Serve HTTPS with this context (None: HTTP).
    ssl_context: ssl.SSLContext | None = None

    def __init__(self) -> None:
        self.url = ""
        self._runner: web.AppRunner | None = None

    def application(self) -> web.Application:
        raise NotImplementedError

    async def start(self) -> str:
        self._runner, address = await serve(self.application(), self.ssl_context)
        self.url = address + self.base_path
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


class ForwardingProxy(LoopbackApp):
    """Forwards every request to ``target``; :meth:`handle` may answer or act on the way."""

    # False: answers reach :meth:`handle` as the target encoded them (gzip stays gzip).
    auto_decompress = True

    def __init__(self, target: str, client_max_size: int = 1 << 30) -> None:
        super().__init__()
        self.target = target.rstrip("/")
        self.client_max_size = client_max_size
        self._session: aiohttp.ClientSession | None = None

    def application(self) -> web.Application:
        app = web.Application(client_max_size=self.client_max_size)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    async def start(self) -> str:
        self._session = aiohttp.ClientSession(auto_decompress=self.auto_decompress)
        return await super().start()

    async def stop(self) -> None:
        await super().stop()
        if self._session is not None:
            await self._session.close()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        return await self.forward(request, await request.read())

    async def forward(
        self, request: web.Request, body: bytes, headers: dict[str, str] | None = None
    ) -> web.Response:
        """``request`` (with ``body``, already read) sent on; the target's answer, as it came.

        ``headers`` default to the request's ``Content-Type`` alone (JSON when none).
        """
        assert self._session is not None, "start() the proxy first"
        if headers is None:
            headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
        async with self._session.request(
            request.method, f"{self.target}{request.path_qs}", data=body, headers=headers
        ) as answer:
            payload = await answer.read()
        return web.Response(status=answer.status, body=payload, content_type=answer.content_type)


class FaultProxy(ForwardingProxy):
    """Forwards to ``target``; answers a ``rate`` share of POSTs itself with a fault.

    Faults cycle through ``kinds``: by default 500, 503, 429 (with ``Retry-After:
    0``) and a reset connection; any other status given as a string is answered
    as it is. A fault's body is ``{"error": "injected <kind>"}``; with ``echo`` the
    error text goes on to quote the request's whole body, as some servers do.
    ``seen`` counts requests per path; ``faults`` counts faults by kind;
    ``forwarded_rows`` counts the rows of the inference requests (v2 bodies) the
    target answered with 200.
    """

    KINDS = ("500", "503", "429", "reset")

    def __init__(self, target: str, rate: float = 0.0, seed: int = 7) -> None:
        super().__init__(target)
        self.rate = rate
        self.kinds: tuple[str, ...] = self.KINDS
        self.echo = False
        self.rng = random.Random(seed)
        self.seen: Counter[str] = Counter()
        self.faults: Counter[str] = Counter()
        self.forwarded_rows = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.seen[request.path] += 1
        body = await request.read()
        if request.method == "POST" and self.rng.random() < self.rate:
            kind = self.kinds[sum(self.faults.values()) % len(self.kinds)]
            self.faults[kind] += 1
            if kind == "reset":
                assert request.transport is not None
                request.transport.abort()
                # The client sees a dropped connection; aiohttp only needs an answer object.
                return web.Response(status=500)
            headers = {"Retry-After": "0"} if kind == "429" else {}
            error = f"injected {kind}"
            if self.echo:
                error += f": cannot process request {body.decode()}"
            return web.json_response({"error": error}, status=int(kind), headers=headers)
        answer = await self.forward(request, body)
        if request.method == "POST" and answer.status == 200:
            inputs = orjson.loads(body).get("inputs") or [{}]
            self.forwarded_rows += int((inputs[0].get("shape") or [0])[0])
        return answer


class AuthProxy(ForwardingProxy):
    """Forwards to ``target`` only requests carrying ``Authorization: Bearer <token>``.

    What an authenticating gateway in front of a KServe model does (KServe's
    ``serving.kserve.io/enable-auth``): any other request is answered 401
    ``Jwt is missing`` or ``Jwt verification fails``, as Istio does. ``token``
    may change at any time (a rotation); ``on_request`` is called with each
    request before it is judged. ``tokens`` are the bearer tokens seen,
    ``hosts`` the ``Host`` headers, ``refused`` how many requests got a 401.
    With ``token`` None every bearer token is accepted (and recorded).
    """

    def __init__(
        self, target: str, token: str | None, ssl_context: ssl.SSLContext | None = None
    ) -> None:
        super().__init__(target)
        self.token = token
        self.ssl_context = ssl_context
        self.tokens: list[str] = []
        self.hosts: Counter[str] = Counter()
        self.refused = 0
        self.forwarded = 0
        self.on_request: Callable[[web.Request], None] | None = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if self.on_request is not None:
            self.on_request(request)
        self.hosts[request.headers.get("Host", "")] += 1
        given = request.headers.get("Authorization", "")
        bearer = given.removeprefix("Bearer ") if given.startswith("Bearer ") else None
        if bearer is not None:
            self.tokens.append(bearer)
        if bearer is None or (self.token is not None and bearer != self.token):
            self.refused += 1
            # What Istio's request authentication (KServe's gateway) answers.
            said = "Jwt is missing" if bearer is None else "Jwt verification fails"
            return web.Response(text=said, status=401)
        self.forwarded += 1
        return await self.forward(request, body)
