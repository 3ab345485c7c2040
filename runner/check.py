"""``python -m runner --check``: a live probe of an InferenceConfig that moves no data.

The controller runs it as a short Job with the config's own runner image and
ServiceAccount, the contract mounted as for a run (``jobId`` the config's uid,
``jobName``, ``kserve``, ``input``, ``output``; ``parameters`` absent or empty)
and the container argument ``--check``. It reads the same environment as a run
(:mod:`runner.app`: ``CONTRACT_PATH``, ``TERMINATION_LOG_PATH``, ``POD_NAMESPACE``,
``RUNNER_DEADLINE_SECONDS``, ``KUBECONFIG`` outside a cluster, ``LOG_LEVEL``).

It never sends the model data and never writes to the storage. Steps, in order,
the first failure ending the check with its stage's exit code (the transient
one when asking again later may pass, the permanent one when it cannot):

1. ``contract`` (2): the contract parses and validates as a run's does;
2. Secrets: every Secret the ``input`` and ``output`` entries reference is read
   with the pod's ServiceAccount and makes an endpoint (:mod:`runner.secrets`):
   ``input`` 3 / ``output`` 5 when the API server cannot be reached or the
   Secret is unusable; 6 / 8 when it is missing (404) or forbidden (403);
3. storage: each provider's ``probe`` (:mod:`runner.storage.krateo`,
   :mod:`runner.storage.http`, :mod:`runner.storage.postgres`,
   :mod:`runner.storage.s3`, "Probe" in each; ``postgres`` connects in step 2,
   then ``PREPARE``s the query and checks the output table's conflict key;
   ``s3`` HEADs the input's objects or lists one page of a prefix), a read that
   moves no data:
   3 / 5 without a connection, on a timeout or a 5xx; 6 / 8 on a 401/403 or an
   answer saying the configuration is wrong (a missing bucket or object);
4. ``inference`` (4, 7): the model's metadata (:func:`model_probe`; with
   ``modelVersion: openai``, ``GET <modelUrl>/models``, which must list
   ``modelName`` when it is set: :func:`check_openai`; v2
   ``GET <base>/v2/models/<name>[/versions/<v>]``, v1 ``GET <base>/v1/models/<name>``,
   the base and name taken from ``kserve.modelUrl`` as a run takes them): 4
   without a connection, on a timeout, a 5xx, 408 or 429; 7 on another 4xx (no
   such model), a v2 answer that is not metadata, a ``modelInputName`` the
   model does not declare, or an input the runner cannot feed
   (:func:`input_problem`). Messages quote the model's own words, trimmed.

Success is exit 0 with a one-line JSON termination message::

    {"check":"ok","protocol":"v2","model":"sklearn-iris","input":"input-0",
     "inputs":[{"name":"input-0","datatype":"FP32","shape":[-1,4]}]}

``input`` is the input a run would send (v2 only), ``inputs`` what the model
declares (at most :data:`MAX_INPUTS_SHOWN`; empty for v1); ``model`` is null and
``metadata`` false when no model name can be derived, in which case only the
model URL's reachability is checked (any answer but a 5xx, 408, 429, 401 or 403).
A failure is the usual ``<stage>: <reason>`` line (:mod:`runner.termination`).
Every step that passes logs one line, ``check step passed`` with ``step``: ``contract``,
``secrets`` (``read``: the Secrets' names), ``storage`` (what each probe saw), ``model``.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import orjson

from contract.document import Contract, KServe
from contract.exitcodes import (
    ContractError,
    ExitCode,
    InferenceError,
    InferenceRejected,
    ModelAuthFailed,
)
from runner import openai, storage
from runner.app import Invocation
from runner.httputil import RETRYABLE_4XX, server_message, unanswered
from runner.inference import (
    DEFAULT_INPUT_NAME,
    InputMetadata,
    Protocol,
    endpoint_from_contract,
    parse_metadata,
)
from runner.logs import get_logger
from runner.proxy import client_session
from runner.retry import Deadline
from runner.secrets import (
    SecretError,
    SecretReader,
)
from runner.stages import STORAGE_ERRORS, storage_failures
from runner.storage.base import (
    Role,
    StorageContext,
    StorageError,
    StorageProvider,
    StorageRejected,
)
from runner.transport import AUTH_REFUSALS, model_session

MODEL_TIMEOUT_SECONDS = 10.0
MAX_INPUTS_SHOWN = 16
# What the runner sends are JSON numbers: any numeric tensor type takes them.
NUMERIC_DATATYPES = frozenset(
    {"FP16", "FP32", "FP64", "INT8", "INT16", "INT32", "INT64"}
    | {"UINT8", "UINT16", "UINT32", "UINT64"}
)
_V1_PATH = re.compile(r"^(?P<prefix>.*)/v1/models/(?P<name>[^/:]+):predict/?$")
# The messages runner.secrets gives a 404 and a 403, for a SecretError without a status.
_SECRET_REFUSED = re.compile(r"^Secret \S+ not found|may not read Secret \S+ \(403\)")


@dataclass(frozen=True)
class ModelProbe:
    """What the check GETs of the model: its metadata, or (no name known) its URL."""

    url: str
    protocol: Protocol | Literal["openai"]
    model_name: str | None

    @property
    def metadata(self) -> bool:
        return self.model_name is not None


def model_probe(kserve: KServe) -> ModelProbe:
    """The model's metadata URL, from ``modelUrl`` as a run reads it; ContractError if bad."""
    if openai.is_openai(kserve):
        target = openai.target_from_contract(kserve)
        return ModelProbe(f"{target.base_url}/models", "openai", target.model)
    endpoint = endpoint_from_contract(kserve)
    if endpoint.protocol == "v2":
        if endpoint.metadata_url and endpoint.model_name:
            return ModelProbe(endpoint.metadata_url, "v2", endpoint.model_name)
        return ModelProbe(endpoint.url, "v2", None)
    if not endpoint.model_name:
        return ModelProbe(endpoint.url, "v1", None)
    parts = urlsplit(endpoint.url)
    matched = _V1_PATH.match(parts.path)
    path = f"{matched.group('prefix') if matched else ''}/v1/models/{endpoint.model_name}"
    url = urlunsplit((parts.scheme, parts.netloc, path, "", ""))
    return ModelProbe(url, "v1", endpoint.model_name)


