"""The streaming path: pages in, batches to the model as pages arrive, keyed chunks out.

A run streams when its input entry asks for paging (``paging: {pageSize: N}``
in a ``krateo`` or ``http`` entry); without it the runner reads the input in one
request and stores the predictions after the last batch, as upstream
(:func:`runner.app.execute`).

**Pipeline.** Three tasks joined by small queues:

1. the *reader* asks the input for the shard's pages one after the other
   (``offset`` = the shard's row number, ``limit`` = N; a page shorter than N
   is the last) and holds at most one page ahead;
2. the *dispatcher* cuts each page into batches and keeps ``concurrency``
   batches in flight across page boundaries (the model never waits for a page
   to finish), with at most ``paging.pagesInFlight`` (default 2) pages between
   "first batch sent" and "stored";
3. the *writer* stores each page's predictions, in page order, as one keyed
   chunk (:meth:`~runner.storage.base.KeyedOutput.store_keyed`), and, after the
   last one, calls the output's ``finish_keyed`` if it has one (an ``s3``
   output's manifest).

So memory is bounded by the page size (about ``pagesInFlight + 2`` pages of
rows and predictions) and the batch size times the concurrency, never by the
input's size.

**Exactly once.** Every stored prediction carries the key ``(jobId,
shard_index, position)``, where ``position`` is the input row's place in the
input; the storage keeps one prediction per key. A keyed write may therefore
be repeated safely, and is: retried on connection errors, timeouts, 5xx, 429
and 408 like a read; a retried pod writes the chunks it redoes again, and the
storage skips what it already has. Chunks are written in order, so what a shard
has stored is a prefix of its rows.

**Resume.** With the output's ``resumePath``, a pod first asks what its shard
already stored (``{"stored": n, "next": k}``) and starts at the shard's row
``k``. As chunks are stored in order and each is one transaction, what a kill
costs is the pages in flight: with the default ``pagesInFlight: 2``, the chunk
whose write was cut off and the page being predicted (``pagesInFlight: 4`` keeps
the model busier while chunks are written, and may cost up to 4 pages).

**Counting.** Progress lines and the termination message count the shard's
rows: ``rowsDone`` includes the rows resumed; ``rowsTotal`` is the shard's size
when the storage says it (``totalField``), else the rows seen so far. The result
adds ``resumedRows``, ``pages``, ``chunks`` and ``duplicates`` (predictions the
storage already had). On a failure the message says which part is stored:
``... (stored: rows 0..k-1 of shard s/c; missing from row k)``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from contract.exitcodes import (
    InferenceRejected,
    InputRejected,
    RunnerError,
)
from contract.progress import EVENT as PROGRESS_EVENT
from contract.progress import Progress
from runner.batching import batch_ranges
from runner.decoding import StreamCollector
from runner.inference import (
    MODEL_RETRY_EVENT,
    BatchPlan,
    ModelClient,
    TensorSpec,
    check_rows,
    infer_batch,
    start_inference,
)
from runner.join import RowSplitter, Selection, SelectionError, join
from runner.openai import OpenAIPredictor, RowReader, openai_plan
from runner.progress import ProgressTracker
from runner.retry import Deadline, log_retries
from runner.stages import model_failures, storage_failures
from runner.storage.base import (
    KeyedOutput,
    Page,
    PagedInput,
    Partition,
    StorageContext,
)


@dataclass
class StreamStats:
    rows_total: int | None = None  # the shard's rows, when the storage says
    resumed: int = 0  # rows stored by an earlier pod of the run, skipped
    predicted: int = 0  # rows predicted by this pod
    stored_next: int = 0  # the shard's first row number not stored yet
    predictions: int = 0  # predictions written by this pod
    pages: int = 0
    chunks: int = 0
    duplicates: int = 0  # predictions the storage already had

    @property
    def rows(self) -> int:
        return self.resumed + self.predicted


def pages_of(work: Any) -> PagedInput | None:
    """The input provider when its entry asks for paging (the run streams), else None."""
    if getattr(work.input, "paging", None) is None:
        return None
    return cast(PagedInput, work.input)


def missing_part(stats: StreamStats, part: Partition) -> str:
    """What a failed streaming run stored, for its termination message."""
    where = f"shard {part.index}/{part.count}" if part.count > 1 else "the input"
    if stats.stored_next == 0:
        return f"(stored: nothing of {where}; missing from row 0)"
    return (
        f"(stored: rows 0..{stats.stored_next - 1} of {where}; "
        f"missing from row {stats.stored_next})"
    )


async def _finish(
    sink: KeyedOutput, ctx: StorageContext, part: Partition, stats: StreamStats
) -> None:
    """Every chunk of the shard is stored: an output that marks it (a manifest) does it now."""
    finish = getattr(sink, "finish_keyed", None)
    if finish is not None:
        with storage_failures("output"):
            await finish(ctx, part, stats.stored_next)


@dataclass
class Joiner:
    """A streaming run's join (:mod:`runner.join`): each page's carried values until stored.

    A page whose rows are kept columnar (an ``s3`` input's Arrow tables,
    :mod:`runner.storage._columnar`) is split in Arrow when it can be: its
    features go to the model as JSON text, its carried columns stay Arrow
    columns; an output that stores tables (``columnar_output``) gets the page's
    output as one table, any other the row path's objects.
    """

    splitter: RowSplitter
    part: Partition
    carried: dict[int, Any]
    columnar_output: bool = False

    @classmethod
    def of(
        cls, selection: Selection | None, part: Partition, columnar_output: bool = False
    ) -> Joiner | None:
        if selection is None:
            return None
        return cls(RowSplitter(selection), part, {}, columnar_output)

    def split(self, page: Page) -> Page:
        """The page with the model's features as rows; its carried values kept aside."""
        columnar = getattr(page.rows, "columnar", None)
        found = columnar(self.splitter) if columnar is not None else None
        if found is not None:
            features, carried = found
            self.carried[page.offset] = carried
            return Page(page.offset, features, page.total)
        name = f"shard {self.part.index}/{self.part.count} row" if self.part.count > 1 else "row"
        try:
            rows, kept = self.splitter.split(page.rows, page.offset, name)
        except SelectionError as error:
            raise InputRejected(str(error)) from None
        self.carried[page.offset] = kept
        return Page(page.offset, rows, page.total)

    def output(self, page: Page, predictions: list[Any]) -> Any:
        """The page's output: ``predictions`` joined to the page's carried values."""
        carried = self.carried.pop(page.offset)
        try:
            if isinstance(carried, list):
                return join(self.splitter.selection, carried, predictions)
            if self.columnar_output:
                return carried.output(predictions)
            return join(self.splitter.selection, carried.records(), predictions)
        except (SelectionError, ValueError) as error:
            raise InferenceRejected(f"page at row {page.offset}: {error}") from None


