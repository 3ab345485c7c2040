"""The informer's cache: objects by key, with named indexes kept in step. Pure.

client-go's thread-safe store and indexer: :class:`Store` holds each object
under its key (``namespace/name``), optionally packed as its JSON, and keeps
every named index (an index function maps an object to values: "runs by
config", "children by their run's uid") in step with every change.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import orjson

from kubeclient.objects import object_key
from kubeclient.resources import Obj

# Aliases, because Store.list and Informer.list shadow the builtin in their classes.
ObjList = list[Obj]
KeyList = list[str]
IndexFunc = Callable[[Obj], Iterable[str]]


class Store:
    """The cache: objects by key, plus named indexes kept in step on every change.

    ``packed``: each object is kept as its JSON (orjson) and parsed again on
    every read. A parsed object takes about three times its JSON in Python
    dicts and strings (a projected run with its ConfigMap, Job and pod: 3.9 KB
    of JSON, 11 KB parsed), and a read costs a parse of a few KB (tens of
    microseconds). Every read then hands out a new dict, so no reader can
    change the cache by changing what it was given. The indexes are computed
    from the objects as given and hold keys only.
    """

    def __init__(
        self, indexers: Mapping[str, IndexFunc] | None = None, *, packed: bool = False
    ) -> None:
        # key -> the object, or its JSON when packed.
        self._items: dict[str, Any] = {}
        self._packed = packed
        self._indexers: dict[str, IndexFunc] = {}
        # index name -> index value -> object key, or keys when more than one
        # (most values, a run's uid, name one object: a set each would be most
        # of the index's memory).
        self._indices: dict[str, dict[str, str | set[str]]] = {}
        for name, func in (indexers or {}).items():
            self.add_indexer(name, func)

    def _load(self, value: Any) -> Obj:
        if self._packed:
            loaded: Obj = orjson.loads(value)
            return loaded
        stored: Obj = value
        return stored

    def add_indexer(self, name: str, func: IndexFunc) -> None:
        if name in self._indexers:
            raise ValueError(f"index {name!r} exists already")
        self._indexers[name] = func
        index: dict[str, str | set[str]] = {}
        for key, value in self._items.items():
            for indexed in func(self._load(value)):
                _index_add(index, indexed, key)
        self._indices[name] = index

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def get(self, key: str) -> Obj | None:
        value = self._items.get(key)
        return None if value is None else self._load(value)

    def list_keys(self) -> KeyList:
        return list(self._items)

    def list(self, namespace: str | None = None) -> list[Obj]:
        if namespace is None:
            return [self._load(value) for value in self._items.values()]
        prefix = f"{namespace}/"
        return [self._load(value) for key, value in self._items.items() if key.startswith(prefix)]

    def index_keys(self, index: str, value: str) -> KeyList:
        """Keys of the objects whose ``index`` function yields ``value``, sorted."""
        found = self._index(index).get(value, ())
        return [found] if isinstance(found, str) else sorted(found)

    def index_count(self, index: str, value: str) -> int:
        """How many objects the ``index`` function maps to ``value`` (nothing parsed)."""
        found = self._index(index).get(value, ())
        return 1 if isinstance(found, str) else len(found)

    def index_values(self, index: str) -> KeyList:
        """Every value the ``index`` function yields for some cached object."""
        return list(self._index(index))

    def _index(self, index: str) -> dict[str, str | set[str]]:
        try:
            return self._indices[index]
        except KeyError:
            raise KeyError(f"no index named {index!r}") from None

    def by_index(self, index: str, value: str) -> ObjList:
        return [self._load(self._items[key]) for key in self.index_keys(index, value)]

    def upsert(self, obj: Obj) -> Obj | None:
        """Store ``obj``; the object it replaced, if any."""
        key = object_key(obj)
        stored = self._items.get(key)
        old = None if stored is None else self._load(stored)
        if old is not None:
            self._unindex(key, old)
        self._items[key] = _pack(obj) if self._packed else obj
        self._index_obj(key, obj)
        return old

    def remove(self, key: str) -> Obj | None:
        stored = self._items.pop(key, None)
        if stored is None:
            return None
        old = self._load(stored)
        self._unindex(key, old)
        return old

    def _index_obj(self, key: str, obj: Obj) -> None:
        for name, func in self._indexers.items():
            index = self._indices[name]
            for value in func(obj):
                _index_add(index, value, key)

    def _unindex(self, key: str, obj: Obj) -> None:
        for name, func in self._indexers.items():
            index = self._indices[name]
            for value in func(obj):
                keys = index.get(value)
                if keys is None:
                    continue
                if isinstance(keys, str):
                    if keys == key:
                        del index[value]
                    continue
                keys.discard(key)
                if len(keys) == 1:
                    index[value] = next(iter(keys))
                elif not keys:
                    del index[value]


def _pack(obj: Obj) -> bytes:
    """``obj`` as JSON, in a bytes object of its own size.

    orjson hands back its whole output buffer, several KB for any object
    (16 KB measured for a 1.5 KB one): copied, the kept bytes are the JSON's.
    """
    return bytes(memoryview(orjson.dumps(obj)))


def _index_add(index: dict[str, str | set[str]], value: str, key: str) -> None:
    keys = index.get(value)
    if keys is None:
        index[value] = key
    elif isinstance(keys, str):
        if keys != key:
            index[value] = {keys, key}
    else:
        keys.add(key)