def describe(declared: InputMetadata) -> str:
    return f"{declared.name} ({declared.datatype} {list(declared.shape)})"


def select_input(
    inputs: Sequence[InputMetadata], input_name: str | None, model: str
) -> InputMetadata | None:
    """The declared input a run would fill: ``modelInputName``'s, else the first.

    :class:`InferenceRejected` when ``modelInputName`` is not among declared
    inputs; None when the model declares none (nothing to compare with).
    """
    if not inputs:
        return None
    if not input_name:
        return inputs[0]
    for declared in inputs:
        if declared.name == input_name:
            return declared
    listed = ", ".join(describe(d) for d in inputs[:MAX_INPUTS_SHOWN])
    raise InferenceRejected(
        f"model {model!r} has no input {input_name!r} (kserve.modelInputName); its inputs: {listed}"
    )


def input_problem(declared: InputMetadata, batch_size: int) -> str | None:
    """Why the runner cannot feed ``declared``, or None (see :mod:`runner.inference`).

    The runner sends JSON numbers, rows stacked along the first dimension: a
    numeric datatype, and, when the model declares two dimensions or more, a
    free first one (or 1 with a batch size of 1) and no nonsense sizes.
    """
    if declared.datatype.upper() not in NUMERIC_DATATYPES:
        return (
            f"datatype {declared.datatype}: the runner sends numbers "
            "(FP16, FP32, FP64, INT8-64, UINT8-64)"
        )
    shape = declared.shape
    if any(size < -1 for size in shape):
        return f"shape {list(shape)} has a negative size other than -1"
    if len(shape) >= 2:
        first = shape[0]
        if first >= 0 and not (first == 1 and batch_size == 1):
            return (
                f"shape {list(shape)} fixes the batch dimension at {first}; the runner sends "
                f"up to {batch_size} rows per request along it (-1 expected)"
            )
        if 0 in shape[1:]:
            return f"shape {list(shape)} has a dimension of size 0"
    return None


