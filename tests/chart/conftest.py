"""The chart tier: the real Helm binary on charts/eagle3-operator (skips, naming `make helm`, without it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.chart.helm import SCENARIOS, helm_or_skip, template


@pytest.fixture(scope="session")
def helm() -> Path:
    return helm_or_skip()


@pytest.fixture(scope="session")
def rendered(helm: Path) -> dict[str, list[dict[str, Any]]]:
    """Every scenario of SCENARIOS rendered once, CRD included: name -> objects."""
    return {name: template(helm, files) for name, files in SCENARIOS.items()}