async def _read(
    source: PagedInput,
    ctx: StorageContext,
    offset: int,
    part: Partition,
    joiner: Joiner | RowReader | None = None,
) -> Page:
    assert source.paging is not None
    limit = source.paging.page_size
    with storage_failures("input"):
        page = await source.read_page(ctx, offset, limit, part)
    if len(page.rows) > limit:
        # A storage that ignores offset/limit would answer the same rows forever.
        raise InputRejected(
            f"the input answered {len(page.rows)} rows to a page of {limit} (offset {offset}): "
            "it does not honour the paging arguments (offset, limit); read it without paging"
        )
    return page if joiner is None else joiner.split(page)


def _check_page(page: Page, first_row: Any) -> None:
    """Every row of the page has the shape of the input's first row (its fault otherwise)."""
    if not isinstance(page.rows, list):
        return  # rows kept columnar: one width by construction
    try:
        check_rows(page.rows)
    except ValueError as error:
        raise InputRejected(f"page at row {page.offset}: {error}") from None
    if not page.rows:
        return
    row = page.rows[0]
    width = len(first_row) if isinstance(first_row, list) else None
    got = len(row) if isinstance(row, list) else None
    if got != width:
        raise InputRejected(
            f"row {page.offset} has {got or 'a single'} value(s), the first row has {width or 1}"
        )