def secret_refused(error: SecretError) -> bool:
    """A missing (404) or forbidden (403) Secret: no retry of the check can read it."""
    status = getattr(error, "status", None)
    if isinstance(status, int):
        return status in (403, 404)
    return _SECRET_REFUSED.search(str(error)) is not None


def success_message(probe: ModelProbe, chosen: str | None, inputs: Sequence[InputMetadata]) -> str:
    summary: dict[str, Any] = {"check": "ok", "protocol": probe.protocol, "model": probe.model_name}
    if not probe.metadata:
        summary["metadata"] = False
    if chosen is not None:
        summary["input"] = chosen
    summary["inputs"] = [
        {"name": d.name, "datatype": d.datatype, "shape": list(d.shape)}
        for d in inputs[:MAX_INPUTS_SHOWN]
    ]
    return orjson.dumps(summary).decode()


class _WatchedSecrets:
    """Remembers the last Secret read that failed, so the check can say how it failed."""

    def __init__(self, inner: SecretReader) -> None:
        self._inner = inner
        self.failure: SecretError | None = None
        self.names: list[str] = []

    async def read(self, namespace: str, name: str) -> Mapping[str, str]:
        try:
            data = await self._inner.read(namespace, name)
        except SecretError as error:
            self.failure = error
            raise
        self.names.append(f"{namespace}/{name}")
        return data


async def _prepare(
    role: Role, provider: StorageProvider, ctx: StorageContext, watched: _WatchedSecrets
) -> None:
    transient, rejected = STORAGE_ERRORS[role]
    watched.failure = None
    try:
        await provider.prepare(ctx)
    except StorageRejected as error:
        raise rejected(error.message) from None
    except StorageError as error:
        refused = watched.failure is not None and secret_refused(watched.failure)
        raise (rejected if refused else transient)(error.message) from None


async def _probe(role: Role, provider: StorageProvider, ctx: StorageContext) -> str:
    transient, _ = STORAGE_ERRORS[role]
    probe = getattr(provider, "probe", None)
    if probe is None:
        raise transient(f"the {provider.key} provider has no probe: cannot check it")
    with storage_failures(role):
        saw: str = await probe(ctx)
    return saw


async def check_model(
    session: aiohttp.ClientSession, contract: Contract, probe: ModelProbe, deadline: Deadline
) -> str:
    """Step 4; the termination message on success, a stage error otherwise."""
    limit = max(deadline.cap(MODEL_TIMEOUT_SECONDS), 0.001)
    what = f"GET {probe.url}"
    try:
        async with session.get(
            probe.url,
            headers={"Accept": "application/json"},
            timeout=aiohttp.ClientTimeout(total=limit),
        ) as response:
            status = response.status
            body = await response.read()
    except (aiohttp.ClientError, ConnectionError, TimeoutError) as error:
        raise InferenceError(unanswered(what, error, limit)) from None
    who = f"model {probe.model_name!r}: " if probe.model_name else ""
    answered = f"{who}{what} answered {status}: {server_message(body)}"
    if status >= 500 or status in RETRYABLE_4XX:
        raise InferenceError(answered)
    if status in AUTH_REFUSALS:
        raise ModelAuthFailed(f"the model refused access (see kserve.auth): {answered}")
    if not probe.metadata:
        return success_message(probe, None, [])
    if not 200 <= status < 300:
        raise InferenceRejected(answered)
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        document = None
    if not isinstance(document, dict):
        raise InferenceRejected(
            f"{who}{what} answered {status} with something that is not model metadata: "
            f"{server_message(body)}"
        )
    name = probe.model_name or ""
    if probe.protocol == "openai":
        return check_openai(probe, document, f"{who}{what}")
    if probe.protocol == "v1":
        if document.get("ready") is False:
            raise InferenceError(f"{who}{what} says the model is not ready")
        return success_message(probe, None, [])
    inputs = parse_metadata(document)
    wanted = contract.kserve.model_input_name
    declared = select_input(inputs, wanted, name)
    if declared is not None:
        batch_size = contract.batching.batch_size if contract.batching else 256
        problem = input_problem(declared, batch_size)
        if problem:
            raise InferenceRejected(f"model {name!r} input {describe(declared)}: {problem}")
    chosen = declared.name if declared else (wanted or DEFAULT_INPUT_NAME)
    return success_message(probe, chosen, inputs)


