"""Models of the two custom resources, ``InferenceConfig`` and ``InferenceRun``.

The CRDs in ``crds/`` are the first line of validation: everything one object
can say about itself that OpenAPI + CEL can check is rejected by the API server.
These models parse what the API server returns (unknown fields tolerated, so a
newer CRD never breaks an older controller) and check the rest:

- the merged model fields (nested ``spec.kserve.*`` wins over the upstream
  README's flat ``spec.modelName``…) must name a model URL;
- a schedule must also be one that ``croniter`` can step through (a range that
  runs backwards, or ``0 0 31 2 *`` which never fires, passes any regex);
- ``timeZone`` must exist in the time-zone database;
- storage settings and the model URL must not carry a credential inline (they
  reach the contract, a ConfigMap and the run's status, all readable by more
  people than a Secret).

They also repeat the CRD's rules for what the API server would refuse (or
the Job and CronJob controllers mishandle) when the controller creates the
children: deadlines a Go ``time.Duration`` can hold, cron steps robfig/cron can
parse, bounded parameters, an image and runner ``resources`` a Pod may have.
An object the API server stored under an older CRD is then still refused
before any child is made.

Two topics live in modules of their own: the cron grammar and time zones in
``controller.cron``, and what a credential looks like (the storage scan) in
``contract.credentials``, which the runner's redaction shares.

Three more have their own modules too: quantities and container resources
(``controller.quantity``), the names, labels and env a runner pod may carry
(``controller.validation``), and the cache of parsed models
(``controller.modelcache``). A failed check is a ``pydantic.ValidationError``;
``controller.invalid.describe_invalid`` turns it (or an ``InvalidObject``) into
the ``(reason, message)`` pair of a condition.
The status models are what the controller writes; ``to_api()`` gives the JSON
body with camelCase keys and without unset fields.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    ValidatorFunctionWrapHandler,
    computed_field,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic.dataclasses import dataclass
from pydantic_core import PydanticCustomError

from contract.credentials import (
    find_inline_credentials,
    is_credential_env,
    is_credential_key,
    text_has_credential,
)
from contract.document import (
    MODEL_CA_FILE,
    MODEL_TOKEN_FILE,
    Batching,
    KServe,
    ModelTransport,
    SecretSource,
    secret_references,
)
from contract.termination import RunResult
from controller.cron import Schedule, TimeZone
from controller.quantity import parse_quantity, resource_list_errors, resource_requirements_errors
from controller.validation import (
    DNS_SUBDOMAIN_PATTERN,
    ENV_NAME_PATTERN,
    LABEL_VALUE_RE,
    MAX_ENV,
    MAX_ENV_VALUE_LENGTH,
    MAX_TOLERATIONS,
    RESERVED_ENV_NAMES,
    NodeSelector,
    PodAnnotations,
    PodLabels,
    qualified_name_error,
)
from kubeclient.resources import API_VERSION as API_VERSION
from kubeclient.resources import CONFIG_KIND as CONFIG_KIND
from kubeclient.resources import CONFIG_PLURAL as CONFIG_PLURAL
from kubeclient.resources import GROUP as GROUP
from kubeclient.resources import RUN_KIND as RUN_KIND
from kubeclient.resources import RUN_PLURAL as RUN_PLURAL
from kubeclient.resources import VERSION as VERSION

AutoDeletePolicy = Literal["None", "DeleteOnSuccess", "DeleteOnCompletion"]
ImagePullPolicy = Literal["Always", "IfNotPresent", "Never"]
# InferenceConfig.spec.unkeyedOutputRetries: whether a run whose output is not
# keyed may try again after a failed attempt (which may have stored rows).
UnkeyedOutputRetries = Literal["Allow", "Never"]
ConcurrencyPolicy = Literal["Allow", "Forbid", "Replace"]
Phase = Literal["Pending", "Running", "Succeeded", "Failed", "Scheduled", "Suspended", "Error"]
ExecutionPhase = Literal["Pending", "Running", "Succeeded", "Failed"]
ConditionStatus = Literal["True", "False", "Unknown"]

# Condition types. Ready is upstream's; Complete/Failed mirror the Job's so
# that `kubectl wait --for=condition=Complete` works on a run.
CONDITION_READY = "Ready"
CONDITION_COMPLETE = "Complete"
CONDITION_FAILED = "Failed"
# kstatus' conditions (cli-utils, read by Flux and kpt): abnormal-true polarity.
CONDITION_RECONCILING = "Reconciling"
CONDITION_STALLED = "Stalled"
# An InferenceConfig's live check (controller/probe.py).
CONDITION_PROBED = "Probed"

# Reason for every validation error that has no more specific one.
REASON_INVALID_SPEC = "InvalidSpec"

DEFAULT_BACKOFF_LIMIT = 2
DEFAULT_CONCURRENCY_POLICY: ConcurrencyPolicy = "Forbid"
MAX_PARALLELISM = 1000
# Condition messages stay short enough to read in `kubectl describe`.
MAX_MESSAGE_LENGTH = 1024
# timeoutSeconds (the Job's activeDeadlineSeconds) and startingDeadlineSeconds
# become a Go time.Duration (int64 nanoseconds) in the Job and CronJob
# controllers, which overflows past 2^63 ns (about 292 years): a Job with a
# deadline of 1000 years fails at once with DeadlineExceeded. Ten years (of 365
# days) is far below the overflow and far above any batch inference.
MAX_DEADLINE_SECONDS = 10 * 365 * 24 * 3600
# spec.parameters are copied into the contract (its ConfigMap holds at most
# 1 MiB; the run's status.contract sits next to spec.parameters in one etcd
# object of at most 1.5 MiB), and `kubectl apply` copies the whole run into an
# annotation (all annotations: at most 256 KiB). Go's JSON encoding writes at
# most 6 bytes per character (`<` is \u003c), so 32 Ki characters of names and
# values take at most 192 KiB in each, whatever they hold.
MAX_PARAMETERS = 64
MAX_PARAMETER_NAME_LENGTH = 253
MAX_PARAMETER_VALUE_LENGTH = 4096
MAX_PARAMETERS_TOTAL_LENGTH = 32768
# A DNS-1123 label (IsDNS1123Label), e.g. a Kueue LocalQueue's name.
DNS_LABEL_PATTERN = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"

# --------------------------------------------------------------------------------------------
# Schedules and time zones: controller.cron (the Schedule and TimeZone types),
# whose cron pattern is also the CRD's CEL rule.

# --------------------------------------------------------------------------------------------
# Inline credentials. Storage settings are scanned with contract.credentials
# (find_inline_credentials: what a credential is, defined once for the runner's
# redaction, the controller's logs and this check).

# A model URL with a password in its userinfo: `http://user:pw@host/...`, or
# `user:pw@host/...` to which the runner adds http://. The CRD's CEL rule on
# kserve.modelUrl and modelUrl is this pattern (a unit test checks), so it uses
# nothing RE2 and Python's `re` read differently.
MODEL_URL_WITH_PASSWORD = "^([A-Za-z][A-Za-z0-9+.-]*://)?[^/?#@]*:[^/?#@]*@"
_MODEL_URL_WITH_PASSWORD = re.compile(MODEL_URL_WITH_PASSWORD)


def model_url_has_password(url: str | None) -> bool:
    """Whether ``url`` carries ``user:password@`` before its host, or any other
    credential (``?api_key=...``, a JWT) that ``contract.credentials`` recognises."""
    if url is None:
        return False
    return _MODEL_URL_WITH_PASSWORD.match(url) is not None or text_has_credential(url)


# --------------------------------------------------------------------------------------------
# Models.


# Statuses repeat a handful of instants (the conditions of a pass share one),
# and each is converted on every parse and every to_api(): remembered.
@functools.lru_cache(maxsize=4096)
def _utc(value: datetime) -> datetime:
    # Truncated to what the API server keeps (metav1.Time: seconds), so a
    # status built in memory compares equal to the same status read back.
    value = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    return value.replace(microsecond=0)


@functools.lru_cache(maxsize=4096)
def _rfc3339(value: datetime) -> str:
    # metav1.Time: second precision, UTC, "Z".
    return _utc(value).strftime("%Y-%m-%dT%H:%M:%SZ")


KubeTime = Annotated[
    datetime, AfterValidator(_utc), PlainSerializer(_rfc3339, return_type=str, when_used="json")
]


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="ignore",
    )

    def to_api(self) -> dict[str, Any]:
        """The JSON body for the API server: camelCase keys, unset fields left out."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class ObjectMeta(_Model):
    name: str
    namespace: str = ""
    uid: str = ""
    generation: int = 0
    resource_version: str = ""
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    creation_timestamp: KubeTime | None = None
    deletion_timestamp: KubeTime | None = None


