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


class StreamCollector:
    """The automatic collector off while a run streams; one full pass every ``every`` chunks.

    :func:`loads` keeps the collector out of a page's decode, but the page's
    rows, alive until their chunk is stored, were still walked by the young and
    middle passes that every 700 allocations set off (the model's answers, the
    HTTP machinery), and by full passes as they aged: the pages in flight are
    most of what a streaming runner holds. With the automatic collector off,
    reference counting frees the rows when their chunk is stored (decoded JSON
    has no cycles); what does form cycles elsewhere (asyncio, aiohttp) waits for
    the full pass this runs after every ``every`` stored chunks, so it stays
    bounded. A process that had the collector off keeps it off, with no passes.
    """

    def __init__(self, every: int = 10) -> None:
        self.every = every
        self.chunks = 0
        self._was_enabled = False

    def __enter__(self) -> StreamCollector:
        self._was_enabled = gc.isenabled()
        gc.disable()
        return self

    def __exit__(self, *_: object) -> None:
        if self._was_enabled:
            gc.enable()

    def chunk_stored(self) -> None:
        self.chunks += 1
        if self._was_enabled and self.chunks % self.every == 0:
            gc.collect()
