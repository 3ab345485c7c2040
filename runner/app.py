"""One run: contract -> input -> inference -> output, and what the controller sees of it.

:func:`run` is the whole process minus argument parsing: it reads the
environment, loads and validates the contract, executes it, writes the
termination message and returns the exit code (:mod:`contract.exitcodes`). The
Secret source is a parameter, so tests run real runs in-process against an
in-memory one.

Order of work, each step failing with its stage's exit code, the first when
another attempt may succeed, the second when none can (the other side refused:
a 4xx other than 408/429, or an answer that is not what it should be; the Job
fails at once on those, see :mod:`contract.exitcodes`):

1. contract (2): parse and validate the contract, the model URL, both storage
   entries and the sharding environment, before any I/O;
2. input (3, 6): read the input storage's Secret and rows;
3. output credentials (5): read the output storage's Secret *before* predicting,
   so a missing Secret costs seconds, not a whole inference;
4. inference (4, 7): batches to the model, progress lines on stdout;
5. output (5, 8): store the predictions, only after every batch succeeded, so a
   failed run leaves no half-written predictions behind.

When the input entry asks for paging, steps 2, 4 and 5 become one stream
(:mod:`runner.streaming`): pages in, batches out, each page's predictions stored
as a keyed chunk, exactly once, resumable after a pod restart.

Environment: ``CONTRACT_PATH``, ``TERMINATION_LOG_PATH``, ``NODE_AGENT_ROOT``
(:mod:`contract.paths`); ``pod_uid`` (upstream's downward-API variable; ``POD_UID``
also works); ``POD_NAMESPACE`` (:func:`runner.secrets.pod_namespace`);
``JOB_COMPLETION_INDEX`` for sharded runs; ``RUNNER_DEADLINE_SECONDS``, the
whole run's deadline for retries and requests (none by default: the Job's
``activeDeadlineSeconds`` still applies); ``LOG_LEVEL``.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import orjson
from pydantic import ValidationError

from contract import paths
from contract.document import STORAGE_SECRETS_DIR_ENV, Contract
from contract.exitcodes import (
    ContractError,
    ExitCode,
    InferenceRejected,
    InputRejected,
    RunnerError,
)
from contract.progress import EVENT as PROGRESS_EVENT
from contract.progress import Progress
from contract.termination import RunResult, success_message
from runner import openai, storage, streaming, termination
from runner.batching import shard
from runner.inference import (
    MODEL_RETRY_EVENT,
    BatchPlan,
    ModelClient,
    ModelEndpoint,
    check_rows,
    endpoint_from_contract,
    predict,
    start_inference,
)
from runner.join import RowSplitter, Selection, SelectionError, join
from runner.logs import get_logger
from runner.progress import ProgressTracker
from runner.proxy import client_session
from runner.retry import Deadline, log_retries
from runner.secrets import (
    KubernetesSecretReader,
    MountedSecretReader,
    RedactingSecretReader,
    SecretReader,
    pod_namespace,
)
from runner.stages import failed, model_failures, storage_failures
from runner.storage.base import (
    KEYED_OUTPUT_KEYS,
    KeyedOutput,
    Partition,
    StorageContext,
    StorageProvider,
    explain,
)
from runner.transport import model_session


@dataclass(frozen=True)
class RunnerEnv:
    contract_path: Path
    termination_log_path: Path
    pod_uid: str
    namespace: str
    completion_index: str | None
    deadline_seconds: float | None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> RunnerEnv:
        raw_deadline = environ.get("RUNNER_DEADLINE_SECONDS", "").strip()
        deadline = None
        if raw_deadline:
            try:
                deadline = float(raw_deadline)
            except ValueError:
                deadline = -1.0
            if not deadline > 0:
                raise ContractError(
                    f"RUNNER_DEADLINE_SECONDS must be a positive number, got {raw_deadline!r}"
                )
        return cls(
            contract_path=paths.contract_path(environ),
            termination_log_path=paths.termination_log_path(environ),
            pod_uid=environ.get("pod_uid") or environ.get("POD_UID") or "",
            namespace=pod_namespace(environ),
            completion_index=environ.get("JOB_COMPLETION_INDEX"),
            deadline_seconds=deadline,
        )


@dataclass
class Invocation:
    """One ``python -m runner`` (``command`` "run") or ``--check`` ("check") from start to end.

    What both begin with (the environment, the termination log, the log, the
    clock, the Secret reader) and end with (the termination message and the exit
    code), so that :func:`run` and :func:`runner.check.run` say only what differs.
    """

    command: str
    environ: dict[str, str]
    termination_path: Path
    log: Any
    started: float = field(default_factory=time.monotonic)
    _kubernetes: KubernetesSecretReader | None = field(default=None, init=False)

    @classmethod
    def start(cls, command: str, environ: Mapping[str, str] | None, log: Any) -> Invocation:
        env_map = dict(os.environ if environ is None else environ)
        return cls(command, env_map, paths.termination_log_path(env_map), log)

    def load(self) -> tuple[RunnerEnv, Contract]:
        """The environment and the contract (ContractError otherwise); the log names the job."""
        env = RunnerEnv.from_environ(self.environ)
        contract = load_contract(env.contract_path)
        self.log = self.log.bind(jobId=contract.job_id, jobName=contract.job_name)
        return env, contract

    def secrets(self, given: SecretReader | None) -> RedactingSecretReader:
        """``given``, else the Secrets the kubelet mounted (``$RUNNER_SECRETS_DIR``), else
        the pod's Kubernetes API (closed by :meth:`close`); redacted."""
        mounted = self.environ.get(STORAGE_SECRETS_DIR_ENV)
        if given is None and mounted:
            given = MountedSecretReader(
                paths.pod_path(mounted, self.environ), pod_namespace(self.environ)
            )
        if given is None:
            self._kubernetes = KubernetesSecretReader(self.environ)
            given = self._kubernetes
        return RedactingSecretReader(given)

    async def close(self) -> None:
        if self._kubernetes is not None:
            await self._kubernetes.close()

    def failed(self, error: BaseException, stage: str, stopped: str) -> int:
        """Report the ``error`` that ended it during ``stage`` (:func:`runner.stages.failed`)."""
        return failed(self.log, self.termination_path, self.command, error, stage, stopped)

    def succeeded(self, event: str, message: str, **fields: Any) -> None:
        """Log ``event`` with ``fields`` and the duration; report the success ``message``."""
        self.log.info(event, **fields, durationSeconds=round(time.monotonic() - self.started, 3))
        termination.report(self.log, self.termination_path, message)


