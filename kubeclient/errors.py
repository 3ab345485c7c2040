"""How the API server says no: :class:`ApiError`.

It carries the HTTP status (0 when no answer came at all) and the API's
``Status`` reason and message; callers ask it ``is_conflict``,
``is_already_exists``, ``is_gone``... (client-go's ``errors.IsConflict`` & co).
Two subclasses exist because callers catch them by name: :class:`NotFound`
("it is not there" ends many a lookup) and :class:`TransportError` (no answer
at all).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass
from typing import Any

import orjson

# The StatusCause reason of a create refused in a namespace being deleted.
NAMESPACE_TERMINATING = "NamespaceTerminating"


# eq=False keeps exceptions hashable and compared by identity; repr=False keeps
# Exception's repr (the message), which is what logs and tracebacks show.
@dataclass(eq=False, repr=False)
class ApiError(Exception):
    """The API server refused a request (or none could be made: ``status`` 0)."""

    status: int
    reason: str = ""
    message: str = ""
    _: KW_ONLY
    verb: str = ""
    path: str = ""
    body: Mapping[str, Any] | None = None
    retry_after: float | None = None

    def __post_init__(self) -> None:
        where = f"{self.verb} {self.path}".strip()
        what = " ".join(str(part) for part in (self.status or "", self.reason) if part)
        text = ": ".join(part for part in (where, what, self.message) if part)
        super().__init__(text or "API error")

    @property
    def is_not_found(self) -> bool:
        return self.status == 404

    @property
    def is_conflict(self) -> bool:
        """409 for a stale resourceVersion (Conflict) or an existing name (AlreadyExists)."""
        return self.status == 409

    @property
    def is_already_exists(self) -> bool:
        return self.status == 409 and self.reason == "AlreadyExists"

    @property
    def is_gone(self) -> bool:
        return self.status == 410

    @property
    def is_forbidden(self) -> bool:
        return self.status == 403

    @property
    def is_namespace_terminating(self) -> bool:
        """403 for a create in a namespace being deleted (cause ``NamespaceTerminating``).

        Final: nothing can be created there again, whoever asks.
        """
        if self.status != 403:
            return False
        details = (self.body or {}).get("details") or {}
        causes = details.get("causes") if isinstance(details, Mapping) else None
        if any(
            isinstance(c, Mapping) and c.get("reason") == NAMESPACE_TERMINATING
            for c in causes or []
        ):
            return True
        return "because it is being terminated" in self.message

    @property
    def is_transient(self) -> bool:
        """Worth retrying as is: no answer, throttled, or a server-side failure."""
        return self.status in (0, 429) or self.status >= 500


class TransportError(ApiError):
    """No HTTP answer: connection refused or reset, TLS failure, timeout."""


class NotFound(ApiError):
    """404: the object (or its namespace, or the resource type) does not exist."""


def api_error(
    status: int,
    body: bytes | Mapping[str, Any] | None,
    *,
    verb: str = "",
    path: str = "",
    retry_after: float | None = None,
) -> ApiError:
    """The error for an HTTP status and an API ``Status`` body (or any body)."""
    status_obj: Mapping[str, Any] | None = None
    if isinstance(body, Mapping):
        status_obj = body
    elif body:
        try:
            parsed = orjson.loads(body)
        except orjson.JSONDecodeError:
            parsed = None
        if isinstance(parsed, dict):
            status_obj = parsed
    if status_obj is not None:
        reason = str(status_obj.get("reason") or "")
        message = str(status_obj.get("message") or "")
    else:
        reason = ""
        message = body[:500].decode("utf-8", "replace") if isinstance(body, bytes) else ""
    cls = NotFound if status == 404 else ApiError
    return cls(
        status,
        reason,
        message,
        verb=verb,
        path=path,
        body=status_obj,
        retry_after=retry_after,
    )
