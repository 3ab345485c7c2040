"""The node agent's own small Kubernetes client (:mod:`hack.nodeagent`): JSON in, JSON out.

Not ``controller.kube``: test infrastructure must not share bugs with the code
it tests.
"""

from __future__ import annotations

import datetime as dt
import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import yaml

Json = dict[str, Any]


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ApiError(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"{status}: {body[:500]}")
        self.status = status


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
