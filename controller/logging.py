"""Structured logs: JSON lines on stdout (or a console format for humans).

- structlog for the controller's own lines; the standard library's loggers
  (aiohttp, kubernetes_asyncio) go through the same processors, so every line
  on stdout is one JSON object.
- Every JSON line has ``msg``, ``level``, ``ts`` (ISO 8601, UTC) and
  ``logger``: the names log pipelines look for.
- Context variables are merged into every line: the workers bind the run key
  (``run="namespace/name"``) around each reconcile with :func:`bound`, and the
  reconcile adds the run's ``uid``, ``generation`` and a ``reconcile`` id, so
  every line a reconcile logs says which run and which pass it is about.
- :func:`redact` runs last before rendering and replaces anything that looks
  like a credential: values of keys such as ``authorization``, ``token``,
  ``password``, ``secret``, ``api_key``, ``cookie``; ``Bearer``/``Basic``
  credentials and ``key=value`` credentials inside strings; passwords in URLs.
  It walks nested dicts and lists, because contracts, headers and API bodies
  get logged as whole objects.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Literal, TextIO

import orjson
import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

REDACTED = "[REDACTED]"

# Keys compared after lower-casing and dropping "-" and "_".
_SECRET_KEYS = frozenset(
    {
        "authorization",
        "proxyauthorization",
        "cookie",
        "setcookie",
        "credentials",
        "bearer",
        "certificatekeydata",
        "clientkeydata",
    }
)
_SECRET_SUFFIXES = (
    "token",
    "password",
    "passwd",
    "passphrase",
    "secret",
    "apikey",
    "privatekey",
    "clientkey",
)
_SCHEME_CREDENTIAL = re.compile(r"(?i)\b(bearer|basic|token)\s+[A-Za-z0-9._~+/=\-]{4,}")
_ASSIGNED_CREDENTIAL = re.compile(
    r"""(?ix)
    (\b(?:authorization|proxy-authorization|x-api-key|api[-_]?key|access[-_]?token
        |refresh[-_]?token|id[-_]?token|token|password|passwd|secret|client[-_]?secret)
     ["']?\s*[:=]\s*["']?)
    (?!\[REDACTED\]|(?:bearer|basic|token)\s+\[REDACTED\])
    ([^\s"',;&}]+)
    """
)
_URL_PASSWORD = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://[^/\s:@]+:)([^/\s@]+)(@)")


def is_secret_key(key: str) -> bool:
    normal = key.lower().replace("-", "").replace("_", "")
    return normal in _SECRET_KEYS or normal.endswith(_SECRET_SUFFIXES)


def redact_text(text: str) -> str:
    """``text`` with credentials inside it replaced."""
    text = _SCHEME_CREDENTIAL.sub(lambda m: f"{m.group(1)} {REDACTED}", text)
    text = _ASSIGNED_CREDENTIAL.sub(lambda m: f"{m.group(1)}{REDACTED}", text)
    return _URL_PASSWORD.sub(lambda m: f"{m.group(1)}{REDACTED}{m.group(3)}", text)


def redact_value(value: Any, _depth: int = 0) -> Any:
    """A copy of ``value`` with every credential-looking part replaced."""
    if _depth > 32:
        return value
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, Mapping):
        return {
            k: (
                REDACTED
                if isinstance(k, str) and is_secret_key(k) and v not in (None, "")
                else redact_value(v, _depth + 1)
            )
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return type(value)(redact_value(v, _depth + 1) for v in value)
    if isinstance(value, bytes):
        return redact_text(value.decode("utf-8", "replace"))
    return value


def redact(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    """structlog processor: drop credentials from every field of the line."""
    redacted = redact_value(dict(event_dict))
    assert isinstance(redacted, dict)
    return redacted


def _json(event_dict: Mapping[str, Any], **_: Any) -> str:
    return orjson.dumps(event_dict, default=repr, option=orjson.OPT_NON_STR_KEYS).decode()


def _shared_processors() -> list[Processor]:
    return [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_logger_name,
        structlog.stdlib.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True, key="ts"),
        structlog.processors.StackInfoRenderer(),
        # The key names log pipelines look for (Loki, Elastic, Datadog, Vector):
        # "msg" for the message, "level", "ts" for the time.
        structlog.processors.EventRenamer("msg"),
    ]


def configure_logging(
    level: str = "INFO",
    fmt: Literal["json", "console"] = "json",
    stream: TextIO | None = None,
) -> None:
    """Route structlog and standard-library logging to ``stream`` (stdout) as ``fmt``."""
    stream = stream if stream is not None else sys.stdout
    numeric_level = logging.getLevelNamesMapping()[level.upper()]
    renderer: Processor
    if fmt == "json":
        renderer = structlog.processors.JSONRenderer(serializer=_json)
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=False)

    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *_shared_processors(),
            structlog.stdlib.PositionalArgumentsFormatter(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=_shared_processors(),
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            # A plain-text traceback: structured ones carry frame locals,
            # which is exactly where credentials hide.
            structlog.processors.format_exc_info,
            redact,
            renderer,
        ],
    )
    handler = _Handler(stream)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    # Replace only our own handler, so calling this twice (or in tests under
    # pytest's log capture) neither duplicates lines nor drops other handlers.
    for old in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric_level)
    # One line per scrape or probe is noise, not news.
    logging.getLogger("aiohttp.access").setLevel(max(numeric_level, logging.WARNING))


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler configure_logging installs on the root logger."""


def get_logger(name: str | None = None, **initial: Any) -> structlog.stdlib.BoundLogger:
    logger: structlog.stdlib.BoundLogger = structlog.stdlib.get_logger(name, **initial)
    return logger


@contextmanager
def bound(**fields: Any) -> Iterator[None]:
    """Add ``fields`` to every line logged inside the block (in this task)."""
    with structlog.contextvars.bound_contextvars(**fields):
        yield
