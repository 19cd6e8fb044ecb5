"""A test tier whose tool is missing here: skipped, saying what is missing and how to get it, or, under
`CI=true`, failed, so that CI never passes with a tier gone (`make test` installs every tool; the gpu tier
alone may skip, where there is no GPU: tests/gpu/gpu_support.py).

Every tier's gate calls `missing` (vLLM CPU, Prometheus and promtool, Helm, hadolint, the pipeline package,
the real node); tests/unit/test_tiers.py checks each of them under CI=true.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

CI_ENV = "CI"


def in_ci() -> bool:
    return os.environ.get(CI_ENV) == "true"


def missing(tier: str, what: str) -> NoReturn:
    """Skip (fail under CI=true) the test of `tier` because of `what`."""
    message = f"the {tier} tier is not run: {what}"
    if in_ci():
        pytest.fail(f"{message} (CI=true: only the gpu tier may be skipped)", pytrace=False)
    pytest.skip(message)
