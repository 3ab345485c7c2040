"""The ``s3`` provider's layout: which objects a shard reads, where its chunks go. Pure.

No I/O here (the provider, :mod:`runner.storage.s3`, lists and moves the
objects); unit-tested without a server.

**Encodings.** An object's format is the entry's ``format``, else its extension:
``.csv`` is CSV, ``.jsonl``/``.ndjson``/``.json`` JSON Lines, ``.parquet``/``.pq``
Parquet; a last ``.gz``/``.gzip`` or ``.zst``/``.zstd`` says gzip or zstd
(``data.csv.gz``), unless the entry's ``compression`` says otherwise.

**Units and shards.** The input is a list of *units* in a fixed order: the
objects in the entry's order (a prefix's objects in key order), each Parquet
object split into its row groups. Shard ``s`` of ``c`` reads the units ``u`` with
``u % c == s``: disjoint, and the same split for the same input every time.

**Output keys.** Chunk ``[start, end)`` (the shard's row numbers) of shard ``s``
of ``c`` of run ``R`` is the object::

    <prefix>/<R>/shard-<s>-of-<c>/part-<start>-<end>.<ext>

with 5-digit shard numbers and 12-digit row numbers, so key order is row order.
A chunk written again gets the same key and the same bytes. When a shard has
stored every chunk it writes ``<prefix>/<R>/shard-<s>-of-<c>/_manifest.json``
(its parts, rows per part, the run's uid); the shard that finds every shard's
manifest present writes ``<prefix>/<R>/_manifest.json``, which marks the whole
output complete, as Hadoop's ``_SUCCESS`` does.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from runner.storage.base import Partition

# openai-batch: an OpenAI Batch API file, JSON Lines read and written line for line
# (never typed by Arrow), named by the entry's format only (its extension is .jsonl).
Format = Literal["csv", "jsonl", "parquet", "openai-batch"]
Compression = Literal["none", "gzip", "zstd"]
FORMATS: tuple[Format, ...] = ("csv", "jsonl", "parquet", "openai-batch")

_FORMAT_EXTENSIONS: dict[str, Format] = {
    ".csv": "csv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".parquet": "parquet",
    ".pq": "parquet",
}
_COMPRESSION_EXTENSIONS: dict[str, Compression] = {
    ".gz": "gzip",
    ".gzip": "gzip",
    ".zst": "zstd",
    ".zstd": "zstd",
}
# What an output object's name ends with, per format (and text compression).
OUTPUT_EXTENSIONS: dict[Format, str] = {
    "csv": ".csv",
    "jsonl": ".jsonl",
    "parquet": ".parquet",
    "openai-batch": ".jsonl",
}
COMPRESSED_EXTENSIONS: dict[Compression, str] = {"none": "", "gzip": ".gz", "zstd": ".zst"}

MANIFEST = "_manifest.json"
_CHUNK = re.compile(r"^part-(?P<start>\d{12})-(?P<end>\d{12})\.[a-z.]+$")
MANIFEST_VERSION = 1


@dataclass(frozen=True)
class Encoding:
    format: Format
    compression: Compression


def _suffix(name: str) -> str:
    dot = name.rfind(".")
    return name[dot:].lower() if dot > 0 else ""


def encoding_of(key: str, fmt: Format | None, compression: Compression | None) -> Encoding:
    """How object ``key`` is written (module docstring); ValueError naming it otherwise."""
    name = key.rsplit("/", 1)[-1]
    found: Compression = "none"
    suffix = _suffix(name)
    if suffix in _COMPRESSION_EXTENSIONS:
        found = _COMPRESSION_EXTENSIONS[suffix]
        name = name[: -len(suffix)]
        suffix = _suffix(name)
    chosen = fmt or _FORMAT_EXTENSIONS.get(suffix)
    if chosen is None:
        known = ", ".join(sorted(_FORMAT_EXTENSIONS))
        raise ValueError(
            f"cannot tell the format of {key!r} from its name (known extensions: {known}); "
            "set format: csv, jsonl or parquet"
        )
    return Encoding(chosen, compression or found)


def hidden(key: str) -> bool:
    """Keys a prefix listing skips: folders, and names starting with ``_`` or ``.``.

    So a run's own ``_manifest.json`` (or Hadoop's ``_SUCCESS``) under an input
    prefix is not read as data.
    """
    name = key.rsplit("/", 1)[-1]
    return not name or name.startswith(("_", "."))


def clean_prefix(prefix: str) -> str:
    """A prefix without its leading and trailing slashes (``""`` is the bucket's root)."""
    return prefix.strip("/")


@dataclass(frozen=True)
class Unit:
    """One piece a shard reads: an object, or one row group of a Parquet object."""

    key: str
    row_group: int | None = None
    rows: int | None = None  # known for a row group

    def describe(self, bucket: str) -> str:
        where = f"s3://{bucket}/{self.key}"
        return where if self.row_group is None else f"{where} (row group {self.row_group})"


def shard_units(units: Sequence[Unit], part: Partition) -> list[Unit]:
    """The units shard ``part`` reads: every ``count``-th from its index (module docstring)."""
    return list(units[part.index :: part.count])


def shard_total(units: Sequence[Unit]) -> int | None:
    """The rows of ``units`` when every one of them says (row groups do), else None."""
    total = 0
    for unit in units:
        if unit.rows is None:
            return None
        total += unit.rows
    return total


# -- output ---------------------------------------------------------------------------


def run_dir(prefix: str, run: str) -> str:
    prefix = clean_prefix(prefix)
    return f"{prefix}/{run}/" if prefix else f"{run}/"


def shard_dir(prefix: str, run: str, part: Partition) -> str:
    return f"{run_dir(prefix, run)}shard-{part.index:05d}-of-{part.count:05d}/"


def output_suffix(fmt: Format, compression: Compression) -> str:
    """An output object's extension: ``.parquet`` (compressed inside), ``.jsonl.gz``, ..."""
    if fmt == "parquet":
        return OUTPUT_EXTENSIONS[fmt]
    return OUTPUT_EXTENSIONS[fmt] + COMPRESSED_EXTENSIONS[compression]


def chunk_key(prefix: str, run: str, part: Partition, start: int, rows: int, suffix: str) -> str:
    """The key of the chunk holding the shard's rows ``[start, start + rows)``."""
    return f"{shard_dir(prefix, run, part)}part-{start:012d}-{start + rows:012d}{suffix}"


@dataclass(frozen=True)
class Chunk:
    key: str
    start: int
    end: int

    @property
    def rows(self) -> int:
        return self.end - self.start


def parse_chunk(key: str) -> Chunk | None:
    """The chunk ``key`` names, or None when it is not a chunk (a manifest, anything else)."""
    matched = _CHUNK.match(key.rsplit("/", 1)[-1])
    if matched is None:
        return None
    start, end = int(matched.group("start")), int(matched.group("end"))
    return Chunk(key, start, end) if end > start else None


def stored_prefix(keys: Iterable[str], suffix: str) -> list[Chunk]:
    """The chunks that cover the shard's rows from 0 without a gap, in row order.

    Only chunks of this output's format count (``suffix``); a chunk that does not
    start where the previous one ended ends the prefix (it cannot happen when
    chunks are written in order, as the runner writes them).
    """
    chunks = sorted(
        (c for k in keys if k.endswith(suffix) and (c := parse_chunk(k)) is not None),
        key=lambda c: (c.start, c.end),
    )
    covered: list[Chunk] = []
    next_row = 0
    for chunk in chunks:
        if chunk.start != next_row:
            if chunk.start < next_row:
                continue
            break
        covered.append(chunk)
        next_row = chunk.end
    return covered


def shard_manifest(run: str, part: Partition, fmt: Format, chunks: Sequence[Chunk]) -> bytes:
    """A shard's ``_manifest.json``: the same bytes for the same chunks."""
    document: dict[str, Any] = {
        "version": MANIFEST_VERSION,
        "runUid": run,
        "shardIndex": part.index,
        "shardCount": part.count,
        "format": fmt,
        "rows": sum(c.rows for c in chunks),
        "parts": [{"key": c.key, "firstRow": c.start, "rows": c.rows} for c in chunks],
    }
    return orjson.dumps(document, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)


def run_manifest(run: str, count: int, shards: Sequence[dict[str, Any]]) -> bytes:
    """The run's ``_manifest.json`` from its ``count`` shard manifests (parsed)."""
    ordered = sorted(shards, key=lambda s: int(s["shardIndex"]))
    document: dict[str, Any] = {
        "version": MANIFEST_VERSION,
        "runUid": run,
        "shardCount": count,
        "format": ordered[0]["format"] if ordered else None,
        "rows": sum(int(s["rows"]) for s in ordered),
        "parts": [p for s in ordered for p in s["parts"]],
        "shards": [{"shardIndex": s["shardIndex"], "rows": s["rows"]} for s in ordered],
    }
    return orjson.dumps(document, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)


def shard_manifest_keys(prefix: str, run: str, count: int) -> list[str]:
    return [f"{shard_dir(prefix, run, Partition(i, count))}{MANIFEST}" for i in range(count)]
