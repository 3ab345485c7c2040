"""The Store's indexes answer like a scan, whatever the order of adds, updates and removes."""

from __future__ import annotations

import random

import pytest

from kubeclient.resources import Obj
from kubeclient.store import Store


def obj(name: str, config: str | None, *tags: str) -> Obj:
    spec = {"configRef": {"name": config}} if config else {}
    return {
        "metadata": {"name": name, "namespace": "ns", "labels": dict.fromkeys(tags, "")},
        "spec": spec,
    }


def by_config(o: Obj) -> list[str]:
    name = (o.get("spec") or {}).get("configRef", {}).get("name")
    return [name] if name else []


def by_tag(o: Obj) -> list[str]:
    return sorted(o["metadata"]["labels"])


def scan(store: Store, func: object, value: str) -> list[str]:
    assert callable(func)
    return sorted(f"ns/{o['metadata']['name']}" for o in store.list() if value in func(o))


@pytest.mark.parametrize("seed", range(20))
def test_indexes_match_a_scan_through_random_changes(seed: int) -> None:
    rng = random.Random(seed)
    store = Store({"config": by_config, "tag": by_tag})
    names = [f"r{i}" for i in range(6)]
    values = ["a", "b", "c"]
    for _ in range(200):
        name = rng.choice(names)
        if rng.random() < 0.3:
            store.remove(f"ns/{name}")
        else:
            tags = rng.sample(values, rng.randint(0, 3))
            store.upsert(obj(name, rng.choice([*values, None]), *tags))
        for value in values:
            assert store.index_keys("config", value) == scan(store, by_config, value)
            assert store.index_keys("tag", value) == scan(store, by_tag, value)
            assert [o["metadata"]["name"] for o in store.by_index("tag", value)] == [
                k.split("/")[1] for k in scan(store, by_tag, value)
            ]


def test_an_indexer_added_late_indexes_what_is_there() -> None:
    store = Store()
    store.upsert(obj("r1", "a"))
    store.upsert(obj("r2", "a"))
    store.upsert(obj("r3", "b"))
    store.add_indexer("config", by_config)
    assert store.index_keys("config", "a") == ["ns/r1", "ns/r2"]
    assert store.index_keys("config", "b") == ["ns/r3"]
    store.upsert(obj("r1", "a"))  # the same value again: still once
    assert store.index_keys("config", "a") == ["ns/r1", "ns/r2"]
