"""Calling the model over the Open Inference Protocol (KServe v2, and v1).

**Where.** ``kserve.modelUrl`` is the URL called (``http://`` is added when it
has no scheme). The protocol is ``kserve.modelVersion`` when that is ``v1`` or
``v2``; otherwise it is read from the URL (``.../v1/models/<m>:predict`` is v1)
and defaults to v2.

**v2.** Body ``{"inputs": [{"name", "shape", "datatype", "data"}]}``; the answer's
``outputs[0].data`` is the batch's predictions, flattened (``[n]``, ``[n, 1]`` and
``[n, 96, 1]`` all become one flat list, in row-major order).

**v1.** Body ``{"instances": rows}``; the answer's ``predictions``, flattened.

**Tensor shape.** Before sending data the runner asks the model for its v2
metadata (``GET .../v2/models/<m>``; optional: a server without it is fine).
A row's shape is taken from the data (``[4]`` for an iris row) unless the model
declares more dimensions whose sizes multiply to the same number: a TTM-shaped
model declaring ``[-1, 512, 1]`` receives rows of 512 values as ``[n, 512, 1]``.
A shape the model declares and the data contradicts fails before any request,
with both shapes in the message. The input's name and datatype come from the
contract (``modelInputName``), else from the metadata, else ``input-0``/``FP32``.

**Errors.** Connection errors, timeouts, 5xx, 429 and 408 are
:class:`~runner.retry.Transient` (with the ``Retry-After`` hint): retried
within the budget, then exit 4 (``INFERENCE``), which a later pod may get past.
Any other 4xx (bad request, no such model, 422), a 2xx that is not the answer
it should be, and rows that contradict the model's declared shape
(:class:`ShapeMismatch`) are :class:`ModelRefused` with ``permanent`` set: no
retry, exit 7 (``INFERENCE_REJECTED``), since every attempt would get the same
answer. A TLS failure is refused too, not retried here, but exit 4: the
certificates may be fixed. Messages quote the server's own words, never the
request's rows (:func:`runner.httputil.server_message`).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import orjson

from contract.document import Batching, KServe
from contract.exitcodes import ContractError, InferenceRejected
from runner import decoding
from runner.batching import batch_ranges, map_ordered
from runner.httputil import RETRYABLE_4XX, retry_after_seconds, server_message, trim
from runner.retry import Deadline, RetryPolicy, Transient, call_with_retries

Protocol = Literal["v1", "v2"]

DEFAULT_INPUT_NAME = "input-0"
DEFAULT_DATATYPE = "FP32"

_V2_PATH = re.compile(
    r"^(?P<prefix>.*)/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?/infer/?$"
)
_V1_PATH = re.compile(r"^(?P<prefix>.*)/v1/models/(?P<name>[^/:]+):predict/?$")


class ModelRefused(Exception):
    """The model call failed in a way asking again at once cannot fix: do not retry.

    ``permanent`` when no later attempt can succeed either: the model answered a
    4xx other than 408/429 (``status``), or a 2xx that is not an answer.
    """

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status

    @property
    def permanent(self) -> bool:
        return self.status is not None and (200 <= self.status < 300 or is_rejection(self.status))


def is_rejection(status: int) -> bool:
    """A 4xx that will be answered again to the same request (not 408, 429)."""
    return 400 <= status < 500 and status not in RETRYABLE_4XX


class ShapeMismatch(ValueError):
    """The rows contradict the model's declared input shape: permanent."""


@dataclass(frozen=True)
class ModelEndpoint:
    url: str
    protocol: Protocol
    model_name: str | None
    metadata_url: str | None


@dataclass(frozen=True)
class InputMetadata:
    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str
    row_shape: tuple[int, ...]


def normalise_url(url: str) -> str:
    url = url.strip()
    return url if "://" in url else f"http://{url}"


