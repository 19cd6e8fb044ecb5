"""The Prometheus tier: a real Prometheus scraping two vLLM CPU servers and the operator's metrics endpoint.

`tier` starts the whole stack once per module (see tier.py); it skips, naming what to build, without the vLLM
CPU environment (scripts/build-vllm-cpu.sh) or Prometheus (scripts/install-prometheus.sh). The dashboard and
the rules file are the committed ones; $EAGLE3_DASHBOARD and $EAGLE3_RULES point the tier at others.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.observability.prometheus import prometheus_or_skip
from tests.observability.tier import Tier, tier_stack
from tests.pipeline.conftest import tiny_models  # noqa: F401  (the fixture: the tiny verifier, built once)
from tests.pipeline.test_vllm_server import vllm_or_skip

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "observability" / "grafana" / "eagle3-dashboard.json"
RULES = ROOT / "observability" / "prometheus" / "eagle3-rules.yaml"


def committed(env: str, default: Path) -> Path:
    path = Path(os.environ.get(env) or default)
    if not path.is_file():
        pytest.fail(f"{path} is missing: `make observability` generates it (or set ${env})")
    return path


@pytest.fixture(scope="session")
def dashboard_path() -> Path:
    return committed("EAGLE3_DASHBOARD", DASHBOARD)


@pytest.fixture(scope="session")
def dashboard(dashboard_path: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(dashboard_path.read_text())
    return document


@pytest.fixture(scope="session")
def rules_path() -> Path:
    return committed("EAGLE3_RULES", RULES)


@pytest.fixture(scope="module")
def tier(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, rules_path: Path
) -> Iterator[Tier]:
    vllm = vllm_or_skip()
    prometheus_bin = prometheus_or_skip()
    models: Path = request.getfixturevalue("tiny_models")  # after the skips: a cold build takes minutes
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EAGLE3_VLLM", vllm)
        mp.setenv("EAGLE3_MODELS_ROOT", str(models))
        work = tmp_path_factory.mktemp("tier")
        with tier_stack(prometheus_bin, models, work, rules_path, tmp_path_factory.getbasetemp()) as stack:
            yield stack
