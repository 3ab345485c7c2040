"""Keeping credentials out of everything the runner writes.

Three nets, applied to every log event (a structlog processor), every error
message and the termination message:

1. **Known values.** Whatever the runner reads from a Secret (except the few keys
   known to be public, such as ``server-url``) and every ``Authorization`` value
   it builds is registered with :meth:`Redactor.add`; any later occurrence in any
   text is replaced by ``[REDACTED]``. Values shorter than
   :data:`MIN_SECRET_LENGTH` are not registered: replacing every ``"1"`` in a log
   would hide more than it protects.
2. **Sensitive keys.** A mapping key that names a credential (``authorization``,
   ``password``, ``token``, ``secret``, ``cookie``, ``api-key``, ...) has its whole
   value replaced, whatever it is.
3. **Shapes.** ``user:password@`` in URLs and ``Basic``/``Bearer`` credentials are
   replaced wherever they appear, even if nobody registered them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

REDACTED = "[REDACTED]"
MIN_SECRET_LENGTH = 4

_SENSITIVE_KEY = re.compile(
    r"authorization|password|passwd|token|secret|cookie|credential|api[-_]?key|private[-_]?key",
    re.IGNORECASE,
)
_URL_USERINFO = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s\"']+@")
_AUTH_SCHEME = re.compile(r"\b(?P<scheme>Basic|Bearer)\s+[A-Za-z0-9._~+/=-]+", re.IGNORECASE)


def is_sensitive_key(key: str) -> bool:
    return bool(_SENSITIVE_KEY.search(key))


class Redactor:
    """Replaces registered secret values and credential-shaped text."""

    def __init__(self, values: Iterable[str] = ()) -> None:
        self._values: set[str] = set()
        self._pattern: re.Pattern[str] | None = None
        for value in values:
            self.add(value)

    def add(self, value: str) -> None:
        value = value.strip()
        if len(value) < MIN_SECRET_LENGTH or value in self._values:
            return
        self._values.add(value)
        # Longest first, so a secret containing another is replaced whole.
        ordered = sorted(self._values, key=len, reverse=True)
        self._pattern = re.compile("|".join(re.escape(v) for v in ordered))

    def redact(self, text: str) -> str:
        if self._pattern is not None:
            text = self._pattern.sub(REDACTED, text)
        text = _URL_USERINFO.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", text)
        return _AUTH_SCHEME.sub(lambda m: f"{m.group('scheme')} {REDACTED}", text)

    def redact_obj(self, obj: Any) -> Any:
        """A copy of ``obj`` with strings redacted and sensitive keys' values hidden."""
        if isinstance(obj, str):
            return self.redact(obj)
        if isinstance(obj, Mapping):
            return {
                key: (
                    REDACTED
                    if isinstance(key, str) and is_sensitive_key(key)
                    else self.redact_obj(value)
                )
                for key, value in obj.items()
            }
        if isinstance(obj, list | tuple):
            return [self.redact_obj(item) for item in obj]
        if isinstance(obj, BaseException):
            return self.redact(str(obj))
        return obj

    def __call__(self, _logger: Any, _method: str, event_dict: Any) -> Any:
        """structlog processor: place it after exception formatting, before rendering."""
        return self.redact_obj(event_dict)


# The process-wide redactor: the log processor and the error paths share it, so a
# value registered once is hidden everywhere.
REDACTOR = Redactor()