class ConfigRef(_Model):
    """``InferenceRun.spec.configRef``; the namespace defaults to the run's."""

    name: str = Field(min_length=1)
    namespace: str | None = None


class SecretRef(_Model):
    """``InferenceConfig.spec.credentialsRef``: an image pull Secret.

    Image pull Secrets are looked up in the pod's (the run's) namespace, so
    ``namespace`` is accepted for upstream compatibility but cannot point
    elsewhere; ``run_config_warnings`` says so when it differs.
    """

    name: str = Field(min_length=1)
    namespace: str | None = None


class Storage(_Model):
    """Provider key (``krateo``, ``http``, …) -> settings passed to the runner unmodified."""

    input: dict[str, dict[str, Any]] = Field(default_factory=dict)
    output: dict[str, dict[str, Any]] = Field(default_factory=dict)

    @property
    def keyed(self) -> bool:
        """Whether the run's output is keyed (see :func:`keyed_output`)."""
        return keyed_output(self.input, self.output)


# Output providers whose every write is keyed, paged or not: postgres inserts
# each prediction keyed by (run, shard, row position), ON CONFLICT DO NOTHING
# (runner/storage/postgres.py).
ALWAYS_KEYED_OUTPUTS = frozenset({"postgres"})


def keyed_output(storage_input: Any, storage_output: Any) -> bool:
    """Whether a run with these storage entries writes keyed (idempotent) output.

    An input entry with ``paging`` makes the run stream, and a streaming run
    keys every prediction by (run, shard, row position); an output provider of
    :data:`ALWAYS_KEYED_OUTPUTS` does so always. The storage then keeps one
    prediction per key, so an attempt that starts again stores no row twice.
    Otherwise the runner writes plain rows, and a retried attempt starts again
    from row 0. The arguments are the config's or a contract's ``input`` and
    ``output`` mappings.
    """
    if isinstance(storage_output, Mapping) and any(
        key in ALWAYS_KEYED_OUTPUTS for key in storage_output
    ):
        return True
    if not isinstance(storage_input, Mapping):
        return False
    return any(
        isinstance(entry, Mapping) and entry.get("paging") is not None
        for entry in storage_input.values()
    )


