"""Storage providers, found by the key of the contract's ``input``/``output`` entry.

The contract's ``input`` and ``output`` are maps with one key naming the provider
(``{"krateo": {...}}``, ``{"http": {...}}``); the value is the provider's own
settings, passed through unmodified by the controller.

**Adding a provider** is adding one module here, named for its key, that defines
``from_settings(settings, role, parameters)`` returning an object with
``prepare``, ``load_rows`` and ``store`` (:class:`~runner.storage.base.StorageProvider`).
Nothing else changes: :func:`provider_keys` lists this package's modules, and
:func:`resolve` imports the one the contract names. Modules whose name starts
with ``_`` are not providers, nor are the parts the providers share:
:mod:`runner.storage.base`, :mod:`runner.storage.endpoint`,
:mod:`runner.storage.transport` and :mod:`runner.storage.jsonhttp`.

The input entry's join keys (``columns``, ``keyColumn``, ``passthroughColumns``;
:mod:`runner.join`) are the runner's, not the provider's: :func:`resolve` takes
them out of the settings before the provider sees them, so every provider has
them, and :func:`selection` parses them. A provider whose rows are objects with
named columns (typed rows from a database or a columnar file) sets the class
attribute ``named_rows = True``: without join keys every column is then a
feature, in the first row's order. A provider that holds something open (a
database connection) may define ``async close()``; the runner calls it when the
run ends (:func:`close`). ``ctx.part`` (:class:`~runner.storage.base.StorageContext`)
is the pod's shard, for a provider that keys an unpaged run's output by position.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from typing import Any

from runner.join import JOIN_KEYS, Selection, split_settings
from runner.storage.base import Role, StorageProvider

_NOT_PROVIDERS = frozenset({"base", "endpoint", "jsonhttp", "transport"})


def provider_keys() -> list[str]:
    return sorted(
        module.name
        for module in pkgutil.iter_modules(__path__)
        if not module.name.startswith("_") and module.name not in _NOT_PROVIDERS
    )


def _entry(entry: Mapping[str, Any], role: Role) -> tuple[str, Any]:
    known = provider_keys()
    if not entry:
        raise ValueError(f"{role}: no storage provider given (one of: {', '.join(known)})")
    if len(entry) > 1:
        raise ValueError(f"{role}: one storage provider expected, got {sorted(entry)}")
    ((key, settings),) = entry.items()
    if key not in known:
        raise ValueError(f"{role}: unknown storage provider {key!r} (known: {', '.join(known)})")
    return key, settings


def selection(entry: Mapping[str, Any], role: Role = "input") -> Selection | None:
    """The join keys of an ``input`` entry (None without any); ValueError when they are wrong."""
    key, settings = _entry(entry, role)
    given = sorted(set(settings) & set(JOIN_KEYS)) if isinstance(settings, Mapping) else []
    if role == "output":
        if given:
            raise ValueError(
                f"output.{key}: {', '.join(given)} belong to the input entry: they say which "
                "input columns feed the model and which ones each output row carries"
            )
        return None
    try:
        return split_settings(settings)[1]
    except ValueError as error:
        raise ValueError(f"{role}.{key}: {error}") from None


async def close(*providers: StorageProvider) -> None:
    """Close what the providers hold open (a database connection); most hold nothing."""
    for provider in providers:
        closer = getattr(provider, "close", None)
        if closer is not None:
            await closer()


def resolve(
    entry: Mapping[str, Any], role: Role, parameters: Mapping[str, str] | None
) -> StorageProvider:
    """The provider for a contract ``input``/``output`` entry; ValueError when it is wrong.

    The join keys are checked (:func:`selection`) and taken out of the settings.
    """
    selection(entry, role)
    key, settings = _entry(entry, role)
    settings, _ = split_settings(settings)
    module = importlib.import_module(f"{__name__}.{key}")
    try:
        provider: StorageProvider = module.from_settings(settings, role, parameters or {})
    except ValueError as error:
        raise ValueError(f"{role}.{key}: {error}") from None
    return provider
