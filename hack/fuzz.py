"""Hostile but plausible InferenceConfig/InferenceRun specs, and the engine that
pushes them through a real API server at a running controller.

Used by ``tests/faults/test_fuzz.py`` (``make test``) and ``bench/fuzz.py``
(10,000 examples). Three parts:

**Strategies.** A :class:`Case` is a valid InferenceConfig and a valid
InferenceRun that uses it, plus 0-4 :class:`Mutation`\\ s. Each mutation has a
``kind`` (``run.timeoutSeconds``, ``config.resources``, ...), the field paths
it edits, and a value drawn from hostile pools: integer boundaries (0, -1,
2^31, 2^63-1, 2^64), wrong JSON types, unicode and control characters, names
and values from 63 bytes to ~1.1 MB, bad and borderline cron schedules and
time zones, resource quantities the pod API refuses (``cpu: "-1"``, requests
above limits, ``nvidia.com/gpu: 0.5``, hugepages without cpu or memory),
credentials written in URLs and headers, missing required fields, unknown
storage providers, configRefs to other namespaces, flat and nested model
fields, and every optional field with valid values too (so mixes of valid
fields are common). Hypothesis shrinks a case towards fewer mutations and the
first value of each pool.

**Engine.** :class:`FuzzEngine` creates each case (config, then run) with the
admin's credentials, checks a refusal at once (the *refusal property*: HTTP
400/422 and a message that names a field the case edited), and leaves
accepted runs to a watch (:class:`Tracker`) that records when each first shows
``status.phase`` and ``status.reason``. ``wait_deferred`` then checks the
*status property* for all of them together: each accepted run has a phase and
a reason within ``STATUS_DEADLINE`` seconds of its creation. A run checked and
finished (or older than ``KEEP_SECONDS``) is deleted with its config, so that
long runs (bench: 10,000 examples) keep the namespace, the caches and the
node's processes small.

**Reduction and verdicts.** A refusal failure is a normal Hypothesis failure
(raised in the example, shrunk by Hypothesis, one report per failure class).
A status failure is known only seconds later, after Hypothesis has moved on,
so it cannot be shrunk the usual way (one example at a time, up to 10 s
each). Instead :meth:`FuzzEngine.reduce` takes the smallest generated
example of each failure class and drops its mutations one at a time, all
candidates of all classes created together and checked together, until no
mutation can go: a few rounds of at most ``STATUS_DEADLINE`` seconds.
:meth:`FuzzEngine.audit` reads the controller's requests from the API
server's audit log (hot-loop property) and :meth:`FuzzEngine.leaks` looks for
the credential marker in statuses, ConfigMaps, Events and the controller log.
"""

from __future__ import annotations

import contextlib
import copy
import json
import random
import re
import statistics
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import seed as fix_seed
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample

from controller.naming import uid_part
from hack.cluster import Api, ApiError
from kubeclient.resources import API_VERSION

Obj = dict[str, Any]

# --------------------------------------------------------------------------------------------
# Values.


class _Delete:
    def __repr__(self) -> str:
        return "<delete>"


DELETE: Any = _Delete()

# A credential written in clear: it must never come back in a status, a ConfigMap,
# an Event or the controller's log: the contract carries Secret references, never values.
SECRET = "s3cr3t-fuzz-9f1c"
OTHER_NAMESPACE_MARK = "<own namespace>"

INT_EDGES = (
    0,
    1,
    -1,
    2,
    3,
    100,
    101,
    1000,
    1001,
    3600,
    2**31 - 1,
    2**31,
    -(2**31),
    2**53 + 1,
    2**63 - 1,
    2**63,
    -(2**63),
    -(2**63) - 1,
    2**64,
)
WRONG_TYPES: tuple[Any, ...] = (
    "3600",
    "",
    "one hour",
    True,
    False,
    None,
    1.5,
    -0.5,
    1e308,
    [],
    [1],
    {},
    {"a": "b"},
)
WEIRD_STRINGS = (
    "",
    " ",
    "a",
    "UPPER",
    "with space",
    "tab\tsep",
    "new\nline",
    "nul\x00byte",
    "ünïcödé",
    "名前",
    "😀",
    "\u202eevil",
    "zero\u200bwidth",
    "-leading",
    "trailing-",
    "a..b",
    "../../etc/passwd",
    "${HOME}",
    "$(echo pwned)",
    "'; DROP TABLE x; --",
    "\\",
    '"quoted"',
    "a" * 63,
    "a" * 64,
    "a" * 253,
    "a" * 254,
    "a" * 1025,
)
# Sizes around the limits that matter: ConfigMap data (1 MiB), etcd's request
# limit (1.5 MiB) with spec and status in one object.
BIG_SIZES = (1_000, 100_000, 700_000, 1_000_000, 1_048_576, 1_100_000)
CRONS = (
    "0 * * * *",
    "*/5 * * * *",
    "@hourly",
    "@daily",
    "0 0 * * MON-FRI",
    "0 0 29 2 *",
    "@every 1h",
    "*/99999999999999999999 * * * *",
    "0 0 31 2 *",
    "0 0 30 2 *",
    "60 * * * *",
    "* 24 * * *",
    "* * 32 * *",
    "* * * 13 *",
    "* * * * 7",
    "5-1 * * * *",
    "*/0 * * * *",
    "* * * *",
    "* * * * * *",
    "CRON_TZ=UTC 0 * * * *",
    "TZ=Europe/Rome 0 * * * *",
    "",
    " ",
    "  0 * * * *  ",
    "0\t*\t*\t*\t*",
    "@HOURLY",
    "? * * * *",
    "* * ? * ?",
    "0 0 * JAN-DEC SUN",
    "0 0 * * 6-SUN",
    "🕐 * * * *",
    "a" * 129,
)
TIME_ZONES = (
    "UTC",
    "Europe/Rome",
    "America/Argentina/Buenos_Aires",
    "Etc/GMT+14",
    "Etc/GMT-14",
    "Local",
    "local",
    "Mars/Olympus_Mons",
    "",
    "../../../etc/passwd",
    "Europe/Rome ",
    "EST5EDT",
    "GMT0",
    "posixrules",
    "Factory",
    "right/UTC",
    "UTC+1",
    "+01:00",
    "a" * 65,
)
QUANTITIES: tuple[Any, ...] = (
    "1",
    "100m",
    "128Mi",
    "0",
    "-1",
    "-100m",
    "0.5",
    "1.5Ti",
    "1e3",
    "1e1000",
    "9223372036854775807",
    "9223372036854775808",
    "abc",
    "",
    "1 Gi",
    "1gi",
    "+1",
    ".5",
    1,
    0,
    -1,
    0.5,
    2**63 - 1,
    2**63,
)
RESOURCE_NAMES = (
    "cpu",
    "memory",
    "nvidia.com/gpu",
    "hugepages-2Mi",
    "hugepages-1Gi",
    "ephemeral-storage",
    "example.com/foo",
    "CPU",
    "unknown",
    "",
    "a/b/c",
    "ünï",
)
MODEL_URLS = (
    "127.0.0.1:1/v2/models/m/infer",
    f"http://user:{SECRET}@model.example/v2/models/m/infer",
    f"https://:{SECRET}@model.example/v2/models/m/infer",
    "https://model.example:99999/v2/models/m/infer",
    "",
    "not a url",
    "ftp://model.example/x",
    "http://[::1]:8080/v2/models/m/infer",
    "javascript:alert(1)",
    "http://ünï.example/x",
)
IMAGES = (
    "test.local/fake-ok:1",
    "test.local/fake-fail:1",
    "test.local/absent-image:1",
    "UPPER/case:tag",
    "image with spaces",
    "registry.example/a:b:c",
    "@sha256:zz",
    "test.local/fake-ok@sha256:" + "0" * 64,
)
NAMESPACES = (
    OTHER_NAMESPACE_MARK,
    "default",
    "kube-system",
    "other-namespace",
    "UPPER",
    "",
    "a" * 64,
    "ünï",
)


