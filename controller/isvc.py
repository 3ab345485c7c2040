"""A config's model named by a KServe InferenceService: resolve it to the contract's fields. Pure.

``spec.kserve.inferenceServiceRef`` (``name``, ``namespace`` defaulting to
the config's, ``preferAddress``) names an InferenceService
(``serving.kserve.io/v1beta1``). :func:`resolve` reads the service as the
controller's cache holds it and gives either a :class:`ResolvedModel` (what
the contract gets) or a :class:`ModelProblem` (why runs must wait, as a
condition's reason and message):

- **URL**: the service's base URL, ``status.address.url`` (cluster-local)
  with ``preferAddress: internal`` (the default; ``status.url`` when the
  service has no address), or ``status.url`` with ``external``; then the
  protocol's inference path: ``<base>/v2/models/<model>/infer`` (v2),
  ``<base>/v1/models/<model>:predict`` (v1), or for ``modelVersion: openai``
  the OpenAI-compatible API's base, ``<base>/openai/v1`` (where KServe's
  Hugging Face and vLLM runtimes serve ``chat/completions``, ``completions``
  and ``embeddings``; the runner adds the endpoint).
- **Protocol**: the config's ``modelVersion`` when set, else the predictor's
  ``protocolVersion`` (``spec.predictor.model``, or the older framework
  fields such as ``spec.predictor.sklearn``), else KServe's default ``v1``.
  ``grpc-v2`` has no HTTP endpoint for the runner: a problem.
- **Model name**: the config's ``modelName`` when set, else KServe's default,
  the service's name.
- **Ready**: the service's ``Ready`` condition. While it is not True (or the
  service has no URL yet) the problem is ``ModelNotReady`` with KServe's own
  condition message. A one-shot run waits for it (``Pending``); a scheduled
  run's CronJob is suspended until it is Ready (``controller.plan``).

What the controller could not read is a problem too (:class:`Access`): the
InferenceService CRD is not installed (``InferenceServiceCRDMissing``), the
controller may not list InferenceServices (``InferenceServiceForbidden``),
the support is turned off (``InferenceServicesDisabled``), the cache has not
been filled yet, or the service's namespace is not watched
(``InferenceServiceOutOfReach``). A service that does not exist is
``InferenceServiceNotFound``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from contract.document import KServe
from controller.api import InferenceConfig, InferenceServiceRef, ModelStatus
from kubeclient.resources import Obj, Resource

INFERENCESERVICES = Resource(
    "serving.kserve.io", "v1beta1", "inferenceservices", "InferenceService"
)

REASON_MODEL_NOT_READY = "ModelNotReady"
REASON_NOT_FOUND = "InferenceServiceNotFound"
REASON_CRD_MISSING = "InferenceServiceCRDMissing"
REASON_FORBIDDEN = "InferenceServiceForbidden"
REASON_DISABLED = "InferenceServicesDisabled"
REASON_OUT_OF_REACH = "InferenceServiceOutOfReach"
REASON_UNSUPPORTED_PROTOCOL = "UnsupportedProtocol"

# KServe's default protocolVersion.
DEFAULT_PROTOCOL = "v1"
HTTP_PROTOCOLS = ("v1", "v2")
# A config's modelVersion for OpenAI-compatible endpoints (runner.openai), and
# the path under which KServe's runtimes serve them on the predictor.
OPENAI_PROTOCOL = "openai"
OPENAI_PATH = "/openai/v1"
# The predictor's framework fields (KServe's older spelling of spec.predictor.model).
_FRAMEWORKS = (
    "model",
    "sklearn",
    "xgboost",
    "lightgbm",
    "tensorflow",
    "pytorch",
    "triton",
    "onnx",
    "pmml",
    "paddle",
    "huggingface",
)


class Access(Enum):
    """Whether the controller can read InferenceServices at all."""

    READY = "ready"  # the cache is filled and kept up to date
    SYNCING = "syncing"  # the cache is being filled
    CRD_MISSING = "crd-missing"
    FORBIDDEN = "forbidden"
    DISABLED = "disabled"


@dataclass(frozen=True)
class AccessState:
    access: Access
    # The API server's words, for FORBIDDEN.
    detail: str = ""


@dataclass(frozen=True)
class ModelProblem:
    reason: str
    message: str
    # What the service (or the controller's access to it) says, as opposed to
    # a cache still being filled: only a settled problem suspends a scheduled
    # run's CronJob (a controller restarting must not pause every schedule).
    settled: bool = True


@dataclass(frozen=True)
class ResolvedModel:
    service: str  # namespace/name
    url: str
    protocol: str
    model_name: str

    def status(self) -> ModelStatus:
        return ModelStatus(
            url=self.url,
            protocol=self.protocol,
            name=self.model_name,
            inference_service=self.service,
        )


Resolution = ResolvedModel | ModelProblem


def service_key(config: InferenceConfig) -> str | None:
    """``namespace/name`` of the InferenceService the config references, or None."""
    ref = config.spec.inference_service_ref
    if ref is None:
        return None
    return f"{ref.namespace or config.metadata.namespace}/{ref.name}"


def _ready_condition(isvc: Obj) -> Obj | None:
    for cond in (isvc.get("status") or {}).get("conditions") or []:
        if isinstance(cond, dict) and cond.get("type") == "Ready":
            return cond
    return None


def protocol_of(isvc: Obj) -> str:
    """The predictor's ``protocolVersion``, or KServe's default."""
    predictor = (isvc.get("spec") or {}).get("predictor") or {}
    for framework in _FRAMEWORKS:
        found = (predictor.get(framework) or {}).get("protocolVersion")
        if isinstance(found, str) and found:
            return found
    return DEFAULT_PROTOCOL


def base_url(isvc: Obj, ref: InferenceServiceRef) -> str | None:
    status = isvc.get("status") or {}
    internal = (status.get("address") or {}).get("url")
    external = status.get("url")
    if ref.prefer_address == "external":
        return external or None
    return internal or external or None


def inference_url(base: str, protocol: str, model: str) -> str:
    base = base.rstrip("/")
    if protocol == "v1":
        return f"{base}/v1/models/{model}:predict"
    if protocol == OPENAI_PROTOCOL:
        return f"{base}{OPENAI_PATH}"
    return f"{base}/v2/models/{model}/infer"


def resolve(
    config: InferenceConfig,
    isvc: Obj | None,
    state: AccessState,
    watch_namespaces: tuple[str, ...] = (),
) -> Resolution:
    """The model a config's ``inferenceServiceRef`` names, or why it cannot be used now."""
    ref = config.spec.inference_service_ref
    key = service_key(config)
    if ref is None or key is None:
        raise ValueError("resolve() is for configs with an inferenceServiceRef")
    namespace = ref.namespace or config.metadata.namespace
    what = f"InferenceService {key}"
    if state.access is Access.DISABLED:
        return ModelProblem(
            REASON_DISABLED,
            f"{what} cannot be read: the controller's InferenceService support is off "
            "(INFERENCESERVICES=false, the chart's inferenceServices.enabled): turn it on, "
            "or name the model by kserve.modelUrl",
        )
    if watch_namespaces and namespace not in watch_namespaces:
        return ModelProblem(
            REASON_OUT_OF_REACH,
            f"{what} is in a namespace the controller does not watch (it watches "
            f"{', '.join(watch_namespaces)})",
        )
    if state.access is Access.CRD_MISSING:
        return ModelProblem(
            REASON_CRD_MISSING,
            f"{what} cannot be read: the cluster has no InferenceService CRD "
            "(serving.kserve.io/v1beta1); install KServe, or name the model by kserve.modelUrl",
        )
    if state.access is Access.FORBIDDEN:
        return ModelProblem(
            REASON_FORBIDDEN,
            f"{what} cannot be read: the controller may not list inferenceservices "
            f"(grant get, list and watch on inferenceservices.serving.kserve.io): {state.detail}",
        )
    if state.access is Access.SYNCING and isvc is None:
        return ModelProblem(
            REASON_MODEL_NOT_READY,
            f"{what}: the controller is still reading InferenceServices",
            settled=False,
        )
    if isvc is None:
        return ModelProblem(REASON_NOT_FOUND, f"{what} not found")
    kserve = config.spec.effective_kserve()
    protocol = (kserve.model_version or "").strip() or protocol_of(isvc)
    if protocol.lower() in (*HTTP_PROTOCOLS, OPENAI_PROTOCOL):
        protocol = protocol.lower()
    elif protocol.lower().startswith("grpc"):
        return ModelProblem(
            REASON_UNSUPPORTED_PROTOCOL,
            f"{what} serves protocol {protocol}, which the runner cannot call: "
            "use v1 or v2 (kserve.modelVersion overrides the service's)",
        )
    ready = _ready_condition(isvc)
    if ready is None or ready.get("status") != "True":
        said = (ready or {}).get("message") or (ready or {}).get("reason")
        return ModelProblem(
            REASON_MODEL_NOT_READY,
            f"{what} is not Ready: {said}" if said else f"{what} is not Ready yet",
        )
    base = base_url(isvc, ref)
    if base is None:
        where = "status.url" if ref.prefer_address == "external" else "status.address.url"
        return ModelProblem(REASON_MODEL_NOT_READY, f"{what} is Ready but has no {where} yet")
    model = (kserve.model_name or "").strip() or ref.name
    known = (*HTTP_PROTOCOLS, OPENAI_PROTOCOL)
    url = inference_url(base, protocol, model) if protocol in known else base
    return ResolvedModel(service=key, url=url, protocol=protocol, model_name=model)


def contract_model(config: InferenceConfig, resolved: ResolvedModel | None) -> KServe:
    """The contract's ``kserve``: the config's fields, with what the service resolved to."""
    kserve = config.spec.effective_kserve()
    if resolved is None:
        return kserve
    return kserve.model_copy(
        update={
            "model_url": resolved.url,
            "model_name": resolved.model_name,
            "model_version": resolved.protocol,
        }
    )
