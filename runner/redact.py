"""Keeping credentials out of everything the runner writes.

Three nets, applied to every log event (a structlog processor), every error
message and the termination message:

1. **Known values.** Whatever the runner reads from a Secret (except the few keys
   known to be public, such as ``server-url``) and every ``Authorization`` value
   it builds is registered with :meth:`Redactor.add`; any later occurrence in any
   text is replaced by ``[REDACTED]``. Values shorter than
   :data:`MIN_SECRET_LENGTH` are not registered: replacing every ``"1"`` in a log
   would hide more than it protects.
2. **Credential keys.** A mapping key that names a credential (``authorization``,
   ``password``, ``token``, ``client_secret``, ``awsSecretAccessKey``,
   ``accountKey``, ``api-key``, ...) has its whole value replaced, whatever it is
   (unless empty).
3. **Shapes.** ``user:password@`` in URLs, ``Basic``/``Bearer`` credentials,
   ``password=...``-style assignments (connection strings' ``AccountKey=`` too),
   PEM private keys, JWTs and well-known token formats are replaced wherever
   they appear, even if nobody registered them.

Nets 2 and 3 are :mod:`contract.credentials`, the definition the controller's log
redaction shares.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

# REDACTED is re-exported: the runner names it through this module.
from contract.credentials import REDACTED as REDACTED
from contract.credentials import redact_structure, redact_text

MIN_SECRET_LENGTH = 4


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

    def clear(self) -> None:
        """Forget every registered value: a new run in the same process (the tests)."""
        self._values.clear()
        self._pattern = None

    def redact(self, text: str) -> str:
        if self._pattern is not None:
            text = self._pattern.sub(REDACTED, text)
        return redact_text(text)

    def redact_obj(self, obj: Any) -> Any:
        """A copy of ``obj`` with strings redacted and credential keys' values hidden."""
        return redact_structure(obj, self.redact)

    def __call__(self, _logger: Any, _method: str, event_dict: Any) -> Any:
        """structlog processor: place it after exception formatting, before rendering."""
        return self.redact_obj(event_dict)


# The process-wide redactor: the log processor and the error paths share it, so a
# value registered once is hidden everywhere.
REDACTOR = Redactor()