@dataclass(frozen=True)
class Big:
    """A string of ``size`` bytes, generated on demand (shrinks to the smallest size)."""

    size: int

    def text(self) -> str:
        return "x" * self.size

    def __repr__(self) -> str:
        return f"Big({self.size})"


@dataclass(frozen=True)
class Name:
    """A metadata.name: ``<unique prefix>-<text>``, padded or cut to ``length`` when set."""

    text: str
    length: int | None = None


def ints() -> st.SearchStrategy[Any]:
    return st.one_of(st.sampled_from(INT_EDGES), st.integers(min_value=-(2**70), max_value=2**70))


def wrong_types() -> st.SearchStrategy[Any]:
    return st.sampled_from(WRONG_TYPES)


def numbers() -> st.SearchStrategy[Any]:
    return st.one_of(ints(), wrong_types())


def strings() -> st.SearchStrategy[Any]:
    return st.one_of(st.sampled_from(WEIRD_STRINGS), st.text(max_size=24))


def big() -> st.SearchStrategy[Big]:
    return st.sampled_from(BIG_SIZES).map(Big)


def names() -> st.SearchStrategy[Name]:
    return st.one_of(
        st.sampled_from(("x", "a.b", "UPPER", "ünï", "under_score", "-x", "x-", "a..b", "")).map(
            Name
        ),
        st.sampled_from((62, 63, 64, 200, 253, 254, 300)).map(lambda n: Name("x", n)),
        st.text(max_size=12).map(Name),
    )


def quantities() -> st.SearchStrategy[Any]:
    return st.one_of(st.sampled_from(QUANTITIES), wrong_types())


def resource_lists() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.dictionaries(st.sampled_from(RESOURCE_NAMES), quantities(), max_size=3),
        wrong_types(),
    )


# --------------------------------------------------------------------------------------------
# Mutations and cases.


@dataclass(frozen=True)
class Mutation:
    """One hostile edit of a case: ``kind`` names its class in reports.

    ``edits`` are ``(target, path, value)`` with target ``config`` or ``run``
    and path a tuple of keys from the object's root; ``value`` may be DELETE,
    a :class:`Big` or a :class:`Name` (metadata.name only).
    """

    kind: str
    edits: tuple[tuple[str, tuple[str, ...], Any], ...]


Labelled = tuple[str, st.SearchStrategy[Mutation]]


def _mut(kind: str, target: str, path: str, values: st.SearchStrategy[Any]) -> Labelled:
    keys = tuple(path.split("."))
    return kind, values.map(lambda v: Mutation(kind, ((target, keys, v),)))


def _maybe_delete(values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(values, st.just(DELETE))


_STORAGE_VALUES: tuple[Any, ...] = (
    {},
    {"input": {}},
    "storage",
    {"input": "krateo"},
    {"input": {"krateo": "not an object"}},
    {"input": {"s3": {"bucket": "b", "key": "k"}}, "output": {"gcs": {"bucket": "b"}}},
    {"input": {"": {}}, "output": {"": {}}},
    {"input": {"krateo": {}}, "output": {"krateo": {}}},
    {"input": {"krateo": {"api": {"password": SECRET}}}, "output": {}},
    {"input": {"http": {"url": f"http://user:{SECRET}@storage.example/in"}}, "output": {}},
    {"input": {"krateo": {"api": {"headers": [f"Authorization: Bearer {SECRET}"]}}}},
    {"input": {"krateo": {"api": {"headers": ["X-Custom: not-a-credential"]}}}},
    {"input": {"http": {"token": {"secretKeyRef": {"name": "s", "key": "t"}}}}},
    {"input": {"krateo": {"api": {"endpointRef": {"name": "UPPER", "namespace": 1}}}}},
)


def run_mutations() -> list[Labelled]:
    run = "run"
    return [
        _mut("run.metadata.name", run, "metadata.name", names()),
        _mut("run.spec", run, "spec", st.sampled_from((DELETE, {}, "spec", []))),
        _mut(
            "run.configRef",
            run,
            "spec.configRef",
            st.sampled_from((DELETE, {}, "cfg", {"name": None}, {"name": "x", "kind": "Secret"})),
        ),
        _mut("run.configRef.name", run, "spec.configRef.name", _maybe_delete(strings())),
        _mut(
            "run.configRef.namespace",
            run,
            "spec.configRef.namespace",
            st.one_of(st.sampled_from(NAMESPACES), wrong_types()),
        ),
        _mut("run.timeoutSeconds", run, "spec.timeoutSeconds", numbers()),
        _mut(
            "run.schedule",
            run,
            "spec.schedule",
            st.one_of(st.sampled_from(CRONS), st.text(max_size=20), wrong_types()),
        ),
        _mut(
            "run.timeZone",
            run,
            "spec.timeZone",
            st.one_of(st.sampled_from(TIME_ZONES), wrong_types()),
        ),
        (
            "run.schedule+timeZone",
            st.builds(
                lambda cron, tz: Mutation(
                    "run.schedule+timeZone",
                    (("run", ("spec", "schedule"), cron), ("run", ("spec", "timeZone"), tz)),
                ),
                st.sampled_from(CRONS),
                st.sampled_from(TIME_ZONES),
            ),
        ),
        _mut(
            "run.parameters",
            run,
            "spec.parameters",
            st.one_of(
                st.dictionaries(strings(), st.one_of(strings(), ints()), max_size=4),
                st.sampled_from(
                    (
                        DELETE,
                        {"nested": {"a": "b"}},
                        {"list": ["a"]},
                        {"null": None},
                        {f"k{i}": "v" for i in range(1000)},
                    )
                ),
                wrong_types(),
            ),
        ),
        _mut("run.parameters.big", run, "spec.parameters.big", big()),
        _mut("run.suspend", run, "spec.suspend", st.one_of(st.booleans(), wrong_types())),
        _mut(
            "run.concurrencyPolicy",
            run,
            "spec.concurrencyPolicy",
            st.one_of(st.sampled_from(("Allow", "Forbid", "Replace", "allow", "")), strings()),
        ),
        _mut("run.startingDeadlineSeconds", run, "spec.startingDeadlineSeconds", numbers()),
        _mut("run.successfulJobsHistoryLimit", run, "spec.successfulJobsHistoryLimit", numbers()),
        _mut("run.failedJobsHistoryLimit", run, "spec.failedJobsHistoryLimit", numbers()),
        _mut("run.backoffLimit", run, "spec.backoffLimit", numbers()),
        _mut("run.parallelism", run, "spec.parallelism", numbers()),
        _mut("run.unknownField", run, "spec.unknownField", st.one_of(strings(), ints())),
        _mut(
            "run.status",  # a client writing status with the object: ignored by the API server
            run,
            "status",
            st.sampled_from(({"phase": "Succeeded"}, {"phase": "Bogus"}, "status")),
        ),
    ]


def config_mutations() -> list[Labelled]:
    cfg = "config"
    return [
        ("config.absent", st.just(Mutation("config.absent", ()))),
        _mut("config.metadata.name", cfg, "metadata.name", names()),
        _mut("config.spec", cfg, "spec", st.sampled_from((DELETE, {}, "spec"))),
        _mut(
            "config.image",
            cfg,
            "spec.image",
            st.one_of(st.sampled_from(IMAGES), strings(), wrong_types(), st.just(DELETE)),
        ),
        _mut("config.image.big", cfg, "spec.image", big()),
        _mut(
            "config.autoDeletePolicy",
            cfg,
            "spec.autoDeletePolicy",
            st.one_of(
                st.sampled_from(("None", "DeleteOnSuccess", "DeleteOnCompletion", "none", "")),
                strings(),
                wrong_types(),
            ),
        ),
        _mut(
            "config.imagePullPolicy",
            cfg,
            "spec.imagePullPolicy",
            st.one_of(st.sampled_from(("Always", "IfNotPresent", "Never", "always")), strings()),
        ),
        _mut(
            "config.kserve",
            cfg,
            "spec.kserve",
            st.sampled_from((DELETE, {}, "kserve", {"modelUrl": None}, {"modelUrl": 1})),
        ),
        _mut(
            "config.kserve.modelUrl",
            cfg,
            "spec.kserve.modelUrl",
            st.one_of(st.sampled_from(MODEL_URLS), strings(), big(), st.just(DELETE)),
        ),
        _mut(
            "config.kserve.modelVersion",
            cfg,
            "spec.kserve.modelVersion",
            st.one_of(st.sampled_from(("v1", "v2", "v3", "V2", "")), strings(), wrong_types()),
        ),
        _mut("config.kserve.modelName", cfg, "spec.kserve.modelName", strings()),
        (
            "config.flatModel",
            st.builds(
                lambda url: Mutation(
                    "config.flatModel",  # the upstream README's spelling, nothing nested
                    (
                        ("config", ("spec", "kserve"), DELETE),
                        ("config", ("spec", "modelName"), "m"),
                        ("config", ("spec", "modelUrl"), url),
                        ("config", ("spec", "modelVersion"), "v2"),
                    ),
                ),
                st.sampled_from(MODEL_URLS),
            ),
        ),
        _mut(
            "config.flatModelUrl",  # flat beside nested: nested wins
            cfg,
            "spec.modelUrl",
            st.one_of(st.sampled_from(MODEL_URLS), strings(), wrong_types()),
        ),
        _mut(
            "config.storage",
            cfg,
            "spec.storage",
            st.one_of(st.sampled_from(_STORAGE_VALUES), st.just(DELETE), wrong_types()),
        ),
        _mut("config.storage.big", cfg, "spec.storage.input.krateo.api.path", big()),
        _mut(
            "config.credentialsRef",
            cfg,
            "spec.credentialsRef",
            st.sampled_from(
                (
                    {"name": "regcred"},
                    {"name": "regcred", "namespace": "other-namespace"},
                    {"name": "Bad_Name"},
                    {},
                    "regcred",
                    {"name": ""},
                )
            ),
        ),
        _mut(
            "config.serviceAccountName",
            cfg,
            "spec.serviceAccountName",
            st.one_of(st.sampled_from(("default", "missing-sa", "UPPER")), strings()),
        ),
        (
            "config.resources",
            st.builds(
                lambda limits, requests: Mutation(
                    "config.resources",
                    (("config", ("spec", "resources"), {"limits": limits, "requests": requests}),),
                ),
                resource_lists(),
                resource_lists(),
            ),
        ),
        _mut(
            "config.resources.classic",
            cfg,
            "spec.resources",
            st.sampled_from(
                (
                    {"limits": {"cpu": "1", "memory": "256Mi"}},
                    {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}},
                    {"limits": {"nvidia.com/gpu": "0.5"}},
                    {"limits": {"nvidia.com/gpu": 1}},
                    {"limits": {"hugepages-2Mi": "100Mi"}},
                    {"requests": {"cpu": "-1"}},
                    {"limits": {"memory": "0"}},
                    {"requests": {"cpu": "1000"}},
                )
            ),
        ),
        _mut("config.batching.batchSize", cfg, "spec.batching.batchSize", numbers()),
        _mut("config.batching.concurrency", cfg, "spec.batching.concurrency", numbers()),
        _mut(
            "config.batching.requestTimeoutSeconds",
            cfg,
            "spec.batching.requestTimeoutSeconds",
            st.one_of(numbers(), st.sampled_from((0.001, 1e-300, 1e300, 0.0))),
        ),
        _mut("config.batching.maxRetries", cfg, "spec.batching.maxRetries", numbers()),
        _mut("config.batching", cfg, "spec.batching", wrong_types()),
        _mut("config.unknownField", cfg, "spec.unknownField", st.one_of(strings(), ints())),
    ]


