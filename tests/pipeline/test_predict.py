"""`eagle3 plan` on the tiny example in vLLM CPU 0.32: the step-cost prediction (two servers: the verifier
alone and with an untrained draft), concurrencies 1 and 2, 32-token answers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from eagle3_pipeline.local.plan import main as plan_main
from eagle3_pipeline.local.plan import run_plan
from tests.pipeline.test_vllm_server import vllm_or_skip

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "tiny" / "eagle3run.yaml"


@pytest.fixture(scope="module")
def planned(tiny_models: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    vllm = vllm_or_skip()
    root = tmp_path_factory.mktemp("plan")
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["evaluation"].update(
        {"concurrencies": [1, 2], "maxTokens": 32, "targetAcceptanceLength": 2.5}
    )
    manifest = root / "run.yaml"
    manifest.write_text(yaml.safe_dump(doc))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EAGLE3_MODELS_ROOT", str(tiny_models))
        mp.setenv("EAGLE3_VLLM", vllm)
        run_plan(str(manifest), str(root / "art"), str(tiny_models), vllm)
        yield manifest, root / "art"


@pytest.mark.vllm
@pytest.mark.timeout(900)
def test_plan_measures_step_cost_on_cpu_and_fills_every_cell(planned: tuple[Path, Path]) -> None:
    manifest, art = planned
    result = run_plan(str(manifest), str(art), None, None)  # cached: no server starts again
    assert result.method == "step-cost" and result.concurrencies == [1, 2]
    assert result.baseline_tokens_per_second and all(b and b > 0 for b in result.baseline_tokens_per_second)
    assert result.measured_acceptance_length and all(
        a is not None and 1.0 <= a < 1.5 for a in result.measured_acceptance_length
    )  # the untrained draft is hardly ever accepted
    lengths = [a.acceptance_length or 0.0 for a in result.acceptance_lengths or []]
    assert 2.5 in lengths and max(lengths) <= 4.0  # the target, and the published ones clamped to k + 1
    assert result.speedup is not None and len(result.speedup) == len(lengths)
    assert all(s is not None and s > 0 for row in result.speedup for s in row)
    assert result.break_even is not None and len(result.break_even) == 2
    assert result.prompts_source and "tiny-chat.jsonl" in result.prompts_source
    assert result.server_start_seconds and set(result.server_start_seconds) == {"baseline", "draft"}


@pytest.mark.vllm
@pytest.mark.timeout(300)
def test_eagle3_plan_prints_the_table(planned: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    manifest, art = planned
    assert plan_main(str(manifest), str(art), None, None, [3.1]) == 0
    out = capsys.readouterr().out
    assert "predicted speedup (step-cost, k=3)" in out and "concurrency 2" in out
    assert "3.10" in out  # the --acceptance-length row
    assert "verifier alone" in out and "break-even" in out