@dataclass
class RunState:
    """Where the run is; read when something unexpected (or SIGTERM) stops it."""

    stage: str = "contract"
    rows_done: int = 0
    rows_total: int = 0


@dataclass(frozen=True)
class Plan:
    """A contract checked and turned into what the run needs."""

    contract: Contract
    # The Open Inference Protocol's endpoint; None for an OpenAI-compatible one (openai).
    model: ModelEndpoint | None
    input: StorageProvider
    output: StorageProvider
    batches: BatchPlan
    shard_count: int
    shard_index: int
    parameters: dict[str, str] = field(default_factory=dict)
    # The input entry's join keys (runner.join); None without any.
    selection: Selection | None = None
    # kserve.modelVersion "openai": the OpenAI-compatible API (runner.openai).
    openai: openai.OpenAITarget | None = None


def load_contract(path: Path) -> Contract:
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise ContractError(f"cannot read the contract at {path}: {error.strerror}") from None
    try:
        document = orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        raise ContractError(f"the contract at {path} is not JSON: {error}") from None
    if not isinstance(document, dict):
        raise ContractError(f"the contract at {path} is not a JSON object")
    try:
        return Contract.model_validate(document)
    except ValidationError as error:
        raise ContractError(f"invalid contract: {explain(error)}") from None


