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
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from typing import Any

from runner.storage.base import Role, StorageProvider

_NOT_PROVIDERS = frozenset({"base", "endpoint", "jsonhttp", "transport"})


def provider_keys() -> list[str]:
    return sorted(
        module.name
        for module in pkgutil.iter_modules(__path__)
        if not module.name.startswith("_") and module.name not in _NOT_PROVIDERS
    )


def resolve(
    entry: Mapping[str, Any], role: Role, parameters: Mapping[str, str] | None
) -> StorageProvider:
    """The provider for a contract ``input``/``output`` entry; ValueError when it is wrong."""
    known = provider_keys()
    if not entry:
        raise ValueError(f"{role}: no storage provider given (one of: {', '.join(known)})")
    if len(entry) > 1:
        raise ValueError(f"{role}: one storage provider expected, got {sorted(entry)}")
    ((key, settings),) = entry.items()
    if key not in known:
        raise ValueError(f"{role}: unknown storage provider {key!r} (known: {', '.join(known)})")
    module = importlib.import_module(f"{__name__}.{key}")
    try:
        provider: StorageProvider = module.from_settings(settings, role, parameters or {})
    except ValueError as error:
        raise ValueError(f"{role}.{key}: {error}") from None
    return provider
