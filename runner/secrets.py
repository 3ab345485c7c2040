"""Reading the Secrets that storage entries reference (``endpointRef``, ``secretRef``).

The runner reads a Secret only through a :class:`SecretReader`, so where Secrets
come from is a parameter: :class:`KubernetesSecretReader` in a pod (and against a
kubeconfig while developing), an in-memory reader in tests. Whatever reader is
used, :class:`RedactingSecretReader` registers every value it returns with the
redactor before anyone sees it, except the keys in :data:`PUBLIC_KEYS`.

Kubernetes access (:class:`KubernetesSecretReader`):

- in a pod (``KUBERNETES_SERVICE_HOST`` set): the service account's token and CA
  (their paths go through :func:`contract.paths.pod_path`, so the test node agent
  can provide them);
- otherwise the kubeconfig at ``$KUBECONFIG`` (or ``~/.kube/config``): its
  current context's token or client certificate.

The read is one aiohttp request that never goes through ``HTTP(S)_PROXY``.

Kubelet-mounted Secrets (:class:`MountedSecretReader`, a config's
``secretSource: Volumes``): when ``$RUNNER_SECRETS_DIR`` is set, each Secret is
the directory of that name under it (one file per key, as the kubelet writes a
Secret volume), only Secrets of the pod's namespace exist, and no token is used.

The namespace of a reference without one is the pod's (:func:`pod_namespace`).
"""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

import aiohttp
import orjson
import yaml

from contract import paths
from runner.redact import REDACTOR, Redactor

# Keys whose values are addresses or switches, not credentials: keeping them
# readable keeps error messages useful ("cannot reach https://db.example:8443").
PUBLIC_KEYS = frozenset(
    {
        "server-url",
        "url",
        "proxy-url",
        "username",
        "insecure",
        "debug",
        "certificate-authority-data",
        "ca",
        "client-certificate-data",
        "aws-region",
        "aws-service",
    }
)


class SecretError(Exception):
    """A Secret could not be read; the message names it and says why, never its content."""


class SecretReader(Protocol):
    async def read(self, namespace: str, name: str) -> Mapping[str, str]:
        """The Secret's data, decoded to text."""
        ...


class RedactingSecretReader:
    """Wraps a reader so every secret value it returns is hidden from all output."""

    def __init__(self, inner: SecretReader, redactor: Redactor = REDACTOR) -> None:
        self._inner = inner
        self._redactor = redactor

    async def read(self, namespace: str, name: str) -> Mapping[str, str]:
        data = await self._inner.read(namespace, name)
        for key, value in data.items():
            if key not in PUBLIC_KEYS:
                self._redactor.add(value)
        return data


class MountedSecretReader:
    """Secrets the kubelet mounted: ``<directory>/<name>/<key>`` (see the module docstring).

    A Secret volume can only hold a Secret of the pod's own namespace; the
    controller mounts the others not at all, and this reader says why. The
    controller makes the volumes optional, so a missing Secret is an empty
    directory here, reported as not found (as the API would), not a pod that
    never starts.
    """

    def __init__(self, directory: Path, namespace: str) -> None:
        self._directory = directory
        self._namespace = namespace

    async def read(self, namespace: str, name: str) -> Mapping[str, str]:
        if namespace != self._namespace:
            raise SecretError(
                f"Secret {namespace}/{name} is not in the pod's namespace ({self._namespace}): "
                "with secretSource Volumes the kubelet mounts only the pod's namespace's "
                "Secrets; copy it there or set secretSource to API"
            )
        folder = self._directory / name
        try:
            # The kubelet's own entries (..data, ..<timestamp>) start with a dot.
            files = sorted(p for p in folder.iterdir() if not p.name.startswith("."))
            data = {p.name: p.read_text(encoding="utf-8", errors="replace") for p in files}
        except OSError:
            data = {}
        if not data:
            raise SecretError(f"Secret {namespace}/{name} not found (nothing mounted at {folder})")
        return data

    async def close(self) -> None:
        return None


