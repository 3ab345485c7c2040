"""Child names (upstream's ComputeJobName plus our CronJob/Indexed bounds) and labels."""

from __future__ import annotations

import random
import re
import string

import pytest

from controller import naming
from controller.naming import (
    child_labels,
    job_name,
    label_value,
    managed_selector,
    max_name_length,
    run_selector,
    uid_part,
)
from tests.unit.helpers import UID

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


@pytest.mark.parametrize(
    ("name", "uid", "expected"),
    [
        # the upstream controller's worked examples of child names
        ("testdata-iris-schedule", UID, "inf-testdata-iris-schedule-5be07ada"),
        ("My_Run..v2", "ABCD-1234-5678-90ef-0000", "inf-my-run-v2-abcd1234"),
        # upstream README's example contract
        ("example-inference-run-triton", UID, "inf-example-inference-run-triton-5be07ada"),
        # UID with fewer than 8 alphanumerics: padded with 0
        ("run", "ab-c", "inf-run-abc00000"),
        ("run", "", "inf-run-00000000"),
        # runs of separators collapse, trailing ones go
        ("a--b__c..", UID, "inf-a-b-c-5be07ada"),
        ("-lead", UID, "inf-lead-5be07ada"),
        ("", UID, "inf-5be07ada"),
    ],
)
def test_upstream_vectors(name: str, uid: str, expected: str) -> None:
    assert job_name(name, uid, scheduled=False) == expected


def test_scheduled_short_names_are_unchanged() -> None:
    # The 52 bound only cuts names upstream could never run as CronJobs anyway.
    assert job_name("testdata-iris-schedule", UID, scheduled=True) == (
        "inf-testdata-iris-schedule-5be07ada"
    )


def test_non_ascii_bytes_become_one_hyphen() -> None:
    # Every byte of "é" (2 bytes) is a non-alphanumeric: one hyphen for the run.
    assert job_name("café-run", UID, scheduled=False) == "inf-caf-run-5be07ada"
    # ASCII-only case folding, like upstream's byte loop: the Kelvin sign is not "k".
    assert job_name("\u212aelvin", UID, scheduled=False) == "inf-elvin-5be07ada"
    assert job_name("日本語", UID, scheduled=False) == "inf-5be07ada"
    assert uid_part("ÄBCDEFGHIJ") == "bcdefghi"


def test_long_name_is_cut_like_upstream() -> None:
    name = "a" * 100
    result = job_name(name, UID, scheduled=False)
    # main part cut at 53 ("inf-" + 49 a's), then "-" + uid: 62 characters.
    assert result == "inf-" + "a" * 49 + "-5be07ada"
    assert len(result) == 62


def test_cut_landing_on_a_hyphen_is_trimmed() -> None:
    # "inf-" + 48 chars puts a "-" at position 53: it must not survive the cut.
    name = "b" * 48 + "-cdef"
    result = job_name(name, UID, scheduled=False)
    assert result == "inf-" + "b" * 48 + "-5be07ada"


def test_scheduled_names_fit_the_cronjob_bound() -> None:
    result = job_name("x" * 80, UID, scheduled=True)
    assert len(result) == 52
    assert result == "inf-" + "x" * 39 + "-5be07ada"


@pytest.mark.parametrize("shards", [2, 10, 11, 100, 1000])
@pytest.mark.parametrize("scheduled", [False, True])
def test_indexed_pod_hostnames_fit(shards: int, scheduled: bool) -> None:
    result = job_name("y" * 80, UID, scheduled=scheduled, shards=shards)
    # The CronJob controller appends 11 characters to a CronJob's name, the
    # Job controller "-<index>" to each pod's hostname: both must stay a DNS label.
    job = result + ("-" + "9" * 10 if scheduled else "")
    hostname = f"{job}-{shards - 1}"
    assert len(hostname) <= 63
    assert DNS_LABEL.match(hostname)


def test_max_name_length() -> None:
    assert max_name_length(scheduled=False) == 63
    assert max_name_length(scheduled=True) == 52
    assert max_name_length(scheduled=False, shards=10) == 61
    assert max_name_length(scheduled=True, shards=11) == 49
    with pytest.raises(ValueError, match="shards"):
        max_name_length(scheduled=False, shards=0)


def test_random_names_are_valid_dns_labels() -> None:
    rng = random.Random(4)
    alphabet = string.ascii_letters + string.digits + "-_.~ é日"
    for _ in range(2000):
        name = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 120)))
        uid = "".join(rng.choice(string.hexdigits + "-") for _ in range(36))
        scheduled = rng.random() < 0.5
        result = job_name(name, uid, scheduled=scheduled)
        assert DNS_LABEL.match(result), (name, result)
        assert len(result) <= (52 if scheduled else 62)
        assert result.endswith("-" + uid_part(uid)) or result == uid_part(uid)


def test_label_value_keeps_short_names() -> None:
    assert label_value("iris-once") == "iris-once"
    assert label_value("a" * 63) == "a" * 63


def test_label_value_hashes_long_names_distinctly() -> None:
    first, second = "n" * 70 + "-one", "n" * 70 + "-two"
    a, b = label_value(first), label_value(second)
    assert a != b
    for value in (a, b):
        assert len(value) <= 63
        assert LABEL_VALUE.match(value)
    assert label_value(first) == a  # stable


def test_label_value_repairs_invalid_characters() -> None:
    value = label_value("-weird name/é-")
    assert LABEL_VALUE.match(value)


def test_child_labels_and_selectors() -> None:
    labels = child_labels("iris-once", UID, "iris-config")
    assert labels == {
        naming.MANAGED_BY_LABEL: naming.MANAGED_BY_VALUE,
        naming.COMPONENT_LABEL: naming.COMPONENT_VALUE,
        naming.RUN_NAME_LABEL: "iris-once",
        naming.RUN_UID_LABEL: UID,
        naming.CONFIG_NAME_LABEL: "iris-config",
    }
    assert managed_selector() == "app.kubernetes.io/managed-by=kserve-inference-controller"
    assert run_selector(UID) == f"{managed_selector()},ai.krateo.io/run-uid={UID}"
    assert naming.CONFIG_NAME_LABEL not in child_labels("r", UID)