Quantity = str | int | float


def _resource_list(value: dict[str, Quantity] | None) -> dict[str, Quantity] | None:
    errors = resource_list_errors(value or {})
    if errors:
        raise PydanticCustomError("InvalidResources", "; ".join(errors))
    return value


ResourceList = Annotated[dict[str, Quantity] | None, AfterValidator(_resource_list)]


class ResourceRequirements(_Model):
    """The runner container's ``resources``, held to what a Pod may have."""

    limits: ResourceList = None
    requests: ResourceList = None

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        errors = resource_requirements_errors(self.limits or {}, self.requests or {})
        if errors:
            raise PydanticCustomError("InvalidResources", "; ".join(errors))
        return self


class Toleration(_Model):
    """``core/v1 Toleration``, held to what Pod validation accepts."""

    key: str | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None

    @model_validator(mode="after")
    def _valid(self) -> Self:
        errors: list[str] = []
        if self.key:
            problem = qualified_name_error(self.key)
            if problem is not None:
                errors.append(f"key {problem}")
        elif self.operator != "Exists":
            errors.append("a toleration without a key must have operator Exists")
        if self.operator == "Exists" and self.value:
            errors.append("a toleration with operator Exists must not have a value")
        if self.value and (len(self.value) > 63 or not LABEL_VALUE_RE.fullmatch(self.value)):
            errors.append(f"value {self.value!r} is not a label value")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            errors.append("tolerationSeconds needs effect NoExecute")
        if errors:
            raise PydanticCustomError("InvalidRunnerPod", "{errors}", {"errors": "; ".join(errors)})
        return self


class EnvVar(_Model):
    """``core/v1 EnvVar``: a value, or a ``valueFrom`` the API server checks."""

    name: str = Field(min_length=1, max_length=256, pattern=ENV_NAME_PATTERN)
    value: str | None = Field(default=None, max_length=MAX_ENV_VALUE_LENGTH)
    value_from: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _valid(self) -> Self:
        if self.name in RESERVED_ENV_NAMES:
            raise PydanticCustomError(
                "InvalidRunnerPod",
                "env {name} is set by the controller or read by the runner from it "
                "(reserved: {reserved})",
                {"name": self.name, "reserved": ", ".join(RESERVED_ENV_NAMES)},
            )
        if self.value and self.value_from is not None:
            raise PydanticCustomError(
                "InvalidRunnerPod", "env {name} has both value and valueFrom", {"name": self.name}
            )
        if self.value and (is_credential_env(self.name) or text_has_credential(self.value)):
            raise PydanticCustomError(
                "InlineCredentials",
                "env {name} holds a credential in clear: the Job's pod template is readable by "
                "whoever may read Jobs, so take it from a Secret (valueFrom.secretKeyRef)",
                {"name": self.name},
            )
        return self


class RunnerPod(_Model):
    """``InferenceConfig.spec.runnerPod``: what runner pods (and the config's probe) carry."""

    labels: PodLabels = None
    annotations: PodAnnotations = None
    node_selector: NodeSelector = None
    tolerations: list[Toleration] | None = Field(default=None, max_length=MAX_TOLERATIONS)
    # Passed through as is: the API server validates it when the Job is created.
    affinity: dict[str, Any] | None = None
    priority_class_name: str | None = Field(
        default=None, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN
    )
    env: list[EnvVar] | None = Field(default=None, max_length=MAX_ENV)

    @field_validator("env")
    @classmethod
    def _unique_env(cls, value: list[EnvVar] | None) -> list[EnvVar] | None:
        names = [e.name for e in value or []]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise PydanticCustomError(
                "InvalidRunnerPod", "env names must be unique: {names}", {"names": ", ".join(twice)}
            )
        return value