def valid_mutations() -> list[Labelled]:
    """Optional fields with valid values: mixed into cases beside the hostile ones."""
    run, cfg = "run", "config"
    return [
        (
            "valid.schedule",
            st.builds(
                lambda cron, tz, policy: Mutation(
                    "valid.schedule",
                    (
                        ("run", ("spec", "schedule"), cron),
                        ("run", ("spec", "timeZone"), tz),
                        ("run", ("spec", "concurrencyPolicy"), policy),
                    ),
                ),
                st.sampled_from(("*/5 * * * *", "@hourly", "0 0 * * MON-FRI", "0 0 29 2 *")),
                st.one_of(st.just(DELETE), st.sampled_from(("UTC", "Europe/Rome"))),
                st.one_of(st.just(DELETE), st.sampled_from(("Allow", "Forbid", "Replace"))),
            ),
        ),
        _mut("valid.suspend", run, "spec.suspend", st.booleans()),
        _mut("valid.timeoutSeconds", run, "spec.timeoutSeconds", st.sampled_from((3600, 1, 0))),
        _mut("valid.backoffLimit", run, "spec.backoffLimit", st.sampled_from((0, 6, 100))),
        _mut("valid.parallelism", run, "spec.parallelism", st.sampled_from((2, 3))),
        _mut(
            "valid.parameters",
            run,
            "spec.parameters",
            st.just({"input_table_name": "in", "output_table_name": "out"}),
        ),
        _mut(
            "valid.configRef.namespace",
            run,
            "spec.configRef.namespace",
            st.just(OTHER_NAMESPACE_MARK),
        ),
        _mut(
            "valid.autoDeletePolicy",
            cfg,
            "spec.autoDeletePolicy",
            st.sampled_from(("DeleteOnSuccess", "DeleteOnCompletion", "None")),
        ),
        _mut("valid.image", cfg, "spec.image", st.sampled_from(IMAGES[:3])),
        _mut(
            "valid.batching",
            cfg,
            "spec.batching",
            st.just({"batchSize": 10, "concurrency": 2, "requestTimeoutSeconds": 0.5}),
        ),
        _mut(
            "valid.resources",
            cfg,
            "spec.resources",
            st.just({"limits": {"cpu": "1", "memory": "256Mi"}, "requests": {"cpu": "100m"}}),
        ),
        _mut("valid.credentialsRef", cfg, "spec.credentialsRef", st.just({"name": "regcred"})),
        _mut("valid.imagePullPolicy", cfg, "spec.imagePullPolicy", st.just("Always")),
    ]


@dataclass(frozen=True)
class Case:
    mutations: tuple[Mutation, ...]

    @property
    def kinds(self) -> frozenset[str]:
        return frozenset(m.kind for m in self.mutations)

    def without(self, i: int) -> Case:
        return Case(self.mutations[:i] + self.mutations[i + 1 :])


_REGISTRY: dict[str, st.SearchStrategy[Mutation]] = {}


def mutation_strategies() -> dict[str, st.SearchStrategy[Mutation]]:
    """Kind -> the strategy of mutations of that kind."""
    if not _REGISTRY:
        for kind, strategy in (*run_mutations(), *config_mutations(), *valid_mutations()):
            _REGISTRY[kind] = strategy
    return _REGISTRY


def _mutation_lists(kinds: list[str], max_size: int) -> st.SearchStrategy[list[Mutation]]:
    registry = mutation_strategies()
    if not kinds or max_size < 1:
        return st.just([])
    return st.lists(
        st.one_of(*(registry[k] for k in kinds)), max_size=max_size, unique_by=lambda m: m.kind
    )


def cases(max_mutations: int = 3, kinds: frozenset[str] | None = None) -> st.SearchStrategy[Case]:
    """Cases of up to ``max_mutations`` hostile and as many valid mutations, distinct kinds.

    With ``kinds``, only mutations of those kinds (at most ``max_mutations`` in all).
    """
    registry = mutation_strategies()
    if kinds is not None:
        lists = _mutation_lists([k for k in registry if k in kinds], max_mutations)
        return lists.map(lambda ms: Case(tuple(ms)))
    hostile = [k for k in registry if not k.startswith("valid.")]
    valid = [k for k in registry if k.startswith("valid.")]
    return st.builds(
        lambda h, v: Case(tuple(h + v)),
        _mutation_lists(hostile, max_mutations),
        _mutation_lists(valid, max_mutations),
    )


