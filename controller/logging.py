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
  credentials and ``key=value`` credentials inside strings; the userinfo of
  URLs. What looks like a credential is :mod:`contract.credentials`, the
  definition the runner's redaction shares. It walks nested dicts and lists,
  because contracts, headers and API bodies get logged as whole objects.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Literal, TextIO

import orjson
import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

from contract.credentials import redact_structure

# Fields this module's processors write from the clock and the logger: never a
# credential, and scanning them was a third of a line's cost.
_OWN_FIELDS = frozenset({"ts", "level", "logger"})


def redact(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    """structlog processor: drop credentials from every field of the line."""
    own = {k: v for k, v in event_dict.items() if k in _OWN_FIELDS and isinstance(v, str)}
    redacted = redact_structure({k: v for k, v in event_dict.items() if k not in own})
    assert isinstance(redacted, dict)
    return {k: own[k] if k in own else redacted[k] for k in event_dict}


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
