"""Field types of the API shared by its models: Kubernetes quantities, counts or percentages, names and label
values, and the schema marker for pass-through objects (each with the pattern the CRD carries)."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import Field, ValidationError, ValidatorFunctionWrapHandler, WrapValidator
from pydantic.config import JsonDict
from pydantic_core import PydanticCustomError

PRESERVE: JsonDict = {"x-kubernetes-preserve-unknown-fields": True}

# The API server's quantity grammar (k8s.io/apimachinery resource.Quantity, as controller-gen writes it into
# CRDs): a number with an optional binary (Ki..Ei), decimal (n..E) or exponent suffix. Also the CRD's pattern.
QUANTITY = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
_QUANTITY = re.compile(QUANTITY)


def _one_quantity_error(value: Any, handler: ValidatorFunctionWrapHandler) -> int | str:
    """Report a bad quantity once, at its field (a union reports per member: `<field>.int`, `.str`)."""
    try:
        result: int | str = handler(value)
    except ValidationError:
        raise PydanticCustomError(
            "quantity_type", "Input should be an integer or a quantity string such as '500Gi'"
        ) from None
    if isinstance(result, str) and not _QUANTITY.fullmatch(result):
        raise PydanticCustomError(
            "quantity_format",
            "{value} is not a Kubernetes quantity: write a number with an optional suffix, such as "
            "'500Gi', '1.5T', '250M' or '500m'",
            {"value": repr(result)},
        )
    return result


Quantity = Annotated[
    int | str,
    WrapValidator(_one_quantity_error),
    Field(json_schema_extra={"x-kubernetes-int-or-string": True, "pattern": QUANTITY}),
]
PERCENT = r"^[0-9]{1,3}%$"
_PERCENT = re.compile(PERCENT)


def _one_count_error(value: Any, handler: ValidatorFunctionWrapHandler) -> int | str:
    """A count (>= 0) or a percentage ('25%'), reported once at its field as Quantity is."""
    try:
        result: int | str = handler(value)
    except ValidationError:
        raise PydanticCustomError(
            "count_or_percent_type", "Input should be a count or a percentage string such as '25%'"
        ) from None
    if isinstance(result, int) and result < 0:
        raise PydanticCustomError("count_negative", "Input should be a count of at least 0")
    if isinstance(result, str) and not _PERCENT.fullmatch(result):
        raise PydanticCustomError(
            "count_or_percent_format",
            "{value} is neither a count nor a percentage: write e.g. 1 or '25%'",
            {"value": repr(result)},
        )
    return result


CountOrPercent = Annotated[
    int | str,
    WrapValidator(_one_count_error),
    Field(json_schema_extra={"x-kubernetes-int-or-string": True, "pattern": PERCENT}),
]
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# A label value (empty, or up to 63 alphanumerics, '-', '_' and '.', alphanumeric at both ends)
# A label or annotation key (k8s.io/apimachinery IsQualifiedName): an optional DNS-subdomain prefix and '/',
# then a name of at most 63 characters. The prefix's own limit (253) is within the key's bound here. No
# backslash: the pattern sits in a CEL string too (rules.py), where '\.' is no escape.
QUALIFIED_NAME = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
QUALIFIED_NAME_MAX = 317  # 253 + '/' + 63
ANNOTATION_VALUE_MAX = 256 * 1024  # the API server's limit on all of an object's annotations together
LabelValue = Annotated[str, Field(max_length=63, pattern=r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")]
# A duration as Kubernetes tools write one: hours, minutes and seconds, e.g. '30s', '10m', '1h30m'.
# An http(s) URL with a host and nothing that is not part of one (no space, no line break at the end): the
# API server checks the same pattern (RE2, no look-around).
HTTP_URL = r"^https?://[^\s/?#@]+(@[^\s/?#@]+)?([/?#]\S*)?$"
# Hours, minutes and seconds, each of a bounded number of digits: CEL's durations (the canary's rule compares
# two) end at 10,000 years, and no setting here needs more than years.
DURATION = r"^([0-9]{1,5}h)?([0-9]{1,7}m)?([0-9]{1,9}s)?$"
_DURATION = re.compile(DURATION)
Duration = Annotated[str, Field(min_length=2, pattern=DURATION)]


def duration_seconds(duration: str) -> int:
    """'1h30m' -> 5400 (a value the Duration pattern accepted)."""
    match = _DURATION.fullmatch(duration)
    if match is None or not duration:
        raise ValueError(f"{duration!r} is not a duration such as '30s', '10m' or '1h30m'")
    hours, minutes, seconds = (int(g[:-1]) if g else 0 for g in match.groups())
    return hours * 3600 + minutes * 60 + seconds