def plan(contract: Contract, env: RunnerEnv) -> Plan:
    """Everything that can be checked without I/O; :class:`ContractError` otherwise."""
    target = (
        openai.target_from_contract(contract.kserve) if openai.is_openai(contract.kserve) else None
    )
    model = None if target else endpoint_from_contract(contract.kserve)
    parameters = dict(contract.parameters or {})
    try:
        input_provider = storage.resolve(contract.input, "input", parameters)
        output_provider = storage.resolve(contract.output, "output", parameters)
        selection = storage.selection(contract.input)
        if target is not None:
            openai.check_selection(target.settings, selection)
        elif selection is None and getattr(input_provider, "named_rows", False):
            # Rows with named columns and no join keys: every column is a feature.
            selection = Selection()
    except ValueError as error:
        raise ContractError(str(error)) from None
    if getattr(input_provider, "paging", None) is not None:
        clash = sorted(set(parameters) & set(KEYED_OUTPUT_KEYS))
        if clash:
            raise ContractError(
                f"parameters {clash} would overwrite fields of a paged run's keyed output "
                "writes: rename them"
            )
        if not hasattr(output_provider, "store_keyed"):
            raise ContractError(
                f"input.{input_provider.key}.paging needs an output provider that stores keyed "
                f"chunks; {output_provider.key!r} does not"
            )
    elif getattr(output_provider, "streams_only", False):
        raise ContractError(
            f"output.{output_provider.key} stores keyed chunks, so the input must stream: "
            f"give input.{input_provider.key} paging"
        )
    count = contract.sharding.count if contract.sharding else 1
    index = 0
    if count > 1:
        raw = (env.completion_index or "").strip()
        if not raw.isdigit() or int(raw) >= count:
            raise ContractError(
                f"sharding.count is {count}, so JOB_COMPLETION_INDEX must be an integer in "
                f"[0, {count}), got {env.completion_index!r}"
            )
        index = int(raw)
    return Plan(
        contract=contract,
        model=model,
        input=input_provider,
        output=output_provider,
        batches=BatchPlan.from_contract(contract.batching),
        shard_count=count,
        shard_index=index,
        parameters=parameters,
        selection=selection,
        openai=target,
    )


async def execute(
    work: Plan,
    env: RunnerEnv,
    secrets: SecretReader,
    state: RunState,
    log: Any,
    clock: Callable[[], float] = time.monotonic,
) -> RunResult:
    started = clock()
    deadline = Deadline(env.deadline_seconds, clock)
    connector = aiohttp.TCPConnector(limit=work.batches.concurrency + 2)
    # Model and storage calls honour HTTP(S)_PROXY and NO_PROXY, read once
    # (runner.proxy). The Secret reads never do (runner.secrets.KubernetesSecretReader).
    # The model has a session of its own: its headers, bearer token and TLS
    # settings (runner.transport) must never reach the storage.
    to_model = model_session(work.contract.kserve.transport, work.batches.concurrency + 2)
    async with client_session(connector=connector) as session, to_model:
        ctx = StorageContext(
            session=session,
            secrets=secrets,
            namespace=env.namespace,
            job_id=work.contract.job_id,
            pod_uid=env.pod_uid,
            parameters=work.parameters,
            deadline=deadline,
            log=log,
            part=Partition(work.shard_index, work.shard_count),
        )
        try:
            return await _execute(work, ctx, to_model, deadline, state, log, clock, started)
        finally:
            await storage.close(work.input, work.output)


async def _execute(
    work: Plan,
    ctx: StorageContext,
    session: aiohttp.ClientSession,
    deadline: Deadline,
    state: RunState,
    log: Any,
    clock: Callable[[], float],
    started: float,
) -> RunResult:
    source = streaming.pages_of(work)
    if source is not None:
        return await _stream(work, ctx, source, session, deadline, state, log, clock, started)
    state.stage = "input"
    with storage_failures("input"):
        await work.input.prepare(ctx)
        rows = await work.input.load_rows(ctx)
    if work.openai is not None:
        return await _execute_openai(
            work, work.openai, ctx, session, rows, deadline, state, log, clock, started
        )
    assert work.model is not None
    carried: list[tuple[Any, ...]] = []
    try:
        if work.selection is not None:
            rows, carried = RowSplitter(work.selection).split(rows)
        check_rows(rows)
    except ValueError as error:
        # A ragged table, a missing column: the same table on every attempt.
        raise InputRejected(str(error)) from None
    rows, carried, input_done = await _start_inference(work, ctx, state, rows, carried, log, clock)
    client = ModelClient(session, work.model)
    predictions = await _infer(work, client, rows, deadline, state, log)
    inference_done = clock()
    if work.selection is not None:
        try:
            predictions = join(work.selection, carried, predictions)
        except SelectionError as error:
            raise InferenceRejected(f"the model's answers: {error}") from None

    return await _store(
        work, ctx, predictions, state, log, clock, (started, input_done, inference_done), len(rows)
    )


