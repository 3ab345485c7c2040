"""The streaming path's pure parts: paging settings, keys, answers, messages."""

from __future__ import annotations

import gc
from typing import Any, ClassVar

import orjson
import pytest

from contract.termination import RunResult, success_message
from runner import decoding, storage
from runner.retry import Deadline
from runner.storage.base import (
    Paging,
    Partition,
    StorageContext,
    StorageRejected,
    Stored,
    keyed_arguments,
    paging_arguments,
)
from runner.storage.transport import Answer, next_from, page_from, stored_from
from runner.streaming import StreamStats, missing_part

pytestmark = pytest.mark.unit

REF = {"endpointRef": {"name": "s"}, "path": "/compute/sklearninput", "verb": "POST"}


def answer(body: Any) -> Answer:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    return Answer("POST", "http://s/x", 200, "application/json", raw)


def context() -> StorageContext:
    return StorageContext(
        session=None,
        secrets=None,
        namespace="ns",
        job_id="run-uid",
        pod_uid="pod",
        parameters={},
        deadline=Deadline(None),
        log=None,
    )


@pytest.mark.parametrize("key", ["krateo", "http"])
def test_paging_is_read_from_the_input_entry_of_either_provider(key: str) -> None:
    settings: dict[str, Any] = (
        {"api": REF, "paging": {"pageSize": 500}}
        if key == "krateo"
        else {"secretRef": {"name": "s"}, "paging": {"pageSize": 500, "totalField": "meta.n"}}
    )
    provider = storage.resolve({key: settings}, "input", {})
    expected = Paging(page_size=500, total_field="meta.n" if key == "http" else "total")
    assert getattr(provider, "paging", None) == expected


