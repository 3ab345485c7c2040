"""Names, labels, annotations and env a runner pod may carry (InferenceConfig.spec.runnerPod).

What the API server's validation (IsQualifiedName, IsValidLabelValue,
IsDNS1123Subdomain) refuses, and what the controller itself sets and so
reserves, as patterns the CRD shares (a unit test checks they agree, so they
use nothing RE2 and Python's ``re`` read differently) and as pydantic types
for the models (``PodLabels``, ``PodAnnotations``, ``NodeSelector``).
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field
from pydantic_core import PydanticCustomError

from contract.document import STORAGE_SECRETS_DIR_ENV
from controller.quantity import RESOURCE_NAME_PATTERN

# IsQualifiedName: an optional DNS-subdomain prefix (at most 253) and a name of at most 63.
QUALIFIED_NAME_PATTERN = RESOURCE_NAME_PATTERN
# IsValidLabelValue: at most 63, empty or alphanumeric at both ends.
LABEL_VALUE_PATTERN = "^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
# IsDNS1123Subdomain (a PriorityClass's name).
DNS_SUBDOMAIN_PATTERN = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# Environment variable names: letters, digits, '_', '-' and '.', not starting with a digit.
ENV_NAME_PATTERN = "^[-._a-zA-Z][-._a-zA-Z0-9]*$"
MAX_POD_MAP_ENTRIES = 64
MAX_ANNOTATION_VALUE_LENGTH = 4096
MAX_TOLERATIONS = 32
MAX_ENV = 64
MAX_ENV_VALUE_LENGTH = 32768
# Labels and annotations the controller (or the Job controller, or Kueue through
# queueName) sets: a runner pod may not carry its own.
RESERVED_METADATA_KEYS = (
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/component",
    "job-name",
    "controller-uid",
    "kueue.x-k8s.io/queue-name",
)
RESERVED_METADATA_PREFIXES = ("ai.krateo.io/", "batch.kubernetes.io/")
# What the renderer and the runner contract use (runner/app.py).
RESERVED_ENV_NAMES = (
    "pod_uid",
    "POD_UID",
    "POD_NAMESPACE",
    "CONTRACT_PATH",
    "TERMINATION_LOG_PATH",
    "NODE_AGENT_ROOT",
    "JOB_COMPLETION_INDEX",
    "RUNNER_DEADLINE_SECONDS",
    STORAGE_SECRETS_DIR_ENV,
)
_QUALIFIED_NAME_RE = re.compile(QUALIFIED_NAME_PATTERN)
# The CRD's CEL rule on runnerPod.env: a variable whose name says it holds a
# credential (AWS_SECRET_ACCESS_KEY, HF_TOKEN, PGPASSWORD, API_KEY_B64) must take
# it from a Secret, not a literal value. Names of separated upper- or lower-case
# words only: the controller's check (contract.credentials.is_credential_env)
# also reads camelCase and refuses credential-shaped values; a unit test checks
# everything this pattern refuses, the controller refuses too. RE2 and `re`
# read it alike.
ENV_CREDENTIAL_PATTERN = (
    "(?i)^([a-z0-9]+[-._])*[a-z0-9]*(password|passwd|passphrase|secret|token|api[-._]?key"
    "|private[-._]?key|secret[-._]?key|secret[-._]?access[-._]?key|account[-._]?key"
    "|client[-._]?key|credentials?)([-._](value|data|pem|b64|base64|json|text|string))?$"
)
LABEL_VALUE_RE = re.compile(LABEL_VALUE_PATTERN)


def qualified_name_error(key: str) -> str | None:
    """Why ``key`` is not a label or annotation key (``IsQualifiedName``), or None."""
    if not _QUALIFIED_NAME_RE.fullmatch(key):
        return (
            f"{key!r} is not a qualified name: an optional DNS subdomain prefix and '/', "
            "then alphanumerics, '-', '_' or '.', starting and ending alphanumeric"
        )
    prefix, _, name = key.rpartition("/")
    if len(name) > 63:
        return f"{key!r}: the name after the prefix must be at most 63 characters"
    if len(prefix) > 253:
        return f"{key!r}: the prefix must be at most 253 characters"
    return None


def reserved_key(key: str) -> bool:
    return key in RESERVED_METADATA_KEYS or key.startswith(RESERVED_METADATA_PREFIXES)


def _metadata_keys(value: dict[str, str] | None, what: str) -> list[str]:
    errors: list[str] = []
    for key in value or {}:
        problem = qualified_name_error(key)
        if problem is not None:
            errors.append(problem)
        elif reserved_key(key):
            hint = "; use spec.queueName" if key == "kueue.x-k8s.io/queue-name" else ""
            errors.append(f"{what} {key!r} is set by the controller and cannot be overridden{hint}")
    return errors


def _label_map(value: dict[str, str] | None, what: str, *, reserved: bool) -> dict[str, str] | None:
    if reserved:
        errors = _metadata_keys(value, what)
    else:
        errors = [p for p in map(qualified_name_error, value or {}) if p is not None]
    for key, item in (value or {}).items():
        if len(item) > 63 or not LABEL_VALUE_RE.fullmatch(item):
            errors.append(
                f"the value of {key!r} is not a label value: at most 63 alphanumerics, '-', '_' "
                "or '.', starting and ending alphanumeric (or empty)"
            )
    if errors:
        raise PydanticCustomError("InvalidRunnerPod", "{errors}", {"errors": "; ".join(errors)})
    return value


def _labels(value: dict[str, str] | None) -> dict[str, str] | None:
    return _label_map(value, "label", reserved=True)


def _node_selector(value: dict[str, str] | None) -> dict[str, str] | None:
    return _label_map(value, "node selector", reserved=False)


def _annotations(value: dict[str, str] | None) -> dict[str, str] | None:
    errors = _metadata_keys(value, "annotation")
    if errors:
        raise PydanticCustomError("InvalidRunnerPod", "{errors}", {"errors": "; ".join(errors)})
    return value


PodLabels = Annotated[
    dict[str, str] | None, Field(max_length=MAX_POD_MAP_ENTRIES), AfterValidator(_labels)
]
PodAnnotations = Annotated[
    dict[str, Annotated[str, Field(max_length=MAX_ANNOTATION_VALUE_LENGTH)]] | None,
    Field(max_length=MAX_POD_MAP_ENTRIES),
    AfterValidator(_annotations),
]
NodeSelector = Annotated[
    dict[str, str] | None, Field(max_length=MAX_POD_MAP_ENTRIES), AfterValidator(_node_selector)
]