def _positive_quantity(value: str | int | None) -> str | int | None:
    if value is None:
        return None
    parsed = parse_quantity(value)
    if parsed is None or parsed <= 0:
        raise PydanticCustomError(
            "InvalidRunnerPod",
            "tmpSizeLimit must be a positive quantity (e.g. 1Gi, 500Mi), got {value!r}",
            {"value": value},
        )
    return value


class RunnerPodDefaults(RunnerPod):
    """The controller's ``RUNNER_POD_DEFAULTS``: a ``runnerPod`` plus default ``resources``
    and the size limit of the runner's ``/tmp`` (``tmpSizeLimit``; unset: the renderer's
    default).

    Also the shape of a config's effective runner pod (:func:`merge_runner_pod`).
    """

    resources: ResourceRequirements | None = None
    tmp_size_limit: Annotated[str | int | None, AfterValidator(_positive_quantity)] = None


def merge_runner_pod(
    config: RunnerPod | None,
    defaults: RunnerPodDefaults | None,
    resources: ResourceRequirements | None = None,
) -> RunnerPodDefaults:
    """A config's runner pod over the controller's defaults; the config wins.

    Maps (labels, annotations, nodeSelector) merge key by key; env merges by
    name (the defaults' order, then the config's new names); tolerations are
    the defaults' then the config's, each once; affinity, priorityClassName and
    ``resources`` (the config's ``spec.resources``) are the config's when set,
    else the defaults'; ``tmpSizeLimit`` is the defaults' (a config has none).
    """
    own = config or RunnerPod()
    base = defaults or RunnerPodDefaults()

    def maps(a: dict[str, str] | None, b: dict[str, str] | None) -> dict[str, str] | None:
        merged = {**(a or {}), **(b or {})}
        return merged or None

    env: dict[str, EnvVar] = {e.name: e for e in base.env or []}
    env.update({e.name: e for e in own.env or []})
    tolerations: list[Toleration] = []
    for toleration in [*(base.tolerations or []), *(own.tolerations or [])]:
        if toleration not in tolerations:
            tolerations.append(toleration)
    return RunnerPodDefaults(
        labels=maps(base.labels, own.labels),
        annotations=maps(base.annotations, own.annotations),
        node_selector=maps(base.node_selector, own.node_selector),
        tolerations=tolerations or None,
        affinity=own.affinity if own.affinity is not None else base.affinity,
        priority_class_name=own.priority_class_name or base.priority_class_name,
        env=list(env.values()) or None,
        resources=resources if resources is not None else base.resources,
        tmp_size_limit=base.tmp_size_limit,
    )


# InferenceServiceRef.preferAddress: the service's cluster-local address
# (status.address.url) or its external URL (status.url).
PreferAddress = Literal["internal", "external"]


class InferenceServiceRef(_Model):
    """``spec.kserve.inferenceServiceRef``: the KServe InferenceService whose model runs call.

    The namespace defaults to the config's. The controller reads the service
    (``serving.kserve.io/v1beta1``) and puts its URL, protocol and model name
    into each run's contract (``controller.isvc``).
    """

    name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)
    namespace: str | None = Field(default=None, max_length=63, pattern=DNS_LABEL_PATTERN)
    prefer_address: PreferAddress = "internal"


# HTTP header names (RFC 9110 tokens).
HEADER_NAME_PATTERN = "^[!#$%&'*+.^_`|~0-9A-Za-z-]+$"
SECRET_KEY_PATTERN = "^[-._a-zA-Z0-9]+$"
MAX_MODEL_HEADERS = 32
# A projected ServiceAccount token lives at least 10 minutes (the API server's minimum).
MIN_TOKEN_EXPIRATION_SECONDS = 600


class TokenSecretRef(_Model):
    """A Secret key holding a bearer token, in the run's namespace (mounted into the pod)."""

    name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)
    key: str = Field(default="token", min_length=1, max_length=253, pattern=SECRET_KEY_PATTERN)


class ServiceAccountToken(_Model):
    """A projected token of the runner's ServiceAccount for ``audience``."""

    audience: str = Field(min_length=1, max_length=1024)
    expiration_seconds: int = Field(
        default=3600, ge=MIN_TOKEN_EXPIRATION_SECONDS, le=MAX_DEADLINE_SECONDS
    )


class ModelAuth(_Model):
    """``spec.kserve.auth``: the bearer token the runner sends the model (exactly one source)."""

    bearer_token_secret_ref: TokenSecretRef | None = None
    service_account_token: ServiceAccountToken | None = None

    @model_validator(mode="after")
    def _one(self) -> Self:
        if (self.bearer_token_secret_ref is None) == (self.service_account_token is None):
            raise PydanticCustomError(
                "InvalidSpec",
                "kserve.auth needs exactly one of bearerTokenSecretRef and serviceAccountToken",
            )
        return self