# --------------------------------------------------------------------------------------------
# Cases -> objects.

BASE_IMAGE = "test.local/fake-ok:1"
# Runs that would start many pods (parallelism) use an image the node agent cannot
# run, so the pods wait (ErrImagePull) instead of churning through completions.
# (Not "*runner*": the node agent runs this checkout's runner for those.)
IDLE_IMAGE = "test.local/absent-image:1"
MANY_PODS = 4
STORAGE = {
    "input": {
        "krateo": {"api": {"endpointRef": {"name": "storage"}, "path": "/in", "verb": "POST"}}
    },
    "output": {
        "krateo": {"api": {"endpointRef": {"name": "storage"}, "path": "/out", "verb": "POST"}}
    },
}


def _value(value: Any) -> Any:
    if value is DELETE:
        return value
    if isinstance(value, Big):
        return value.text()
    return copy.deepcopy(value)


def _name(value: Any, prefix: str) -> Any:
    if not isinstance(value, Name):
        return _value(value)
    text = f"{prefix}-{value.text}"
    if value.length is not None:
        text = (text + "x" * value.length)[: value.length]
    return text


def _apply(obj: Obj, path: tuple[str, ...], value: Any) -> None:
    node: Any = obj
    for key in path[:-1]:
        if not isinstance(node.get(key), dict):
            if value is DELETE:
                return
            node[key] = {}
        node = node[key]
    if value is DELETE:
        node.pop(path[-1], None)
    else:
        node[path[-1]] = value


@dataclass
class Objects:
    config: Obj | None
    run: Obj
    # Field paths the API server may name when it refuses each object.
    config_paths: list[str]
    run_paths: list[str]


def materialize(case: Case, index: int, namespace: str, labels: dict[str, str]) -> Objects:
    config_name, run_name = f"fc{index}", f"fr{index}"
    config: Obj = {
        "apiVersion": API_VERSION,
        "kind": "InferenceConfig",
        "metadata": {"name": config_name, "labels": dict(labels)},
        "spec": {
            "image": BASE_IMAGE,
            "kserve": {
                "modelName": "m",
                "modelUrl": "127.0.0.1:1/v2/models/m/infer",
                "modelVersion": "v2",
                "modelInputName": "input-0",
            },
            "storage": copy.deepcopy(STORAGE),
        },
    }
    run: Obj = {
        "apiVersion": API_VERSION,
        "kind": "InferenceRun",
        "metadata": {"name": run_name, "labels": dict(labels)},
        "spec": {"configRef": {"name": config_name}, "parameters": {"table": "iris"}},
    }
    paths: dict[str, list[str]] = {"config": [], "run": []}
    create_config = True
    for mutation in case.mutations:
        if mutation.kind == "config.absent":
            create_config = False
        for target, path, value in mutation.edits:
            obj = config if target == "config" else run
            if path == ("metadata", "name"):
                value = _name(value, config_name if target == "config" else run_name)
            elif path == ("spec", "configRef", "namespace") and value == OTHER_NAMESPACE_MARK:
                value = namespace
            else:
                value = _value(value)
            _apply(obj, path, value)
            paths[target].append(".".join(path))
    # The run follows a renamed config unless the case edits its configRef itself.
    new_name = config["metadata"].get("name")
    ref = (run.get("spec") or {}).get("configRef") if isinstance(run.get("spec"), dict) else None
    edits_ref = any(p.startswith("spec.configRef") or p == "spec" for p in paths["run"])
    if new_name != config_name and isinstance(ref, dict) and not edits_ref:
        ref["name"] = new_name
        paths["run"].append("spec.configRef.name")
    # Keep the node's load bounded: a run that would start many pods gets an image
    # whose pods wait instead of running (the controller sees the same Job).
    spec = run.get("spec")
    parallelism = spec.get("parallelism") if isinstance(spec, dict) else None
    config_spec = config.get("spec")
    if (
        isinstance(parallelism, int)
        and not isinstance(parallelism, bool)
        and parallelism > MANY_PODS
        and isinstance(config_spec, dict)
        and config_spec.get("image") == BASE_IMAGE
    ):
        config_spec["image"] = IDLE_IMAGE
    return Objects(config if create_config else None, run, paths["config"], paths["run"])


# --------------------------------------------------------------------------------------------
# Engine.


STATUS_DEADLINE = 10.0
KEEP_SECONDS = 30.0
FINISHED_PHASES = ("Succeeded", "Failed", "Error")
# Accepted runs still waiting for a status before a new case is created: keeps the
# creation rate near what the controller can take, so a late status means a
# problem of the controller, not of a test that outran it on 2 cores.
MAX_IN_FLIGHT = 10


@dataclass
class Refusal:
    code: int
    reason: str
    message: str


@dataclass
class Submitted:
    index: int
    case: Case
    objects: Objects
    config_refusal: Refusal | None = None
    run_refusal: Refusal | None = None
    run_uid: str = ""
    created: float = 0.0
    deleted: bool = False
    verdict: str | None = None  # None while waiting; "ok" or a failure class
    status: Obj | None = None
    trial: bool = False  # made while shrinking or reducing: not counted in the summary
    config_exists: bool = False  # the run names a config that was accepted

    @property
    def accepted(self) -> bool:
        return self.run_refusal is None


@dataclass
class Failure:
    """One failure class: ``key``, how many examples showed it, the smallest example."""

    key: str
    count: int
    example: Submitted
    detail: str
    reduced: Case | None = None
    log_lines: list[str] = field(default_factory=list)


class RefusalFailure(AssertionError):
    """Base of the per-class exception types raised inside Hypothesis examples."""


_FAILURE_TYPES: dict[str, type[RefusalFailure]] = {}


def failure_type(key: str) -> type[RefusalFailure]:
    """One exception type per failure class, so Hypothesis reports (and shrinks) each apart."""
    if key not in _FAILURE_TYPES:
        slug = re.sub(r"\W+", "_", key).strip("_")[:80] or "failure"
        _FAILURE_TYPES[key] = type(f"Refused_{slug}", (RefusalFailure,), {})
    return _FAILURE_TYPES[key]


_PATH_RE = re.compile(r"\b(?:metadata|spec|status)(?:\.[\w\-/]+|\[[^\]]*\])*")


def _shape(path: str) -> str:
    """A field path without its map keys and list indices: ``spec.x[0]`` -> ``spec.x[]``."""
    return re.sub(r"\[[^\]]*\]", "[]", path)


def names_a_field(message: str, paths: list[str]) -> bool:
    """Does a refusal message name one of the edited field paths?

    Yes when the message holds a path at or below an edited one
    (``spec.storage.input.krateo`` for an edit of ``spec.storage``), or a path
    above it plus the edited field's own name (a CEL rule on ``spec`` whose
    message says ``timeZone``).
    """
    found = [p.replace("[", ".").replace("]", "") for p in _PATH_RE.findall(message)]
    for edited in paths:
        leaf = edited.rsplit(".", 1)[-1]
        for path in found:
            if path == edited or path.startswith(edited + "."):
                return True
            if edited.startswith(path + ".") and leaf in message:
                return True
    return False


def _names_config(objects: Objects, namespace: str) -> bool:
    spec = objects.run.get("spec")
    ref = spec.get("configRef") if isinstance(spec, dict) else None
    if objects.config is None or not isinstance(ref, dict):
        return False
    same_namespace = ref.get("namespace") in (None, "", namespace)
    return same_namespace and ref.get("name") == objects.config["metadata"].get("name")


def _age(submitted: Submitted, now: float) -> float:
    return now - submitted.created