def endpoint_from_contract(kserve: KServe) -> ModelEndpoint:
    """The model's URLs and protocol; :class:`ContractError` when they make no sense."""
    if not kserve.model_url or not kserve.model_url.strip():
        raise ContractError("kserve.modelUrl is required")
    url = normalise_url(kserve.model_url)
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ContractError(f"kserve.modelUrl must be an http(s) URL with a host, got {url!r}")
    v2 = _V2_PATH.match(parts.path)
    v1 = _V1_PATH.match(parts.path)
    # Upstream manifests also put a model's own version ("1") in modelVersion:
    # only "v1"/"v2" name a protocol; anything else leaves it to the URL.
    version = (kserve.model_version or "").strip().lower()
    protocol: Protocol = "v1" if version == "v1" or (version != "v2" and v1) else "v2"
    matched = v2 or v1
    name = matched.group("name") if matched else kserve.model_name
    metadata_url = None
    if protocol == "v2" and name:
        prefix = v2.group("prefix") if v2 else ""
        path = f"{prefix}/v2/models/{name}"
        if v2 and v2.group("version"):
            path += f"/versions/{v2.group('version')}"
        metadata_url = urlunsplit((parts.scheme, parts.netloc, path, "", ""))
    return ModelEndpoint(url=url, protocol=protocol, model_name=name, metadata_url=metadata_url)


def parse_metadata(body: Any) -> list[InputMetadata]:
    """The ``inputs`` of a v2 model metadata answer; entries that make no sense are skipped."""
    inputs = body.get("inputs") if isinstance(body, dict) else None
    found = []
    for entry in inputs if isinstance(inputs, list) else []:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            continue
        shape = entry.get("shape")
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) for d in shape
        ):
            continue
        datatype = entry.get("datatype")
        found.append(
            InputMetadata(
                name=entry["name"],
                datatype=datatype if isinstance(datatype, str) and datatype else DEFAULT_DATATYPE,
                shape=tuple(shape),
            )
        )
    return found


def row_shape(row: Any) -> tuple[int, ...]:
    """The nested-list shape of one row, read along its first elements."""
    shape = []
    while isinstance(row, list):
        shape.append(len(row))
        if not row:
            break
        row = row[0]
    return tuple(shape)


