"""Names, labels and annotations of the objects the controller creates, in one place.

Pure (hashlib only), so the planners and the I/O modules share these facts
without the planners importing I/O (pyproject.toml's "pure-modules-no-io").
The one label here that is not ours, ``COMPLETION_INDEX_LABEL``, is the Job
controller's, read from an Indexed Job's pods.

Child name: upstream's ``ComputeJobName("inf", name, uid)``, byte for byte, so a
run keeps the name its Job/CronJob/ConfigMap had under the Go controller:

- ``uid`` part: the first 8 ASCII ``[a-z0-9]`` characters of the UID (upper
  case folded), right-padded with ``0``;
- main part: ``"inf-" + name`` with ASCII upper case folded and every run of
  other bytes (including every byte of a non-ASCII character) collapsed into
  one ``-``, never leading, trailing ones trimmed;
- the main part is cut so that ``main + "-" + uid`` fits, then trailing ``-``
  trimmed again.

Upstream keeps the main part to 53 characters, so its names are at most 62.
Two stricter bounds are ours, and both only shorten names that upstream could
never have used successfully:

- a CronJob name must leave room for the 11 characters the CronJob controller
  appends to each Job it creates, hence 52;
- an Indexed Job (a sharded run) gives each pod the hostname
  ``<job name>-<index>``, which must be a DNS label (63), so the name leaves
  room for ``-`` and the largest index. For a sharded CronJob the two add up.

Because these bounds depend on the spec, one run can have different child names
over its life (schedule added, parallelism changed): the controller finds its
children by label (``RUN_UID_LABEL``), not by recomputing the name.
"""

from __future__ import annotations

import hashlib

# Defined with the API's other names a client reads (contract.api).
from contract.api import COMPLETION_INDEX_LABEL as COMPLETION_INDEX_LABEL
from contract.api import MANAGED_BY_LABEL as MANAGED_BY_LABEL
from contract.api import MANAGED_BY_VALUE as MANAGED_BY_VALUE
from contract.api import RUN_UID_LABEL as RUN_UID_LABEL
from contract.api import managed_selector as managed_selector
from contract.api import run_selector as run_selector

PREFIX = "inf"

DNS_LABEL_MAX = 63
# The CronJob controller names Jobs "<cronjob>-<minutes since epoch>" and
# reserves 11 characters for the suffix (k8s validation: 52 = 63 - 11).
CRONJOB_NAME_MAX = 52
UID_PART_LEN = 8

COMPONENT_LABEL = "app.kubernetes.io/component"
COMPONENT_VALUE = "inference-runner"
RUN_NAME_LABEL = "ai.krateo.io/inference-run"
CONFIG_NAME_LABEL = "ai.krateo.io/inference-config"
# On a config's probe Job, its ConfigMap and pods (see controller/probe.py).
CONFIG_UID_LABEL = "ai.krateo.io/config-uid"
PROBE_COMPONENT_VALUE = "inference-probe"
# Kueue's: the LocalQueue that admits a Job (InferenceConfig.spec.queueName).
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"

# Set on every child: a hash of what the controller rendered, so drift is found
# by comparing one annotation instead of diffing server-defaulted specs.
DESIRED_HASH_ANNOTATION = "ai.krateo.io/desired-hash"
# Set on a one-shot run's Job: a hash of the run's spec it was made from, so an
# edit that the existing Job cannot follow is reported instead of ignored.
RUN_SPEC_HASH_ANNOTATION = "ai.krateo.io/run-spec-hash"
# Set on a config's probe Job: the config generation it was made for, so a
# result is matched to its spec (controller/probe.py).
PROBE_GENERATION_ANNOTATION = "ai.krateo.io/config-generation"
# Set on a run's ConfigMap: the InferenceConfig's generation and resourceVersion
# its contract was rendered from (the run's status repeats them), so the
# contract's bytes stay upstream's.
CONFIG_GENERATION_ANNOTATION = PROBE_GENERATION_ANNOTATION
CONFIG_RESOURCE_VERSION_ANNOTATION = "ai.krateo.io/config-resource-version"
# On a run's Job the controller ended (its activeDeadlineSeconds cut to now) because
# a runner pod could not start within the pod-start timeout: "reason: message".
POD_START_FAILED_ANNOTATION = "ai.krateo.io/pod-start-failed"


def _is_alnum(b: int) -> bool:
    return 0x61 <= b <= 0x7A or 0x30 <= b <= 0x39


def _fold(b: int) -> int:
    # ASCII-only upper -> lower, exactly like upstream's byte loop (not Unicode
    # lowering: e.g. the Kelvin sign must not become "k").
    return b + 0x20 if 0x41 <= b <= 0x5A else b


