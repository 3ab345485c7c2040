"""Parsed models of cached objects, reused while the object is unchanged."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

M = TypeVar("M", bound=BaseModel)


class ModelCache(Generic[M]):
    """Parsed models of cached objects, reused while the object is unchanged.

    A reconcile parses (and so validates) the run or config it reads from the
    cache; most reconciles see an object that has not changed since the last
    one (a child's event, a resync, the next round of the same pass). The
    model is kept per object key with the uid and resourceVersion it was
    parsed from, and used again only while both are the same: the API server
    gives every change a new resourceVersion. At most ``size`` models are
    kept (least recently used dropped first), and :meth:`forget` drops a
    deleted object's, so memory stays bounded whatever the number of objects.

    A model handed out may be handed out again: callers must not change it
    (the reconcilers derive new statuses, they never edit the parsed one).
    An object that does not validate raises ``ValidationError`` each time.
    """

    def __init__(self, model: type[M], size: int = 256) -> None:
        if size < 1:
            raise ValueError("size must be at least 1")
        self.model = model
        self.size = size
        self._items: OrderedDict[str, tuple[str, str, M]] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._items)

    def parse(self, key: str, raw: Mapping[str, Any]) -> M:
        """``model.model_validate(raw)``, or the model parsed from the same version before."""
        meta = raw.get("metadata") or {}
        uid, version = meta.get("uid"), meta.get("resourceVersion")
        if not uid or not version:
            return self.model.model_validate(raw)  # not from the API server: never reused
        found = self._items.get(key)
        if found is not None and found[0] == uid and found[1] == version:
            self._items.move_to_end(key)
            self.hits += 1
            return found[2]
        self.misses += 1
        parsed = self.model.model_validate(raw)
        self._items[key] = (uid, version, parsed)
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            self._items.popitem(last=False)
        return parsed

    def forget(self, key: str) -> None:
        self._items.pop(key, None)
