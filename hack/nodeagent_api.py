"""The node agent's own small Kubernetes client (:mod:`hack.nodeagent`): JSON in, JSON out.

Not ``kubeclient``: test infrastructure must not share bugs with the code
it tests.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import ssl
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import yaml

Json = dict[str, Any]
T = TypeVar("T")

# Backoff of a write that must land (a pod's status, a deletion's confirmation):
# doubling from RETRY_FIRST to RETRY_MAX seconds, for as long as it takes.
RETRY_FIRST = 0.5
RETRY_MAX = 10.0


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ApiError(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"{status}: {body[:500]}")
        self.status = status


def transient(exc: BaseException) -> bool:
    """An error that a later attempt may not meet: no connection, a timeout, 5xx, 429.

    What the API server answers while etcd is down or stopped (500/503/504), or
    while it restarts (connection refused).
    """
    if isinstance(exc, ApiError):
        return exc.status >= 500 or exc.status == 429
    return isinstance(exc, aiohttp.ClientError | TimeoutError | OSError)


async def until_landed(
    call: Callable[[], Awaitable[T]],
    what: str,
    *,
    wanted: Callable[[], bool] = lambda: True,
    first: float = RETRY_FIRST,
    cap: float = RETRY_MAX,
) -> T | None:
    """``call()`` again, with backoff, until it is not refused for a transient reason.

    A kubelet does not drop a status update because the API server could not
    store it: neither does the node agent. Returns ``call()``'s answer, or None
    once ``wanted()`` is false (a newer update replaced this one). Errors that
    no retry can fix (4xx) are raised.
    """
    delay = first
    while wanted():
        try:
            return await call()
        except (ApiError, aiohttp.ClientError, TimeoutError, OSError) as exc:
            if not transient(exc):
                raise
            print(
                f"node agent: {what}: {exc!r}; again in {delay:.1f} s", file=sys.stderr, flush=True
            )
        await asyncio.sleep(delay)
        delay = min(cap, delay * 2)
    return None


class Api:
    """The smallest useful Kubernetes client: JSON in, JSON out."""

    def __init__(self, kubeconfig: Path) -> None:
        config = yaml.safe_load(kubeconfig.read_text())
        context = next(c for c in config["contexts"] if c["name"] == config["current-context"])
        cluster = next(c for c in config["clusters"] if c["name"] == context["context"]["cluster"])
        user = next(u for u in config["users"] if u["name"] == context["context"]["user"])
        self.server = cluster["cluster"]["server"].rstrip("/")
        self.ca_file = cluster["cluster"]["certificate-authority"]
        self._headers = {"Authorization": f"Bearer {user['user']['token']}"}
        self._ssl = ssl.create_default_context(cafile=self.ca_file)
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                headers=self._headers, connector=aiohttp.TCPConnector(ssl=self._ssl)
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def request(
        self,
        method: str,
        path: str,
        body: Json | None = None,
        *,
        content_type: str = "application/json",
        params: dict[str, str] | None = None,
    ) -> Json:
        data = json.dumps(body) if body is not None else None
        async with self.session.request(
            method,
            self.server + path,
            data=data,
            params=params,
            headers={"Content-Type": content_type},
        ) as resp:
            text = await resp.text()
            if resp.status >= 400:
                raise ApiError(resp.status, text)
            return json.loads(text) if text else {}

    async def watch(self, path: str, params: dict[str, str]) -> AsyncIterator[Json]:
        query = {**params, "watch": "true"}
        timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
        async with self.session.get(self.server + path, params=query, timeout=timeout) as resp:
            if resp.status >= 400:
                raise ApiError(resp.status, await resp.text())
            async for line in resp.content:
                if line.strip():
                    yield json.loads(line)
