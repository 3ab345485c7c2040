"""What a credential looks like: the one definition the runner and the controller share.

Pure (``re`` only), so the controller may import it: its log redaction
(``controller.logging``) and its admission scan of storage settings
(:func:`find_inline_credentials`, used by ``controller.api``) use the same rules
as the runner's redaction (:mod:`runner.redact`).

- **Keys** (:func:`is_credential_key`): compared lower-cased without ``-`` and
  ``_``, a key names a credential if it is one of :data:`CREDENTIAL_KEYS` or
  ends with one of :data:`CREDENTIAL_SUFFIXES` (``serviceAccountToken``,
  ``client_secret``, ``x-api-key``). Keys that only *name* a secret
  (``secretName``, ``secretRef``, ``tokens_used``) are not credentials: their
  values are names, and hiding them hides what an operator needs to read.
- **Free text** (:func:`redact_text`): ``Bearer``/``Basic``/``token``
  credentials, ``key=value`` (or ``key: value``) credentials, and the userinfo
  of a URL (``https://user:password@host`` or ``https://token@host``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

REDACTED = "[REDACTED]"

# Keys, compared after lower-casing and dropping "-" and "_".
CREDENTIAL_KEYS = frozenset(
    {
        "authorization",
        "proxyauthorization",
        "cookie",
        "setcookie",
        "credential",
        "credentials",
        "bearer",
        "certificatekeydata",
        "clientkeydata",
        "secretkey",
        "secretaccesskey",
    }
)
CREDENTIAL_SUFFIXES = (
    "token",
    "password",
    "passwd",
    "passphrase",
    "secret",
    "apikey",
    "privatekey",
    "clientkey",
)

_CHARS = r"[A-Za-z0-9._~+/=\-]"
# "Bearer x" and "Basic x" whatever their length; "token x" only from 4
# characters on, so prose such as "token is" stays readable.
_SCHEME_CREDENTIAL = re.compile(
    rf"(?i)\b(?:(bearer|basic)\s+{_CHARS}+|(token)\s+{_CHARS}{{4,}})",
)
_ASSIGNED_CREDENTIAL = re.compile(
    r"""(?ix)
    (\b(?:authorization|proxy-authorization|x-api-key|api[-_]?key|access[-_]?token
        |refresh[-_]?token|id[-_]?token|token|password|passwd|secret|client[-_]?secret)
     ["']?\s*[:=]\s*["']?)
    (?!\[REDACTED\]|(?:bearer|basic|token)\s+\[REDACTED\])
    ([^\s"',;&}]+)
    """
)
# The whole userinfo of a URL: "user:password@" and "token@" alike.
_URL_USERINFO = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s\"']+@")
# A password the userinfo pattern cannot take whole (one with a quote in it).
_URL_PASSWORD = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://[^/\s:@]+:)([^/\s@]+)(@)")
# A value that is a URL with "user:password@" (the admission scan's check).
_URL_WITH_PASSWORD = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/@\s]*:[^/@\s]*@")
# A header line's name ("X-Api-Key" in "X-Api-Key: 123"): no spaces, no slashes.
_HEADER_NAME = re.compile(r"[A-Za-z0-9_-]+")
# Nested structures deeper than this are left as they are (a cycle guard).
_MAX_DEPTH = 32


def _normal(key: str) -> str:
    return key.lower().replace("-", "").replace("_", "")


def is_credential_key(key: str) -> bool:
    """Whether a mapping key (or a header name) names a credential value."""
    normal = _normal(key)
    return normal in CREDENTIAL_KEYS or normal.endswith(CREDENTIAL_SUFFIXES)


def redact_text(text: str) -> str:
    """``text`` with every credential-shaped part replaced by :data:`REDACTED`."""
    text = _SCHEME_CREDENTIAL.sub(lambda m: f"{m.group(1) or m.group(2)} {REDACTED}", text)
    text = _ASSIGNED_CREDENTIAL.sub(lambda m: f"{m.group(1)}{REDACTED}", text)
    text = _URL_USERINFO.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", text)
    return _URL_PASSWORD.sub(lambda m: f"{m.group(1)}{REDACTED}{m.group(3)}", text)


def redact_structure(value: Any, text: Callable[[str], str] = redact_text, _depth: int = 0) -> Any:
    """A copy of ``value`` with strings passed through ``text`` and credential keys hidden.

    A credential key's value is replaced whole, whatever it is, unless it is
    empty (None or ""): an empty password says something worth logging and
    nothing worth hiding. Nested dicts, lists and tuples are walked, because
    contracts, headers and API bodies get logged as whole objects; bytes are
    decoded and exceptions become their (redacted) text.
    """
    if _depth > _MAX_DEPTH:
        return value
    if isinstance(value, str):
        return text(value)
    if isinstance(value, Mapping):
        return {
            k: (
                REDACTED
                if isinstance(k, str) and is_credential_key(k) and v not in (None, "")
                else redact_structure(v, text, _depth + 1)
            )
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return type(value)(redact_structure(v, text, _depth + 1) for v in value)
    if isinstance(value, bytes):
        return text(value.decode("utf-8", "replace"))
    if isinstance(value, BaseException):
        return text(str(value))
    return value


def _is_credential_header(line: str) -> bool:
    name, colon, _ = line.partition(":")
    return bool(colon) and _HEADER_NAME.fullmatch(name) is not None and is_credential_key(name)


def find_inline_credentials(value: Any, path: str = "") -> list[str]:
    """Paths inside ``value`` that look like a credential written in clear.

    Deliberately narrow, so references stay legal: only non-empty *strings* are
    flagged (``token: {secretKeyRef: ...}`` is fine), under keys that name a
    credential, in header lines that carry one (``Authorization: ...``), or in
    URLs with a password.
    """
    found: list[str] = []
    if isinstance(value, Mapping):
        for key, item in value.items():
            child = f"{path}.{key}" if path else str(key)
            if is_credential_key(str(key)) and isinstance(item, str) and item:
                found.append(child)
            else:
                found.extend(find_inline_credentials(item, child))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found.extend(find_inline_credentials(item, f"{path}[{i}]"))
    elif isinstance(value, str):
        stripped = value.strip()
        if _is_credential_header(stripped) or _URL_WITH_PASSWORD.match(stripped):
            found.append(path)
    return found