class Tracker:
    """Watches the namespace's runs (and ConfigMaps, for leaks) in background threads."""

    def __init__(self, api: Api, namespace: str, selector: str) -> None:
        self.api = api
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.first_status: dict[str, tuple[float, Obj]] = {}  # run uid -> (when, status)
        self.last_status: dict[str, Obj] = {}
        self.config_status: dict[str, Obj] = {}
        self.leaks: list[str] = []
        q = urllib.parse.urlencode({"labelSelector": selector})
        base = f"/apis/{API_VERSION}/namespaces/{namespace}"
        self.threads = [
            threading.Thread(
                target=self._follow, args=(f"{base}/inferenceruns?{q}", self._run), daemon=True
            ),
            threading.Thread(
                target=self._follow,
                args=(f"{base}/inferenceconfigs?{q}", self._config),
                daemon=True,
            ),
            threading.Thread(
                target=self._follow,
                args=(f"/api/v1/namespaces/{namespace}/configmaps", self._configmap),
                daemon=True,
            ),
        ]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(15)

    def _follow(self, path: str, handle: Callable[[Obj], None]) -> None:
        while not self.stop.is_set():
            try:
                for event in self.api.watch(path, self.stop):
                    if event["type"] in ("ADDED", "MODIFIED"):
                        handle(event["object"])
            except ApiError:
                self.stop.wait(1)

    def _run(self, obj: Obj) -> None:
        status = obj.get("status") or {}
        uid = obj["metadata"]["uid"]
        with self.lock:
            self.last_status[uid] = status
            if status.get("phase") and status.get("reason") and uid not in self.first_status:
                self.first_status[uid] = (time.monotonic(), status)
        if SECRET in json.dumps(status):
            self.leaks.append(f"status of InferenceRun {obj['metadata']['name']}")

    def _config(self, obj: Obj) -> None:
        with self.lock:
            self.config_status[obj["metadata"]["name"]] = obj.get("status") or {}

    def _configmap(self, obj: Obj) -> None:
        if SECRET in json.dumps(obj.get("data") or {}):
            self.leaks.append(f"ConfigMap {obj['metadata']['name']}")


def _brief(value: Any, limit: int = 200) -> Any:
    """A value for a report: long strings shortened, saying how long they were."""
    if isinstance(value, str) and len(value) > limit:
        return f"<{len(value)} chars: {value[:24]!r}...>"
    if isinstance(value, dict):
        if len(value) > 20:
            return f"<{len(value)} keys>"
        return {str(k)[:limit]: _brief(v, limit) for k, v in value.items()}
    if isinstance(value, list):
        return [_brief(v, limit) for v in value[:20]]
    return value


def describe_case(case: Case) -> str:
    if not case.mutations:
        return "(valid config and run, no mutation)"
    parts = []
    for m in case.mutations:
        edits = ", ".join(f"{t}.{'.'.join(p)}={_brief(v, 60)!r}" for t, p, v in m.edits)
        parts.append(f"[{m.kind}] {edits}" if edits else f"[{m.kind}]")
    return "; ".join(parts)


