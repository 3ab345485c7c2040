"""The desired children of a run, as plain dicts ready to send to the API server.

Pure functions of (run, config, settings): no clock, no client. What they
render, and why:

- the **contract** (``render_contract``) byte for byte as upstream's Go
  controller marshals it, so a runner written against upstream reads the same
  file: keys ``jobId, jobName, kserve, input, output, parameters`` in that
  order, then our optional ``batching`` and ``sharding``; empty kserve fields,
  empty ``input``/``output`` and absent ``parameters`` left out; storage and
  parameters with every object's keys sorted (upstream round-trips them
  through Go maps); compact, with Go's escaping (``<>&`` as ``\\u003c``…, other
  non-ASCII raw). It never holds a credential: storage entries only reference
  Secrets, and ``controller.api`` refuses configs that inline one;
- a **ConfigMap** named like the Job holding it as ``contract.json``, annotated
  with the generation and resourceVersion of the config it was rendered from
  (``CONFIG_GENERATION_ANNOTATION``, ``CONFIG_RESOURCE_VERSION_ANNOTATION``);
- a **Job** (or a **CronJob** with the same job template when the run has a
  schedule) running container ``inference`` with the contract at
  ``/tmp/contract.json`` (a subPath mount over a writable emptyDir ``/tmp``),
  ``pod_uid`` from the downward API, a security context that passes Pod
  Security "restricted", a small ``backoffLimit`` (0 when the config says
  ``unkeyedOutputRetries: Never`` and the output is not keyed) and a
  ``podFailurePolicy`` that fails the Job at once when the runner's exit code
  says that retrying cannot help (a bad contract, or a request the storage or
  the model refused), and, for keyed output only, does not count an evicted
  or preempted pod as a failed attempt.
  There is no ``ttlSecondsAfterFinished``: finished runs are deleted by the
  controller (autoDeletePolicy), deleting their children through owner
  references, never by a TTL that makes the run start again.

Every child carries the labels of ``controller.naming.child_labels`` (on the
Job template and CronJob job template too, so pods and scheduled Jobs are
selectable), a controller owner reference to the run, and a hash of its
desired state in ``DESIRED_HASH_ANNOTATION`` for cheap drift detection.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any, TypedDict, Unpack

from contract.api import CONTAINER_NAME as CONTAINER_NAME
from contract.document import (
    MODEL_CA_DIR,
    MODEL_TOKEN_DIR,
    STORAGE_SECRETS_DIR,
    STORAGE_SECRETS_DIR_ENV,
    Contract,
    KServe,
    Sharding,
)
from contract.exitcodes import PERMANENT
from contract.paths import CONTRACT, TERMINATION_LOG
from contract.paths import CONTRACT_DIR as CONTRACT_DIR
from contract.paths import CONTRACT_KEY as CONTRACT_KEY
from controller.api import (
    API_VERSION,
    CONFIG_KIND,
    DEFAULT_CONCURRENCY_POLICY,
    RUN_KIND,
    InferenceConfig,
    InferenceRun,
    RunnerPodDefaults,
    merge_runner_pod,
)
from controller.naming import (
    CONFIG_GENERATION_ANNOTATION,
    CONFIG_RESOURCE_VERSION_ANNOTATION,
    DESIRED_HASH_ANNOTATION,
    KUEUE_QUEUE_LABEL,
    child_labels,
    job_name,
    probe_labels,
)

# Where the contract is mounted: the runner's default path (contract.paths, its one definition).
CONTRACT_PATH = CONTRACT
# The runner's exit codes that mean "retrying cannot help" (a bad contract, or a
# request the storage or the model refused): the Job fails at once on them.
PERMANENT_EXIT_CODES = sorted(int(code) for code in PERMANENT)
# The distroless "nonroot" user the runner image runs as.
RUNNER_UID = 65532
# The runner's scratch /tmp (an emptyDir) is bounded: a runner that fills it is
# evicted by its kubelet instead of filling the node's disk. The runner itself
# writes only small files there (upstream's runners could not write /tmp at
# all); RUNNER_POD_DEFAULTS' tmpSizeLimit changes it.
TMP_VOLUME = "tmp"
DEFAULT_TMP_SIZE_LIMIT = "1Gi"
# Tells the cluster autoscaler that the pod's emptyDir volumes hold nothing worth
# keeping a node for (without it, a pod with local storage blocks a scale-down).
SAFE_TO_EVICT_LOCAL_VOLUMES = "cluster-autoscaler.kubernetes.io/safe-to-evict-local-volumes"

# --------------------------------------------------------------------------------------------
# Go-compatible JSON.

_GO_HTML_ESCAPES = {
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}
_GO_ESCAPE_RE = re.compile("[<>&\u2028\u2029]")
_LONE_SURROGATE_RE = re.compile("[\ud800-\udfff]")


def _go_string(text: str) -> str:
    # Python's escaping of quotes, backslashes and control characters
    # (\b \f \n \r \t, else \u00xx in lower-case hex) is Go's (since Go 1.22);
    # Go additionally escapes <, >, & and U+2028/9, and turns invalid UTF-8
    # (a lone surrogate once decoded) into U+FFFD.
    text = _LONE_SURROGATE_RE.sub("\ufffd", text)
    encoded = json.dumps(text, ensure_ascii=False)
    return _GO_ESCAPE_RE.sub(lambda m: _GO_HTML_ESCAPES[m.group()], encoded)


def _go_float(value: float) -> str:
    # strconv.AppendFloat(f, 'f' or 'e', -1, 64) as encoding/json uses it:
    # shortest round-trip digits (what repr() finds too), fixed notation for
    # 1e-6 <= |f| < 1e21, else exponent notation with "e-7" not "e-07".
    if not math.isfinite(value):
        raise ValueError(f"JSON cannot represent {value}")
    if value == 0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    decimal = Decimal(repr(value)).as_tuple()
    digits = "".join(map(str, decimal.digits))
    stripped = digits.rstrip("0")
    exponent = int(decimal.exponent) + len(digits) - len(stripped)
    point = len(stripped) + exponent  # value = 0.<stripped> * 10**point
    sign = "-" if decimal.sign else ""
    magnitude = abs(value)
    if magnitude < 1e-6 or magnitude >= 1e21:
        mantissa = stripped[0] + (f".{stripped[1:]}" if len(stripped) > 1 else "")
        power = point - 1
        # Go pads a positive exponent to two digits ("e+21") but not a negative one.
        exponent_text = f"+{power:02d}" if power >= 0 else f"-{-power}"
        return f"{sign}{mantissa}e{exponent_text}"
    if point <= 0:
        return f"{sign}0.{'0' * -point}{stripped}"
    if point >= len(stripped):
        return f"{sign}{stripped}{'0' * (point - len(stripped))}"
    return f"{sign}{stripped[:point]}.{stripped[point:]}"


def go_json(value: Any) -> str:
    """``value`` as Go's ``json.Marshal`` writes it, keys in the given order."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _go_float(value)
    if isinstance(value, str):
        return _go_string(value)
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{_go_string(str(k))}:{go_json(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(go_json(v) for v in value) + "]"
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def _sorted(value: Any) -> Any:
    # Go sorts map keys by bytes; UTF-8 byte order is code point order, which
    # is how Python compares str.
    if isinstance(value, Mapping):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


# --------------------------------------------------------------------------------------------
# Contract.


def child_name(run: InferenceRun) -> str:
    """The name shared by the run's ConfigMap and Job or CronJob."""
    return job_name(
        run.metadata.name, run.metadata.uid, run.spec.scheduled, shards=run.spec.parallelism
    )


def build_contract(
    run: InferenceRun,
    config: InferenceConfig,
    *,
    name: str | None = None,
    kserve: KServe | None = None,
) -> Contract:
    """The contract as the runner's model (validated the way the runner will).

    ``name`` is the children's name when it was decided earlier (see
    ``controller.plan``); by default the name the run's spec gives. ``kserve``
    is the model as resolved from the config's InferenceService
    (``controller.isvc.contract_model``); by default the config's own fields.
    """
    if not run.metadata.uid:
        raise ValueError(f"run {run.metadata.name!r} has no uid yet: it must be read from the API")
    shards = run.spec.parallelism
    return Contract(
        job_id=run.metadata.uid,
        job_name=name or child_name(run),
        kserve=kserve if kserve is not None else config.spec.effective_kserve(),
        input=config.spec.storage.input,
        output=config.spec.storage.output,
        parameters=run.spec.parameters,
        batching=config.spec.batching,
        sharding=Sharding(count=shards) if shards > 1 else None,
    )


def kserve_document(kserve: KServe) -> dict[str, Any]:
    """The contract's ``kserve``: empty fields left out, and the transport's unset ones."""
    model = {k: v for k, v in kserve.model_dump(by_alias=True).items() if v}
    if kserve.transport is not None:
        model["transport"] = kserve.transport.model_dump(by_alias=True, exclude_none=True)
    return model


def contract_document(
    run: InferenceRun,
    config: InferenceConfig,
    *,
    name: str | None = None,
    kserve: KServe | None = None,
) -> dict[str, Any]:
    """The contract as an ordered dict: exactly the keys and order of the file."""
    contract = build_contract(run, config, name=name, kserve=kserve)
    model = kserve_document(contract.kserve)
    doc: dict[str, Any] = {"jobId": contract.job_id, "jobName": contract.job_name, "kserve": model}
    if contract.input:
        doc["input"] = _sorted(contract.input)
    if contract.output:
        doc["output"] = _sorted(contract.output)
    if contract.parameters is not None:
        doc["parameters"] = _sorted(contract.parameters)
    if contract.batching is not None:
        doc["batching"] = contract.batching.model_dump(by_alias=True)
    if contract.sharding is not None:
        doc["sharding"] = contract.sharding.model_dump(by_alias=True)
    return doc


def render_contract(
    run: InferenceRun,
    config: InferenceConfig,
    *,
    name: str | None = None,
    kserve: KServe | None = None,
) -> str:
    """The contract file's text (UTF-8), as upstream's controller would write it."""
    return go_json(contract_document(run, config, name=name, kserve=kserve))


# --------------------------------------------------------------------------------------------
# Children.


def owner_reference(run: InferenceRun) -> dict[str, Any]:
    if not run.metadata.uid:
        raise ValueError(f"run {run.metadata.name!r} has no uid yet: it must be read from the API")
    return {
        "apiVersion": API_VERSION,
        "kind": RUN_KIND,
        "name": run.metadata.name,
        "uid": run.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _labels(run: InferenceRun) -> dict[str, str]:
    return child_labels(run.metadata.name, run.metadata.uid, run.spec.config_ref.name)


def _job_labels(
    run: InferenceRun, config: InferenceConfig, shape: RunnerPodDefaults
) -> dict[str, str]:
    """Labels of the Job (or a CronJob's job template): the runner pod's, the child labels,
    and Kueue's queue."""
    labels = {**(shape.labels or {}), **_labels(run)}
    if config.spec.queue_name:
        labels[KUEUE_QUEUE_LABEL] = config.spec.queue_name
    return labels


def desired_hash(payload: Any) -> str:
    """Short, stable hash of a rendered object part (for the drift annotation)."""
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _metadata(run: InferenceRun, name: str, payload: Any) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": run.metadata.namespace,
        "labels": _labels(run),
        "annotations": {DESIRED_HASH_ANNOTATION: desired_hash(payload)},
        "ownerReferences": [owner_reference(run)],
    }


def desired_configmap(
    run: InferenceRun,
    config: InferenceConfig,
    *,
    name: str | None = None,
    kserve: KServe | None = None,
) -> dict[str, Any]:
    """The ConfigMap holding the contract, named like the Job/CronJob."""
    name = name or child_name(run)
    data = {CONTRACT_KEY: render_contract(run, config, name=name, kserve=kserve)}
    metadata = _metadata(run, name, data)
    # Which version of the config the contract was rendered from (outside the
    # drift hash: a config edit that leaves the contract as it is moves nothing).
    if config.metadata.resource_version:
        metadata["annotations"][CONFIG_RESOURCE_VERSION_ANNOTATION] = (
            config.metadata.resource_version
        )
    if config.metadata.generation:
        metadata["annotations"][CONFIG_GENERATION_ANNOTATION] = str(config.metadata.generation)
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data}


def runner_pod(config: InferenceConfig, defaults: RunnerPodDefaults | None) -> RunnerPodDefaults:
    """The config's runner pod shape over the controller's defaults (see ``merge_runner_pod``)."""
    return merge_runner_pod(config.spec.runner_pod, defaults, config.spec.resources)


def _container(config: InferenceConfig, shape: RunnerPodDefaults) -> dict[str, Any]:
    spec = config.spec
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        # No CONTRACT_PATH: the runner's default is CONTRACT_PATH already, and
        # leaving it unset lets the test node agent relocate the file.
        "env": [
            {"name": "pod_uid", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
            # The runner's namespace (a Secret reference's default) where no token,
            # and so no ServiceAccount namespace file, is mounted.
            {
                "name": "POD_NAMESPACE",
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
            },
            *(e.to_api() for e in shape.env or []),
        ],
        "volumeMounts": [
            # /tmp stays writable (read-only root filesystem); the contract is
            # one read-only file inside it, as upstream's runners expect.
            {"name": TMP_VOLUME, "mountPath": CONTRACT_DIR},
            {
                "name": "contract",
                "mountPath": CONTRACT_PATH,
                "subPath": CONTRACT_KEY,
                "readOnly": True,
            },
        ],
        # The runner writes its one-line summary there; if it dies before,
        # the tail of its log is the next best message for the run's status.
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "runAsUser": RUNNER_UID,
            "runAsGroup": RUNNER_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    if shape.resources is not None:
        container["resources"] = shape.resources.to_api()
    return container


def _pod_spec(
    config: InferenceConfig,
    name: str,
    service_account: str | None,
    shape: RunnerPodDefaults,
    namespace: str | None,
) -> dict[str, Any]:
    """The runner pod, in ``namespace``: the config's image with the contract of ConfigMap
    ``name``."""
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        # A token only where the runner reads a storage Secret through the API
        # server with this pod's service account (secretSource API, and a
        # storage entry that references one): the one reason to mount it.
        "automountServiceAccountToken": config.spec.reads_secrets_through_api,
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUNNER_UID,
            "runAsGroup": RUNNER_UID,
            "fsGroup": RUNNER_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [_container(config, shape)],
        "volumes": [
            {
                "name": TMP_VOLUME,
                "emptyDir": {"sizeLimit": shape.tmp_size_limit or DEFAULT_TMP_SIZE_LIMIT},
            },
            {
                "name": "contract",
                "configMap": {
                    "name": name,
                    "items": [{"key": CONTRACT_KEY, "path": CONTRACT_KEY}],
                    "defaultMode": 0o444,
                },
            },
        ],
    }
    _model_volumes(config, pod)
    _storage_secret_volumes(config, pod, namespace)
    account = config.spec.service_account_name or service_account
    if account:
        pod["serviceAccountName"] = account
    if config.spec.credentials_ref is not None:
        pod["imagePullSecrets"] = [{"name": config.spec.credentials_ref.name}]
    if shape.node_selector:
        pod["nodeSelector"] = dict(shape.node_selector)
    if shape.tolerations:
        pod["tolerations"] = [t.to_api() for t in shape.tolerations]
    if shape.affinity is not None:
        pod["affinity"] = shape.affinity
    if shape.priority_class_name:
        pod["priorityClassName"] = shape.priority_class_name
    return pod


def _storage_secret_volumes(
    config: InferenceConfig, pod: dict[str, Any], namespace: str | None
) -> None:
    """``secretSource: Volumes``: each storage Secret of the pod's namespace, mounted by the
    kubelet at ``STORAGE_SECRETS_DIR/<name>``, and the runner told where.

    The volumes are optional: a missing Secret is an empty directory, which the
    runner reports as not found (as the API would), rather than a pod that
    waits forever to start. A Secret of another namespace cannot be mounted:
    it is left out, and the runner says so.
    """
    if config.spec.secret_source != "Volumes":
        return
    container = pod["containers"][0]
    container["env"].append({"name": STORAGE_SECRETS_DIR_ENV, "value": STORAGE_SECRETS_DIR})
    names = [n for ns, n in config.spec.secret_references() if ns in (None, namespace)]
    for index, secret in enumerate(dict.fromkeys(names)):
        volume = f"storage-secret-{index}"
        pod["volumes"].append(
            {
                "name": volume,
                "secret": {"secretName": secret, "defaultMode": 0o440, "optional": True},
            }
        )
        container["volumeMounts"].append(
            {"name": volume, "mountPath": f"{STORAGE_SECRETS_DIR}/{secret}", "readOnly": True}
        )


MODEL_TOKEN_VOLUME = "model-token"
MODEL_CA_VOLUME = "model-ca"


def _model_volumes(config: InferenceConfig, pod: dict[str, Any]) -> None:
    """The model's bearer token and CA bundle, mounted where the contract's transport says.

    Whole volumes, not subPath mounts: the kubelet then rewrites a rotated
    Secret or ServiceAccount token in place, and the runner reads it again.
    """
    kserve = config.spec.kserve
    if kserve is None:
        return
    container = pod["containers"][0]
    auth = kserve.auth
    if auth is not None:
        if auth.bearer_token_secret_ref is not None:
            ref = auth.bearer_token_secret_ref
            source: dict[str, Any] = {
                "secret": {
                    "secretName": ref.name,
                    "items": [{"key": ref.key, "path": "token"}],
                    "defaultMode": 0o440,
                }
            }
        else:
            assert auth.service_account_token is not None
            sat = auth.service_account_token
            source = {
                "projected": {
                    "sources": [
                        {
                            "serviceAccountToken": {
                                "audience": sat.audience,
                                "expirationSeconds": sat.expiration_seconds,
                                "path": "token",
                            }
                        }
                    ],
                    "defaultMode": 0o440,
                }
            }
        pod["volumes"].append({"name": MODEL_TOKEN_VOLUME, **source})
        container["volumeMounts"].append(
            {"name": MODEL_TOKEN_VOLUME, "mountPath": MODEL_TOKEN_DIR, "readOnly": True}
        )
    tls = kserve.tls
    if tls is not None and tls.ca_bundle is not None and not tls.insecure_skip_verify:
        bundle = tls.ca_bundle
        if bundle.secret_ref is not None:
            ca: dict[str, Any] = {
                "secret": {
                    "secretName": bundle.secret_ref.name,
                    "items": [{"key": bundle.secret_ref.key, "path": "ca.crt"}],
                }
            }
        else:
            assert bundle.config_map_ref is not None
            ca = {
                "configMap": {
                    "name": bundle.config_map_ref.name,
                    "items": [{"key": bundle.config_map_ref.key, "path": "ca.crt"}],
                }
            }
        pod["volumes"].append({"name": MODEL_CA_VOLUME, **ca})
        container["volumeMounts"].append(
            {"name": MODEL_CA_VOLUME, "mountPath": MODEL_CA_DIR, "readOnly": True}
        )


def _template_metadata(labels: dict[str, str], shape: RunnerPodDefaults) -> dict[str, Any]:
    """Pod template metadata: the runner pod's labels under the controller's; its
    annotations over the autoscaler's safe-to-evict one for the ``/tmp`` emptyDir."""
    return {
        "labels": {**(shape.labels or {}), **labels},
        "annotations": {SAFE_TO_EVICT_LOCAL_VOLUMES: TMP_VOLUME, **(shape.annotations or {})},
    }


def _job_spec(
    run: InferenceRun,
    config: InferenceConfig,
    name: str,
    service_account: str | None,
    shape: RunnerPodDefaults,
) -> dict[str, Any]:
    pod = _pod_spec(config, name, service_account, shape, run.metadata.namespace)
    shards = run.spec.parallelism
    rules: list[dict[str, Any]] = [
        {
            "action": "FailJob",
            "onExitCodes": {
                "containerName": CONTAINER_NAME,
                "operator": "In",
                "values": list(PERMANENT_EXIT_CODES),
            },
        },
    ]
    if config.spec.storage.keyed:
        # An evicted or preempted pod is not the runner's failure, and with keyed
        # output its replacement stores no row twice: it costs no retry. Output
        # that is not keyed counts it like any failed attempt (as upstream, which
        # has no podFailurePolicy): the Job's counters then tell every attempt
        # that may have stored rows (the run's status.result.attempts).
        rules.append({"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]})
    cap = config.spec.backoff_limit_cap
    spec: dict[str, Any] = {
        # unkeyedOutputRetries: Never: a failed attempt fails the run.
        "backoffLimit": run.spec.backoff_limit if cap is None else min(cap, run.spec.backoff_limit),
        "completions": shards,
        "parallelism": shards,
        "podFailurePolicy": {"rules": rules},
        "template": {"metadata": _template_metadata(_labels(run), shape), "spec": pod},
    }
    if shards > 1:
        # Each pod gets JOB_COMPLETION_INDEX; the contract says how many shards.
        spec["completionMode"] = "Indexed"
    if run.spec.deadline_seconds is not None:
        spec["activeDeadlineSeconds"] = run.spec.deadline_seconds
    return spec


class RunnerOptions(TypedDict, total=False):
    """The controller's settings for runner pods, the same for every child it renders."""

    # The model resolved from the config's InferenceService (a probe's contract).
    model: KServe | None

    # Its default for configs that name none (``serviceAccountName`` in the config wins).
    runner_service_account: str | None
    # Its ``RUNNER_POD_DEFAULTS``, under the config's ``runnerPod``.
    pod_defaults: RunnerPodDefaults | None


class ChildOptions(RunnerOptions, total=False):
    # The child's name (default: ``child_name(run)``).
    name: str | None


def _named_job_spec(
    run: InferenceRun, config: InferenceConfig, options: ChildOptions
) -> tuple[str, RunnerPodDefaults, dict[str, Any]]:
    """The child's name, its runner pod's shape and the Job spec (a CronJob's job template)."""
    name = options.get("name") or child_name(run)
    shape = runner_pod(config, options.get("pod_defaults"))
    return name, shape, _job_spec(run, config, name, options.get("runner_service_account"), shape)


def desired_job(
    run: InferenceRun, config: InferenceConfig, **options: Unpack[ChildOptions]
) -> dict[str, Any]:
    """The Job of a one-shot run."""
    if run.spec.scheduled:
        raise ValueError(f"run {run.metadata.name!r} has a schedule: render its CronJob")
    name, shape, spec = _named_job_spec(run, config, options)
    # Kueue's webhook suspends a queued Job at creation (and Kueue un-suspends it
    # on admission); the controller creates it as the run asks.
    spec["suspend"] = run.spec.suspend
    metadata = _metadata(run, name, spec)
    metadata["labels"] = _job_labels(run, config, shape)
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata, "spec": spec}


def desired_cronjob(
    run: InferenceRun, config: InferenceConfig, **options: Unpack[ChildOptions]
) -> dict[str, Any]:
    """The CronJob of a scheduled run; its job template is the one-shot Job's spec."""
    if run.spec.schedule is None:
        raise ValueError(f"run {run.metadata.name!r} has no schedule: render its Job")
    name, shape, job_spec = _named_job_spec(run, config, options)
    run_spec = run.spec
    spec: dict[str, Any] = {
        "schedule": run_spec.schedule,
        "concurrencyPolicy": run_spec.concurrency_policy or DEFAULT_CONCURRENCY_POLICY,
        "suspend": run_spec.suspend,
        "jobTemplate": {
            "metadata": {"labels": _job_labels(run, config, shape)},
            "spec": job_spec,
        },
    }
    optional = {
        "timeZone": run_spec.time_zone,
        "startingDeadlineSeconds": run_spec.starting_deadline_seconds,
        "successfulJobsHistoryLimit": run_spec.successful_jobs_history_limit,
        "failedJobsHistoryLimit": run_spec.failed_jobs_history_limit,
    }
    spec.update({k: v for k, v in optional.items() if v is not None})
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": _metadata(run, name, spec),
        "spec": spec,
    }


def desired_workload(
    run: InferenceRun, config: InferenceConfig, **options: Unpack[ChildOptions]
) -> dict[str, Any]:
    """``desired_cronjob`` for a scheduled run, else ``desired_job``."""
    render = desired_cronjob if run.spec.scheduled else desired_job
    return render(run, config, **options)


# --------------------------------------------------------------------------------------------
# A config's probe (controller/probe.py decides when).

# The probe checks Secrets, storage and the model's metadata; it never takes long.
PROBE_DEADLINE_SECONDS = 120
PROBE_ARGS = ["--check"]


def probe_contract(
    config: InferenceConfig, name: str, model: KServe | None = None
) -> dict[str, Any]:
    """A run's contract without a run: the config's model (``model`` when resolved from its
    InferenceService) and storage, no parameters."""
    fields = model if model is not None else config.spec.effective_kserve()
    kserve = kserve_document(fields)
    doc: dict[str, Any] = {"jobId": config.metadata.uid, "jobName": name, "kserve": kserve}
    if config.spec.storage.input:
        doc["input"] = _sorted(config.spec.storage.input)
    if config.spec.storage.output:
        doc["output"] = _sorted(config.spec.storage.output)
    return doc


def desired_probe(
    config: InferenceConfig, name: str, **options: Unpack[RunnerOptions]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ConfigMap and Job that run ``python -m runner --check`` for ``config``.

    Its pod is shaped like a run's (a ResourceQuota or a node pool applies to
    it too); its labels are the probe's, with the runner pod's under them.
    """
    if not config.metadata.uid:
        raise ValueError(f"config {config.metadata.name!r} has no uid yet")
    labels = probe_labels(config.metadata.name, config.metadata.uid)
    owner = {
        "apiVersion": API_VERSION,
        "kind": CONFIG_KIND,
        "name": config.metadata.name,
        "uid": config.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }
    metadata = {
        "name": name,
        "namespace": config.metadata.namespace,
        "labels": labels,
        "ownerReferences": [owner],
    }
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata,
        "data": {CONTRACT_KEY: go_json(probe_contract(config, name, options.get("model")))},
    }
    shape = runner_pod(config, options.get("pod_defaults"))
    pod = _pod_spec(
        config, name, options.get("runner_service_account"), shape, config.metadata.namespace
    )
    pod["containers"][0]["args"] = list(PROBE_ARGS)
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata,
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": PROBE_DEADLINE_SECONDS,
            # A safety net: the controller deletes a probe once it has read it.
            "ttlSecondsAfterFinished": 3600,
            "template": {"metadata": _template_metadata(labels, shape), "spec": pod},
        },
    }
    return configmap, job
