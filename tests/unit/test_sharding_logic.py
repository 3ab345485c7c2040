"""Sharding by namespace (controller/sharding.py): stable, even, and a partition."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from typing import Any

import pytest

from controller.settings import load_settings
from controller.sharding import (
    MAX_SHARDS,
    Shard,
    compose,
    lease_name,
    namespace_hash,
    shard_of,
)

pytestmark = pytest.mark.unit

# Fixed values: a change here moves namespaces between shards on upgrade, so it
# must be deliberate (and said in the release notes). Computed once, and the same
# as `echo $(( 0x$(printf %s NAME | sha256sum | cut -c1-8) % COUNT ))`.
EXPECTED_HASHES = {
    "default": 933818049,
    "kube-system": 2281734000,
    "team-a": 2529331308,
    "team-b": 3860385450,
    "ns-1": 2053339635,
    "ns-3": 2311119743,
    "krateo-system": 1895347586,
}
EXPECTED_SHARDS = {  # namespace -> (of 2, of 3, of 16)
    "default": (1, 0, 1),
    "kube-system": (0, 0, 0),
    "team-a": (0, 0, 12),
    "team-b": (0, 0, 10),
    "ns-1": (1, 0, 3),
    "ns-3": (1, 2, 15),
    "krateo-system": (0, 2, 2),
}


def many_namespaces(n: int = 10_000) -> list[str]:
    # Names as people make them: a prefix and a counter, which a weak hash
    # (FNV-1a's low bits) would spread unevenly.
    return [f"team-{i}" for i in range(n // 2)] + [f"ns{i:05d}" for i in range(n - n // 2)]


def test_the_hash_is_fixed() -> None:
    assert {ns: namespace_hash(ns) for ns in EXPECTED_HASHES} == EXPECTED_HASHES
    for ns, expected in EXPECTED_SHARDS.items():
        assert (shard_of(ns, 2), shard_of(ns, 3), shard_of(ns, 16)) == expected, ns


def test_the_hash_is_the_same_in_another_process() -> None:
    # Python's own hash() of a str differs between processes (PYTHONHASHSEED).
    names = sorted(EXPECTED_HASHES)
    code = (
        "import sys; from controller.sharding import shard_of; "
        "print(' '.join(str(shard_of(n, 7)) for n in sys.argv[1:]))"
    )
    outputs = set()
    for seed in ("1", "2", "random"):
        done = subprocess.run(
            [sys.executable, "-c", code, *names],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed, "PATH": ""},
        )
        outputs.add(done.stdout.strip())
    assert outputs == {" ".join(str(shard_of(n, 7)) for n in names)}


def test_the_shell_one_liner_agrees() -> None:
    for ns in ("default", "ns-3", "krateo-system"):
        done = subprocess.run(
            ["bash", "-c", f"echo $(( 0x$(printf %s {ns} | sha256sum | cut -c1-8) % 3 ))"],
            capture_output=True,
            text=True,
            check=True,
        )
        assert int(done.stdout) == shard_of(ns, 3), ns


@pytest.mark.parametrize("count", [2, 3, 4, 7, 16])
def test_namespaces_spread_evenly(count: int) -> None:
    names = many_namespaces()
    sizes = Counter(shard_of(ns, count) for ns in names)
    assert set(sizes) == set(range(count))
    expected = len(names) / count
    # Binomial spread: 5 standard deviations either way is not luck.
    sigma = (len(names) * (1 / count) * (1 - 1 / count)) ** 0.5
    for shard, size in sizes.items():
        assert abs(size - expected) < 5 * sigma, (shard, size, expected)


@pytest.mark.parametrize("count", [1, 2, 3, 5])
def test_every_namespace_is_in_exactly_one_shard(count: int) -> None:
    shards = [Shard(index, count) for index in range(count)]
    for ns in many_namespaces(2_000):
        owners = [shard.index for shard in shards if shard.owns(ns)]
        assert owners == [shard_of(ns, count)], ns


def test_one_shard_is_no_sharding() -> None:
    shard = Shard()
    assert not shard.sharded
    assert shard.keep is None
    assert shard.label == ""
    assert shard.owns("anything")
    assert shard.narrow(["a", "b"]) == ("a", "b")
    assert shard.lease_name("ksc") == "ksc"


def obj(namespace: str | None, name: str = "x") -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    return {"metadata": metadata}


def test_keep_drops_other_shards_objects() -> None:
    zero, one = Shard(0, 2), Shard(1, 2)
    assert zero.keep is not None
    assert one.keep is not None
    mine = obj("team-a")  # shard 0 of 2
    assert zero.keep(mine) is mine
    assert one.keep(mine) is None
    assert one.keep(obj("default")) is not None
    # Cluster-scoped objects have no namespace to shard by: every shard keeps them.
    assert zero.keep(obj(None)) is not None
    assert one.keep(obj(None)) is not None


def test_narrow_keeps_the_shards_namespaces_and_never_widens_to_all() -> None:
    zero, one = Shard(0, 2), Shard(1, 2)
    assert zero.narrow(["team-a", "default", "ns-1", "team-b"]) == ("team-a", "team-b")
    assert one.narrow(["team-a", "default", "ns-1", "team-b"]) == ("default", "ns-1")
    assert zero.narrow([]) == ()  # all namespaces, filtered on arrival
    # None of them is shard 1's: still those namespaces (all dropped), not "all".
    assert one.narrow(["team-a", "team-b"]) == ("team-a", "team-b")


def test_lease_names() -> None:
    assert lease_name("ksc", 0, 1) == "ksc"
    assert lease_name("ksc", 0, 2) == "ksc-shard-0-of-2"
    assert lease_name("ksc", 11, 12) == "ksc-shard-11-of-12"
    assert Shard(1, 3).label == "1-of-3"


@pytest.mark.parametrize(("index", "count"), [(2, 2), (-1, 2), (0, 0), (0, MAX_SHARDS + 1)])
def test_a_shard_outside_its_range_is_refused(index: int, count: int) -> None:
    with pytest.raises(ValueError, match="shard"):
        Shard(index, count)
    with pytest.raises(ValueError, match="at least 1"):
        shard_of("x", 0)


def test_compose_applies_in_order_and_stops_at_a_drop() -> None:
    seen: list[str] = []

    def project(o: dict[str, Any]) -> dict[str, Any]:
        seen.append(o["metadata"]["namespace"])
        return {"metadata": o["metadata"], "projected": True}

    shard = Shard(0, 2)
    both = compose(shard.keep, project)
    assert both is not None
    assert both(obj("team-a")) == {"metadata": obj("team-a")["metadata"], "projected": True}
    assert both(obj("default")) is None
    assert seen == ["team-a"]  # the projection never saw another shard's object
    assert compose(None, None) is None
    assert compose(None, project) is project
    assert compose(Shard().keep, project) is project


def test_shard_from_settings() -> None:
    settings = load_settings([], {"SHARD_COUNT": "3", "SHARD_INDEX": "2"})
    assert settings.shard == Shard(2, 3)
    assert load_settings([], {}).shard == Shard(0, 1)
