"""The controller's settings, from environment variables and command-line flags.

Precedence: flag > environment variable > default. Every setting has an
environment variable named like the field in capitals (``POLLING_INTERVAL``)
and a flag in kebab case (``--polling-interval``); upstream's flag and variable
spellings are accepted as aliases (``--pollinginterval``,
``--maxreconcilerate``, ``--watchnamespace``, ``--leader-elect``,
``SA_RUNNER``).

A bad value never turns into a silent default (upstream turned a bad
``POLLING_INTERVAL`` into 0, i.e. no polling): :func:`load_settings` raises
:class:`SettingsError` with one line per bad setting, naming the variable, and
``python -m controller`` prints it and exits non-zero.

``MAX_RECONCILE_RATE`` = n is the number of concurrent workers (upstream's
``MaxConcurrentReconciles``). The work queue's global token bucket for retries
scales with it: ``10 * n`` tokens per second, burst ``100 * n`` (client-go's
default at n = 1), unless ``QUEUE_QPS`` / ``QUEUE_BURST`` say otherwise.
Upstream used n for a bucket of n/s too, so a rate of 1 admitted one retry a
second; the work queue's per-key backoff already keeps a failing run slow.

``SHARD_COUNT`` = n > 1 and ``SHARD_INDEX`` = i (0..n-1) make this controller
one of n shards: it handles only the namespaces whose hash mod n is i
(controller/sharding.py) and elects its leader on the Lease
``<LEASE_NAME>-shard-<i>-of-<n>`` (:attr:`Settings.effective_lease_name`). An
index outside 0..n-1 is an error, not a silent shard 0.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn

import durationpy
import orjson
from pydantic import (
    AliasChoices,
    BeforeValidator,
    Field,
    ValidationError,
    computed_field,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from controller.api import RunnerPodDefaults
from controller.invalid import describe_invalid
from controller.sharding import Shard, lease_name

# Below one second a "poll" is a hot loop against the API server.
MIN_POLLING_INTERVAL = 1.0
IN_CLUSTER_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_OBJECT_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


class SettingsError(ValueError):
    """One or more settings are invalid; the message names each of them."""


def parse_duration(value: Any) -> float:
    """Seconds from ``300`` (plain integer = seconds), ``30s``, ``1m``, ``1h30m``, ``1.5h``.

    Go duration syntax (durationpy). Zero, negative and unparsable values are
    errors, as is anything under one second.
    """
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, bool):
        raise ValueError("expected a duration such as 300, 30s, 1m or 1h30m")
    elif isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip()
        if re.fullmatch(r"[+-]?\d+", text):
            seconds = float(int(text))
        else:
            try:
                seconds = durationpy.from_str(text).total_seconds()
            except Exception as exc:
                raise ValueError(
                    f"{value!r} is not a duration: use seconds (300) or a Go duration "
                    "such as 30s, 1m, 1h30m"
                ) from exc
    else:
        raise ValueError("expected a duration such as 300, 30s, 1m or 1h30m")
    if seconds <= 0:
        raise ValueError(f"{value!r} must be a positive duration")
    if seconds < MIN_POLLING_INTERVAL:
        raise ValueError(f"{value!r} is shorter than {MIN_POLLING_INTERVAL:g}s")
    return seconds


def parse_namespaces(value: Any) -> tuple[str, ...]:
    """``""`` -> all namespaces (empty tuple); ``"a"`` or ``"a,b"`` -> those, deduplicated."""
    if value is None:
        return ()
    if isinstance(value, str):
        parts = [part.strip() for part in value.split(",")]
    elif isinstance(value, list | tuple):
        parts = [str(part).strip() for part in value]
    else:
        raise ValueError("expected a namespace or a comma-separated list of namespaces")
    names = [part for part in parts if part]
    for name in names:
        if len(name) > 63 or not _DNS1123_LABEL.match(name):
            raise ValueError(f"{name!r} is not a valid namespace name")
    return tuple(dict.fromkeys(names))


def _parse_bool(value: Any) -> Any:
    if isinstance(value, str) and value.strip() == "":
        return None
    return value


def _empty_is_none(value: Any) -> Any:
    if isinstance(value, str) and value.strip() == "":
        return None
    return value


def _duration_or_off(value: Any) -> float:
    """A duration, or 0 (any spelling: ``0``, ``0s``) for "off"."""
    if isinstance(value, int | float) and not isinstance(value, bool) and value == 0:
        return 0.0
    if isinstance(value, str) and re.fullmatch(r"\s*0+(\.0*)?([a-zµ]+)?\s*", value):
        return 0.0
    return parse_duration(value)


def parse_runner_pod_defaults(value: Any) -> RunnerPodDefaults | None:
    """``RUNNER_POD_DEFAULTS``: JSON of an InferenceConfig's ``runnerPod`` plus ``resources``.

    Empty (or ``{}``/``null``): no defaults. Held to the same rules as a
    config's ``runnerPod``, so a default can never make a runner pod invalid.
    """
    if value is None or isinstance(value, RunnerPodDefaults):
        return value
    if isinstance(value, str):
        if not value.strip():
            return None
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"not JSON: {exc}") from None
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError(
            "expected a JSON object with labels, annotations, nodeSelector, tolerations, "
            "affinity, priorityClassName, env, resources and/or tmpSizeLimit"
        )
    try:
        return RunnerPodDefaults.model_validate(value)
    except ValidationError as exc:
        raise ValueError(describe_invalid(exc)[1]) from None


Duration = Annotated[float, BeforeValidator(parse_duration)]
DurationOrOff = Annotated[float, BeforeValidator(_duration_or_off)]
# NoDecode: a comma-separated string, not the JSON pydantic-settings expects for tuples
# (load_settings reads the environment itself; this keeps any settings source from decoding).
Namespaces = Annotated[tuple[str, ...], NoDecode, BeforeValidator(parse_namespaces)]
OptionalBool = Annotated[bool | None, BeforeValidator(_parse_bool)]
OptionalStr = Annotated[str | None, BeforeValidator(_empty_is_none)]
PodDefaults = Annotated[
    RunnerPodDefaults | None, NoDecode, BeforeValidator(parse_runner_pod_defaults)
]
# Under 10 s every quiet watch would be reopened between two bookmarks; over
# 90 s a stalled watch leaves the controller blind too long.
MIN_WATCH_IDLE_TIMEOUT, MAX_WATCH_IDLE_TIMEOUT = 10.0, 90.0


def _watch_idle(value: Any) -> float:
    seconds = parse_duration(value)
    if not MIN_WATCH_IDLE_TIMEOUT <= seconds <= MAX_WATCH_IDLE_TIMEOUT:
        raise ValueError(
            f"{value!r} is outside {MIN_WATCH_IDLE_TIMEOUT:g}s..{MAX_WATCH_IDLE_TIMEOUT:g}s"
        )
    return seconds


WatchIdle = Annotated[float, BeforeValidator(_watch_idle)]
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]


class Settings(BaseSettings):
    """The controller's settings. Build them with :func:`load_settings`."""

    model_config = SettingsConfigDict(
        frozen=True,
        extra="ignore",
        populate_by_name=True,
        case_sensitive=False,
    )

    polling_interval: Duration = Field(
        300.0,
        description="How often every run is reconciled again without any change "
        "(seconds, or a Go duration: 30s, 1m, 1h30m).",
    )
    max_reconcile_rate: int = Field(
        1, ge=1, le=1000, description="Number of concurrent reconcile workers."
    )
    watch_namespace: Namespaces = Field(
        (),
        description="Namespace(s) to watch: empty for all, one, or a comma-separated list.",
    )
    runner_service_account: OptionalStr = Field(
        None,
        validation_alias=AliasChoices("runner_service_account", "sa_runner"),
        description="Service account of runner pods when the config names none "
        "(unset: the namespace's default service account).",
    )
    runner_pod_defaults: PodDefaults = Field(
        None,
        description="JSON defaults for every runner pod (and config probe): labels, annotations, "
        "nodeSelector, tolerations, affinity, priorityClassName, env, resources and "
        "tmpSizeLimit (the runner's /tmp emptyDir, default 1Gi); a config's "
        "spec.runnerPod (and spec.resources) wins. Empty: none.",
    )
    probe_interval: DurationOrOff = Field(
        1800.0,
        description="How often each InferenceConfig is probed by a short Job running "
        "`python -m runner --check` (besides on create and on change); 0 disables probes.",
    )
    pod_start_timeout: DurationOrOff = Field(
        600.0,
        description="How long a runner pod may wait unable to start (ErrImagePull, "
        "ImagePullBackOff, InvalidImageName, CreateContainerConfigError, Unschedulable) "
        "before its one-shot run fails with that reason; a run's "
        "spec.podStartTimeoutSeconds wins; 0 waits for ever.",
    )
    log_level: LogLevel = Field("INFO", description="Log level.")
    log_format: Literal["json", "console"] = Field("json", description="Log format.")
    bind_address: str = Field(
        "0.0.0.0", min_length=1, description="Address of the metrics and health servers."
    )
    metrics_port: int = Field(8080, ge=0, le=65535, description="Port serving /metrics.")
    health_port: int = Field(8081, ge=0, le=65535, description="Port serving /healthz and /readyz.")
    leader_elect: OptionalBool = Field(
        None,
        description="Lease-based leader election (default: on in-cluster, off locally).",
    )
    lease_name: str = Field(
        "kserve-inference-controller", min_length=1, max_length=253, description="Lease name."
    )
    lease_namespace: OptionalStr = Field(
        None,
        description="Namespace of the Lease (default: the pod's namespace, "
        "else the only watched namespace).",
    )
    lease_duration: Duration = Field(15.0, description="Leader election lease duration.")
    renew_deadline: Duration = Field(10.0, description="Leader election renew deadline.")
    retry_period: Duration = Field(2.0, description="Leader election retry period.")
    pod_name: OptionalStr = Field(
        None, description="This pod's name (downward API); the leader identity's prefix."
    )
    pod_namespace: OptionalStr = Field(None, description="This pod's namespace (downward API).")
    pod_service_account: OptionalStr = Field(
        None,
        max_length=253,
        description="This pod's ServiceAccount (downward API); it owns the Lease, so deleting "
        "it (helm uninstall) deletes the Lease (unset: the Lease has no owner).",
    )
    # The API server's priority and fairness already protects it from one
    # client; a client-side limit near client-go's old 20/30 only made a burst
    # of runs wait on ourselves (p50 create->Job 6.7 s for 100 runs). This one
    # still stops a runaway loop from flooding the server.
    kube_api_qps: float = Field(
        200.0,
        gt=0,
        description="Client-side API requests per second (priority and fairness on the API "
        "server is the real protection; this stops a runaway loop).",
    )
    kube_api_burst: int = Field(400, ge=1, description="Client-side API request burst.")
    watch_idle_timeout: WatchIdle = Field(
        75.0,
        description="A watch that delivers neither an event nor a bookmark for this long "
        "(the API server sends a bookmark about every minute) is taken for a stalled "
        "connection, closed and reopened from where it was; the API connections' TCP "
        "keepalive notices a dead peer within the same time. 10s to 90s.",
    )
    events_qps: float = Field(
        10.0,
        gt=0,
        description="Client-side requests per second for Events, a budget of their own: a "
        "burst of Events never delays a create or a status write (nor the reverse).",
    )
    events_burst: int = Field(50, ge=1, description="Client-side request burst for Events.")
    queue_qps: float | None = Field(
        None, gt=0, description="Work queue retry token bucket rate (default 10 x workers)."
    )
    queue_burst: int | None = Field(
        None, ge=1, description="Work queue retry token bucket burst (default 100 x workers)."
    )
    shard_count: int = Field(
        1,
        ge=1,
        le=1000,
        description="Number of controller shards splitting the namespaces between them "
        "(1: no sharding). Each shard is a separate Deployment with SHARD_INDEX of its own.",
    )
    shard_index: int = Field(
        0,
        ge=0,
        description="This controller's shard, 0..SHARD_COUNT-1: it handles the namespaces whose "
        "hash (the first 32 bits of the name's SHA-256) mod SHARD_COUNT is SHARD_INDEX, and "
        "elects its leader on the Lease <LEASE_NAME>-shard-<index>-of-<count>.",
    )
    inferenceservices: bool = Field(
        True,
        description="Read KServe InferenceServices, for configs that name their model by "
        "spec.kserve.inferenceServiceRef (needs get, list and watch on them); false: never "
        "read, and such configs are not Ready.",
    )
    kubeconfig: OptionalStr = Field(
        None, description="Path of a kubeconfig file (unset: in-cluster, else ~/.kube/config)."
    )
    in_cluster: bool = Field(
        False,
        description="Set by load_settings: running in a pod with no explicit kubeconfig.",
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # load_settings passes the environment and flags in explicitly, so a
        # test's settings never depend on the process environment.
        return (init_settings,)

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper_level(cls, value: Any) -> Any:
        return value.strip().upper() if isinstance(value, str) else value

    @field_validator("log_format", mode="before")
    @classmethod
    def _lower_format(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("lease_name", "pod_service_account")
    @classmethod
    def _object_name(cls, value: str | None) -> str | None:
        if value is not None and not _OBJECT_NAME.match(value):
            raise ValueError(f"{value!r} is not a valid object name")
        return value

    @field_validator("lease_namespace", "pod_namespace")
    @classmethod
    def _namespace(cls, value: str | None) -> str | None:
        if value is not None and (len(value) > 63 or not _DNS1123_LABEL.match(value)):
            raise ValueError(f"{value!r} is not a valid namespace name")
        return value

    @model_validator(mode="after")
    def _leader_timings(self) -> Settings:
        # client-go's own checks: the renew deadline must leave room for
        # retries, and the lease must outlive the deadline.
        if self.lease_duration <= self.renew_deadline:
            raise ValueError("LEASE_DURATION must be greater than RENEW_DEADLINE")
        if self.renew_deadline <= 1.2 * self.retry_period:
            raise ValueError("RENEW_DEADLINE must be greater than 1.2 x RETRY_PERIOD")
        if self.shard_index >= self.shard_count:
            raise ValueError(
                f"SHARD_INDEX={self.shard_index} is out of range for SHARD_COUNT="
                f"{self.shard_count}: shards are numbered 0..{self.shard_count - 1}"
            )
        if len(self.effective_lease_name) > 253:
            raise ValueError(
                f"the Lease name {self.effective_lease_name!r} is longer than 253 characters: "
                "shorten LEASE_NAME"
            )
        if self.leader_election and self.lease_namespace is None:
            raise ValueError(
                "leader election needs the Lease's namespace: set LEASE_NAMESPACE "
                "(or POD_NAMESPACE), or watch exactly one namespace"
            )
        return self

    @computed_field  # type: ignore[prop-decorator]
    @property
    def leader_election(self) -> bool:
        """Whether to elect a leader: LEADER_ELECT, else on in-cluster and off locally."""
        return self.in_cluster if self.leader_elect is None else self.leader_elect

    @property
    def lease_owner(self) -> str | None:
        """The ServiceAccount to own the Lease: this pod's, when the Lease is in its namespace.

        An owner must live in its dependent's namespace; a Lease elsewhere (an
        explicit LEASE_NAMESPACE) would name someone else's ServiceAccount.
        """
        if self.pod_namespace is not None and self.pod_namespace != self.lease_namespace:
            return None
        return self.pod_service_account

    @property
    def shard(self) -> Shard:
        """This controller's shard: SHARD_INDEX of SHARD_COUNT."""
        return Shard(self.shard_index, self.shard_count)

    @property
    def effective_lease_name(self) -> str:
        """The Lease this controller elects its leader on: LEASE_NAME, suffixed per shard.

        ``<LEASE_NAME>-shard-<index>-of-<count>`` when SHARD_COUNT > 1, so that
        each shard has a leader of its own (see controller/sharding.py).
        """
        return lease_name(self.lease_name, self.shard_index, self.shard_count)

    @property
    def watch_namespaces(self) -> tuple[str, ...]:
        """The namespaces to watch; empty means all namespaces."""
        return self.watch_namespace

    @property
    def workers(self) -> int:
        return self.max_reconcile_rate

    @property
    def effective_queue_qps(self) -> float:
        return self.queue_qps if self.queue_qps is not None else 10.0 * self.max_reconcile_rate

    @property
    def effective_queue_burst(self) -> int:
        return self.queue_burst if self.queue_burst is not None else 100 * self.max_reconcile_rate


# Upstream's flag spellings, kept so the same Deployment args keep working.
_FLAG_ALIASES: dict[str, tuple[str, ...]] = {
    "polling_interval": ("--pollinginterval",),
    "max_reconcile_rate": ("--maxreconcilerate",),
    "watch_namespace": ("--watchnamespace",),
    "runner_service_account": ("--sa-runner",),
}


class _ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise SettingsError(f"invalid command line: {message}")


def _env_name(field: str) -> str:
    return field.upper()


def _flag_name(field: str) -> str:
    return "--" + field.replace("_", "-")


def build_parser() -> argparse.ArgumentParser:
    """The command line: one flag per setting, all optional, values parsed by Settings."""
    parser = _ArgumentParser(
        prog="python -m controller",
        description="KServe Inference Controller: runs InferenceRuns as Kubernetes Jobs. "
        "Every flag can also be given as the environment variable in brackets.",
        argument_default=argparse.SUPPRESS,
    )
    for name, field in Settings.model_fields.items():
        if name == "in_cluster":
            continue
        flags = [_flag_name(name), *_FLAG_ALIASES.get(name, ())]
        env_names = [_env_name(name)] + (["SA_RUNNER"] if name == "runner_service_account" else [])
        help_text = f"{field.description} [{', '.join(env_names)}]"
        if field.default is not None and field.default != ():
            help_text += f" (default: {field.default})"
        if name == "leader_elect":
            parser.add_argument(
                *flags,
                dest=name,
                action=argparse.BooleanOptionalAction,
                help=help_text,
            )
            continue
        parser.add_argument(*flags, dest=name, metavar=_env_name(name), help=help_text)
    # Answered by controller.__main__ before any setting is read; listed here for --help.
    parser.add_argument(
        "--version", action="store_true", dest="version", help="print the version and exit"
    )
    return parser


def _env_names(name: str, field: FieldInfo) -> tuple[str, ...]:
    """The lower-case variable names a setting is read from, first match wins.

    The field's name, or its validation aliases (``SA_RUNNER`` besides
    ``RUNNER_SERVICE_ACCOUNT``) in their order.
    """
    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        return tuple(choice.lower() for choice in alias.choices if isinstance(choice, str))
    if isinstance(alias, str):
        return (alias.lower(),)
    return (name.lower(),)


def _from_env(env: Mapping[str, str]) -> dict[str, str]:
    """Each setting's raw value from ``env``, matched case-insensitively.

    Keyed by field name (so a bad ``SA_RUNNER`` is reported as
    ``RUNNER_SERVICE_ACCOUNT``, as before). Values stay strings, empty ones
    included: the field validators parse them. Public API only (no
    pydantic-settings source internals), so an upgrade of pydantic-settings
    cannot change what is read.
    """
    lowered = {key.lower(): value for key, value in env.items()}
    values: dict[str, str] = {}
    for name, field in Settings.model_fields.items():
        for key in _env_names(name, field):
            if key in lowered:
                values[name] = lowered[key]
                break
    return values


def _in_cluster(env: Mapping[str, str], kubeconfig: str | None) -> bool:
    return kubeconfig is None and bool(env.get("KUBERNETES_SERVICE_HOST"))


def load_settings(
    argv: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
    *,
    namespace_file: Path = IN_CLUSTER_NAMESPACE_FILE,
) -> Settings:
    """Settings from ``argv`` (no program name) and ``env`` (default: the process's).

    Raises :class:`SettingsError` naming every bad setting; ``--help`` exits 0
    through argparse as usual.
    """
    argv = list(argv) if argv is not None else []
    env = dict(env) if env is not None else dict(os.environ)

    flags = vars(build_parser().parse_args(argv))
    values: dict[str, Any] = dict(_from_env(env))
    values.update(flags)

    kubeconfig = flags.get("kubeconfig") or env.get("KUBECONFIG") or None
    in_cluster = _in_cluster(env, kubeconfig)
    values["in_cluster"] = in_cluster
    # The Lease lives next to the controller: its own namespace in-cluster,
    # else the only namespace it watches.
    if not values.get("lease_namespace"):
        pod_namespace = values.get("pod_namespace") or (
            _read_namespace_file(namespace_file) if in_cluster else None
        )
        if pod_namespace:
            values["lease_namespace"] = pod_namespace
        else:
            try:
                watched = parse_namespaces(values.get("watch_namespace", ""))
            except ValueError:
                watched = ()
            if len(watched) == 1:
                values["lease_namespace"] = watched[0]
    if not values.get("pod_name") and env.get("HOSTNAME"):
        values["pod_name"] = env["HOSTNAME"]

    try:
        return Settings(**values)
    except ValidationError as exc:
        raise SettingsError(_describe(exc, values)) from None


def _read_namespace_file(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def _describe(exc: ValidationError, values: Mapping[str, Any]) -> str:
    lines = []
    for error in exc.errors():
        loc = [str(part) for part in error["loc"] if isinstance(part, str)]
        message = error["msg"].removeprefix("Value error, ")
        if loc:
            field = loc[0]
            shown = values.get(field)
            lines.append(f"invalid setting {_env_name(field)}={shown!r}: {message}")
        else:
            lines.append(f"invalid settings: {message}")
    return "\n".join(lines)