class CASecretRef(_Model):
    name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)
    key: str = Field(default="ca.crt", min_length=1, max_length=253, pattern=SECRET_KEY_PATTERN)


class CABundle(_Model):
    """A PEM bundle of CAs in a Secret or a ConfigMap of the run's namespace (exactly one)."""

    secret_ref: CASecretRef | None = None
    config_map_ref: CASecretRef | None = None

    @model_validator(mode="after")
    def _one(self) -> Self:
        if (self.secret_ref is None) == (self.config_map_ref is None):
            raise PydanticCustomError(
                "InvalidSpec", "kserve.tls.caBundle needs exactly one of secretRef and configMapRef"
            )
        return self


class ModelTLS(_Model):
    """``spec.kserve.tls``: how the model's certificate is checked."""

    ca_bundle: CABundle | None = None
    insecure_skip_verify: bool = False


def _model_headers(value: dict[str, str] | None) -> dict[str, str] | None:
    for name in value or {}:
        if not re.fullmatch(HEADER_NAME_PATTERN, name):
            raise PydanticCustomError(
                "InvalidSpec", "kserve.headers: {name!r} is not a header name", {"name": name}
            )
        if is_credential_key(name):
            raise PydanticCustomError(
                "InlineCredentials",
                "kserve.headers.{name} carries a credential: headers reach the contract, a "
                "ConfigMap and the run's status; use kserve.auth (a Secret or a ServiceAccount "
                "token) instead",
                {"name": name},
            )
    return value


ModelHeaders = Annotated[
    dict[str, Annotated[str, Field(max_length=4096)]] | None,
    Field(max_length=MAX_MODEL_HEADERS),
    AfterValidator(_model_headers),
]


class KServeSpec(KServe):
    """``spec.kserve``: the contract's model fields, or a reference to an InferenceService,
    and how the runner reaches the model (auth, headers, TLS)."""

    inference_service_ref: InferenceServiceRef | None = None
    auth: ModelAuth | None = None
    headers: ModelHeaders = None
    tls: ModelTLS | None = None

    def model_transport(self) -> ModelTransport | None:
        """What the contract says of it: header values and the paths of mounted files."""
        insecure = self.tls is not None and self.tls.insecure_skip_verify
        ca = self.tls is not None and self.tls.ca_bundle is not None
        if not (self.auth or self.headers or insecure or ca):
            return None
        return ModelTransport(
            headers=dict(self.headers) if self.headers else None,
            token_file=MODEL_TOKEN_FILE if self.auth is not None else None,
            ca_file=MODEL_CA_FILE if ca and not insecure else None,
            insecure_skip_verify=True if insecure else None,
        )


