"""JSON decoding of bulk data (pages of rows, model answers) kept away from the collector.

A storage page of 10,000 rows decodes to 10,000 lists (or dicts), each tracked
by CPython's cyclic garbage collector. Allocated in one burst, they set off a
young-generation pass every 700 allocations, and the pages still in flight are
promoted and walked again by every full pass: in a profile of the streaming
runner that was half of its own CPU per row. Decoded JSON holds no reference
cycle (it is a tree), so nothing is lost by not collecting during the decode:
:func:`loads` pauses the automatic collector for the decode only, and the
collector runs as usual afterwards (one young pass over the new objects).
"""

from __future__ import annotations

import gc
from typing import Any

import orjson


def loads(body: bytes | bytearray | memoryview | str) -> Any:
    """``orjson.loads(body)`` with the automatic collector paused meanwhile (module doc)."""
    if not gc.isenabled():
        return orjson.loads(body)
    gc.disable()
    try:
        return orjson.loads(body)
    finally:
        gc.enable()
