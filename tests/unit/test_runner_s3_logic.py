"""The s3 provider's pure parts: settings, client options, layout, formats (no server)."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from runner.storage import resolve
from runner.storage._s3formats import (
    FormatError,
    RangeFile,
    StreamFile,
    TextOptions,
    chunk_table,
    decode_row_group,
    encode_chunk,
    footer_range,
    open_text,
    parquet_metadata,
    records_of,
    row_group_range,
)
from runner.storage._s3layout import (
    Encoding,
    Unit,
    chunk_key,
    encoding_of,
    hidden,
    parse_chunk,
    run_manifest,
    shard_manifest,
    shard_total,
    shard_units,
    stored_prefix,
)
from runner.storage.base import Partition, StorageRejected
from runner.storage.s3 import (
    Credentials,
    S3Provider,
    Settings,
    credentials_from_secret,
    failure,
    from_settings,
    store_options,
)

pytestmark = pytest.mark.unit


def test_encoding_from_settings_or_extension() -> None:
    assert encoding_of("a/b.csv", None, None) == Encoding("csv", "none")
    assert encoding_of("a/b.csv.gz", None, None) == Encoding("csv", "gzip")
    assert encoding_of("b.jsonl.zst", None, None) == Encoding("jsonl", "zstd")
    assert encoding_of("b.ndjson", None, None) == Encoding("jsonl", "none")
    assert encoding_of("x/part-0.parquet", None, None) == Encoding("parquet", "none")
    # The settings win over the name.
    assert encoding_of("dump.txt", "csv", "gzip") == Encoding("csv", "gzip")
    assert encoding_of("b.csv.gz", None, "none") == Encoding("csv", "none")
    with pytest.raises(ValueError, match=r"cannot tell the format of 'data/rows.txt'"):
        encoding_of("data/rows.txt", None, None)


def test_prefix_listing_skips_folders_and_hidden_names() -> None:
    assert hidden("out/run/_manifest.json")
    assert hidden("in/_SUCCESS")
    assert hidden("in/.keep")
    assert hidden("in/sub/")
    assert not hidden("in/part_0.csv")


def test_shards_take_disjoint_units_the_same_way_every_time() -> None:
    units = [Unit("a.parquet", g, 10) for g in range(5)] + [Unit("b.csv"), Unit("c.csv")]
    shards = [shard_units(units, Partition(i, 3)) for i in range(3)]
    assert [u for s in shards for u in s] != units  # interleaved, not cut in blocks
    assert sorted((u.key, u.row_group or 0) for s in shards for u in s) == sorted(
        (u.key, u.row_group or 0) for u in units
    )
    assert all(len(set(s)) == len(s) for s in shards)
    assert shards == [shard_units(units, Partition(i, 3)) for i in range(3)]
    assert shards[0] == [units[0], units[3], units[6]]
    assert shard_total(shards[1][:2]) == 20
    assert shard_total(shards[0]) is None  # c.csv's row count is not known


def test_chunk_keys_sort_in_row_order_and_parse_back() -> None:
    part = Partition(1, 4)
    first = chunk_key("out/", "run-1", part, 0, 100, ".parquet")
    second = chunk_key("out", "run-1", part, 100, 50, ".parquet")
    assert first == "out/run-1/shard-00001-of-00004/part-000000000000-000000000100.parquet"
    assert first < second
    parsed = parse_chunk(second)
    assert parsed is not None
    assert (parsed.start, parsed.end, parsed.rows) == (100, 150, 50)
    assert parse_chunk("out/run-1/shard-00001-of-00004/_manifest.json") is None
    assert chunk_key("", "r", Partition(), 0, 1, ".csv").startswith("r/shard-00000-of-00001/")


def test_resume_counts_only_a_gapless_prefix_of_this_format() -> None:
    def key(start: int, end: int, suffix: str = ".parquet") -> str:
        return f"p/r/shard-00000-of-00001/part-{start:012d}-{end:012d}{suffix}"

    keys = [key(0, 10), key(10, 20), key(30, 40), key(20, 25, ".csv"), "p/r/x/_manifest.json"]
    stored = stored_prefix(keys, ".parquet")
    assert [(c.start, c.end) for c in stored] == [(0, 10), (10, 20)]
    assert stored_prefix([], ".parquet") == []
    assert stored_prefix([key(5, 10)], ".parquet") == []


def test_manifests_are_the_same_bytes_for_the_same_chunks() -> None:
    part = Partition(0, 2)
    keys = [chunk_key("p", "r", part, 0, 10, ".parquet"), chunk_key("p", "r", part, 10, 3, ".pq")]
    chunks = stored_prefix([*keys, chunk_key("p", "r", part, 10, 3, ".parquet")], ".parquet")
    body = shard_manifest("r", part, "parquet", chunks)
    assert body == shard_manifest("r", part, "parquet", list(chunks))
    document = orjson.loads(body)
    assert document["rows"] == 13
    assert [p["rows"] for p in document["parts"]] == [10, 3]
    other = orjson.loads(shard_manifest("r", Partition(1, 2), "parquet", chunks[:1]))
    whole = orjson.loads(run_manifest("r", 2, [other, document]))
    assert whole["rows"] == 23
    assert [s["shardIndex"] for s in whole["shards"]] == [0, 1]
    assert whole["runUid"] == "r"


# -- settings -------------------------------------------------------------------------


def test_input_names_its_objects_exactly_one_way() -> None:
    with pytest.raises(ValueError, match="exactly one of key, prefix or keys"):
        from_settings({"bucket": "b"}, "input", {})
    with pytest.raises(ValueError, match=r"\(got key, prefix\)"):
        from_settings({"bucket": "b", "key": "a.csv", "prefix": "x"}, "input", {})
    provider = from_settings({"bucket": "b", "prefix": "in/"}, "input", {})
    assert provider.paging is not None
    assert provider.paging.page_size == 10_000


def test_output_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="needs a prefix"):
        from_settings({"bucket": "b"}, "output", {})
    with pytest.raises(ValueError, match="key, paging only apply to an s3 input"):
        from_settings(
            {"bucket": "b", "prefix": "o", "key": "k", "paging": {"pageSize": 5}}, "output", {}
        )
    with pytest.raises(ValueError, match="Parquet output is compressed inside"):
        from_settings({"bucket": "b", "prefix": "o", "compression": "gzip"}, "output", {})
    provider = from_settings(
        {"bucket": "b", "prefix": "o", "format": "jsonl", "compression": "gzip"}, "output", {}
    )
    assert provider.suffix == ".jsonl.gz"
    assert provider.paging is None


def test_resolve_names_the_bad_setting() -> None:
    with pytest.raises(ValueError, match=r"input\.s3: endpointUrl: .*http\(s\) URL"):
        resolve({"s3": {"bucket": "b", "key": "k", "endpointUrl": "ftp://x"}}, "input", {})
    with pytest.raises(ValueError, match="must not carry credentials"):
        resolve({"s3": {"bucket": "b", "key": "k", "endpointUrl": "https://u:p@x"}}, "input", {})
    with pytest.raises(ValueError, match="unknown type 'decimal'"):
        resolve({"s3": {"bucket": "b", "key": "k", "columnTypes": {"a": "decimal"}}}, "input", {})
    with pytest.raises(ValueError, match="format"):
        resolve({"s3": {"bucket": "b", "key": "k", "format": "xml"}}, "input", {})


def test_client_options_for_a_private_endpoint_and_for_aws() -> None:
    private = Settings.model_validate(
        {"bucket": "b", "endpointUrl": "http://127.0.0.1:9000/", "region": "eu-west-1"}
    )
    options = store_options(private, Credentials("AK", "SK"), "PEM")
    assert options["config"] == {
        "region": "eu-west-1",
        "endpoint": "http://127.0.0.1:9000",
        "virtual_hosted_style_request": False,
    }
    assert options["client_options"]["allow_http"] is True
    assert options["client_options"]["root_certificate"] == "PEM"
    assert options["credential_provider"]() == {
        "access_key_id": "AK",
        "secret_access_key": "SK",
        "token": None,
        "expires_at": None,
    }
    hosted = Settings.model_validate(
        {"bucket": "b", "endpointUrl": "https://s3.example:8443", "pathStyle": False}
    )
    assert store_options(hosted, None, None)["config"]["endpoint"] == "https://b.s3.example:8443"
    aws = store_options(Settings.model_validate({"bucket": "b"}), None, None)
    # No Secret: no credential provider, so the AWS environment (IRSA, Pod Identity) applies.
    assert "credential_provider" not in aws
    assert aws["config"] == {"virtual_hosted_style_request": True}


def test_a_secret_without_both_keys_is_refused_by_name() -> None:
    with pytest.raises(StorageRejected, match="Secret ns/s has no AWS_SECRET_ACCESS_KEY"):
        credentials_from_secret({"AWS_ACCESS_KEY_ID": "AK"}, "Secret ns/s")
    found = credentials_from_secret(
        {"AWS_ACCESS_KEY_ID": "AK", "AWS_SECRET_ACCESS_KEY": "SK", "AWS_SESSION_TOKEN": "T"}, "x"
    )
    assert found == Credentials("AK", "SK", "T")


def test_failures_are_rejected_only_when_asking_again_cannot_help() -> None:
    from obstore.exceptions import GenericError, NotFoundError, PermissionDeniedError

    assert isinstance(failure(NotFoundError("gone"), "s3://b/k"), StorageRejected)
    assert isinstance(failure(PermissionDeniedError("no"), "s3://b/k"), StorageRejected)
    refused = failure(GenericError("Client error with status 400 Bad Request: x"), "w")
    assert isinstance(refused, StorageRejected)
    assert "refused (400)" in refused.message
    busy = failure(GenericError("Server error with status 503 Slow Down"), "w")
    assert not isinstance(busy, StorageRejected)
    throttled = failure(GenericError("Client error with status 429 Too Many"), "w")
    assert not isinstance(throttled, StorageRejected)


def test_a_400_without_a_reason_names_the_region_and_the_stores_words_are_unescaped() -> None:
    from obstore.exceptions import GenericError

    head = GenericError("Error performing HEAD - Server returned non-2xx status code: 400 Bad")
    said = failure(head, "s3://b/k", "eu-west-3").message
    assert said.startswith("s3://b/k: refused (400): the store gave no reason")
    assert "requests are signed for eu-west-3" in said
    assert "the default region" in failure(head, "s3://b/k").message
    listing = GenericError(
        "status code: 400 Bad Request: <Error><Code>AuthorizationHeaderMalformed</Code>"
        "<Message>the region &#34;eu-west-3&#34; is wrong</Message></Error>"
    )
    assert failure(listing, "w", "eu-west-3").message == (
        'w: refused (400): AuthorizationHeaderMalformed: the region "eu-west-3" is wrong'
    )
    full = GenericError(
        "status code: 507 Insufficient Storage: <Error><Code>InsufficientStorage</Code>"
        "<Message>No space left on device.</Message></Error>"
    )
    out_of_space = failure(full, "writing s3://b/k")
    assert not isinstance(out_of_space, StorageRejected)
    assert out_of_space.message == (
        "writing s3://b/k: InsufficientStorage: No space left on device."
    )


# -- formats --------------------------------------------------------------------------


def _parquet(table: pa.Table, row_group_size: int) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=row_group_size)
    return bytes(sink.getvalue())


def test_parquet_row_groups_decode_from_their_own_byte_ranges_only() -> None:
    table = pa.table({"a": [float(i) for i in range(1000)], "b": list(range(1000))})
    data = _parquet(table, 300)
    start, end = footer_range(len(data))
    metadata = parquet_metadata(data[start:end], len(data), "x.parquet")
    assert [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)] == [
        300,
        300,
        300,
        100,
    ]
    rows: list[Any] = []
    for group in range(metadata.num_row_groups):
        first, last = row_group_range(metadata, group)
        assert last - first < len(data) // 2
        # No fetch function: a read outside the range would fail.
        source = RangeFile(len(data), None, "x.parquet")
        source.add(first, data[first:last])
        rows.extend(records_of(decode_row_group(metadata, group, source)))
    assert rows == [{"a": float(i), "b": i} for i in range(1000)]


def test_a_file_that_is_not_parquet_is_named_as_such() -> None:
    with pytest.raises(FormatError, match="not a Parquet file"):
        parquet_metadata(b"a,b\n1,2\n", 8, "x.csv")


async def _pieces(data: bytes, size: int) -> AsyncIterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


def _next(reader: Any) -> Any:
    try:
        return reader.read_next_batch()
    except StopIteration:
        return None


async def _read_all(blob: bytes, encoding: Encoding, options: TextOptions) -> pa.Table:
    source = StreamFile(_pieces(blob, 7000), asyncio.get_running_loop())
    reader = await asyncio.to_thread(open_text, source, encoding, options, None)
    batches = []
    while (batch := await asyncio.to_thread(_next, reader)) is not None:
        batches.append(batch)
    return pa.Table.from_batches(batches, schema=reader.schema)


@pytest.mark.parametrize("compression", ["none", "gzip", "zstd"])
async def test_csv_streams_in_pieces_compressed_or_not(compression: str) -> None:
    text = b"x,y\n" + b"".join(f"{i},{i / 4}\n".encode() for i in range(20000))
    blob = {
        "none": text,
        "gzip": gzip.compress(text),
        "zstd": pa.compress(text, codec="zstd", asbytes=True),
    }[compression]
    table = await _read_all(blob, Encoding("csv", compression), TextOptions())
    assert table.num_rows == 20000
    assert table.schema.types == [pa.int64(), pa.float64()]
    assert records_of(table.slice(3, 1)) == [{"x": 3, "y": 0.75}]


async def test_csv_column_types_can_be_given() -> None:
    text = b"id,x\n007,1\n008,2\n"
    table = await _read_all(text, Encoding("csv", "none"), TextOptions({"id": "string"}))
    assert table.column("id").to_pylist() == ["007", "008"]


async def test_json_lines_stream_with_vectors() -> None:
    text = b"".join(orjson.dumps({"v": [i, i + 1.5]}) + b"\n" for i in range(5000))
    table = await _read_all(text, Encoding("jsonl", "none"), TextOptions())
    assert table.num_rows == 5000
    assert records_of(table.slice(2, 1)) == [{"v": [2.0, 3.5]}]


def test_chunks_are_the_same_bytes_when_written_again() -> None:
    for fmt, compression in (("parquet", "none"), ("jsonl", "gzip"), ("csv", "zstd")):
        first = encode_chunk(chunk_table([0.0, 1.0, 2.0], 3, 10, 1), fmt, compression)
        again = encode_chunk(chunk_table([0.0, 1.0, 2.0], 3, 10, 1), fmt, compression)
        assert first == again, fmt


def test_chunk_rows_carry_their_key_and_predictions() -> None:
    table = chunk_table([0.0, 1.0, 2.0], 3, 10, 1)
    assert table.to_pylist()[0] == {"shard": 1, "row": 10, "prediction": 0.0}
    several = chunk_table([1, 2, 3, 4], 2, 0, 0)
    assert several.column("prediction").to_pylist() == [[1, 2], [3, 4]]
    joined = chunk_table([{"id": "a", "prediction": 1}, {"id": "b", "prediction": 2}], 2, 5, 0)
    assert joined.to_pylist()[1] == {"shard": 0, "row": 6, "id": "b", "prediction": 2}
    with pytest.raises(FormatError, match="3 predictions for 2 rows"):
        chunk_table([1, 2, 3], 2, 0, 0)
    lines = encode_chunk(several, "csv", "none").decode().splitlines()
    assert lines == ['"shard","row","prediction"', '0,0,"[1,2]"', '0,1,"[3,4]"']


@pytest.mark.parametrize("kind", ["objects", "table"])
def test_joined_outputs_keep_their_count_and_leave_the_chunks_columns_alone(kind: str) -> None:
    def output(rows: list[dict[str, Any]]) -> Any:
        return rows if kind == "objects" else pa.Table.from_pylist(rows)

    table = chunk_table(output([{"id": "a", "p": 1}, {"id": "b", "p": 2}]), 2, 7, 3)
    assert table.column_names == ["shard", "row", "id", "p"]
    assert table.to_pylist() == [
        {"shard": 3, "row": 7, "id": "a", "p": 1},
        {"shard": 3, "row": 8, "id": "b", "p": 2},
    ]
    with pytest.raises(FormatError, match="1 output rows for 2 input rows"):
        chunk_table(output([{"id": "a"}]), 2, 0, 0)
    with pytest.raises(FormatError, match=r"output columns \['row'\] clash with the chunk's own"):
        chunk_table(output([{"row": 1}, {"row": 2}]), 2, 0, 0)


def test_the_provider_needs_prepare_before_it_talks() -> None:
    provider = from_settings({"bucket": "b", "key": "k.csv"}, "input", {})
    assert isinstance(provider, S3Provider)
    with pytest.raises(RuntimeError, match="prepare"):
        _ = provider.client


def test_a_403_without_a_reason_names_both_causes() -> None:
    from obstore.exceptions import PermissionDeniedError

    head = PermissionDeniedError(
        "Error performing HEAD http://s/b/k - Server returned non-2xx status code: 403 Forbidden:"
    )
    said = failure(head, "s3://b/k").message
    assert said.startswith("s3://b/k: access denied (403): the store gave no reason")
    assert "the access key and secret do not match" in said
    assert "has no right on this bucket or object" in said


@pytest.mark.parametrize(
    "predictions",
    [[2**63, 1], [{"id": 1, "prediction": 1}, {"id": 2, "prediction": -(2**63) - 1}]],
    ids=["flat", "joined"],
)
def test_an_integer_beyond_64_bits_is_the_outputs_clear_refusal(predictions: list[Any]) -> None:
    # It was an OverflowError, which the provider did not take for a refusal.
    with pytest.raises(FormatError, match="integer beyond 64 bits"):
        chunk_table(predictions, 2, 0, 0)