def _fit_shape(declared: tuple[int, ...], data: tuple[int, ...]) -> tuple[int, ...] | None:
    """``declared`` (a row's dims, ``-1`` = any) filled in to hold ``data``, or None."""
    size = math.prod(data)
    known = math.prod(d for d in declared if d >= 0)
    wildcards = sum(1 for d in declared if d < 0)
    if wildcards == 0:
        return declared if known == size else None
    if wildcards > 1 or known == 0 or size % known:
        return None
    return tuple(size // known if d < 0 else d for d in declared)


def resolve_tensor_spec(
    first_row: Any, input_name: str | None, metadata: Sequence[InputMetadata]
) -> TensorSpec:
    """Name, datatype and row shape to send (see "Tensor shape" in the module docstring)."""
    data_shape = row_shape(first_row)
    declared = next((m for m in metadata if m.name == input_name), None) if input_name else None
    if declared is None and metadata and not input_name:
        declared = metadata[0]
    name = input_name or (declared.name if declared else DEFAULT_INPUT_NAME)
    datatype = declared.datatype if declared else DEFAULT_DATATYPE
    if declared is None or len(declared.shape) < 2:
        return TensorSpec(name=name, datatype=datatype, row_shape=data_shape)
    # The first declared dimension is the batch.
    wanted = declared.shape[1:]
    if len(wanted) == len(data_shape):
        if all(w < 0 or w == d for w, d in zip(wanted, data_shape, strict=True)):
            return TensorSpec(name=name, datatype=datatype, row_shape=data_shape)
    elif len(wanted) > len(data_shape):
        fitted = _fit_shape(wanted, data_shape)
        if fitted is not None:
            return TensorSpec(name=name, datatype=datatype, row_shape=fitted)
    else:
        return TensorSpec(name=name, datatype=datatype, row_shape=data_shape)
    raise ShapeMismatch(
        f"the model declares input {name!r} of shape {list(declared.shape)}, "
        f"but the input's rows have shape {list(data_shape)}"
    )


def check_rows(rows: Sequence[Any]) -> None:
    """Every row has the first row's length (a ragged table is the input's fault)."""
    if not rows:
        return
    # The common case in C loops (a page is 10,000 rows): all lists of one length.
    if set(map(type, rows)) == {list} and len(set(map(len, rows))) == 1:
        return
    first = rows[0]
    width = len(first) if isinstance(first, list) else None
    for index, row in enumerate(rows):
        if width is None:
            if isinstance(row, list):
                raise ValueError(f"row {index} is a list but row 0 is a single value")
        elif not isinstance(row, list) or len(row) != width:
            got = f"{len(row)} values" if isinstance(row, list) else "a single value"
            raise ValueError(f"row {index} has {got}, row 0 has {width}")


def _data(rows: Sequence[Any]) -> Any:
    """The rows for a JSON body: rows kept as JSON text (a columnar page's) go in as they are."""
    fragment = getattr(rows, "fragment", None)
    return rows if fragment is None else fragment()


def v2_request(spec: TensorSpec, rows: Sequence[Any]) -> bytes:
    # Nested data with the full shape: OIP servers accept nested or flat row-major
    # data and reshape it to `shape`, so [n, 512] rows go out as [n, 512, 1].
    return orjson.dumps(
        {
            "inputs": [
                {
                    "name": spec.name,
                    "shape": [len(rows), *spec.row_shape],
                    "datatype": spec.datatype,
                    "data": _data(rows),
                }
            ]
        }
    )


def v1_request(rows: Sequence[Any]) -> bytes:
    return orjson.dumps({"instances": _data(rows)})


def flatten(values: Any) -> list[Any]:
    if not isinstance(values, list):
        return [values]
    if list not in set(map(type, values)):
        return values
    flat: list[Any] = []
    for value in values:
        flat.extend(flatten(value))
    return flat


def _check_count(predictions: list[Any], rows: int) -> list[Any]:
    if rows and (not predictions or len(predictions) % rows):
        raise ModelRefused(
            f"the model answered {len(predictions)} value(s) for {rows} row(s)", status=200
        )
    return predictions


def parse_v2_response(body: bytes, rows: int) -> list[Any]:
    answer = _json(body)
    outputs = answer.get("outputs") if isinstance(answer, dict) else None
    if not isinstance(outputs, list) or not outputs or not isinstance(outputs[0], dict):
        raise ModelRefused(f"the model's answer has no outputs: {server_message(body)}", status=200)
    data = outputs[0].get("data")
    if not isinstance(data, list):
        raise ModelRefused("the model's outputs[0] has no data list", status=200)
    return _check_count(flatten(data), rows)


def parse_v1_response(body: bytes, rows: int) -> list[Any]:
    answer = _json(body)
    predictions = answer.get("predictions") if isinstance(answer, dict) else None
    if not isinstance(predictions, list):
        raise ModelRefused(
            f"the model's answer has no predictions: {server_message(body)}",
            status=200,
        )
    return _check_count(flatten(predictions), rows)


def _json(body: bytes) -> Any:
    try:
        return decoding.loads(body)
    except orjson.JSONDecodeError:
        raise ModelRefused(
            f"the model answered with something that is not JSON: {server_message(body)}",
            status=200,
        ) from None


def classify(status: int, body: bytes, retry_after: str | None) -> Exception:
    """The error for a non-2xx answer: transient (5xx, 429, 408) or a refusal."""
    message = f"model answered {status}: {server_message(body)}"
    if status >= 500 or status in RETRYABLE_4XX:
        return Transient(message, retry_after=retry_after_seconds(retry_after))
    return ModelRefused(message, status=status)


class ModelClient:
    """One model endpoint over one aiohttp session."""

    def __init__(self, session: aiohttp.ClientSession, endpoint: ModelEndpoint) -> None:
        self._session = session
        self.endpoint = endpoint

    async def fetch_metadata(self, time_limit: float) -> list[InputMetadata]:
        """The model's declared inputs; empty when the server has no (usable) metadata."""
        if not self.endpoint.metadata_url:
            return []
        try:
            async with self._session.get(
                self.endpoint.metadata_url, timeout=aiohttp.ClientTimeout(total=time_limit)
            ) as response:
                if response.status != 200:
                    return []
                return parse_metadata(orjson.loads(await response.read()))
        except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError):
            return []

    async def infer(self, spec: TensorSpec, rows: Sequence[Any], time_limit: float) -> list[Any]:
        v2 = self.endpoint.protocol == "v2"
        body = v2_request(spec, rows) if v2 else v1_request(rows)
        with model_call_failures(time_limit):
            async with self._session.post(
                self.endpoint.url,
                data=body,
                headers={"Content-Type": "application/json", "Accept": "application/json"},
                timeout=aiohttp.ClientTimeout(total=time_limit),
            ) as response:
                answer = await response.read()
                if not 200 <= response.status < 300:
                    raise classify(response.status, answer, response.headers.get("Retry-After"))
        return parse_v2_response(answer, len(rows)) if v2 else parse_v1_response(answer, len(rows))