def pod_namespace(environ: Mapping[str, str] | None = None) -> str:
    """``$POD_NAMESPACE``, else the service account's namespace file, else ``default``."""
    env = os.environ if environ is None else environ
    if env.get("POD_NAMESPACE"):
        return env["POD_NAMESPACE"]
    try:
        namespace = paths.pod_path(paths.SERVICE_ACCOUNT_NAMESPACE, env).read_text().strip()
    except OSError:
        namespace = ""
    return namespace or "default"


def decode_data(data: Mapping[str, str] | None) -> dict[str, str]:
    """A Secret's ``data`` (base64 values) as text."""
    return {
        key: base64.b64decode(value).decode("utf-8", errors="replace")
        for key, value in (data or {}).items()
    }


# How long one Secret read may take (connect, TLS, answer).
SECRET_READ_TIMEOUT = 30.0


@dataclass(frozen=True)
class ApiAccess:
    """Where the Kubernetes API is and how to prove who the runner is."""

    server: str
    token: str | None = None
    token_file: Path | None = None
    ca_file: Path | None = None
    ca_data: bytes | None = None
    client_cert: tuple[Path, Path] | None = None
    insecure: bool = False

    def bearer(self) -> str | None:
        # A projected token is rotated by the kubelet: read it for each request.
        if self.token_file is not None:
            return self.token_file.read_text().strip()
        return self.token

    def ssl_context(self) -> ssl.SSLContext | bool:
        if not self.server.startswith("https://"):
            return False
        if self.insecure:
            return False
        context = ssl.create_default_context(
            cafile=str(self.ca_file) if self.ca_file else None,
            cadata=self.ca_data.decode() if self.ca_data else None,
        )
        if self.client_cert is not None:
            context.load_cert_chain(str(self.client_cert[0]), str(self.client_cert[1]))
        return context


def in_cluster_access(environ: Mapping[str, str]) -> ApiAccess:
    """The pod's ServiceAccount: ``KUBERNETES_SERVICE_HOST``/``PORT``, its token and CA."""
    host = environ["KUBERNETES_SERVICE_HOST"]
    port = environ.get("KUBERNETES_SERVICE_PORT", "443")
    if ":" in host:  # IPv6
        host = f"[{host}]"
    return ApiAccess(
        server=f"https://{host}:{port}",
        token_file=paths.pod_path(paths.SERVICE_ACCOUNT_TOKEN, environ),
        ca_file=paths.pod_path(paths.SERVICE_ACCOUNT_CA, environ),
    )


def _data_file(directory: Path, name: str, data: str) -> Path:
    path = directory / name
    path.write_bytes(base64.b64decode(data))
    path.chmod(0o600)
    return path


def kubeconfig_access(path: Path, scratch: Path) -> ApiAccess:
    """The current context of a kubeconfig: token or client certificate, and the CA.

    ``scratch`` holds a client certificate given inline (``ssl`` loads chains
    from files only). Exec plugins and auth providers are not supported: the
    runner reads Secrets in a pod, a kubeconfig is for development.
    """
    try:
        config = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as error:
        raise SecretError(f"cannot read the kubeconfig {path}: {error}") from None
    base = path.parent

    def named(kind: str, name: Any) -> dict[str, Any]:
        for item in config.get(f"{kind}s") or []:
            if isinstance(item, dict) and item.get("name") == name:
                return item.get(kind) or {}
        raise SecretError(f"the kubeconfig {path} has no {kind} {name!r}")

    def local(value: str) -> Path:
        return (base / value) if not Path(value).is_absolute() else Path(value)

    context = named("context", config.get("current-context"))
    cluster = named("cluster", context.get("cluster"))
    user = named("user", context.get("user"))
    if "exec" in user or "auth-provider" in user:
        raise SecretError(
            f"the kubeconfig {path} authenticates with an exec plugin or auth provider, "
            "which the runner does not run: use a token or a client certificate"
        )
    cert = key = None
    if user.get("client-certificate-data") and user.get("client-key-data"):
        cert = _data_file(scratch, "client.crt", user["client-certificate-data"])
        key = _data_file(scratch, "client.key", user["client-key-data"])
    elif user.get("client-certificate") and user.get("client-key"):
        cert, key = local(user["client-certificate"]), local(user["client-key"])
    ca_data = cluster.get("certificate-authority-data")
    return ApiAccess(
        server=str(cluster.get("server") or "").rstrip("/"),
        token=user.get("token"),
        token_file=local(user["tokenFile"]) if user.get("tokenFile") else None,
        ca_file=local(cluster["certificate-authority"])
        if cluster.get("certificate-authority")
        else None,
        ca_data=base64.b64decode(ca_data) if ca_data else None,
        client_cert=(cert, key) if cert is not None and key is not None else None,
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
    )


