"""The main job, as `make demo` runs it: the tiny example from chat data to an exported draft, on vLLM.

Every stage runs for real (generate and evaluate start vLLM CPU servers; train runs speculators on the CPU),
and the acceptance gate is checked on vLLM's own speculative-decoding counters.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from eagle3_contract.gate import judge_evaluation
from eagle3_contract.results import EvaluateResult
from tests.pipeline.test_vllm_server import vllm_or_skip

pytestmark = [pytest.mark.pipeline, pytest.mark.vllm]
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny" / "eagle3run.yaml"
# The quality bar for the tiny verifier: mean acceptance length with 3 speculative tokens at T=0.
MIN_ACCEPTANCE_LENGTH = 2.0


def results(artifacts: Path, stage: str) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((artifacts / stage).glob("*/result.json"))]


@pytest.mark.timeout(3600)
def test_the_tiny_example_trains_a_draft_vllm_accepts(tmp_path: Path, tiny_models: Path) -> None:
    vllm = vllm_or_skip()
    art = tmp_path / "art"
    argv = [sys.executable, "-m", "eagle3_cli", "run", str(EXAMPLE), "--artifacts", str(art)]
    argv += ["--models", str(tiny_models), "--vllm", vllm]
    first = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert first.returncode == 0, first.stderr[-4000:]
    [evaluate] = results(art, "evaluate")
    # the gate is computed from vLLM's raw counters: 1 + accepted / drafts
    assert evaluate["acceptanceLength"] == pytest.approx(
        1 + evaluate["acceptedTokens"] / evaluate["drafts"], abs=1e-5
    )
    assert sum(evaluate["acceptedTokensByPosition"]) == evaluate["acceptedTokens"]
    assert evaluate["acceptanceLength"] >= MIN_ACCEPTANCE_LENGTH, evaluate
    assert judge_evaluation(EvaluateResult.parse(evaluate), MIN_ACCEPTANCE_LENGTH).passed
    assert evaluate["outputsMatchingBaseline"] == evaluate["prompts"]
    [export] = results(art, "export")
    assert len(export["sha256"]) == 64 and export["ratio"] <= 1.05
    second = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert second.returncode == 0 and "==> stage" not in second.stderr, (
        "a second run finds every stage complete"
    )
