"""Kubernetes quantities and container resources, as Pod validation reads them.

``parse_quantity`` is ``resource.ParseQuantity``; ``resource_list_errors`` and
``resource_requirements_errors`` say what ``ValidateContainerResourceRequirements``
(pkg/apis/core/validation) refuses in a runner's ``resources``, as the CRD's CEL
rules check it. Pure: re and decimal only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import MAX_EMAX, MIN_EMIN, ROUND_UP, Context, Decimal, localcontext

_QUANTITY_RE = re.compile(
    r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:(?P<binary>[KMGTPE]i)|(?P<decimal>[numkMGTPE])|[eE](?P<exponent>[+-]?[0-9]+))?"
)
_BINARY_SUFFIXES = {s: 10 * (i + 1) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))}
_DECIMAL_SUFFIXES = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_MAX_QUANTITY = Decimal(2**63 - 1)
_NANO = Decimal("1e-9")
_STANDARD_CONTAINER_RESOURCES = frozenset({"cpu", "memory", "ephemeral-storage"})
HUGEPAGES_PREFIX = "hugepages-"
# Bounds that keep the CRD's CEL rules within their cost budget.
MAX_RESOURCES = 16
MAX_QUANTITY_LENGTH = 64
# IsQualifiedName: an optional DNS-subdomain prefix and a name of at most 63.
RESOURCE_NAME_PATTERN = (
    "^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$"
)
_RESOURCE_NAME_RE = re.compile(RESOURCE_NAME_PATTERN)


def parse_quantity(value: str | int | float) -> Decimal | None:
    """The value of a Kubernetes quantity as ``resource.ParseQuantity`` reads it, or None.

    Like Go: rounded up (away from zero) to a billionth, and capped at
    2^63-1 either way.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return Decimal(value).max(-_MAX_QUANTITY).min(_MAX_QUANTITY)
    match = _QUANTITY_RE.fullmatch(repr(value) if isinstance(value, float) else value)
    if match is None:
        return None
    exponent = 0
    if match["exponent"] is not None:
        parsed = int(match["exponent"])
        if not -(2**63) <= parsed < 2**63:  # strconv.ParseInt(.., 64)
            return None
        exponent = (parsed + 2**31) % 2**32 - 2**31  # then int32(parsed)
    elif match["decimal"] is not None:
        exponent = _DECIMAL_SUFFIXES[match["decimal"]]
    number = Decimal(f"{match['number']}E{exponent}")
    with localcontext(Context(prec=len(match["number"]) + 64, Emax=MAX_EMAX, Emin=MIN_EMIN)):
        if match["binary"] is not None:
            number *= 2 ** _BINARY_SUFFIXES[match["binary"]]
        if abs(number) >= _MAX_QUANTITY:
            return _MAX_QUANTITY.copy_sign(number)
        return number.quantize(_NANO, rounding=ROUND_UP)


def _is_native_resource(name: str) -> bool:
    return "/" not in name or "kubernetes.io/" in name


def _is_extended_resource(name: str) -> bool:
    # Also integer-only and not overcommittable (IsExtendedResourceName).
    return not _is_native_resource(name)


def _overcommit_allowed(name: str) -> bool:
    return _is_native_resource(name) and not name.startswith(HUGEPAGES_PREFIX)


def valid_container_resource_name(name: str) -> bool:
    """``validateContainerResourceName``: cpu, memory, ephemeral-storage, hugepages-*, a domain."""
    if not _RESOURCE_NAME_RE.fullmatch(name) or len(name.rsplit("/", 1)[-1]) > 63:
        return False
    slash = name.find("/")
    if slash < 0:
        return name in _STANDARD_CONTAINER_RESOURCES or name.startswith(HUGEPAGES_PREFIX)
    if _is_native_resource(name):
        return slash <= 253
    # The quota name requests.<name> must itself be a qualified name.
    return not name.startswith("requests.") and slash <= 253 - len("requests.")


def _is_whole(quantity: Decimal) -> bool:
    return quantity == quantity.to_integral_value()


def _hugepages_error(name: str, value: Decimal) -> str | None:
    page = parse_quantity(name.removeprefix(HUGEPAGES_PREFIX))
    if page is None or page <= 0 or not _is_whole(page):
        return "does not name a page size (e.g. hugepages-2Mi)"
    if not _is_whole(value) or value % page != 0:
        return f"must be a whole multiple of its page size ({int(page)} bytes)"
    return None


def resource_list_errors(resources: Mapping[str, str | int | float]) -> list[str]:
    """What Pod validation refuses in one of a container's ``limits`` or ``requests``."""
    errors: list[str] = []
    if len(resources) > MAX_RESOURCES:
        errors.append(f"at most {MAX_RESOURCES} resources may be listed")
    for name, raw in resources.items():
        if not valid_container_resource_name(name):
            errors.append(
                f"{name!r} is not a container resource: use cpu, memory, ephemeral-storage, "
                "hugepages-<page size> or an extended resource with a domain (e.g. nvidia.com/gpu)"
            )
            continue
        value = parse_quantity(raw)
        if isinstance(raw, str) and len(raw) > MAX_QUANTITY_LENGTH:
            errors.append(f"{name} is longer than {MAX_QUANTITY_LENGTH} characters")
            continue
        if value is None:
            errors.append(f"{name} is not a quantity (e.g. 500m, 1Gi, 2)")
            continue
        if value < 0:
            errors.append(f"{name} must not be negative")
            continue
        if _is_extended_resource(name) and not (_is_whole(value) and value < _MAX_QUANTITY):
            errors.append(f"{name} is an extended resource: it must be a whole number")
        if name.startswith(HUGEPAGES_PREFIX):
            problem = _hugepages_error(name, value)
            if problem is not None:
                errors.append(f"{name} {problem}")
    return errors


def resource_requirements_errors(
    limits: Mapping[str, str | int | float], requests: Mapping[str, str | int | float]
) -> list[str]:
    """What Pod validation refuses between a container's ``limits`` and ``requests``."""
    errors: list[str] = []
    for name, raw in requests.items():
        request, limit = parse_quantity(raw), None
        if name in limits:
            limit = parse_quantity(limits[name])
        if request is None or not valid_container_resource_name(name):
            continue
        if _overcommit_allowed(name):
            if limit is not None and request > limit:
                errors.append(f"the {name} request must not exceed its limit")
        elif name not in limits:
            errors.append(f"{name} needs a limit equal to its request")
        elif limit is not None and request != limit:
            errors.append(f"the {name} request must equal its limit")
    names = set(limits) | set(requests)
    if any(n.startswith(HUGEPAGES_PREFIX) for n in names) and not names & {"cpu", "memory"}:
        errors.append("hugepages need a cpu or memory request or limit")
    return errors
