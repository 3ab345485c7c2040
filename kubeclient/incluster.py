"""The pod's own connection to its API server: what a controller running in a pod uses.

A pod reaches its cluster's API server with three things the kubelet gives
every pod whose ServiceAccount token is mounted: the service's address in
``KUBERNETES_SERVICE_HOST``/``KUBERNETES_SERVICE_PORT``, the cluster's CA
certificate and a projected token, both under
``/var/run/secrets/kubernetes.io/serviceaccount``. The token rotates (the
kubelet rewrites the file well before it expires), so it is read again at
most every :data:`TOKEN_RELOAD` seconds, as client-go does.

This is all the in-cluster path needs, and it is written here rather than
taken from kubernetes_asyncio because importing that library's loader loads
its whole generated client (about 35 MiB of the controller's idle memory)
for these few lines. Kubeconfigs, with their exec plugins and auth
providers, still go through the library
(:func:`kubeclient.transport.load_configuration`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
HOST_ENV = "KUBERNETES_SERVICE_HOST"
PORT_ENV = "KUBERNETES_SERVICE_PORT"
# Seconds between reads of the token file (client-go reads it again every minute).
TOKEN_RELOAD = 60.0


class InClusterConfigError(Exception):
    """The pod's connection cannot be made: an address or a file is missing or empty."""


def join_host_port(host: str, port: str) -> str:
    """``host:port``, with an IPv6 address in brackets (Go's ``net.JoinHostPort``)."""
    return f"[{host}]:{port}" if ":" in host or "%" in host else f"{host}:{port}"


@dataclass
class InClusterConfiguration:
    """The API server address, CA and rotating token of the pod, as the transport reads them.

    The attribute names are those of kubernetes_asyncio's ``Configuration``
    that :class:`kubeclient.transport.Transport` reads, so either can be
    given to it.
    """

    host: str
    ssl_ca_cert: str
    token_file: Path
    cert_file: str | None = None
    key_file: str | None = None
    verify_ssl: bool = True
    disable_strict_ssl_verification: bool = False
    proxy: str | None = None
    tls_server_name: str | None = None
    _token: str = field(default="", repr=False)
    _read_at: float = field(default=float("-inf"), repr=False)

    @classmethod
    def from_pod(
        cls,
        environ: Mapping[str, str] = os.environ,
        directory: Path = SERVICE_ACCOUNT_DIR,
    ) -> InClusterConfiguration:
        """The configuration of this process's pod; :class:`InClusterConfigError` if unusable."""
        host, port = environ.get(HOST_ENV, ""), environ.get(PORT_ENV, "")
        if not host or not port:
            raise InClusterConfigError(f"{HOST_ENV} and {PORT_ENV} must both be set and not empty")
        ca = directory / "ca.crt"
        if not _non_empty(ca):
            raise InClusterConfigError(f"the CA certificate {ca} is missing or empty")
        configuration = cls(
            host=f"https://{join_host_port(host, port)}",
            ssl_ca_cert=str(ca),
            token_file=directory / "token",
        )
        configuration.token()  # fails now rather than on the first request
        return configuration

    def token(self) -> str:
        """The bearer token, read again when the last read is :data:`TOKEN_RELOAD` seconds old.

        A read that fails or finds the file empty after a good one keeps the
        last token and tries again on the next request: the kubelet replaces
        the file atomically, so that is a passing state, and the API server
        says 401 if the kept token has expired.
        """
        now = time.monotonic()
        if now - self._read_at < TOKEN_RELOAD:
            return self._token
        try:
            token = self.token_file.read_text().strip()
        except OSError as exc:
            token, why = "", f"cannot be read: {exc}"
        else:
            why = "is empty"
        if token:
            self._token, self._read_at = token, now
        elif not self._token:
            raise InClusterConfigError(f"the token {self.token_file} {why}")
        return self._token

    async def auth_settings(self) -> dict[str, dict[str, Any]]:
        """The ``Authorization`` header, shaped as kubernetes_asyncio's ``auth_settings()``."""
        return {
            "BearerToken": {
                "in": "header",
                "key": "authorization",
                "value": f"Bearer {self.token()}",
            }
        }


def _non_empty(path: Path) -> bool:
    try:
        return path.stat().st_size > 0
    except OSError:
        return False
