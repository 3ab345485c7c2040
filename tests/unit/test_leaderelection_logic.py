"""Leader election's pure decisions (kubeclient/leaderelection.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from kubeclient.leaderelection import (
    Action,
    LeaseRecord,
    Observation,
    decide,
    lease_spec,
    make_identity,
    micro_time,
    observe,
    released_spec,
)

pytestmark = pytest.mark.unit

ME = "controller-7d9f_abc"
OTHER = "controller-5c2e_def"
WALL = datetime(2026, 5, 1, 12, 0, 0, 123456, tzinfo=UTC)


def record(
    holder: str = OTHER, renew: str = "t1", duration: float = 15, transitions: int = 3
) -> LeaseRecord:
    return LeaseRecord(
        holder=holder,
        lease_duration=duration,
        acquire_time="t0",
        renew_time=renew,
        transitions=transitions,
    )


def test_a_missing_lease_is_created() -> None:
    assert decide(ME, None, now=100) is Action.CREATE


def test_a_valid_lease_held_by_another_candidate_means_wait() -> None:
    seen = Observation(record(OTHER), changed_at=100)
    assert decide(ME, seen, now=100) is Action.WAIT
    assert decide(ME, seen, now=114.9) is Action.WAIT


def test_a_lease_not_renewed_for_its_duration_is_taken_over() -> None:
    seen = Observation(record(OTHER), changed_at=100)
    assert decide(ME, seen, now=115) is Action.ACQUIRE
    assert decide(ME, seen, now=500) is Action.ACQUIRE


def test_the_lease_duration_comes_from_the_lease_itself() -> None:
    seen = Observation(record(OTHER, duration=60), changed_at=100)
    assert decide(ME, seen, now=150) is Action.WAIT
    assert decide(ME, seen, now=160) is Action.ACQUIRE


def test_a_released_lease_is_free_at_once() -> None:
    seen = Observation(record(""), changed_at=100)
    assert decide(ME, seen, now=100) is Action.ACQUIRE


def test_our_own_lease_is_renewed_even_if_it_looks_expired() -> None:
    assert decide(ME, Observation(record(ME), changed_at=100), now=101) is Action.RENEW
    assert decide(ME, Observation(record(ME), changed_at=100), now=1000) is Action.RENEW


def test_expiry_is_measured_from_when_the_record_last_changed_locally() -> None:
    first = observe(None, record(OTHER, renew="t1"), now=100)
    assert first.changed_at == 100
    # Same record read again later: the clock keeps running from 100.
    same = observe(first, record(OTHER, renew="t1"), now=110)
    assert same.changed_at == 100
    assert decide(ME, same, now=116) is Action.ACQUIRE
    # The holder renewed (renewTime changed): the clock restarts.
    renewed = observe(same, record(OTHER, renew="t2"), now=116)
    assert renewed.changed_at == 116
    assert decide(ME, renewed, now=116) is Action.WAIT


def test_remote_timestamps_are_never_compared_with_the_local_clock() -> None:
    # A renewTime far in the past (a skewed clock on the holder's node) does
    # not make a lease we just saw change look expired.
    skewed = LeaseRecord(OTHER, 15, "1999-01-01T00:00:00.000000Z", "1999-01-01T00:00:00.000000Z", 0)
    assert decide(ME, observe(None, skewed, now=100), now=101) is Action.WAIT


def test_lease_record_from_a_lease_object() -> None:
    lease = {
        "metadata": {"name": "l", "resourceVersion": "5"},
        "spec": {
            "holderIdentity": OTHER,
            "leaseDurationSeconds": 20,
            "acquireTime": "a",
            "renewTime": "r",
            "leaseTransitions": 4,
        },
    }
    assert LeaseRecord.from_lease(lease, 15) == LeaseRecord(OTHER, 20, "a", "r", 4)
    assert LeaseRecord.from_lease({"metadata": {}}, 15) == LeaseRecord("", 15, None, None, 0)


def test_micro_time_is_utc_with_microseconds() -> None:
    assert micro_time(WALL) == "2026-05-01T12:00:00.123456Z"
    plus_two = WALL.astimezone(timezone(timedelta(hours=2)))
    assert micro_time(plus_two) == "2026-05-01T12:00:00.123456Z"


def test_spec_for_create_acquire_and_renew() -> None:
    now = micro_time(WALL)
    assert lease_spec(Action.CREATE, ME, None, WALL, 15) == {
        "holderIdentity": ME,
        "leaseDurationSeconds": 15,
        "acquireTime": now,
        "renewTime": now,
        "leaseTransitions": 0,
    }
    taken = lease_spec(Action.ACQUIRE, ME, record(OTHER, transitions=3), WALL, 15)
    assert (taken["holderIdentity"], taken["acquireTime"], taken["leaseTransitions"]) == (
        ME,
        now,
        4,
    )
    renewed = lease_spec(Action.RENEW, ME, record(ME, transitions=3), WALL, 15)
    # A renewal keeps the acquire time and the transition count.
    assert (renewed["acquireTime"], renewed["renewTime"], renewed["leaseTransitions"]) == (
        "t0",
        now,
        3,
    )
    with pytest.raises(ValueError, match="nothing to write"):
        lease_spec(Action.WAIT, ME, record(), WALL, 15)


def test_release_empties_the_holder_and_shortens_the_lease() -> None:
    spec = released_spec(record(ME, transitions=7), WALL)
    assert spec["holderIdentity"] == ""
    assert spec["leaseDurationSeconds"] == 1
    assert spec["leaseTransitions"] == 7


def test_identity_is_the_pod_name_plus_a_random_suffix() -> None:
    first, second = make_identity("ctl-7d9f"), make_identity("ctl-7d9f")
    assert first.startswith("ctl-7d9f_")
    assert second.startswith("ctl-7d9f_")
    assert first != second
    assert make_identity(None)