def check_openai(probe: ModelProbe, document: dict[str, Any], what: str) -> str:
    """An OpenAI model list (``{"data": [{"id": ...}]}``) that has the model, if one is named."""
    data = document.get("data")
    if not isinstance(data, list):
        raise InferenceRejected(f"{what} answered something that is not a model list")
    served = [str(m.get("id")) for m in data if isinstance(m, dict) and m.get("id") is not None]
    if probe.model_name is not None and probe.model_name not in served:
        listed = ", ".join(repr(m) for m in served[:MAX_INPUTS_SHOWN]) or "none"
        raise InferenceRejected(
            f"model {probe.model_name!r} is not served there (kserve.modelName); "
            f"the server lists: {listed}"
        )
    summary = {"check": "ok", "protocol": "openai", "model": probe.model_name, "models": served}
    return orjson.dumps(summary).decode()


@dataclass
class _Step:
    name: str = "contract"


async def run(
    environ: Mapping[str, str] | None = None,
    *,
    secrets: SecretReader | None = None,
) -> int:
    """Check the contract the environment points at; returns the exit code."""
    call = Invocation.start("check", environ, get_logger().bind(check=True))
    step = _Step()
    providers: dict[Role, StorageProvider] = {}
    try:
        env, contract = call.load()
        log = call.log
        probe = model_probe(contract.kserve)
        parameters = dict(contract.parameters or {})
        try:
            providers = {
                "input": storage.resolve(contract.input, "input", parameters),
                "output": storage.resolve(contract.output, "output", parameters),
            }
        except ValueError as error:
            raise ContractError(str(error)) from None
        log.info(
            "check step passed",
            step="contract",
            modelUrl=contract.kserve.model_url,
            input=providers["input"].key,
            output=providers["output"].key,
        )
        watched = _WatchedSecrets(call.secrets(secrets))
        deadline = Deadline(env.deadline_seconds)
        # The same proxy rule as a run's (runner.app.execute).
        async with client_session() as session:
            ctx = StorageContext(
                session=session,
                secrets=watched,
                namespace=env.namespace,
                job_id=contract.job_id,
                pod_uid=env.pod_uid,
                parameters=parameters,
                deadline=deadline,
                log=log,
            )
            for role, provider in providers.items():
                step.name = role
                await _prepare(role, provider, ctx, watched)
            log.info("check step passed", step="secrets", read=watched.names)
            saw = {}
            for role, provider in providers.items():
                step.name = role
                saw[role] = await _probe(role, provider, ctx)
            log.info("check step passed", step="storage", **saw)
            step.name = "inference"
            async with model_session(contract.kserve.transport) as to_model:
                message = await check_model(to_model, contract, probe, deadline)
            log.info("check step passed", step="model", url=probe.url)
    except (asyncio.CancelledError, Exception) as error:
        return call.failed(error, step.name, f"check stopped during {step.name}")
    finally:
        await storage.close(*providers.values())
        await call.close()
    call.succeeded("check succeeded", message, result=message)
    return int(ExitCode.DONE)