@contextlib.contextmanager
def model_call_failures(time_limit: float) -> Iterator[None]:
    """A model call that got no answer, as the runner's errors (whatever the protocol).

    A TLS failure is refused (a wrong CA or name does not mend itself); a
    connection failure or a timeout after ``time_limit`` seconds is transient.
    """
    try:
        yield
    except aiohttp.ClientSSLError as error:
        raise ModelRefused(f"model call failed: TLS: {trim(str(error))}") from None
    except (aiohttp.ClientError, ConnectionError) as error:
        raise Transient(f"model call failed: {type(error).__name__}: {trim(str(error))}") from None
    except TimeoutError:
        raise Transient(f"model call timed out after {time_limit:.1f}s") from None


@dataclass(frozen=True)
class BatchPlan:
    batch_size: int
    concurrency: int
    request_timeout: float
    retry: RetryPolicy

    @classmethod
    def from_contract(cls, batching: Batching | None) -> BatchPlan:
        settings = batching or Batching()
        return cls(
            batch_size=settings.batch_size,
            concurrency=settings.concurrency,
            request_timeout=settings.request_timeout_seconds,
            retry=RetryPolicy(max_retries=settings.max_retries),
        )


# What a model request being retried logs (runner.retry.log_retries).
MODEL_RETRY_EVENT = "model request failed, retrying"


async def start_inference(
    client: ModelClient,
    first_row: Any,
    input_name: str | None,
    plan: BatchPlan,
    deadline: Deadline,
    log: Any,
    **fields: Any,
) -> TensorSpec:
    """The model input for rows like ``first_row``, logged as "inference started" with ``fields``.

    A v2 model's metadata is asked first (:func:`resolve_tensor_spec`); rows that
    cannot be its input are :class:`InferenceRejected` (the same rows on every attempt).
    """
    metadata = []
    if client.endpoint.protocol == "v2":
        metadata = await client.fetch_metadata(deadline.cap(plan.request_timeout))
    try:
        spec = resolve_tensor_spec(first_row, input_name, metadata)
    except ShapeMismatch as error:
        raise InferenceRejected(str(error)) from None
    log.info(
        "inference started",
        url=client.endpoint.url,
        protocol=client.endpoint.protocol,
        input=spec.name,
        datatype=spec.datatype,
        shape=[-1, *spec.row_shape],
        batchSize=plan.batch_size,
        concurrency=plan.concurrency,
        **fields,
    )
    return spec


async def infer_batch(
    client: ModelClient,
    spec: TensorSpec,
    rows: Sequence[Any],
    plan: BatchPlan,
    deadline: Deadline,
    *,
    on_retry: Callable[[int, Transient, float], None] | None = None,
    sleep: Callable[[float], Any] = asyncio.sleep,
) -> list[Any]:
    """One batch's predictions, retried as ``plan`` says (:mod:`runner.retry`)."""

    async def attempt(time_limit: float) -> list[Any]:
        return await client.infer(spec, rows, time_limit)

    return await call_with_retries(
        attempt,
        policy=plan.retry,
        deadline=deadline,
        request_timeout=plan.request_timeout,
        sleep=sleep,
        on_retry=on_retry,
    )


async def predict(
    client: ModelClient,
    spec: TensorSpec,
    rows: Sequence[Any],
    plan: BatchPlan,
    deadline: Deadline,
    *,
    on_batch_done: Callable[[int], None] = lambda _rows: None,
    on_retry: Callable[[int, Transient, float], None] | None = None,
    sleep: Callable[[float], Any] = asyncio.sleep,
) -> list[Any]:
    """Every row's predictions, flattened, in input order."""

    async def one_batch(span: range) -> list[Any]:
        batch = rows[span.start : span.stop]
        predictions = await infer_batch(
            client, spec, batch, plan, deadline, on_retry=on_retry, sleep=sleep
        )
        on_batch_done(len(batch))
        return predictions

    answers = await map_ordered(
        batch_ranges(len(rows), plan.batch_size), one_batch, plan.concurrency
    )
    flat: list[Any] = []
    for answer in answers:
        flat.extend(answer)
    return flat
