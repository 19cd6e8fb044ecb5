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
# CRDs): a number with an optional binary (Ki..Ei), decimal (n..E) or exponent suffix.
_SUFFIX = r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
QUANTITY = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))" + _SUFFIX
_QUANTITY = re.compile(QUANTITY)
# The same grammar without a minus sign: what a container's requests and limits take (the API server refuses
# a negative one). Also the CRD's pattern of those.
NON_NEGATIVE_QUANTITY = r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))" + _SUFFIX
# ... and with a digit other than 0 too: a size (a claim's storage request must be more than 0).
POSITIVE_QUANTITY = r"^\+?(([0-9]*[1-9][0-9]*(\.[0-9]*)?)|([0-9]*\.[0-9]*[1-9][0-9]*))" + _SUFFIX
_QUANTITY_RULES = {  # the pattern -> the least integer, and what the pattern asks in words
    NON_NEGATIVE_QUANTITY: (0, "at least 0"),
    POSITIVE_QUANTITY: (1, "more than 0"),
}


def _quantity_validator(pattern: str) -> WrapValidator:
    """Report a bad quantity once, at its field (a union reports per member: `<field>.int`, `.str`)."""
    grammar = re.compile(pattern)
    least, bound = _QUANTITY_RULES[pattern]

    def check(value: Any, handler: ValidatorFunctionWrapHandler) -> int | str:
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
        wrong_sign = isinstance(result, str) and not grammar.fullmatch(result)
        if wrong_sign or (isinstance(result, int) and result < least):
            raise PydanticCustomError(
                "quantity_range",
                "{value} is not {bound}: the API server refuses it",
                {"value": repr(result), "bound": bound},
            )
        return result

    return WrapValidator(check)


def _quantity_schema(pattern: str) -> JsonDict:
    """The CRD's int-or-string node: the pattern checks the string form, `minimum` the integer form."""
    return {"x-kubernetes-int-or-string": True, "pattern": pattern, "minimum": _QUANTITY_RULES[pattern][0]}


# A container's resource request or limit (at least 0), and a volume's size (more than 0).
NonNegativeQuantity = Annotated[
    int | str,
    _quantity_validator(NON_NEGATIVE_QUANTITY),
    Field(json_schema_extra=_quantity_schema(NON_NEGATIVE_QUANTITY)),
]
PositiveQuantity = Annotated[
    int | str,
    _quantity_validator(POSITIVE_QUANTITY),
    Field(json_schema_extra=_quantity_schema(POSITIVE_QUANTITY)),
]
# A percentage of at most 100% (the API server refuses more in a PodDisruptionBudget), leading zeros allowed
# as the API server allows them.
PERCENT = r"^0*([0-9]{1,2}|100)%$"
_PERCENT = re.compile(PERCENT)


def _one_count_error(value: Any, handler: ValidatorFunctionWrapHandler) -> int | str:
    """A count (>= 0) or a percentage ('25%', at most '100%'), reported once at its field as a quantity is."""
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
            "{value} is neither a count nor a percentage of at most 100%: write e.g. 1 or '25%'",
            {"value": repr(result)},
        )
    return result


CountOrPercent = Annotated[
    int | str,
    WrapValidator(_one_count_error),
    Field(json_schema_extra={"x-kubernetes-int-or-string": True, "pattern": PERCENT, "minimum": 0}),
]
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# A DNS-1123 subdomain (k8s.io/apimachinery IsDNS1123Subdomain): DNS labels joined by '.', at most 253
# characters (DNS_SUBDOMAIN_MAX): a PriorityClass's name, a node's.
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DNS_SUBDOMAIN_MAX = 253
# A label or annotation key (k8s.io/apimachinery IsQualifiedName): an optional DNS-subdomain prefix and '/',
# then a name of at most 63 characters. The prefix's own limit (253) is within the key's bound here. No
# backslash: the pattern sits in a CEL string too (rules.py), where '\.' is no escape.
QUALIFIED_NAME = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
QUALIFIED_NAME_MAX = 317  # 253 + '/' + 63
# A label value (k8s.io/apimachinery IsValidLabelValue): empty, or up to 63 alphanumerics, '-', '_' and '.',
# alphanumeric at both ends
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
LABEL_VALUE_MAX = 63
ANNOTATION_VALUE_MAX = 256 * 1024  # the API server's limit on all of an object's annotations together
LabelValue = Annotated[str, Field(max_length=LABEL_VALUE_MAX, pattern=LABEL_VALUE)]
# A container image as the API server takes one: no whitespace at either end (it refuses an image with
# leading or trailing whitespace; the name itself is the container runtime's to resolve). Empty is "unset"
# here (serving.image); where a field needs a value its minLength says so.
IMAGE = r"^([^\s]([\s\S]*[^\s])?)?$"
# Linux user and group ids as the API server takes them (runAsUser, runAsGroup, fsGroup, supplementalGroups)
ID_MAX = 2**31 - 1
# An http(s) URL with a host (a name, or an IP address, an IPv6 one in brackets), an optional user and port,
# and nothing that is not part of one (no space, no line break at the end): the API server checks the same
# pattern (RE2, no look-around). `http://:9090` names no host.
HTTP_URL = r"^https?://([^\s/?#@]+@)?([^\s/?#@:\[\]]+|\[[0-9A-Fa-f:.]+\])(:[0-9]{0,5})?([/?#]\S*)?$"
# A duration as Kubernetes tools write one: hours, minutes and seconds, e.g. '30s', '10m', '1h30m'.
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