T = TypeVar("T")


async def _start_inference(
    work: Plan,
    ctx: StorageContext,
    state: RunState,
    rows: list[T],
    carried: list[tuple[Any, ...]],
    log: Any,
    clock: Callable[[], float],
) -> tuple[list[T], list[tuple[Any, ...]], float]:
    """From the whole input read to the inference's start, for either kind of model.

    Returns this shard's rows, the columns carried beside them and when the
    input was done (before the output is prepared).
    """
    total = len(rows)
    rows = shard(rows, work.shard_count, work.shard_index)
    log.info("input loaded", rows=total, shardRows=len(rows), provider=work.input.key)
    input_done = clock()
    await _prepare_output(work, ctx, state)
    state.stage = "inference"
    state.rows_total = len(rows)
    return rows, shard(carried, work.shard_count, work.shard_index), input_done


async def _execute_openai(
    work: Plan,
    target: openai.OpenAITarget,
    ctx: StorageContext,
    session: aiohttp.ClientSession,
    rows: list[Any],
    deadline: Deadline,
    state: RunState,
    log: Any,
    clock: Callable[[], float],
    started: float,
) -> RunResult:
    """:func:`_execute` from the rows read on, against an OpenAI-compatible API."""
    reader = openai.RowReader(target.settings, work.selection)
    try:
        inputs, carried = reader.read(rows)
    except SelectionError as error:
        raise InputRejected(str(error)) from None
    inputs, carried, input_done = await _start_inference(
        work, ctx, state, inputs, carried, log, clock
    )
    predictor = _openai_predictor(work, target, session, deadline, log)
    tracker = _progress(work, state, log, len(inputs))
    outputs: list[Any] = []
    if inputs:
        predictor.started(log, **_shard_fields(work))
        with model_failures():
            async with tracker.running():
                outputs = await predictor.predict(inputs, on_row_done=tracker.advance)
    inference_done = clock()
    predictions = openai.join(target.settings, work.selection, carried, outputs)

    return await _store(
        work,
        ctx,
        predictions,
        state,
        log,
        clock,
        (started, input_done, inference_done),
        len(inputs),
        rowErrors=predictor.row_errors,
    )


async def _store(
    work: Plan,
    ctx: StorageContext,
    predictions: list[Any],
    state: RunState,
    log: Any,
    clock: Callable[[], float],
    marks: tuple[float, float, float],
    rows: int,
    **timing_fields: Any,
) -> RunResult:
    """Step 5 of a one-read run: store the predictions, log the stage timings, the result.

    ``marks`` are the clock at the start, once the input was read and once the
    model answered.
    """
    started, input_done, inference_done = marks
    state.stage = "output"
    with storage_failures("output"):
        await work.output.store(ctx, predictions)
    finished = clock()
    log.info(
        "stage timings",
        inputSeconds=round(input_done - started, 3),
        inferenceSeconds=round(inference_done - input_done, 3),
        outputSeconds=round(finished - inference_done, 3),
        **timing_fields,
    )
    return RunResult(rows=rows, predictions=len(predictions), duration_seconds=finished - started)


def _shard_fields(work: Plan) -> dict[str, int]:
    """The shard's index and count for progress lines, when the run has shards."""
    if work.shard_count > 1:
        return {"shardIndex": work.shard_index, "shardCount": work.shard_count}
    return {}


def _progress(work: Plan, state: RunState, log: Any, rows: int) -> ProgressTracker:
    """The progress of a one-read run over ``rows`` rows: kept in ``state`` and logged.

    With no rows there is nothing to predict: that is logged and the (complete)
    progress reported at once.
    """
    shard_fields = _shard_fields(work)

    def emit(progress: Progress) -> None:
        state.rows_done = progress.rows_done
        log.info(PROGRESS_EVENT, **progress.fields(), **shard_fields)

    tracker = ProgressTracker(rows, emit)
    if not rows:
        log.warning("the input has no rows: nothing to predict")
        tracker.report()
    return tracker


def _openai_predictor(
    work: Plan,
    target: openai.OpenAITarget,
    session: aiohttp.ClientSession,
    deadline: Deadline,
    log: Any,
) -> openai.OpenAIPredictor:
    """The predictor of a run against an OpenAI-compatible API, one-read or streaming."""
    return openai.OpenAIPredictor(
        openai.OpenAIClient(session, target),
        openai.openai_plan(work.batches),
        deadline,
        work.contract.job_id,
        on_retry=log_retries(log, MODEL_RETRY_EVENT),
    )


