"""Kubernetes quantities ("500m", "2Gi", "1e3") as numbers: for comparing what the API server stores with
what was applied (eagle3_operator.reconcile.drift) and a volume's size with the bytes a run will store
(eagle3_contract.storage).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

# A Kubernetes quantity (k8s.io/apimachinery resource.Quantity): a number and a binary, decimal or exponent
# suffix. Parsed here because kubernetes_asyncio has no parser (the synchronous client's
# kubernetes.utils.parse_quantity is not a dependency, and the contract takes no Kubernetes library).
_QUANTITY = re.compile(r"^([+-]?(?:\d+(?:\.\d*)?|\.\d+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$")
_SUFFIX = {
    "Ki": Decimal(2) ** 10, "Mi": Decimal(2) ** 20, "Gi": Decimal(2) ** 30, "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50, "Ei": Decimal(2) ** 60, "n": Decimal("1e-9"), "u": Decimal("1e-6"),
    "m": Decimal("1e-3"), "": Decimal(1), "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"),
    "T": Decimal("1e12"), "P": Decimal("1e15"), "E": Decimal("1e18"),
}  # fmt: skip


def quantity(text: str) -> Decimal | None:
    """The value of a Kubernetes quantity string, or None if it is not one."""
    match = _QUANTITY.match(text)
    if match is None:
        return None
    number, suffix = match.group(1), match.group(2) or ""
    try:
        if suffix[:1] in ("e", "E") and len(suffix) > 1:
            return Decimal(number + suffix)
        return Decimal(number) * _SUFFIX[suffix]
    except InvalidOperation:
        return None
