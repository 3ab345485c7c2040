"""Where a storage is and how to talk to it: an :class:`Endpoint` built from a Secret.

The configuration side of the HTTP providers (the transport side, requests and
answers, is :mod:`runner.storage.transport`): a base URL, its credentials, TLS
and proxy, read from the Secret the contract names; the contract's header lines.
Each provider names its Secret keys in a :class:`SecretKeys` (a dialect's table);
:func:`endpoint_from_secret` is the one reader.
"""

from __future__ import annotations

import base64
import binascii
import os
import ssl
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit, urlunsplit

from runner.storage.base import StorageError


def parse_header_lines(lines: Sequence[str] | Mapping[str, str]) -> dict[str, str]:
    """``["K: V", ...]`` (upstream's form) or a mapping, as headers; bad lines are errors."""
    if isinstance(lines, Mapping):
        pairs = list(lines.items())
    else:
        pairs = []
        for line in lines:
            if not isinstance(line, str) or ":" not in line:
                raise ValueError(f"header {line!r} is not of the form 'Name: value'")
            name, _, value = line.partition(":")
            pairs.append((name, value))
    headers: dict[str, str] = {}
    for name, value in pairs:
        name = name.strip()
        if not name or any(c.isspace() or c in '()<>@,;:\\"/[]?={}' for c in name):
            raise ValueError(f"header name {name!r} is not a valid HTTP header name")
        headers[name] = str(value).strip()
    return headers


def parse_bool(value: str, key: str) -> bool:
    """Go's ``strconv.ParseBool``, which upstream uses for ``insecure``."""
    if value in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if value in ("0", "f", "F", "FALSE", "false", "False", ""):
        return False
    raise StorageError(f"Secret key {key!r} must be a boolean (true or false)")


@dataclass(frozen=True)
class Endpoint:
    """A base URL with its credentials and TLS settings, built from a Secret."""

    base_url: str
    authorization: str | None = None
    ssl: ssl.SSLContext | bool = True
    proxy: str | None = None

    def url_for(self, path: str) -> str:
        if not path:
            return self.base_url
        return self.base_url.rstrip("/") + "/" + path.lstrip("/")


@dataclass(frozen=True)
class SecretKeys:
    """A provider's names for the Secret keys; ``None`` where its Secret has no such key.

    ``token``, ``username``, ``password`` and ``insecure`` are the same for every
    provider so far, so they are not in the table.
    """

    url: str
    ca: str
    proxy: str | None = None
    client_cert: str | None = None
    client_key: str | None = None


def endpoint_from_secret(data: Mapping[str, str], source: str, keys: SecretKeys) -> Endpoint:
    """The endpoint a provider's Secret ``data`` describes; ``source`` names the Secret."""

    def value(key: str | None) -> str | None:
        return (data.get(key) or None) if key else None

    url = (data.get(keys.url) or "").strip()
    if not url:
        raise StorageError(f"{source} has no {keys.url}")
    return build_endpoint(
        url=url,
        token=data.get("token") or None,
        username=data.get("username"),
        password=data.get("password") or None,
        ca_data=value(keys.ca),
        insecure=parse_bool(data.get("insecure", "").strip(), "insecure"),
        proxy_url=(value(keys.proxy) or "").strip() or None,
        client_cert=value(keys.client_cert),
        client_key=value(keys.client_key),
        source=source,
    )


def build_endpoint(
    *,
    url: str,
    token: str | None,
    username: str | None,
    password: str | None,
    ca_data: str | None,
    insecure: bool,
    proxy_url: str | None,
    client_cert: str | None = None,
    client_key: str | None = None,
    source: str,
) -> Endpoint:
    """One endpoint; ``source`` names the Secret in error messages.

    Credentials written into the URL (``https://user:pw@host``) are taken out of it
    and used for Basic auth when the Secret has no other, as Go's client does.
    """
    url, url_user, url_password = split_userinfo(url.strip())
    if not url.startswith(("http://", "https://")):
        raise StorageError(f"{source}: the URL must start with http:// or https://")
    if url_password is not None and not (token or password):
        username, password = url_user, url_password
    if token and password:
        raise StorageError(f"{source}: has both a token and a password; keep one")
    authorization = None
    if token:
        authorization = f"Bearer {token.strip()}"
    elif password:
        pair = f"{username or ''}:{password}".encode()
        authorization = f"Basic {base64.b64encode(pair).decode()}"
    if proxy_url and not proxy_url.startswith(("http://", "https://")):
        raise StorageError(f"{source}: only http(s) proxies are supported")
    tls: ssl.SSLContext | bool = True
    if url.startswith("https://") and (insecure or ca_data or client_cert):
        tls = _tls_context(ca_data, insecure, client_cert, client_key, source)
    return Endpoint(base_url=url, authorization=authorization, ssl=tls, proxy=proxy_url or None)


def split_userinfo(url: str) -> tuple[str, str, str | None]:
    """``url`` without ``user:password@``, the user, and the password (None if absent)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, "", None
    userinfo, _, host = parts.netloc.rpartition("@")
    user, has_password, password = userinfo.partition(":")
    cleaned = urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
    return cleaned, unquote(user), unquote(password) if has_password else None


def pem(value: str) -> str:
    """PEM text, whether given as PEM or (kubeconfig style) base64 of PEM."""
    if "-----BEGIN" in value:
        return value
    try:
        return base64.b64decode(value, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        raise ValueError("neither PEM nor base64 of PEM") from None


def _tls_context(
    ca_data: str | None,
    insecure: bool,
    client_cert: str | None,
    client_key: str | None,
    source: str,
) -> ssl.SSLContext:
    context = ssl.create_default_context()
    try:
        if ca_data:
            context.load_verify_locations(cadata=pem(ca_data))
        if client_cert and client_key:
            _load_client_pair(context, pem(client_cert), pem(client_key))
    except (ValueError, ssl.SSLError) as error:
        raise StorageError(f"{source}: unusable TLS material: {type(error).__name__}") from None
    if insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def _load_client_pair(context: ssl.SSLContext, cert: str, key: str) -> None:
    # ssl only loads key pairs from files: write them privately, load, delete.
    with tempfile.TemporaryDirectory(prefix="runner-tls-") as directory:
        cert_path = os.path.join(directory, "tls.crt")
        key_path = os.path.join(directory, "tls.key")
        for path, text in ((cert_path, cert), (key_path, key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(text)
        context.load_cert_chain(cert_path, key_path)
