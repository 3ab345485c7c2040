"""Reading the Secrets that storage entries reference (``endpointRef``, ``secretRef``).

The runner reads a Secret only through a :class:`SecretReader`, so where Secrets
come from is a parameter: :class:`KubernetesSecretReader` in a pod (and against a
kubeconfig while developing), an in-memory reader in tests. Whatever reader is
used, :class:`RedactingSecretReader` registers every value it returns with the
redactor before anyone sees it, except the keys in :data:`PUBLIC_KEYS`.

Kubernetes access (:class:`KubernetesSecretReader`):

- in a pod (``KUBERNETES_SERVICE_HOST`` set): the service account's token and CA
  (their paths go through :func:`runner.paths.pod_path`, so the test node agent
  can provide them);
- otherwise the kubeconfig at ``$KUBECONFIG`` (or ``~/.kube/config``).

The namespace of a reference without one is the pod's (:func:`pod_namespace`).
"""

from __future__ import annotations

import base64
import os
from collections.abc import Mapping
from typing import Any, Protocol

import orjson

from runner import paths
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


class KubernetesSecretReader:
    """Reads Secrets through the Kubernetes API (see the module docstring)."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._environ = dict(os.environ if environ is None else environ)
        self._api: Any = None

    async def _client(self) -> Any:
        if self._api is not None:
            return self._api
        # Imported here: it is large, and a run without Secrets never needs it.
        from kubernetes_asyncio import client, config

        configuration = client.Configuration()
        try:
            if self._environ.get("KUBERNETES_SERVICE_HOST"):
                config.incluster_config.InClusterConfigLoader(
                    token_filename=str(paths.pod_path(paths.SERVICE_ACCOUNT_TOKEN, self._environ)),
                    cert_filename=str(paths.pod_path(paths.SERVICE_ACCOUNT_CA, self._environ)),
                    environ=self._environ,
                ).load_and_set(configuration)
            else:
                await config.load_kube_config(
                    config_file=self._environ.get("KUBECONFIG"),
                    client_configuration=configuration,
                    persist_config=False,
                )
        except (config.ConfigException, OSError) as error:
            raise SecretError(f"no Kubernetes credentials to read Secrets with: {error}") from None
        self._api = client.ApiClient(configuration)
        return self._api

    async def read(self, namespace: str, name: str) -> Mapping[str, str]:
        from kubernetes_asyncio import client
        from kubernetes_asyncio.client.exceptions import ApiException

        api = await self._client()
        try:
            secret = await client.CoreV1Api(api).read_namespaced_secret(name, namespace)
        except ApiException as error:
            raise SecretError(_api_error(namespace, name, error.status, error.body)) from None
        except (OSError, TimeoutError) as error:
            raise SecretError(
                f"cannot reach the Kubernetes API to read Secret {namespace}/{name}: "
                f"{type(error).__name__}"
            ) from None
        return decode_data(secret.data)

    async def close(self) -> None:
        if self._api is not None:
            await self._api.close()
            self._api = None


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
