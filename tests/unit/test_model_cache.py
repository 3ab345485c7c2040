"""Parsed runs and configs are reused while unchanged, and the cache stays bounded."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from bench.common import config_body
from controller.api import InferenceRun
from controller.modelcache import ModelCache
from controller.reconcile import Reconciler
from tests.unit.helpers import run_raw


def listed_run(name: str = "r", uid: str = "u-1", rv: str | None = "5", **spec: Any) -> Any:
    """The run as a list returns it: a resourceVersion (``None`` leaves it out), no generation."""
    return run_raw(name=name, uid=uid, generation=None, resource_version=rv, **spec)


def test_the_same_version_is_parsed_once() -> None:
    cache = ModelCache(InferenceRun)
    first = cache.parse("ns/r", listed_run())
    assert cache.parse("ns/r", listed_run()) is first
    assert (cache.hits, cache.misses) == (1, 1)


@pytest.mark.parametrize("change", [{"rv": "6"}, {"uid": "u-2"}])
def test_a_new_version_or_a_new_object_of_the_same_name_is_parsed_again(
    change: dict[str, str],
) -> None:
    cache = ModelCache(InferenceRun)
    first = cache.parse("ns/r", listed_run())
    again = cache.parse("ns/r", listed_run(suspend=True, **change))
    assert again is not first
    assert again.spec.suspend
    assert len(cache) == 1  # one model per key


def test_objects_not_from_the_api_server_are_never_reused() -> None:
    cache = ModelCache(InferenceRun)
    assert cache.parse("ns/r", listed_run(rv=None)) is not cache.parse("ns/r", listed_run(rv=None))
    assert len(cache) == 0


def test_the_least_recently_used_go_first_and_forget_drops_one() -> None:
    cache = ModelCache(InferenceRun, size=2)
    a = cache.parse("ns/a", listed_run("a", "u-a"))
    cache.parse("ns/b", listed_run("b", "u-b"))
    assert cache.parse("ns/a", listed_run("a", "u-a")) is a  # a is now the most recent
    cache.parse("ns/c", listed_run("c", "u-c"))
    assert len(cache) == 2
    assert cache.parse("ns/a", listed_run("a", "u-a")) is a
    assert cache.misses == 3  # b was dropped, a was not
    cache.forget("ns/a")
    assert len(cache) == 1
    cache.forget("ns/gone")  # nothing to forget: fine


def test_an_invalid_object_raises_every_time() -> None:
    cache = ModelCache(InferenceRun)
    bad = listed_run(timeoutSeconds=-1)
    for _ in range(2):
        with pytest.raises(ValidationError):
            cache.parse("ns/r", bad)
    assert len(cache) == 0


def test_the_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="size"):
        ModelCache(InferenceRun, size=0)


def test_the_reconciler_forgets_a_deleted_runs_model() -> None:
    reconciler = Reconciler(client=None, caches=None, events=None)
    reconciler._run_models.parse("ns/r", listed_run())
    reconciler.forget("ns/r")
    assert len(reconciler._run_models) == 0


def test_the_reconciler_keeps_the_configs_of_hundreds_of_namespaces_parsed() -> None:
    # Runs spread over 300 namespaces, each with its config, reconciled round-robin:
    # a cache smaller than the configs in use dropped each one just before its next
    # use, and every reconcile parsed its config again.
    reconciler = Reconciler(client=None, caches=None, events=None)
    configs = [
        config_body(f"ns-{i}", "cfg", "runner:1")
        | {
            "metadata": {
                "namespace": f"ns-{i}",
                "name": "cfg",
                "uid": f"u-{i}",
                "resourceVersion": "7",
            }
        }
        for i in range(300)
    ]
    for _ in range(3):
        for config in configs:
            reconciler._config_models.parse(f"{config['metadata']['namespace']}/cfg", config)
    assert reconciler._config_models.misses == 300
    assert reconciler._config_models.hits == 600