def _parse_time(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


@dataclass
class AuditSummary:
    total: int
    minutes: float
    per_minute_peak: int
    by_verb: Counter[str]
    per_case_max: int
    per_case_worst: str
    per_case_worst_requests: Counter[str]
    unattributed: int
    unattributed_requests: Counter[str]
    over_budget: list[str]


class FuzzEngine:
    """Creates cases in one namespace, checks them, keeps the books."""

    def __init__(
        self,
        api: Api,
        namespace: str,
        *,
        alive: Callable[[], bool],
        log: Callable[[], str],
        audit_log: Path,
        controller_user: str,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.alive = alive
        self.controller_log = log
        self.audit_log = audit_log
        self.controller_user = controller_user
        self.labels = {"ksc-fuzz": "1"}
        self.tracker = Tracker(api, namespace, "ksc-fuzz=1")
        self.submitted: list[Submitted] = []
        self.refusal_failures: dict[str, list[Submitted]] = defaultdict(list)
        self.status_failures: dict[str, list[Submitted]] = defaultdict(list)
        self.started = time.time()
        self.crashed = False
        self._index = 0
        self._live: list[Submitted] = []  # not deleted yet
        self._in_flight: list[Submitted] = []  # accepted, no status yet
        self._lock = threading.Lock()

    # ---------------------------------------------------------------- set-up

    def start(self) -> None:
        # A quota on pods keeps Indexed Jobs (parallelism up to 1000) from filling
        # the node: pods past it are refused to the Job controller, not to us.
        quota = {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "fuzz-pods"},
            "spec": {"hard": {"pods": "60"}},
        }
        with contextlib.suppress(ApiError):
            self.api.request("POST", f"/api/v1/namespaces/{self.namespace}/resourcequotas", quota)
        self.tracker.start()

    def close(self) -> None:
        self.tracker.close()

    # ---------------------------------------------------------------- create

    def _path(self, kind: str) -> str:
        return f"/apis/{API_VERSION}/namespaces/{self.namespace}/{kind}"

    def _create(self, obj: Obj, plural: str) -> tuple[Obj | None, Refusal | None]:
        try:
            return self.api.request("POST", self._path(plural), obj), None
        except ApiError as e:
            return None, Refusal(e.code, str(e.status.get("reason", "")), e.message)

    def submit(self, case: Case, *, trial: bool = False) -> Submitted:
        """Create one case; return it with its refusals (checked by ``refusal_problem``)."""
        self._throttle()
        with self._lock:
            self._index += 1
            index = self._index
        objects = materialize(case, index, self.namespace, self.labels)
        sub = Submitted(index, case, objects, trial=trial)
        if objects.config is not None:
            _, sub.config_refusal = self._create(objects.config, "inferenceconfigs")
        created, sub.run_refusal = self._create(objects.run, "inferenceruns")
        sub.config_exists = _names_config(objects, self.namespace) and (
            objects.config is not None and sub.config_refusal is None
        )
        sub.created = time.monotonic()
        if created is not None:
            sub.run_uid = created["metadata"]["uid"]
        # Keep what reports need, not the megabytes (bench: 10,000 cases).
        objects.run = _brief(objects.run, 1100)
        objects.config = _brief(objects.config, 1100) if objects.config is not None else None
        with self._lock:
            self.submitted.append(sub)
            self._live.append(sub)
            if sub.accepted:
                self._in_flight.append(sub)
        if index % 25 == 0:
            self.collect()
        return sub

    def refusal_problem(self, sub: Submitted) -> tuple[str, str] | None:
        """(failure class, message) when a refusal breaks the refusal property."""
        for target, refusal, paths in (
            ("config", sub.config_refusal, sub.objects.config_paths),
            ("run", sub.run_refusal, sub.objects.run_paths),
        ):
            if refusal is None:
                continue
            if refusal.code not in (400, 422):
                key = f"{target} refused with HTTP {refusal.code} {refusal.reason}"
            elif not paths:
                key = f"valid {target} refused"
            elif not names_a_field(refusal.message, paths):
                first = (_PATH_RE.findall(refusal.message) or ["no field path"])[0]
                first = _shape(first)
                key = f"{target} refused naming {first}, not an edited field"
            else:
                continue
            return key, (
                f"{key}\n  case: {describe_case(sub.case)}\n  edited: {paths}\n"
                f"  HTTP {refusal.code}: {refusal.message[:600]}"
            )
        return None

    def record_refusal(self, key: str, sub: Submitted) -> None:
        with self._lock:
            self.refusal_failures[key].append(sub)

    def _throttle(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            now = time.monotonic()
            self._in_flight = [
                s
                for s in self._in_flight
                if s.run_uid not in self.tracker.first_status and _age(s, now) < STATUS_DEADLINE
            ]
            if len(self._in_flight) < MAX_IN_FLIGHT:
                return
            time.sleep(0.05)

    def collect(self) -> None:
        """Delete judged runs that finished, or are older than KEEP_SECONDS, with their configs.

        Runs that failed a property stay: their requests keep counting in the audit.
        """
        now = time.monotonic()
        for sub in self._live:
            self.judge(sub, now)
        keep = []
        for sub in self._live:
            if sub.accepted and sub.verdict != "ok":
                if sub.verdict is None:
                    keep.append(sub)
                continue
            last = self.tracker.last_status.get(sub.run_uid) or {}
            unfinished = last.get("phase") not in FINISHED_PHASES
            if _age(sub, now) < 2 or (
                sub.accepted and unfinished and _age(sub, now) < KEEP_SECONDS
            ):
                keep.append(sub)
                continue
            sub.deleted = True
            for obj, plural, refused in (
                (sub.objects.run, "inferenceruns", sub.run_refusal),
                (sub.objects.config, "inferenceconfigs", sub.config_refusal),
            ):
                name = (obj or {}).get("metadata", {}).get("name")
                if obj is None or refused is not None or not isinstance(name, str):
                    continue
                with contextlib.suppress(ApiError, OSError):
                    self.api.request(
                        "DELETE", f"{self._path(plural)}/{urllib.parse.quote(name, safe='')}"
                    )
        self._live = keep

    # ---------------------------------------------------------------- status

    def judge(self, sub: Submitted, now: float) -> None:
        """Give an accepted run its verdict once it is known (at the latest at the deadline).

        ``ok``: a phase and a reason within STATUS_DEADLINE, and no
        ``ConfigNotFound`` left when the config it names exists (a status
        written before the config reached the controller's cache must be
        corrected: a run's status always says what is true now).
        """
        if not sub.accepted or sub.verdict is not None:
            return
        first = self.tracker.first_status.get(sub.run_uid)
        last = self.tracker.last_status.get(sub.run_uid) or {}
        stale = sub.config_exists and last.get("reason") == "ConfigNotFound"
        if first is not None and first[0] - sub.created <= STATUS_DEADLINE and not stale:
            sub.verdict, sub.status = "ok", last or first[1]
            return
        if _age(sub, now) < STATUS_DEADLINE:
            return
        sub.status = last
        if first is not None and first[0] - sub.created > STATUS_DEADLINE:
            sub.verdict = f"first status later than {STATUS_DEADLINE:.0f}s"
        elif stale:
            sub.verdict = "stale status: ConfigNotFound although the config exists"
        elif not last:
            sub.verdict = "no status"
        elif not last.get("phase"):
            sub.verdict = "status without phase"
        else:
            sub.verdict = "status without reason"
        if not sub.trial:
            with self._lock:
                self.status_failures[sub.verdict].append(sub)

    def wait_deferred(self, subs: list[Submitted] | None = None) -> None:
        """Judge every accepted run, waiting at most STATUS_DEADLINE after its creation."""
        subs = list(self.submitted if subs is None else subs)
        while True:
            now = time.monotonic()
            for sub in subs:
                self.judge(sub, now)
            if all(s.verdict is not None for s in subs if s.accepted):
                return
            if not self.alive():
                self.crashed = True
                return
            time.sleep(0.2)

    def time_to_status(self) -> list[float]:
        out = []
        for s in self.submitted:
            if s.trial:
                continue
            first = self.tracker.first_status.get(s.run_uid)
            if s.accepted and first is not None:
                out.append(first[0] - s.created)
        return out

    # ---------------------------------------------------------------- reduction

    def reduce(self, max_classes: int = 8, max_rounds: int = 5) -> list[Failure]:
        """Failure classes of the status property, each with a reduced example.

        Representatives: the smallest failing example (fewest mutations, then
        shortest JSON) of each (verdict, mutation kinds). Each round creates,
        for every representative, the cases with one mutation dropped and the
        case with one big value one size smaller, all at once, waits for them
        together, and keeps the smallest that still fails. Classes that reduce
        to the same verdict and kinds are merged.
        """

        def size(s: Submitted) -> tuple[int, int]:
            return len(s.case.mutations), len(json.dumps(_brief(s.objects.run), default=str))

        causes = self.causes()
        groups: dict[tuple[str, frozenset[str], str], list[Submitted]] = defaultdict(list)
        for verdict, subs in self.status_failures.items():
            for s in subs:
                groups[(verdict, s.case.kinds, causes.get(_run_name(s), ""))].append(s)
        reps = sorted((min(subs, key=size) for subs in groups.values()), key=size)[:max_classes]
        current = {id(r): r for r in reps}
        for _ in range(max_rounds):
            trials: list[tuple[int, Submitted]] = []
            for rep in reps:
                case = current[id(rep)].case
                for candidate in _smaller_cases(case):
                    trials.append((id(rep), self.submit(candidate, trial=True)))
            if not trials:
                break
            self.wait_deferred([t for _, t in trials])
            changed = False
            for rep in reps:
                best = current[id(rep)]
                for rid, trial in trials:
                    fails = rid == id(rep) and trial.verdict not in (None, "ok")
                    if fails and _case_size(trial.case) < _case_size(best.case):
                        best = trial
                if best is not current[id(rep)]:
                    current[id(rep)] = best
                    changed = True
            if not changed:
                break
        merged: dict[str, Failure] = {}
        causes = self.causes()
        for rep in reps:
            final = current[id(rep)]
            kinds = final.case.kinds
            cause = causes.get(_run_name(final)) or causes.get(_run_name(rep)) or "no error logged"
            key = f"{final.verdict}: {' + '.join(sorted(kinds)) or 'no mutation'} ({cause})"
            count = sum(
                1 for subs in self.status_failures.values() for s in subs if kinds <= s.case.kinds
            )
            if key not in merged:
                merged[key] = Failure(key, count, rep, _status_detail(final), reduced=final.case)
                merged[key].log_lines = self.log_lines(final, 2)
        return sorted(merged.values(), key=lambda f: -f.count)

    def causes(self) -> dict[str, str]:
        """Run name -> the last error the controller logged for it, without names and values."""
        out: dict[str, str] = {}
        prefix = f'"run":"{self.namespace}/'
        for line in self.controller_log().splitlines():
            if prefix not in line or '"error"' not in line:
                continue
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            run = str(entry.get("run", "")).split("/", 1)[-1]
            out[run] = normalise_error(str(entry["error"]), self.namespace)
        return out

    def log_lines(self, sub: Submitted, limit: int = 4) -> list[str]:
        """The controller's log lines about a run (warnings and errors first)."""
        name = sub.objects.run.get("metadata", {}).get("name")
        if not isinstance(name, str):
            return []
        key = f"{self.namespace}/{name}"
        lines = [ln for ln in self.controller_log().splitlines() if f'"{key}"' in ln]
        loud = [ln for ln in lines if '"level":"warning"' in ln or '"level":"error"' in ln]
        chosen = (loud or lines)[-limit:]
        return [ln[:700] for ln in chosen]

    # ---------------------------------------------------------------- audit

    def audit(
        self, budget_per_case: int, unattributed_budget: int, unattributed_per_minute: float = 0
    ) -> AuditSummary:
        """The controller's requests since ``start``, attributed to the case they serve.

        Requests about no case are held to ``unattributed_budget`` plus
        ``unattributed_per_minute`` for each minute since ``start``: some of
        them are periodic (watch renewals, KServe's discovery while a config
        names an InferenceService), so a fixed budget alone would fail a slow
        run on a loaded machine and still pass a hot loop's first minute.
        """
        by_run: dict[str, Submitted] = {}
        by_config: dict[str, Submitted] = {}
        by_uid: dict[str, Submitted] = {}
        for s in self.submitted:
            run_name = s.objects.run.get("metadata", {}).get("name")
            if isinstance(run_name, str):
                by_run[run_name] = s
            if s.objects.config is not None:
                config_name = s.objects.config.get("metadata", {}).get("name")
                if isinstance(config_name, str):
                    by_config[config_name] = s
            if s.run_uid:
                by_uid[uid_part(s.run_uid)] = s

        def owner(ref: Obj) -> Submitted | None:
            name = str(ref.get("name") or "")
            resource = ref.get("resource")
            if resource == "inferenceruns":
                return by_run.get(name)
            if resource == "inferenceconfigs":
                return by_config.get(name)
            if resource == "events":
                base = name.rsplit(".", 1)[0]
                return by_run.get(base) or by_config.get(base)
            for token in name.split("-"):
                if token in by_uid:
                    return by_uid[token]
            return None

        per_case: Counter[int] = Counter()
        per_case_verbs: dict[int, Counter[str]] = defaultdict(Counter)
        per_minute: Counter[int] = Counter()
        verbs: Counter[str] = Counter()
        unattributed = 0
        unattributed_requests: Counter[str] = Counter()
        per_job_events: Counter[str] = Counter()
        total = 0
        needle = f'"username":"{self.controller_user}"'
        with self.audit_log.open() as f:
            for line in f:
                if needle not in line:
                    continue
                event = json.loads(line)
                if event.get("stage") != "ResponseComplete":
                    if not (
                        event.get("verb") == "watch" and event.get("stage") == "ResponseStarted"
                    ):
                        continue
                elif event.get("verb") == "watch":
                    continue  # counted when it started
                at = _parse_time(event["stageTimestamp"])
                if at < self.started:
                    continue
                total += 1
                ref = event.get("objectRef") or {}
                what = str(ref.get("resource", "?")) + (
                    "/" + ref["subresource"] if ref.get("subresource") else ""
                )
                verbs[f"{event['verb']} {what}"] += 1
                per_minute[int((at - self.started) // 60)] += 1
                sub = owner(ref)
                watched = _events_of(event) if sub is None else None
                if watched is not None:
                    # A Job's FailedCreate Events, read on a backoff while it has no
                    # pod: a list, so no name says whose. Each Job is held to the
                    # per-case budget on its own.
                    per_job_events[watched] += 1
                elif sub is None:
                    unattributed += 1
                    # No objectRef: a discovery or other non-resource request.
                    unattributed_requests[
                        f"{event['verb']} {what if ref else event.get('requestURI', '?')}"
                    ] += 1
                else:
                    per_case[sub.index] += 1
                    per_case_verbs[sub.index][f"{event['verb']} {what}"] += 1
        minutes = max((time.time() - self.started) / 60, 1 / 60)
        worst_index, worst = per_case.most_common(1)[0] if per_case else (0, 0)
        by_index = {s.index: s for s in self.submitted}
        over = [
            f"case {i} ({n} requests): {describe_case(by_index[i].case)}"
            for i, n in per_case.most_common()
            if n > budget_per_case and i in by_index
        ]
        over += [
            f"Events of object {uid} listed {n} times (budget {budget_per_case})"
            for uid, n in per_job_events.most_common()
            if n > budget_per_case
        ]
        allowed = unattributed_budget + int(unattributed_per_minute * minutes)
        if unattributed > allowed:
            over.append(
                f"{unattributed} requests about no case in {minutes:.1f} min (budget {allowed}): "
                + _top(unattributed_requests, 10)
            )
        worst_text = describe_case(by_index[worst_index].case) if worst_index in by_index else ""
        return AuditSummary(
            total=total,
            minutes=minutes,
            per_minute_peak=max(per_minute.values(), default=0),
            by_verb=verbs,
            per_case_max=worst,
            per_case_worst=worst_text,
            per_case_worst_requests=per_case_verbs.get(worst_index, Counter()),
            unattributed=unattributed,
            unattributed_requests=unattributed_requests,
            over_budget=over,
        )

    # ---------------------------------------------------------------- leaks, crashes

    def leaks(self) -> list[str]:
        found = list(dict.fromkeys(self.tracker.leaks))
        events = self.api.request("GET", f"/api/v1/namespaces/{self.namespace}/events")
        for event in events.get("items") or []:
            if SECRET in json.dumps(event.get("message") or ""):
                obj = event.get("involvedObject") or {}
                found.append(f"Event {event.get('reason')} on {obj.get('kind')} {obj.get('name')}")
        log_hits = [ln for ln in self.controller_log().splitlines() if SECRET in ln]
        if log_hits:
            found.append(f"{len(log_hits)} controller log lines, e.g. {log_hits[0][:300]}")
        return found

    def tracebacks(self) -> list[str]:
        """Log lines with a Traceback, one per distinct (normalised) error."""
        out: dict[str, str] = {}
        for line in self.controller_log().splitlines():
            if "Traceback" not in line:
                continue
            try:
                error = str(json.loads(line).get("error", ""))
            except ValueError:
                error = ""
            out.setdefault(normalise_error(error, self.namespace), line[:3000])
        return [f"{k}: {v}" for k, v in out.items()]

    # ---------------------------------------------------------------- summary

    def summary(self) -> dict[str, Any]:
        subs = [s for s in self.submitted if not s.trial]
        configs = [s for s in subs if s.objects.config is not None]
        refusal_codes: Counter[str] = Counter()
        refusal_fields: Counter[str] = Counter()
        for s in subs:
            for target, refusal in (("config", s.config_refusal), ("run", s.run_refusal)):
                if refusal is None:
                    continue
                refusal_codes[f"{target} {refusal.code} {refusal.reason}"] += 1
                for path in dict.fromkeys(_PATH_RE.findall(refusal.message)):
                    refusal_fields[f"{target} {_shape(path)}"] += 1
        reasons: Counter[str] = Counter()
        for s in subs:
            if s.status:
                reasons[f"{s.status.get('phase')}/{s.status.get('reason')}"] += 1
        times = sorted(self.time_to_status())
        return {
            "examples": len(subs),
            "configs_created": len(configs),
            "configs_accepted": sum(1 for s in configs if s.config_refusal is None),
            "configs_refused": sum(1 for s in configs if s.config_refusal is not None),
            "runs_accepted": sum(1 for s in subs if s.accepted),
            "runs_refused": sum(1 for s in subs if not s.accepted),
            "refusals": refusal_codes,
            "refusal_fields": refusal_fields,
            "first_status": reasons,
            "time_to_status": times,
            "time_to_status_p50": statistics.median(times) if times else None,
            "time_to_status_p95": times[int(len(times) * 0.95)] if times else None,
            "time_to_status_max": times[-1] if times else None,
        }


def _case_size(case: Case) -> tuple[int, int]:
    bigs = sum(v.size for m in case.mutations for _, _, v in m.edits if isinstance(v, Big))
    return len(case.mutations), bigs


def _smaller_cases(case: Case) -> list[Case]:
    """One mutation dropped (each in turn), or one big value one size smaller."""
    out = [case.without(i) for i in range(len(case.mutations))]
    for i, m in enumerate(case.mutations):
        if len(m.edits) == 1 and isinstance(m.edits[0][2], Big):
            target, path, value = m.edits[0]
            smaller = [n for n in BIG_SIZES if n < value.size]
            if smaller:
                simpler = Mutation(m.kind, ((target, path, Big(smaller[-1])),))
                out.append(Case((*case.mutations[:i], simpler, *case.mutations[i + 1 :])))
    return out


def _run_name(sub: Submitted) -> str:
    return str(sub.objects.run.get("metadata", {}).get("name", ""))


def normalise_error(error: str, namespace: str) -> str:
    """An error without the names, namespace and values that differ between examples."""
    error = re.sub(rf"\b{re.escape(namespace)}/", "<ns>/", error)
    error = error.replace(f"/namespaces/{namespace}/", "/namespaces/<ns>/")
    error = re.sub(r'"(inf|fr|fc)[^"]*"', '"<name>"', error)
    error = re.sub(r"\b(inf-)?f[rc]\d+[-\w]*", "<name>", error)
    error = re.sub(r'Invalid value: (".*?"|\S+): ', "Invalid value: <v>: ", error)
    error = re.sub(r"\b\d{4,}\b", "<n>", error)
    return error[:240]


def _status_detail(sub: Submitted) -> str:
    status = sub.status or {}
    keep = {k: status.get(k) for k in ("phase", "reason", "message") if status.get(k)}
    return json.dumps(_brief(keep, 300)) if keep else "no status"


def format_failures(failures: list[Failure]) -> str:
    lines = []
    for f in failures:
        lines.append(f"- {f.key}: {f.count} example(s)")
        reduced = describe_case(f.reduced) if f.reduced is not None else ""
        lines.append(f"    minimal: {reduced}")
        lines.append(f"    smallest generated: {describe_case(f.example.case)}")
        lines.append(f"    status: {f.detail}")
        lines.extend(f"    log: {ln}" for ln in f.log_lines)
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# One fuzzing session: generate, shrink refusals, wait for statuses, reduce, audit.


@dataclass
class FuzzReport:
    seed: int
    examples: int
    summary: dict[str, Any]
    refusal_failures: list[Failure]
    status_failures: list[Failure]
    audit: AuditSummary
    budget_per_case: int
    tracebacks: list[str]
    leaks: list[str]
    alive: bool
    timings: dict[str, float]

    @property
    def problems(self) -> list[str]:
        out = [f"refusal property: {f.key}" for f in self.refusal_failures]
        out += [f"status property: {f.key}" for f in self.status_failures]
        if not self.alive:
            out.append("controller process died")
        if self.tracebacks:
            out.append(f"controller logged {len(self.tracebacks)} Traceback(s)")
        out += [f"hot loop: {line}" for line in self.audit.over_budget]
        out += [f"credential echoed: {line}" for line in self.leaks]
        return out

    def text(self) -> str:
        s = self.summary
        a = self.audit
        lines = [
            f"seed {self.seed}: {s['examples']} examples "
            f"(configs: {s['configs_accepted']} accepted, {s['configs_refused']} refused; "
            f"runs: {s['runs_accepted']} accepted, {s['runs_refused']} refused)",
            "timings: " + ", ".join(f"{k} {v:.1f}s" for k, v in self.timings.items()),
        ]
        if s["time_to_status"]:
            lines.append(
                f"time to first status: p50 {s['time_to_status_p50']:.2f}s, "
                f"p95 {s['time_to_status_p95']:.2f}s, max {s['time_to_status_max']:.2f}s"
            )
        lines.append(
            f"controller requests: {a.total} in {a.minutes:.1f} min "
            f"({a.total / a.minutes:.0f}/min, peak minute {a.per_minute_peak}); "
            f"per case max {a.per_case_max} (budget {self.budget_per_case}); "
            f"about no case {a.unattributed}"
        )
        lines.append("requests about no case: " + _top(a.unattributed_requests, 10))
        lines.append(f"costliest case: {a.per_case_worst} -> {_top(a.per_case_worst_requests, 10)}")
        lines.append("first status seen (phase/reason): " + _top(s["first_status"], 12))
        lines.append("refusals: " + _top(s["refusals"], 8))
        lines.append("refused fields: " + _top(s["refusal_fields"], 15))
        if self.problems:
            lines.append(f"PROPERTY FAILURES ({len(self.problems)}):")
            lines.extend(f"  {p}" for p in self.problems)
        if self.refusal_failures:
            lines.append("refusal failures (shrunk by Hypothesis):")
            lines.append(format_failures(self.refusal_failures))
        if self.status_failures:
            lines.append("status failures (smallest example, mutations dropped in batches):")
            lines.append(format_failures(self.status_failures))
        for tb in self.tracebacks[:3]:
            lines.append(f"traceback: {tb}")
        return "\n".join(lines)


def _events_of(event: Obj) -> str | None:
    """The uid in a list of Events by ``involvedObject.uid`` (the Job's FailedCreate read)."""
    ref = event.get("objectRef") or {}
    if event.get("verb") != "list" or ref.get("resource") != "events":
        return None
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(str(event.get("requestURI"))).query)
    for selector in query.get("fieldSelector", []):
        for term in selector.split(","):
            name, _, value = term.partition("=")
            if name == "involvedObject.uid" and value:
                return value
    return None


def _top(counter: Counter[str], n: int) -> str:
    return ", ".join(f"{k} x{v}" for k, v in counter.most_common(n)) or "-"


def _fuzz_settings(max_examples: int, *, shrink: bool) -> settings:
    return settings(
        max_examples=max_examples,
        deadline=None,
        database=None,  # nothing written into the work tree; the seed replays a run
        phases=[Phase.generate, Phase.shrink] if shrink else [Phase.generate],
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
    )


def generate(engine: FuzzEngine, examples: int, seed: int) -> None:
    """Hypothesis draws ``examples`` cases; each is created and its refusals checked."""

    @fix_seed(seed)
    @_fuzz_settings(examples, shrink=False)
    @given(case=cases())
    def body(case: Case) -> None:
        # Nothing is raised here: Hypothesis stops generating soon after its first
        # failure, and every example should run. Refusal failures are recorded and
        # shrunk afterwards, one class at a time (``shrink_refusal``).
        if engine.crashed:
            return
        sub = engine.submit(case)
        problem = engine.refusal_problem(sub)
        if problem is not None:
            engine.record_refusal(problem[0], sub)
        if not engine.alive():
            engine.crashed = True

    body()


def _smallest(subs: list[Submitted]) -> Submitted:
    return min(
        subs,
        key=lambda s: (len(s.case.mutations), len(json.dumps(_brief(s.objects.run), default=str))),
    )


def shrink_refusal(engine: FuzzEngine, key: str, seed: int) -> Failure:
    """Hypothesis' minimal example of one refusal failure class.

    ``find`` searches the cases made of the mutation kinds of the smallest
    example seen (so the class turns up at once) and shrinks the first hit:
    fewer mutations, then the first value of each pool that still fails.
    """
    subs = engine.refusal_failures[key]
    smallest = _smallest(subs)
    hits: list[Submitted] = []

    def fails(case: Case) -> bool:
        sub = engine.submit(case, trial=True)
        problem = engine.refusal_problem(sub)
        if problem is not None and problem[0] == key:
            hits.append(sub)
            return True
        return False

    strategy = cases(len(smallest.case.mutations), smallest.case.kinds)
    try:
        found = find(
            strategy, fails, settings=_fuzz_settings(100, shrink=True), random=random.Random(seed)
        )
        example = next((h for h in reversed(hits) if h.case == found), smallest)
    except NoSuchExample:
        example = smallest
    problem = engine.refusal_problem(example)
    detail = problem[1].split("\n")[-1].strip() if problem else ""
    failure = Failure(key, len(subs), example, detail, reduced=example.case)
    return failure


def run_fuzz(
    engine: FuzzEngine,
    examples: int,
    seed: int,
    *,
    budget_per_case: int,
    unattributed_budget: int,
    unattributed_per_minute: float = 0,
    max_classes: int = 8,
) -> FuzzReport:
    timings: dict[str, float] = {}
    started = time.monotonic()
    engine.start()
    try:
        generate(engine, examples, seed)
        timings["generate"] = time.monotonic() - started
        mark = time.monotonic()
        refusals = [
            shrink_refusal(engine, key, seed) for key in list(engine.refusal_failures)[:max_classes]
        ]
        timings["shrink refusals"] = time.monotonic() - mark
        mark = time.monotonic()
        engine.wait_deferred()
        timings["wait statuses"] = time.monotonic() - mark
        mark = time.monotonic()
        statuses = engine.reduce(max_classes=max_classes)
        timings["reduce"] = time.monotonic() - mark
        alive = engine.alive()
        audit = engine.audit(budget_per_case, unattributed_budget, unattributed_per_minute)
        leaks = engine.leaks()
    finally:
        engine.close()
    timings["total"] = time.monotonic() - started
    return FuzzReport(
        seed=seed,
        examples=examples,
        summary=engine.summary(),
        refusal_failures=refusals,
        status_failures=statuses,
        audit=audit,
        budget_per_case=budget_per_case,
        tracebacks=engine.tracebacks(),
        leaks=leaks,
        alive=alive,
        timings=timings,
    )
