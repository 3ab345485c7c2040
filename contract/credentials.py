"""What a credential looks like: the one definition the runner and the controller share.

Pure (``re`` only), so the controller may import it: its log redaction
(``controller.logging``) and its admission scan of settings
(:func:`find_inline_credentials`, used by ``controller.api``) use the same rules
as the runner's redaction (:mod:`runner.redact`). Whatever the scan refuses, the
redaction hides: one rule, tested from one corpus (``tests/unit/test_credentials.py``).

- **Keys** (:func:`is_credential_key`): a key is split into words (camelCase,
  ``snake_case``, ``kebab-case``, ``dot.case``, ``UPPER_CASE`` alike), a last
  word that only says how the value is written (``Value``, ``Data``, ``Pem``,
  ``Json``, ``B64``, ...) is dropped, and the rest, joined and lower-cased,
  names a credential if it is one of :data:`CREDENTIAL_KEYS` or ends with one
  of :data:`CREDENTIAL_SUFFIXES`: ``awsSecretAccessKey``,
  ``AWS_SECRET_ACCESS_KEY``, ``accountKey``, ``pwd``, ``apiKeyValue``,
  ``privateKeyPem``, ``client_secret``, ``x-api-key``. Keys that only *name* or
  *locate* a secret (``secretName``, ``secretKeyRef``, ``tokenUrl``,
  ``passwordFile``, ``maxTokens``, ``signatureVersion``, ``accessKeyId``) are
  not credentials: their values are names, and hiding them hides what an
  operator needs to read.
- **Shapes** (:data:`CREDENTIAL_SHAPES`): PEM private keys (a GCP service
  account's ``private_key``), JWTs, AWS access key ids, and the token formats
  of GitHub, GitLab, Slack, Google API keys and OpenAI-style ``sk-`` keys,
  wherever they appear.
- **Free text** (:func:`redact_text`): ``Bearer``/``Basic``/``token``
  credentials, ``key=value`` (or ``key: value``) assignments whose key names a
  credential (which covers Azure connection strings' ``AccountKey=``, SAS
  tokens' ``sig=``, libpq DSNs' ``password=`` and URL query parameters such as
  ``?access_token=``), the userinfo of a URL (``https://user:password@host``
  or ``https://token@host``), and the shapes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any

REDACTED = "[REDACTED]"

# Whole keys (words joined, lower-cased) that name a credential.
CREDENTIAL_KEYS = frozenset(
    {
        "authorization",
        "proxyauthorization",
        "cookie",
        "setcookie",
        "bearer",
        "sig",
        "pwd",
        "certificatekeydata",
        "clientkeydata",
        "serviceaccountjson",
        "serviceaccountkey",
        "sharedaccesskey",
        "sharedaccesssignature",
        "connectionpassword",
    }
)
# Endings (of the joined, lower-cased words) that name a credential.
CREDENTIAL_SUFFIXES = (
    "token",
    "password",
    "passwd",
    "passphrase",
    "secret",
    "apikey",
    "privatekey",
    "secretkey",
    "secretaccesskey",
    "accountkey",
    "clientkey",
    "masterkey",
    "signingkey",
    "sharedkey",
    "credential",
    "credentials",
    "signature",
    "authorization",
    "cookie",
)
# A last word that says how the value is written, not what it is: dropped
# before the key is judged (apiKeyValue, privateKeyPem, clientKeyData).
ENCODING_WORDS = frozenset(
    {
        "value",
        "data",
        "pem",
        "der",
        "b64",
        "base64",
        "json",
        "text",
        "string",
        "str",
        "bytes",
        "raw",
    }
)
# Environment variable names the system sets to things that are not credentials.
NOT_CREDENTIAL_ENV = frozenset({"PWD", "OLDPWD"})

_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")

# Shapes that are a credential wherever they appear.
CREDENTIAL_SHAPES: tuple[re.Pattern[str], ...] = (
    # A PEM private key (RSA, EC, OPENSSH, ENCRYPTED, or plain PKCS#8), to its
    # END line or the end of the text; in JSON its newlines are "\n".
    re.compile(
        r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\Z)",
        re.DOTALL,
    ),
    # A JWT: base64url JSON header and payload, and a signature.
    re.compile(r"\beyJ[A-Za-z0-9_-]{4,}\.eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*"),
    # AWS access key ids (long-term and temporary).
    re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),
    # GitHub, GitLab and Slack tokens, Google API keys, OpenAI-style keys.
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{30,}"),
    re.compile(r"\bgithub_pat_[A-Za-z0-9_]{30,}"),
    re.compile(r"\bglpat-[A-Za-z0-9_-]{20,}"),
    re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"),
    re.compile(r"\bAIza[0-9A-Za-z_-]{35}"),
    re.compile(r"\bsk-(?:proj-|ant-)?[A-Za-z0-9_-]{20,}"),
)

_CHARS = r"[A-Za-z0-9._~+/=\-]"
# "Bearer x" and "Basic x" whatever their length; "token x" only from 4
# characters on, so prose such as "token is" stays readable.
_SCHEME_CREDENTIAL = re.compile(
    rf"(?i)\b(?:(bearer|basic)\s+{_CHARS}+|(token)\s+{_CHARS}{{4,}})",
)
# A short lower-case word: in prose ("token expired", "credentials: model
# answered 401") it is English, not a secret. Generated tokens and keys mix
# case, digits or punctuation, or run longer than any word.
_PROSE_WORD = re.compile(r"[a-z]{1,23}")
# Any `key: value` or `key=value` (the key optionally quoted); the key decides.
_ASSIGNMENT = re.compile(
    r"""(?x)
    (?P<quote>["']?)(?P<key>\b[A-Za-z][A-Za-z0-9_.\-]*)(?P=quote)
    (?P<op>\s*[:=]\s*\[?\s*["']?)
    (?!\[REDACTED\]|(?i:bearer|basic|token)\s+\[REDACTED\])
    (?P<value>[^\s"',;&}]+)
    """
)
# `key=value` inside a settings string: a DSN (`host=db password=x`), a
# connection string (`AccountKey=x;`), a URL's query (`?sig=x&`). No spaces
# around `=`, so SQL such as `WHERE password = $1` is not taken for one.
_PAIR = re.compile(r"(?:^|[\s;&?#,])(?P<key>[A-Za-z][A-Za-z0-9_.\-]*)=(?P<value>[^\s;&#,]+)")
# The whole userinfo of a URL: "user:password@" and "token@" alike.
_URL_USERINFO = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s\"']+@")
# A password the userinfo pattern cannot take whole (one with a quote in it).
_URL_PASSWORD = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://[^/\s:@]+:)([^/\s@]+)(@)")
# A URL with "user:password@" anywhere in a string (the admission scan's check).
_URL_WITH_PASSWORD = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^/@\s]*:[^/@\s]*@")
# A header line's name ("X-Api-Key" in "X-Api-Key: 123"): no spaces, no slashes.
_HEADER_NAME = re.compile(r"[A-Za-z0-9_-]+")
# Nested structures deeper than this are left as they are (a cycle guard).
_MAX_DEPTH = 32


def key_words(key: str) -> list[str]:
    """``key`` split into lower-cased words: ``AWS_SECRET_ACCESS_KEY`` and
    ``awsSecretAccessKey`` both give ``aws secret access key``."""
    words: list[str] = []
    for word in _WORDS.findall(key):
        if word.isdigit() and words:
            words[-1] += word  # base64, b64, sha256: one word
        else:
            words.append(word.lower())
    return words


# Keys repeat (every log line has the same few): remembered, as the answer only
# depends on the key; a key names a value, it is never a secret itself.
@lru_cache(maxsize=4096)
def is_credential_key(key: str) -> bool:
    """Whether a mapping key, header name or variable name names a credential value."""
    words = key_words(key)
    if len(words) > 1 and words[-1] in ENCODING_WORDS:
        words = words[:-1]
    joined = "".join(words)
    return joined in CREDENTIAL_KEYS or joined.endswith(CREDENTIAL_SUFFIXES)


def is_credential_env(name: str) -> bool:
    """Whether an environment variable's name says its value is a credential."""
    return name not in NOT_CREDENTIAL_ENV and is_credential_key(name)


def _redact_scheme(match: re.Match[str]) -> str:
    if match.group(2) is not None:  # "token x"
        value = match.group(0)[len(match.group(2)) :].lstrip()
        if _PROSE_WORD.fullmatch(value):
            return match.group(0)
    return f"{match.group(1) or match.group(2)} {REDACTED}"


def _is_prose(text: str, match: re.Match[str]) -> bool:
    """Whether an unquoted ``key: value`` is a sentence, not a setting: the
    value is a short lower-case word and more words follow on the line
    (``credentials: model answered 401``). ``password: hunter`` alone, a
    quoted value and ``key=value`` are always taken for settings."""
    if match["quote"] or match["op"].strip() != ":" or not match["op"].endswith(" "):
        return False
    if not _PROSE_WORD.fullmatch(match["value"]):
        return False
    return re.match(r" +[A-Za-z0-9]", text[match.end("value") :]) is not None


def _redact_assignments(text: str) -> str:
    out: list[str] = []
    pos = 0
    while (match := _ASSIGNMENT.search(text, pos)) is not None:
        if is_credential_key(match["key"]) and not _is_prose(text, match):
            out.append(text[pos : match.start("value")])
            out.append(REDACTED)
            pos = match.end("value")
        else:
            # Only the key is passed over: its value may hold an assignment
            # of its own (`url=https://h/?token=x`).
            out.append(text[pos : match.end("key")])
            pos = match.end("key")
    out.append(text[pos:])
    return "".join(out)


def redact_text(text: str) -> str:
    """``text`` with every credential-shaped part replaced by :data:`REDACTED`."""
    for shape in CREDENTIAL_SHAPES:
        text = shape.sub(REDACTED, text)
    text = _SCHEME_CREDENTIAL.sub(_redact_scheme, text)
    text = _redact_assignments(text)
    text = _URL_USERINFO.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", text)
    return _URL_PASSWORD.sub(lambda m: f"{m.group(1)}{REDACTED}{m.group(3)}", text)


def text_has_credential(text: str) -> bool:
    """Whether a settings string carries a credential in clear.

    A header line naming one (``Authorization: ...``, ``X-Api-Key: ...``), a
    URL with a password, a ``key=value`` pair whose key names one, or one of
    the :data:`CREDENTIAL_SHAPES`.
    """
    stripped = text.strip()
    if _is_credential_header(stripped) or _URL_WITH_PASSWORD.search(stripped):
        return True
    if any(shape.search(stripped) for shape in CREDENTIAL_SHAPES):
        return True
    return any(is_credential_key(m["key"]) for m in _PAIR.finditer(stripped))


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


def _is_clear_value(value: Any) -> bool:
    # YAML reads `password: 123456` as a number: still a password in clear.
    if isinstance(value, bool) or value is None:
        return False
    return isinstance(value, int | float) or (isinstance(value, str) and value != "")


def find_inline_credentials(value: Any, path: str = "") -> list[str]:
    """Paths inside ``value`` that look like a credential written in clear.

    Narrow where it must be, so references stay legal: under a key that names
    a credential, a non-empty string or a number (or a list of them) is
    flagged, while a mapping (``token: {secretKeyRef: ...}``) is walked like
    any other. Any string anywhere is flagged when
    :func:`text_has_credential` says it carries one.
    """
    found: list[str] = []
    if isinstance(value, Mapping):
        for key, item in value.items():
            child = f"{path}.{key}" if path else str(key)
            clear = _is_clear_value(item) or (
                isinstance(item, list) and any(_is_clear_value(i) for i in item)
            )
            if clear and is_credential_key(str(key)):
                found.append(child)
            else:
                found.extend(find_inline_credentials(item, child))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found.extend(find_inline_credentials(item, f"{path}[{i}]"))
    elif isinstance(value, str) and text_has_credential(value):
        found.append(path)
    return found