def uid_part(uid: str) -> str:
    """The first 8 ASCII alphanumerics of ``uid``, lower-cased, ``0``-padded."""
    out = bytearray()
    for raw in uid.encode("utf-8"):
        b = _fold(raw)
        if _is_alnum(b):
            out.append(b)
            if len(out) == UID_PART_LEN:
                break
    return out.decode("ascii").ljust(UID_PART_LEN, "0")


def _sanitise(text: str) -> str:
    out = bytearray()
    last_hyphen = False
    for raw in text.encode("utf-8"):
        b = _fold(raw)
        if _is_alnum(b):
            out.append(b)
            last_hyphen = False
        elif not last_hyphen and out:
            out.append(0x2D)
            last_hyphen = True
    return out.decode("ascii").rstrip("-")


def max_name_length(*, scheduled: bool, shards: int = 1) -> int:
    """The longest child name usable for a run of this shape."""
    if shards < 1:
        raise ValueError(f"shards must be >= 1, got {shards}")
    limit = CRONJOB_NAME_MAX if scheduled else DNS_LABEL_MAX
    if shards > 1:
        # Room for the pod hostname suffix "-<largest index>".
        limit -= 1 + len(str(shards - 1))
    return limit


def job_name(name: str, uid: str, scheduled: bool, shards: int = 1) -> str:
    """Upstream's child name for a run, bounded for a CronJob or an Indexed Job.

    >>> job_name("testdata-iris-schedule", "5be07ada-5fe0-4c9e-a8bc-aaae67d8d344", False)
    'inf-testdata-iris-schedule-5be07ada'
    """
    suffix = uid_part(uid)
    main = _sanitise(f"{PREFIX}-{name}")
    if not main:
        return suffix
    if scheduled or shards > 1:
        max_main = max_name_length(scheduled=scheduled, shards=shards) - UID_PART_LEN - 1
    else:
        # Upstream reserves "2 hyphens" although it adds one, so its longest
        # name is 62 (main at most 53): kept, so long names stay identical.
        max_main = DNS_LABEL_MAX - UID_PART_LEN - 2
    if max_main < 1:
        return suffix
    if len(main) > max_main:
        main = main[:max_main].rstrip("-")
        if not main:
            return suffix
    return f"{main}-{suffix}"


def label_value(text: str) -> str:
    """``text`` as a valid label value (at most 63 characters).

    Object names only hold ``[a-z0-9.-]``, so they are valid label values as
    long as they are short enough; longer ones keep a readable head and a hash
    of the whole so that two long names never share a value by accident.
    """
    if len(text) <= DNS_LABEL_MAX and _valid_label_value(text):
        return text
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:10]
    head = "".join(c if c.isascii() and (c.isalnum() or c in "-_.") else "-" for c in text)
    head = head[: DNS_LABEL_MAX - len(digest) - 1].strip("-_.")
    return f"{head}-{digest}" if head else digest


def _valid_label_value(text: str) -> bool:
    if not text:
        return True
    if not (text[0].isascii() and text[0].isalnum() and text[-1].isascii() and text[-1].isalnum()):
        return False
    return all(c.isascii() and (c.isalnum() or c in "-_.") for c in text)


def child_labels(run_name: str, run_uid: str, config_name: str | None = None) -> dict[str, str]:
    """Labels put on every child (ConfigMap, Job, CronJob, Job template, pods)."""
    labels = {
        MANAGED_BY_LABEL: MANAGED_BY_VALUE,
        COMPONENT_LABEL: COMPONENT_VALUE,
        RUN_NAME_LABEL: label_value(run_name),
        RUN_UID_LABEL: run_uid,
    }
    if config_name:
        labels[CONFIG_NAME_LABEL] = label_value(config_name)
    return labels


def probe_labels(config_name: str, config_uid: str) -> dict[str, str]:
    """Labels put on a config's probe Job, its pods and its ConfigMap."""
    return {
        MANAGED_BY_LABEL: MANAGED_BY_VALUE,
        COMPONENT_LABEL: PROBE_COMPONENT_VALUE,
        CONFIG_NAME_LABEL: label_value(config_name),
        CONFIG_UID_LABEL: config_uid,
    }


def probe_name(config_name: str, config_uid: str, attempt: int) -> str:
    """A probe Job's name: the config's child name and an attempt number (unique, <= 63)."""
    base = job_name(f"{config_name}-probe", config_uid, scheduled=True)  # at most 52
    return f"{base}-{attempt:x}"[:DNS_LABEL_MAX].rstrip("-")