class InferenceConfigSpec(_Model):
    image: str = Field(min_length=1)
    auto_delete_policy: AutoDeletePolicy = "None"
    kserve: KServeSpec | None = None
    # The upstream README's flat spelling; spec.kserve.* wins field by field.
    model_name: str | None = None
    model_url: str | None = None
    model_version: str | None = None
    model_input_name: str | None = None
    storage: Storage
    credentials_ref: SecretRef | None = None
    resources: ResourceRequirements | None = None
    image_pull_policy: ImagePullPolicy = "IfNotPresent"
    service_account_name: str | None = None
    batching: Batching | None = None
    # Kueue's LocalQueue in the run's namespace: the label kueue.x-k8s.io/queue-name.
    queue_name: str | None = Field(default=None, max_length=63, pattern=DNS_LABEL_PATTERN)
    runner_pod: RunnerPod | None = None
    # Never: a failed attempt of a run whose output is not keyed fails the run
    # (its Job's backoffLimit is 0) instead of starting again from row 0.
    unkeyed_output_retries: UnkeyedOutputRetries = "Allow"
    # How the runner gets the storage entries' Secrets (contract.document.SecretSource).
    # API, the default: upstream's configs name Secrets in other namespaces
    # (krateo-system), which no kubelet can mount into the run's pod.
    secret_source: SecretSource = "API"

    def secret_references(self) -> list[tuple[str | None, str]]:
        """The Secrets the storage entries reference, ``(namespace or None, name)``."""
        return secret_references(self.storage.input, self.storage.output)

    @property
    def reads_secrets_through_api(self) -> bool:
        """Whether the runner reads a Secret with its ServiceAccount token (and so needs one)."""
        return self.secret_source == "API" and bool(self.secret_references())

    @property
    def backoff_limit_cap(self) -> int | None:
        """The most retries a run of this config may have, or None for the run's own limit."""
        if self.unkeyed_output_retries == "Never" and not self.storage.keyed:
            return 0
        return None

    def effective_kserve(self) -> KServe:
        """The model fields the contract gets: nested when non-empty, else flat."""
        nested = self.kserve or KServeSpec()

        def pick(inner: str | None, flat: str | None) -> str | None:
            # A blank value is as good as none (a URL of spaces names no model).
            return (inner if inner and inner.strip() else None) or (
                flat if flat and flat.strip() else None
            )

        return KServe(
            model_name=pick(nested.model_name, self.model_name),
            model_url=pick(nested.model_url, self.model_url),
            model_version=pick(nested.model_version, self.model_version),
            model_input_name=pick(nested.model_input_name, self.model_input_name),
            openai=nested.openai,
            transport=nested.model_transport(),
        )

    @field_validator("image")
    @classmethod
    def _image(cls, value: str) -> str:
        # Pod validation refuses it, so the Job would never get a pod.
        if value != value.strip():
            raise PydanticCustomError(
                "InvalidSpec", "the image must not have leading or trailing whitespace"
            )
        return value

    @property
    def inference_service_ref(self) -> InferenceServiceRef | None:
        """``spec.kserve.inferenceServiceRef``, if the config names its model that way."""
        return self.kserve.inference_service_ref if self.kserve is not None else None

    @model_validator(mode="after")
    def _usable(self) -> Self:
        effective = self.effective_kserve()
        if effective.openai is not None and (effective.model_version or "").lower() != "openai":
            raise PydanticCustomError(
                "InvalidSpec",
                "kserve.openai applies only to an OpenAI-compatible model: set "
                "kserve.modelVersion to openai, or remove the openai block",
            )
        url = effective.model_url
        if self.inference_service_ref is not None and url:
            raise PydanticCustomError(
                "ConflictingModel",
                "kserve.inferenceServiceRef and a modelUrl are both set: name the model one "
                "way, by its InferenceService or by its URL",
            )
        if self.inference_service_ref is None and not url:
            raise PydanticCustomError(
                "MissingModelUrl",
                "kserve.modelUrl (or the flat modelUrl) or kserve.inferenceServiceRef is "
                "required: the runner has no model to call without one",
            )
        urls = [
            path
            for path, url in (
                ("kserve.modelUrl", self.kserve.model_url if self.kserve else None),
                ("modelUrl", self.model_url),
            )
            if model_url_has_password(url)
        ]
        if urls:
            raise PydanticCustomError(
                "InlineCredentials",
                "{paths} carries a credential (user:password@host, or a token or key in the "
                "URL): the model URL reaches the contract, a ConfigMap and the run's status, so "
                "it must not hold one",
                {"paths": " and ".join(urls)},
            )
        leaks = find_inline_credentials(self.storage.to_api(), "storage")
        if leaks:
            raise PydanticCustomError(
                "InlineCredentials",
                "{paths} look like credentials written in clear; storage settings reach the "
                "contract, a ConfigMap and the run's status, so reference a Secret instead "
                "(e.g. api.endpointRef)",
                {"paths": ", ".join(leaks)},
            )
        return self


_SCHEDULED_ONLY = (
    "time_zone",
    "concurrency_policy",
    "starting_deadline_seconds",
    "successful_jobs_history_limit",
    "failed_jobs_history_limit",
)


ParameterName = Annotated[str, Field(max_length=MAX_PARAMETER_NAME_LENGTH)]
ParameterValue = Annotated[str, Field(max_length=MAX_PARAMETER_VALUE_LENGTH)]