async def _prepare_output(work: Plan, ctx: StorageContext, state: RunState) -> None:
    """Step 3: the output's Secret and connection, before any prediction.

    Exits as the input's would: 5 when another attempt may get through (a Secret
    not there yet, no connection), 8 when the storage refused the credentials
    (a wrong password), like 6 for the same refusal of the input.
    """
    state.stage = "output"
    with storage_failures("output"):
        await work.output.prepare(ctx)


async def _stream(
    work: Plan,
    ctx: StorageContext,
    source: Any,
    session: aiohttp.ClientSession,
    deadline: Deadline,
    state: RunState,
    log: Any,
    clock: Callable[[], float],
    started: float,
) -> RunResult:
    """The streaming path (runner/streaming.py): pages in, keyed chunks out, resumable."""
    state.stage = "input"
    with storage_failures("input"):
        await work.input.prepare(ctx)
    await _prepare_output(work, ctx, state)
    state.stage = "inference"
    part = Partition(work.shard_index, work.shard_count)
    stats = streaming.StreamStats()

    def on_progress(done: int, total: int) -> None:
        state.rows_done, state.rows_total = done, total

    sink: KeyedOutput = work.output  # type: ignore[assignment]
    predictor = None
    if work.openai is not None:
        predictor = _openai_predictor(work, work.openai, session, deadline, log)
    try:
        model = streaming.Model(
            None if work.model is None else ModelClient(session, work.model),
            work.batches,
            work.contract.kserve.model_input_name,
            deadline,
            predictor,
        )
        await streaming.Stream(
            source, sink, ctx, part, model, stats, log, on_progress, work.selection
        ).run()
    except RunnerError as error:
        error.message = f"{error.message} {streaming.missing_part(stats, part)}"
        raise
    finished = clock()
    log.info(
        "stream done",
        rows=stats.rows,
        resumedRows=stats.resumed,
        pages=stats.pages,
        chunks=stats.chunks,
        duplicates=stats.duplicates,
        seconds=round(finished - started, 3),
    )
    return RunResult(
        rows=stats.rows,
        predictions=stats.resumed + stats.predictions,
        duration_seconds=finished - started,
        resumed_rows=stats.resumed,
        pages=stats.pages,
        chunks=stats.chunks,
        duplicates=stats.duplicates,
    )


async def _infer(
    work: Plan,
    client: ModelClient,
    rows: list[Any],
    deadline: Deadline,
    state: RunState,
    log: Any,
) -> list[Any]:
    tracker = _progress(work, state, log, len(rows))
    if not rows:
        return []
    input_name = work.contract.kserve.model_input_name
    spec = await start_inference(client, rows[0], input_name, work.batches, deadline, log)
    with model_failures():
        async with tracker.running():
            return await predict(
                client,
                spec,
                rows,
                work.batches,
                deadline,
                on_batch_done=tracker.advance,
                on_retry=log_retries(log, MODEL_RETRY_EVENT),
            )


async def run(
    environ: Mapping[str, str] | None = None,
    *,
    secrets: SecretReader | None = None,
) -> int:
    """Run the contract the environment points at; returns the exit code."""
    call = Invocation.start("run", environ, get_logger())
    state = RunState()
    try:
        env, contract = call.load()
        log = call.log
        work = plan(contract, env)
        log.info(
            "contract loaded",
            modelUrl=contract.kserve.model_url,
            input=work.input.key,
            output=work.output.key,
            parameters=sorted(work.parameters),
            shardIndex=work.shard_index,
            shardCount=work.shard_count,
        )
        if not env.pod_uid:
            log.warning("no pod_uid in the environment: predictions are stored with an empty one")
        result = await execute(work, env, call.secrets(secrets), state, log)
    except (asyncio.CancelledError, Exception) as error:
        stopped = f"stopped during {state.stage} after {state.rows_done}/{state.rows_total} rows"
        return call.failed(error, state.stage, stopped)
    finally:
        await call.close()
    message = success_message(result)
    call.succeeded("run succeeded", message, rows=result.rows, predictions=result.predictions)
    return ExitCode.DONE