def test_without_paging_the_input_is_one_read_as_upstream() -> None:
    provider = storage.resolve({"krateo": {"api": REF}}, "input", {})
    assert getattr(provider, "paging", "absent") is None


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"pageSize": 0}, "pageSize: Input should be greater than or equal to 1"),
        ({"pageSize": 10, "cursor": "x"}, "cursor: Extra inputs are not permitted"),
        ({"pageSize": 10, "pagesInFlight": 0}, "pagesInFlight: Input should be greater"),
    ],
)
def test_bad_paging_is_a_contract_error(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        storage.resolve({"krateo": {"api": REF, "paging": settings}}, "input", {})


def test_a_paged_input_may_not_have_a_parameter_named_like_a_paging_argument() -> None:
    with pytest.raises(ValueError, match=r"\['offset'\]"):
        storage.resolve(
            {"krateo": {"api": REF, "paging": {"pageSize": 10}}}, "input", {"offset": "3"}
        )


def test_a_shard_is_the_positions_congruent_to_its_index() -> None:
    part = Partition(index=2, count=4)
    assert [part.position(k) for k in range(3)] == [2, 6, 10]
    assert paging_arguments(5, 100, part) == {
        "offset": "5",
        "limit": "100",
        "shard_index": "2",
        "shard_count": "4",
    }


def test_a_chunk_key_names_the_run_the_shard_and_the_first_rows_position() -> None:
    assert keyed_arguments(context(), 10, Partition(1, 3)) == {
        "predictions_offset": "10",
        "shard_index": "1",
        "shard_count": "3",
        "idempotency_key": "run-uid/1/31",
    }


def test_a_page_answer_gives_rows_and_maybe_the_shards_total() -> None:
    paging = Paging(page_size=2)
    page = page_from(answer({"result": [[1.0], [2.0]], "total": 7}), "result", paging, 4)
    assert (page.offset, page.rows, page.total) == (4, [[1.0], [2.0]], 7)
    assert page_from(answer({"result": []}), "result", paging, 0).total is None
    assert page_from(answer({"result": [], "total": "7"}), "result", paging, 0).total is None


class CountingAnswer(Answer):
    """An answer that counts how often its body is decoded."""

    decodes: ClassVar[list[int]] = []

    def json(self) -> Any:
        self.decodes.append(1)
        return super().json()


def test_a_page_answer_is_decoded_once() -> None:
    # Decoding a page of 10,000 rows is most of the runner's own cost per row.
    CountingAnswer.decodes.clear()
    body = orjson.dumps({"result": [[1.0, 2.0]] * 3, "total": 3})
    page = page_from(
        CountingAnswer("GET", "http://s/x", 200, "application/json", body),
        "result",
        Paging(page_size=3),
        0,
    )
    assert (len(page.rows), page.total) == (3, 3)
    assert CountingAnswer.decodes == [1]


def test_decoding_a_page_sets_off_no_collection_and_leaves_the_collector_on() -> None:
    body = orjson.dumps({"rows": [[float(i), 1.0, 2.0, 3.0] for i in range(20_000)]})
    passes: list[str] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            passes.append(phase)

    assert gc.isenabled()
    gc.callbacks.append(seen)
    try:
        rows = decoding.loads(body)["rows"]
    finally:
        gc.callbacks.remove(seen)
    # 20,000 new lists would set off ~28 young passes (threshold 700) with it on.
    assert len(rows) == 20_000
    assert passes == []
    assert gc.isenabled()
    with pytest.raises(orjson.JSONDecodeError):
        decoding.loads(b"not json")
    assert gc.isenabled()


def test_a_stream_keeps_the_collector_off_its_rows_and_collects_cycles_every_n_chunks() -> None:
    import weakref

    class Node:
        other: Any = None

    passes: list[int] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            passes.append(info["generation"])

    assert gc.isenabled()
    gc.callbacks.append(seen)
    try:
        with decoding.StreamCollector(every=3) as collector:
            assert not gc.isenabled()
            pages = [[[float(i), 1.0] for i in range(5_000)] for _ in range(4)]
            cycle = Node()
            cycle.other = cycle
            dead = weakref.ref(cycle)
            del cycle
            collector.chunk_stored()
            collector.chunk_stored()
            # No pass over 20,000 new lists, and the cycle waits for the third chunk.
            assert passes == []
            assert dead() is not None
            collector.chunk_stored()
            assert passes == [2]
            assert dead() is None
            assert len(pages) == 4
    finally:
        gc.callbacks.remove(seen)
    assert gc.isenabled()


def test_a_process_with_the_collector_off_keeps_it_off_with_no_passes() -> None:
    gc.disable()
    try:
        with decoding.StreamCollector(every=1) as collector:
            collector.chunk_stored()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_write_answer_may_count_what_was_stored() -> None:
    assert stored_from(answer({"stored": 8, "duplicates": 2})) == Stored(8, 2)
    assert stored_from(answer(b"")) == Stored()
    assert stored_from(answer({"ok": True})) == Stored()


def test_a_resume_answer_must_say_the_next_row() -> None:
    assert next_from(answer({"stored": 30, "next": 30})) == 30
    with pytest.raises(StorageRejected, match="without a 'next' row number"):
        next_from(answer({"stored": 30}))
    with pytest.raises(StorageRejected, match="not JSON"):
        next_from(answer(b"Traceback: no such table"))


def test_a_failed_streaming_run_says_what_is_stored_and_what_is_missing() -> None:
    assert missing_part(StreamStats(), Partition()) == (
        "(stored: nothing of the input; missing from row 0)"
    )
    assert missing_part(StreamStats(stored_next=300), Partition(1, 4)) == (
        "(stored: rows 0..299 of shard 1/4; missing from row 300)"
    )


def test_the_result_of_an_unpaged_run_is_unchanged() -> None:
    assert success_message(RunResult(150, 150, 1.2345)) == (
        '{"rows":150,"predictions":150,"durationSeconds":1.234}'
    )


def test_the_result_of_a_streaming_run_says_how_many_rows_were_resumed() -> None:
    result = RunResult(1000, 1000, 2.0, resumed_rows=900, pages=2, chunks=1, duplicates=0)
    assert orjson.loads(success_message(result)) == {
        "rows": 1000,
        "predictions": 1000,
        "durationSeconds": 2.0,
        "resumedRows": 900,
        "pages": 2,
        "chunks": 1,
        "duplicates": 0,
    }
