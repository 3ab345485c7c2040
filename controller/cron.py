"""Cron schedules and time zones: what the CronJob controller accepts, and when it fires.

Pure (``re``, ``zoneinfo``, ``croniter``): ``controller.api`` types a run's
``schedule`` and ``timeZone`` as :data:`Schedule` and :data:`TimeZone`, strings
checked with :func:`check_schedule` and :func:`check_time_zone`;
``controller.status`` says when the CronJob fires next with
:func:`next_schedule_time`.
"""

from __future__ import annotations

import re
import zoneinfo
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Annotated

from croniter import CroniterBadDateError, croniter
from pydantic import AfterValidator, Field
from pydantic_core import PydanticCustomError

# Cron syntax. The same pattern is the CRD's CEL rule (a unit test checks the
# two agree), so it uses nothing RE2 and Python's `re` read differently: no
# backslashes, scoped `(?i:...)` only for month and weekday names (robfig/cron,
# which the CronJob controller uses, reads names case-insensitively but
# descriptors like `@hourly` only in lower case). Fields are separated by
# spaces; a `CRON_TZ=`/`TZ=` prefix is refused (use `timeZone`).

CRON_DESCRIPTORS = ("yearly", "annually", "monthly", "weekly", "daily", "midnight", "hourly")
# Steps have at most 3 digits. robfig/cron reads a step with strconv.Atoi, so
# `*/99999999999999999999` overflows and the CronJob is refused although
# croniter runs it; a step past a field's range is fine in both (it fires at
# the range's start only), so nothing a schedule can say is lost.
_STEP = "(/[1-9][0-9]{0,2})?"
_MONTH_NAMES = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_DAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")


def _cron_field(value: str, wildcard: str) -> str:
    atom = f"({wildcard}|{value}(-{value})?){_STEP}"
    return f"{atom}(,{atom})*"


_CRON_FIELDS = (
    _cron_field("[0-5]?[0-9]", "[*]"),
    _cron_field("([01]?[0-9]|2[0-3])", "[*]"),
    _cron_field("(0?[1-9]|[12][0-9]|3[01])", "[*?]"),
    _cron_field(f"(0?[1-9]|1[0-2]|(?i:{'|'.join(_MONTH_NAMES)}))", "[*]"),
    _cron_field(f"([0-6]|(?i:{'|'.join(_DAY_NAMES)}))", "[*?]"),
)
CRON_PATTERN = f"^(@({'|'.join(CRON_DESCRIPTORS)})| *{' +'.join(_CRON_FIELDS)} *)$"
_CRON_RE = re.compile(CRON_PATTERN)
_CRON_FIELD_NAMES = ("minute", "hour", "day-of-month", "month", "day-of-week")
_CRON_NAMES: tuple[dict[str, int], ...] = (
    {},
    {},
    {},
    {name: i + 1 for i, name in enumerate(_MONTH_NAMES)},
    {name: i for i, name in enumerate(_DAY_NAMES)},
)
# Any fixed instant works: the question is only whether the schedule ever fires.
_CRON_PROBE_START = datetime(2000, 1, 1, tzinfo=UTC)


def check_schedule(schedule: str) -> None:
    """Raise ``PydanticCustomError("InvalidSchedule")`` unless the CronJob would run it."""
    if schedule.startswith(("CRON_TZ=", "TZ=")):
        raise PydanticCustomError(
            "InvalidSchedule",
            "a CRON_TZ= or TZ= prefix is not supported: set spec.timeZone instead",
        )
    if not _CRON_RE.fullmatch(schedule):
        raise PydanticCustomError(
            "InvalidSchedule",
            "'{schedule}' is not a cron schedule: use 5 space-separated fields "
            "(minute hour day-of-month month day-of-week, e.g. '0 * * * *', with steps of "
            "at most 3 digits) or one of @yearly, @annually, @monthly, @weekly, @daily, "
            "@midnight, @hourly",
            {"schedule": schedule},
        )
    if not schedule.startswith("@"):
        for field, name, names in zip(
            schedule.split(), _CRON_FIELD_NAMES, _CRON_NAMES, strict=True
        ):
            _check_ranges(field, name, names)
    try:
        croniter(schedule, _CRON_PROBE_START).get_next(datetime)
    except CroniterBadDateError:
        raise PydanticCustomError(
            "InvalidSchedule",
            "'{schedule}' never fires (no date matches it)",
            {"schedule": schedule},
        ) from None
    except (ValueError, KeyError) as exc:  # croniter's parse errors
        raise PydanticCustomError(
            "InvalidSchedule",
            "'{schedule}' is not a cron schedule: {detail}",
            {"schedule": schedule, "detail": str(exc)},
        ) from None


def _check_ranges(field: str, name: str, names: Mapping[str, int]) -> None:
    # robfig/cron rejects a range whose start is after its end; croniter wraps
    # it around instead, so without this the controller would accept a run
    # whose CronJob the API server then refuses.
    for item in field.split(","):
        bounds = item.split("/", 1)[0].split("-")
        if len(bounds) != 2:
            continue
        low, high = (names[b.lower()] if b.lower() in names else int(b) for b in bounds)
        if low > high:
            raise PydanticCustomError(
                "InvalidSchedule",
                "the {field} range '{item}' runs backwards",
                {"field": name, "item": item},
            )


def check_time_zone(name: str) -> None:
    """Raise ``PydanticCustomError("InvalidTimeZone")`` unless ``name`` is an IANA zone."""
    # "Local" would mean the controller-manager's zone; Kubernetes refuses it.
    if name.lower() == "local":
        raise PydanticCustomError(
            "InvalidTimeZone", "'Local' is not allowed: name an IANA time zone such as 'UTC'"
        )
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise PydanticCustomError(
            "InvalidTimeZone",
            "'{name}' is not a time zone in the IANA database (e.g. 'Europe/Rome', 'UTC')",
            {"name": name},
        ) from None


def _checked(check: Callable[[str], None]) -> AfterValidator:
    def validate(value: str) -> str:
        check(value)
        return value

    return AfterValidator(validate)


# The CRD's maxLength for spec.schedule.
MAX_SCHEDULE_LENGTH = 128
# The types of spec.schedule and spec.timeZone: a string the check accepts
# (a schedule first held to its length, so an overlong one is only that).
Schedule = Annotated[str, Field(max_length=MAX_SCHEDULE_LENGTH), _checked(check_schedule)]
TimeZone = Annotated[str, _checked(check_time_zone)]


def next_schedule_time(schedule: str, time_zone: str | None, now: datetime) -> datetime | None:
    """When the CronJob fires next after ``now``, in UTC.

    Without a time zone the CronJob follows kube-controller-manager's, which
    is UTC on nearly every cluster; that is what is assumed here.
    """
    try:
        zone = zoneinfo.ZoneInfo(time_zone) if time_zone else UTC
        fire = croniter(schedule, now.astimezone(zone)).get_next(datetime)
    except (ValueError, KeyError, CroniterBadDateError, zoneinfo.ZoneInfoNotFoundError):
        return None
    return fire.astimezone(UTC) if isinstance(fire, datetime) else None
