"""The predict stage's synthetic method on CUDA: vLLM's synthetic rejection sampling at each acceptance length
(the tiny verifier, concurrencies 1 and 4). Skips without CUDA."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from eagle3_pipeline.local.plan import run_plan
from tests.gpu.gpu_support import gpu_vllm, require_cuda

require_cuda()
pytestmark = pytest.mark.gpu
VLLM = gpu_vllm()
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny" / "eagle3run.yaml"


@pytest.mark.timeout(1200)
def test_synthetic_prediction_grows_with_the_acceptance_length(
    tiny_models: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["nodePool"]["device"] = "gpu"
    doc["spec"]["evaluation"].update(
        {"concurrencies": [1, 4], "maxTokens": 64, "targetAcceptanceLength": 1.5}
    )
    manifest = tmp_path / "run.yaml"
    manifest.write_text(yaml.safe_dump(doc))
    monkeypatch.setenv("EAGLE3_MODELS_ROOT", str(tiny_models))
    result = run_plan(str(manifest), str(tmp_path / "art"), str(tiny_models), VLLM)
    assert result.method == "synthetic" and result.measured_acceptance_length is None
    assert result.server_start_seconds and len(result.server_start_seconds) == 1 + len(
        {a.acceptance_length for a in result.acceptance_lengths or []}
    )
    assert result.speedup is not None
    for column in range(2):
        speedups = [row[column] or 0.0 for row in result.speedup]
        assert all(s > 0 for s in speedups)
        assert speedups[-1] > speedups[0]  # more tokens accepted per step: faster
