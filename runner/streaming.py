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
                table = carried.output(predictions)
                if table is not None:
                    return table
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


@dataclass
class _PageWork:
    """One page between its first batch sent and its chunk stored."""

    page: Page
    done: asyncio.Future[list[Any]]
    results: list[list[Any]]
    remaining: int

    def answered(self, number: int, answer: list[Any]) -> None:
        """Batch ``number``'s answer; the page's predictions once every batch answered."""
        self.results[number] = answer
        self.remaining -= 1
        if self.remaining == 0:
            flat: list[Any] = []
            for piece in self.results:
                flat.extend(piece)
            self.done.set_result(flat)


@dataclass
class Model:
    """What predicts a stream's rows: a v2 client, or an OpenAI-compatible predictor.

    With a ``predictor`` (:mod:`runner.openai`) rows are requests, sent one per
    row, and ``client`` is not used.
    """

    client: ModelClient | None
    plan: BatchPlan
    input_name: str | None
    deadline: Deadline
    predictor: OpenAIPredictor | None = None


@dataclass
class Stream:
    """Predict and store the shard's rows as the module docstring says; fills ``stats``.

    With a ``selection`` (:mod:`runner.join`) each page is split into the model's
    features and the carried columns, and its output rows are joined to them.
    :meth:`run` is the whole stream: the reader, dispatcher and writer tasks.
    """

    source: PagedInput
    sink: KeyedOutput
    ctx: StorageContext
    part: Partition
    model: Model
    stats: StreamStats
    log: Any
    on_progress: Callable[[int, int], None]
    selection: Selection | None = None

    def __post_init__(self) -> None:
        assert self.source.paging is not None
        self.paging = self.source.paging
        self.plan = openai_plan(self.model.plan) if self.model.predictor else self.model.plan
        self.shard_fields = (
            {"shardIndex": self.part.index, "shardCount": self.part.count}
            if self.part.count > 1
            else {}
        )
        self.joiner: Joiner | RowReader | None = Joiner.of(
            self.selection, self.part, getattr(self.sink, "columnar_output", False)
        )
        if self.model.predictor is not None:
            self.joiner = RowReader(self.model.predictor.settings, self.selection, self.part)
        self.pending_rows: list[Page] = []
        self.tracker = ProgressTracker(0, self._emit)
        self.spec: TensorSpec | None = None
        self.model_row: Any = None
        self.on_retry = log_retries(self.log, MODEL_RETRY_EVENT)
        # The collector stays off the rows in flight (runner.decoding.StreamCollector).
        self.collector = StreamCollector()
        self.pages: asyncio.Queue[Page | None] = asyncio.Queue(maxsize=1)
        self.done: asyncio.Queue[_PageWork | None] = asyncio.Queue()
        self.window = asyncio.Semaphore(self.paging.pages_in_flight)
        self.slots = asyncio.Semaphore(self.plan.concurrency)

    async def run(self) -> StreamStats:
        stats, part = self.stats, self.part
        with storage_failures("output"):
            start = await self.sink.stored_next(self.ctx, part)
        start = start or 0
        stats.resumed = stats.stored_next = start
        if start:
            self.log.info("resuming", resumedRows=start, **self.shard_fields)
        first = await _read(self.source, self.ctx, start, part, self.joiner)
        stats.pages += 1
        stats.rows_total = first.total
        self.pending_rows.append(first)
        self.tracker.rows_total = self._total()
        self.tracker.rows_done = start
        if not first.rows:
            if start == 0:
                self.log.warning("the input has no rows: nothing to predict")
            await _finish(self.sink, self.ctx, part, stats)
            self.tracker.report()
            return stats
        await self._start(first, start)
        try:
            with self.collector:
                async with self.tracker.running(), asyncio.TaskGroup() as group:
                    group.create_task(self._reader(first))
                    group.create_task(self._writer())
                    group.create_task(self._dispatcher(group))
        except BaseExceptionGroup as failures:
            errors: list[BaseException] = list(failures.exceptions)
            runner_errors = [e for e in errors if isinstance(e, RunnerError)]
            raise (runner_errors or errors)[0] from None
        await _finish(self.sink, self.ctx, part, stats)
        self.tracker.rows_total = max(self.tracker.rows_total, self.tracker.rows_done)
        self.tracker.report()
        return stats

    async def _start(self, first: Page, start: int) -> None:
        """The model's first call (v2: its metadata and the tensor's shape), and its log line."""
        fields: dict[str, Any] = {
            "pageSize": self.paging.page_size,
            "pagesInFlight": self.paging.pages_in_flight,
            "startRow": start,
            **self.shard_fields,
        }
        model = self.model
        if model.predictor is not None:
            model.predictor.started(self.log, **fields)
        else:
            assert model.client is not None
            self.spec = await start_inference(
                model.client,
                first.rows[0],
                model.input_name,
                self.plan,
                model.deadline,
                self.log,
                **fields,
            )
        self.model_row = first.rows[0]

    def _total(self) -> int:
        seen = self.stats.rows + sum(len(p.rows) for p in self.pending_rows)
        return max(self.stats.rows_total or 0, seen)

    def _emit(self, progress: Progress) -> None:
        self.on_progress(progress.rows_done, progress.rows_total)
        self.log.info(
            PROGRESS_EVENT,
            **progress.fields(),
            rowsResumed=self.stats.resumed,
            pages=self.stats.pages,
            chunks=self.stats.chunks,
            **self.shard_fields,
        )

    async def _reader(self, first: Page) -> None:
        page, stats = first, self.stats
        while True:
            if self.model.predictor is None:
                _check_page(page, self.model_row)
            await self.pages.put(page)
            self.pending_rows.remove(page)
            if len(page.rows) < self.paging.page_size:
                break
            offset = page.offset + len(page.rows)
            page = await _read(self.source, self.ctx, offset, self.part, self.joiner)
            stats.pages += 1
            if page.total is not None:
                stats.rows_total = page.total
            self.pending_rows.append(page)
            self.tracker.rows_total = self._total()
            if not page.rows:
                break
        await self.pages.put(None)

    async def _one_batch(self, rows: list[Any], work: _PageWork, number: int) -> None:
        model = self.model
        try:
            with model_failures():
                if model.predictor is not None:
                    answer: list[Any] = await model.predictor.infer_batch(rows)
                else:
                    assert model.client is not None
                    assert self.spec is not None
                    answer = await infer_batch(
                        model.client,
                        self.spec,
                        rows,
                        self.plan,
                        model.deadline,
                        on_retry=self.on_retry,
                    )
        finally:
            self.slots.release()
        self.stats.predicted += len(rows)
        self.tracker.advance(len(rows))
        work.answered(number, answer)

    async def _dispatcher(self, group: asyncio.TaskGroup) -> None:
        while (page := await self.pages.get()) is not None:
            if not page.rows:
                continue
            await self.window.acquire()
            spans = batch_ranges(len(page.rows), self.plan.batch_size)
            work = _PageWork(
                page,
                asyncio.get_running_loop().create_future(),
                [[] for _ in spans],
                len(spans),
            )
            await self.done.put(work)
            for number, span in enumerate(spans):
                await self.slots.acquire()
                group.create_task(self._one_batch(page.rows[span.start : span.stop], work, number))
        await self.done.put(None)

    async def _writer(self) -> None:
        stats = self.stats
        while (work := await self.done.get()) is not None:
            page = work.page
            predictions = await work.done
            if self.joiner is not None:
                predictions = self.joiner.output(page, predictions)
            with storage_failures("output"):
                answer = await self.sink.store_keyed(
                    self.ctx, page.offset, predictions, self.part, row_count=len(page.rows)
                )
            stats.chunks += 1
            stats.predictions += len(predictions)
            stats.stored_next = page.offset + len(page.rows)
            if answer.duplicates:
                stats.duplicates += answer.duplicates
            self.window.release()
            self.collector.chunk_stored()