class InferenceRunSpec(_Model):
    config_ref: ConfigRef
    # 0 keeps upstream's meaning: no deadline.
    timeout_seconds: int | None = Field(default=None, ge=0, le=MAX_DEADLINE_SECONDS)
    schedule: Schedule | None = None
    parameters: dict[ParameterName, ParameterValue] | None = Field(
        default=None, max_length=MAX_PARAMETERS
    )
    suspend: bool = False
    concurrency_policy: ConcurrencyPolicy | None = None
    starting_deadline_seconds: int | None = Field(default=None, ge=0, le=MAX_DEADLINE_SECONDS)
    successful_jobs_history_limit: int | None = Field(default=None, ge=0)
    failed_jobs_history_limit: int | None = Field(default=None, ge=0)
    time_zone: TimeZone | None = None
    backoff_limit: int = Field(default=DEFAULT_BACKOFF_LIMIT, ge=0, le=100)
    parallelism: int = Field(default=1, ge=1, le=MAX_PARALLELISM)
    # How long a runner pod may fail to start (image, config, scheduling) before
    # the run fails; unset: the controller's POD_START_TIMEOUT; 0: no limit.
    pod_start_timeout_seconds: int | None = Field(default=None, ge=0, le=MAX_DEADLINE_SECONDS)

    @field_validator("parameters")
    @classmethod
    def _parameters(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        total = sum(len(k) + len(v) for k, v in (value or {}).items())
        if total > MAX_PARAMETERS_TOTAL_LENGTH:
            raise PydanticCustomError(
                "InvalidSpec",
                "parameter names and values total {total} characters, more than "
                "{limit}: pass large data through the input storage instead",
                {"total": total, "limit": MAX_PARAMETERS_TOTAL_LENGTH},
            )
        return value

    @model_validator(mode="after")
    def _schedule_fields(self) -> Self:
        if self.schedule is None:
            stray = [to_camel(name) for name in _SCHEDULED_ONLY if getattr(self, name) is not None]
            if stray:
                raise PydanticCustomError(
                    "InvalidSpec",
                    "{fields} only apply to scheduled runs: set spec.schedule or remove them",
                    {"fields": ", ".join(stray)},
                )
        return self

    @property
    def scheduled(self) -> bool:
        return self.schedule is not None

    @property
    def deadline_seconds(self) -> int | None:
        """``activeDeadlineSeconds`` for the Job, or None for no deadline."""
        return self.timeout_seconds or None


# --------------------------------------------------------------------------------------------
# Status.


class Condition(_Model):
    """``metav1.Condition``."""

    type: str
    status: ConditionStatus
    reason: str
    message: str = ""
    last_transition_time: KubeTime
    observed_generation: int | None = None


def condition(
    type_: str, on: bool, reason: str, message: str, now: datetime, generation: int | None
) -> Condition:
    """The condition ``type_``, ``True`` when ``on`` (else ``False``), set ``now``."""
    return Condition(
        type=type_,
        status="True" if on else "False",
        reason=reason,
        message=message,
        last_transition_time=now,
        observed_generation=generation,
    )


def set_condition(conditions: Sequence[Condition], new: Condition) -> list[Condition]:
    """``meta.SetStatusCondition``: replace by type, keep the transition time if unchanged."""
    out: list[Condition] = []
    replaced = False
    for old in conditions:
        if old.type != new.type:
            out.append(old)
            continue
        replaced = True
        if old.status == new.status:
            new = new.model_copy(update={"last_transition_time": old.last_transition_time})
        out.append(new)
    if not replaced:
        out.append(new)
    return out


def find_condition(conditions: Iterable[Condition], type_: str) -> Condition | None:
    return next((c for c in conditions if c.type == type_), None)


class ObjectReference(_Model):
    """``core/v1 ObjectReference`` of the run's Job or CronJob (upstream's ``jobStatus``)."""

    kind: str | None = None
    api_version: str | None = None
    namespace: str | None = None
    name: str
    uid: str | None = None


class Progress(_Model):
    rows_done: int = Field(default=0, ge=0)
    rows_total: int | None = Field(default=None, ge=0)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def summary(self) -> str:
        """What the Progress printer column shows, e.g. ``120/500 (24%)``."""
        if not self.rows_total:
            return str(self.rows_done)
        percent = min(100, self.rows_done * 100 // self.rows_total)
        return f"{self.rows_done}/{self.rows_total} ({percent}%)"


class Execution(_Model):
    """The most recent Job a scheduled run's CronJob started."""

    name: str
    phase: ExecutionPhase
    reason: str | None = None
    message: str | None = None
    start_time: KubeTime | None = None
    completion_time: KubeTime | None = None


@dataclass(frozen=True, config=ConfigDict(alias_generator=to_camel, validate_by_name=True))
class RunOutcome(RunResult):
    """``status.result``: the runner's :class:`RunResult` and how many attempts made it.

    ``attempts``: the runner pods the Job ran to an end (failed or succeeded,
    over all shards); more than the shards means that an attempt started again.
    """

    attempts: Annotated[int, Field(ge=0)] | None = None


class InferenceRunStatus(_Model):
    phase: Phase | None = None
    conditions: list[Condition] = Field(default_factory=list)
    observed_generation: int | None = None
    contract: dict[str, Any] | None = None
    # The config version the contract was rendered from (the ConfigMap's annotations).
    config_resource_version: str | None = None
    config_generation: int | None = Field(default=None, ge=0)
    job_status: ObjectReference | None = None
    start_time: KubeTime | None = None
    completion_time: KubeTime | None = None
    last_schedule_time: KubeTime | None = None
    progress: Progress | None = None
    # The runner's success message, its keys and (over shards) its sums
    # (contract.termination.RunResult, the one definition), and the attempts.
    result: RunOutcome | None = None
    reason: str | None = None
    message: str | None = None
    last_execution: Execution | None = None
    # Scheduled runs: the newest executions (newest first) and the next tick.
    recent_executions: list[Execution] | None = None
    next_schedule_time: KubeTime | None = None

    @field_validator("result", mode="before")
    @classmethod
    def _result(cls, value: Any) -> Any:
        # The runner's RunResult as it is: the attempts unknown.
        if isinstance(value, RunResult) and not isinstance(value, RunOutcome):
            return RunOutcome(**dataclasses.asdict(value))
        return value


class ModelStatus(_Model):
    """``status.model`` of a config whose model is an InferenceService: what runs call now."""

    url: str | None = None
    protocol: str | None = None
    name: str | None = None
    # namespace/name of the InferenceService it was resolved from.
    inference_service: str | None = None


class InferenceConfigStatus(_Model):
    conditions: list[Condition] = Field(default_factory=list)
    observed_generation: int | None = None
    last_probe_time: KubeTime | None = None
    model: ModelStatus | None = None


class _Object(_Model):
    """What both custom resources have: type, metadata and a status read leniently."""

    api_version: str = API_VERSION
    kind: str
    metadata: ObjectMeta

    @field_validator("status", mode="wrap", check_fields=False)
    @classmethod
    def _status(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        # A status this version cannot read (written by another version, or by
        # hand) must not make the object itself invalid: it is rewritten anyway.
        try:
            return handler(value)
        except ValidationError:
            return cls.model_fields["status"].get_default(call_default_factory=True)


class InferenceConfig(_Object):
    kind: str = CONFIG_KIND
    spec: InferenceConfigSpec
    status: InferenceConfigStatus = Field(default_factory=InferenceConfigStatus)

    @model_validator(mode="after")
    def _mountable_secrets(self) -> Self:
        namespace = self.metadata.namespace
        if self.spec.secret_source != "Volumes" or not namespace:
            return self
        elsewhere = sorted(
            f"{ns}/{name}"
            for ns, name in self.spec.secret_references()
            if ns not in (None, namespace)
        )
        if elsewhere:
            raise PydanticCustomError(
                "InvalidSpec",
                "secretSource Volumes: the kubelet mounts only Secrets of the run's namespace "
                "({namespace}), and the storage references {secrets}; copy them there or set "
                "secretSource to API",
                {"namespace": namespace, "secrets": ", ".join(elsewhere)},
            )
        return self


class InferenceRun(_Object):
    kind: str = RUN_KIND
    spec: InferenceRunSpec
    status: InferenceRunStatus = Field(default_factory=InferenceRunStatus)

    @property
    def config_namespace(self) -> str:
        return self.spec.config_ref.namespace or self.metadata.namespace

    @property
    def config_key(self) -> tuple[str, str]:
        """``(namespace, name)`` of the InferenceConfig this run uses."""
        return self.config_namespace, self.spec.config_ref.name


INSECURE_WARNING = (
    "InsecureSkipVerify",
    "kserve.tls.insecureSkipVerify is true: the model's certificate is not checked, so "
    "whoever sits between the runner and the model can read and change its requests",
)


def insecure_skip_verify(config: InferenceConfig) -> bool:
    tls = config.spec.kserve.tls if config.spec.kserve is not None else None
    return tls is not None and tls.insecure_skip_verify


def run_config_warnings(run: InferenceRun, config: InferenceConfig) -> list[tuple[str, str]]:
    """``(reason, message)`` for each thing a valid pair does differently than written."""
    warnings: list[tuple[str, str]] = []
    ref = config.spec.credentials_ref
    if ref is not None and ref.namespace and ref.namespace != run.metadata.namespace:
        warnings.append(
            (
                "CredentialsNamespaceIgnored",
                f"credentialsRef names Secret {ref.namespace}/{ref.name}, but image pull "
                f"Secrets are read from the pod's namespace: {run.metadata.namespace}/{ref.name} "
                "is used",
            )
        )
    if run.spec.scheduled and config.spec.auto_delete_policy != "None":
        warnings.append(
            (
                "AutoDeleteIgnored",
                f"autoDeletePolicy {config.spec.auto_delete_policy} does not apply to "
                "scheduled runs: the run and its CronJob are kept",
            )
        )
    probed = find_condition(config.status.conditions, CONDITION_PROBED)
    finished = run.status.phase in ("Succeeded", "Failed")  # nothing left to warn about
    if probed is not None and probed.status == "False" and not finished:
        warnings.append(
            (
                "ConfigProbeFailed",
                f"the probe of InferenceConfig {config.metadata.namespace}/"
                f"{config.metadata.name} failed ({probed.reason}): {probed.message}",
            )
        )
    spec = config.spec
    if insecure_skip_verify(config):
        warnings.append(INSECURE_WARNING)
    if spec.kserve is not None:
        for field in ("model_name", "model_url", "model_version", "model_input_name"):
            nested, flat = getattr(spec.kserve, field), getattr(spec, field)
            if nested and flat and nested != flat:
                warnings.append(
                    (
                        "ModelFieldsConflict",
                        f"spec.kserve.{to_camel(field)} and spec.{to_camel(field)} differ: "
                        "the nested one is used",
                    )
                )
    return warnings