class KubernetesSecretReader:
    """Reads Secrets through the Kubernetes API (see the module docstring).

    One ``GET /api/v1/namespaces/<ns>/secrets/<name>`` with aiohttp, which
    the runner has anyway: no Kubernetes client library (``kubernetes_asyncio``
    is about half of what such an image would install, for this one call).
    The session ignores ``HTTP(S)_PROXY``: the API server is the cluster's
    own, and a proxy meant for the model and storage must never see the
    runner's token (see :func:`runner.app.execute`, whose session honours
    them).
    """

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._environ = dict(os.environ if environ is None else environ)
        self._access: ApiAccess | None = None
        self._session: aiohttp.ClientSession | None = None
        self._scratch: tempfile.TemporaryDirectory[str] | None = None

    def _load(self) -> ApiAccess:
        if self._access is not None:
            return self._access
        try:
            if self._environ.get("KUBERNETES_SERVICE_HOST"):
                access = in_cluster_access(self._environ)
            else:
                config = self._environ.get("KUBECONFIG") or str(Path.home() / ".kube/config")
                self._scratch = tempfile.TemporaryDirectory(prefix="runner-kube-")
                access = kubeconfig_access(
                    Path(config.split(os.pathsep)[0]), Path(self._scratch.name)
                )
            if not access.server.startswith(("https://", "http://")):
                raise SecretError(f"the Kubernetes API address {access.server!r} is not a URL")
            access.ssl_context()  # a CA or certificate that does not load fails here
        except (OSError, ssl.SSLError, ValueError) as error:
            raise SecretError(f"no Kubernetes credentials to read Secrets with: {error}") from None
        self._access = access
        return access

    async def read(self, namespace: str, name: str) -> Mapping[str, str]:
        access = self._load()
        if self._session is None:
            self._session = aiohttp.ClientSession(
                trust_env=False,
                timeout=aiohttp.ClientTimeout(total=SECRET_READ_TIMEOUT),
                connector=aiohttp.TCPConnector(ssl=access.ssl_context()),
            )
        headers = {"Accept": "application/json"}
        try:
            token = access.bearer()
        except OSError as error:
            raise SecretError(f"cannot read the ServiceAccount token: {error}") from None
        if token:
            headers["Authorization"] = f"Bearer {token}"
        path = f"/api/v1/namespaces/{quote(namespace, safe='')}/secrets/{quote(name, safe='')}"
        url = access.server + path
        try:
            async with self._session.get(url, headers=headers) as response:
                body = await response.read()
                if response.status != 200:
                    raise SecretError(_api_error(namespace, name, response.status, body))
        except (aiohttp.ClientError, OSError, TimeoutError) as error:
            raise SecretError(
                f"cannot reach the Kubernetes API to read Secret {namespace}/{name}: "
                f"{type(error).__name__}"
            ) from None
        try:
            secret = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise SecretError(
                f"reading Secret {namespace}/{name}: the answer is not JSON"
            ) from None
        return decode_data(secret.get("data") if isinstance(secret, dict) else None)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None


def _api_error(namespace: str, name: str, status: int | None, body: Any) -> str:
    detail = ""
    try:
        parsed = orjson.loads(body) if body else None
        if isinstance(parsed, dict) and isinstance(parsed.get("message"), str):
            detail = f": {parsed['message']}"
    except (orjson.JSONDecodeError, TypeError):
        pass
    if status == 404:
        return f"Secret {namespace}/{name} not found{detail}"
    if status in (401, 403):
        return f"the runner may not read Secret {namespace}/{name} ({status}){detail}"
    return f"reading Secret {namespace}/{name} failed ({status}){detail}"