async def stream(
    source: PagedInput,
    sink: KeyedOutput,
    ctx: StorageContext,
    client: ModelClient | None,
    plan: BatchPlan,
    input_name: str | None,
    part: Partition,
    deadline: Deadline,
    stats: StreamStats,
    log: Any,
    on_progress: Callable[[int, int], None],
    selection: Selection | None = None,
    *,
    predictor: OpenAIPredictor | None = None,
) -> StreamStats:
    """Predict and store the shard's rows as the module docstring says; fills ``stats``.

    With a ``selection`` (:mod:`runner.join`) each page is split into the model's
    features and the carried columns, and its output rows are joined to them.
    With a ``predictor`` (an OpenAI-compatible model, :mod:`runner.openai`) rows
    are requests, sent one per row, and ``client`` is not used.
    """
    assert source.paging is not None
    if predictor is not None:
        plan = openai_plan(plan)
    page_size = source.paging.page_size
    shard_fields = {"shardIndex": part.index, "shardCount": part.count} if part.count > 1 else {}

    with storage_failures("output"):
        start = await sink.stored_next(ctx, part)
    start = start or 0
    stats.resumed = stats.stored_next = start
    if start:
        log.info("resuming", resumedRows=start, **shard_fields)

    joiner: Joiner | RowReader | None = Joiner.of(
        selection, part, getattr(sink, "columnar_output", False)
    )
    if predictor is not None:
        joiner = RowReader(predictor.settings, selection, part)
    first = await _read(source, ctx, start, part, joiner)
    stats.pages += 1
    stats.rows_total = first.total

    def total() -> int:
        seen = stats.rows + sum(len(p.rows) for p in pending_rows)
        return max(stats.rows_total or 0, seen)

    pending_rows: list[Page] = [first]

    def emit(progress: Progress) -> None:
        on_progress(progress.rows_done, progress.rows_total)
        log.info(
            PROGRESS_EVENT,
            **progress.fields(),
            rowsResumed=stats.resumed,
            pages=stats.pages,
            chunks=stats.chunks,
            **shard_fields,
        )

    tracker = ProgressTracker(total(), emit)
    tracker.rows_done = start
    if not first.rows:
        if start == 0:
            log.warning("the input has no rows: nothing to predict")
        await _finish(sink, ctx, part, stats)
        tracker.report()
        return stats

    fields: dict[str, Any] = {
        "pageSize": page_size,
        "pagesInFlight": source.paging.pages_in_flight,
        "startRow": start,
        **shard_fields,
    }
    spec: TensorSpec | None = None
    if predictor is not None:
        predictor.started(log, **fields)
    else:
        assert client is not None
        spec = await start_inference(
            client, first.rows[0], input_name, plan, deadline, log, **fields
        )
    model_row = first.rows[0]
    on_retry = log_retries(log, MODEL_RETRY_EVENT)

    # The collector stays off the rows in flight (runner.decoding.StreamCollector).
    collector = StreamCollector()
    pages: asyncio.Queue[Page | None] = asyncio.Queue(maxsize=1)
    done: asyncio.Queue[tuple[Page, asyncio.Future[list[Any]]] | None] = asyncio.Queue()
    window = asyncio.Semaphore(source.paging.pages_in_flight)
    slots = asyncio.Semaphore(plan.concurrency)

    async def reader() -> None:
        page = first
        while True:
            if predictor is None:
                _check_page(page, model_row)
            await pages.put(page)
            pending_rows.remove(page)
            if len(page.rows) < page_size:
                break
            page = await _read(source, ctx, page.offset + len(page.rows), part, joiner)
            stats.pages += 1
            if page.total is not None:
                stats.rows_total = page.total
            pending_rows.append(page)
            tracker.rows_total = total()
            if not page.rows:
                break
        await pages.put(None)

    async def one_batch(
        spec: TensorSpec | None,
        rows: list[Any],
        results: list[list[Any]],
        number: int,
        remaining: list[int],
        future: asyncio.Future[list[Any]],
    ) -> None:
        try:
            with model_failures():
                if predictor is not None:
                    answer: list[Any] = await predictor.infer_batch(rows)
                else:
                    assert client is not None
                    assert spec is not None
                    answer = await infer_batch(
                        client, spec, rows, plan, deadline, on_retry=on_retry
                    )
        finally:
            slots.release()
        results[number] = answer
        stats.predicted += len(rows)
        tracker.advance(len(rows))
        remaining[0] -= 1
        if remaining[0] == 0:
            flat: list[Any] = []
            for piece in results:
                flat.extend(piece)
            future.set_result(flat)

    async def dispatcher(group: asyncio.TaskGroup) -> None:
        while (page := await pages.get()) is not None:
            if not page.rows:
                continue
            await window.acquire()
            spans = batch_ranges(len(page.rows), plan.batch_size)
            future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
            results: list[list[Any]] = [[] for _ in spans]
            remaining = [len(spans)]
            await done.put((page, future))
            for number, span in enumerate(spans):
                await slots.acquire()
                group.create_task(
                    one_batch(
                        spec,
                        page.rows[span.start : span.stop],
                        results,
                        number,
                        remaining,
                        future,
                    )
                )
        await done.put(None)

    async def writer() -> None:
        while (item := await done.get()) is not None:
            page, future = item
            predictions = await future
            if joiner is not None:
                predictions = joiner.output(page, predictions)
            with storage_failures("output"):
                answer = await sink.store_keyed(
                    ctx, page.offset, predictions, part, row_count=len(page.rows)
                )
            stats.chunks += 1
            stats.predictions += len(predictions)
            stats.stored_next = page.offset + len(page.rows)
            if answer.duplicates:
                stats.duplicates += answer.duplicates
            window.release()
            collector.chunk_stored()

    try:
        with collector:
            async with tracker.running(), asyncio.TaskGroup() as group:
                group.create_task(reader())
                group.create_task(writer())
                group.create_task(dispatcher(group))
    except BaseExceptionGroup as failures:
        errors: list[BaseException] = list(failures.exceptions)
        runner_errors = [e for e in errors if isinstance(e, RunnerError)]
        raise (runner_errors or errors)[0] from None
    await _finish(sink, ctx, part, stats)
    tracker.rows_total = max(tracker.rows_total, tracker.rows_done)
    tracker.report()
    return stats
