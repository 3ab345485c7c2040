"""How the runner reaches the model: extra headers, a bearer token, TLS (``kserve.transport``).

The model gets an aiohttp session of its own (:func:`model_session`), so
nothing meant for it (a ``Host`` header, a token) ever reaches the storage:

- **headers**: added to every request to the model (``Host`` for an Istio or
  Knative ingress that routes on it, or any other);
- **token file**: ``Authorization: Bearer <token>`` on every request, the
  token read from the file the pod mounts (a Secret's key, or a projected
  ServiceAccount token with an audience). The kubelet rotates both, so the
  file is read again whenever its modification time or size changes; every
  token read is registered with the redactor first, so no log line or
  termination message can show it;
- **CA file**: the model's certificate is checked against this PEM bundle
  (the system's CAs otherwise); ``insecureSkipVerify``: not checked at all.

A model that answers 401 or 403 refused the credentials: the run fails at
once with exit 9 (``ModelAuthFailed``, :mod:`contract.exitcodes`).
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp

from contract import paths
from contract.document import ModelTransport
from contract.exitcodes import ContractError, InferenceError
from runner.proxy import client_session
from runner.redact import REDACTOR

# The model's answers that refuse the credentials.
AUTH_REFUSALS = frozenset({401, 403})

Handler = Callable[[aiohttp.ClientRequest], Awaitable[aiohttp.ClientResponse]]


class TokenFile:
    """A bearer token in a file, read again whenever the file changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen: tuple[int, int, int] | None = None
        self._token = ""
        self.reads = 0

    def token(self) -> str:
        try:
            stat = os.stat(self.path)
            seen = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
            if seen != self._seen:
                token = self.path.read_text().strip()
                REDACTOR.add(token)
                self._token, self._seen = token, seen
                self.reads += 1
        except OSError as error:
            raise InferenceError(
                f"cannot read the model's token file {self.path}: {error.strerror}"
            ) from None
        if not self._token:
            raise InferenceError(f"the model's token file {self.path} is empty")
        return self._token


def ssl_context(transport: ModelTransport | None) -> ssl.SSLContext | bool:
    """The TLS settings for the model: a context with the CA bundle, False, or the default."""
    if transport is None:
        return True
    if transport.insecure_skip_verify:
        return False
    if transport.ca_file:
        path = paths.pod_path(transport.ca_file)
        try:
            return ssl.create_default_context(cafile=str(path))
        except (OSError, ssl.SSLError) as error:
            raise ContractError(f"cannot use the model's CA bundle {path}: {error}") from None
    return True


def model_session(transport: ModelTransport | None, limit: int = 100) -> aiohttp.ClientSession:
    """A session for the model's requests, with the transport's headers, token and TLS."""
    headers = dict(transport.headers or {}) if transport is not None else {}
    token = (
        TokenFile(paths.pod_path(transport.token_file))
        if transport is not None and transport.token_file
        else None
    )

    async def add_credentials(
        request: aiohttp.ClientRequest, handler: Handler
    ) -> aiohttp.ClientResponse:
        for name, value in headers.items():
            request.headers[name] = value
        if token is not None:
            request.headers["Authorization"] = f"Bearer {token.token()}"
        return await handler(request)

    connector = aiohttp.TCPConnector(limit=limit, ssl=ssl_context(transport))
    middlewares = (add_credentials,) if headers or token is not None else ()
    # The model, like the storage, is reached through HTTP(S)_PROXY when set (runner.proxy).
    return client_session(connector=connector, middlewares=middlewares)
