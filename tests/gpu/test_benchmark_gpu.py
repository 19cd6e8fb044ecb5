"""`benchmarks/gpu_pipeline.py` in a small mode on the GPU: extraction and both training runs, on CUDA, run to
their end (validation and checkpoints) and uncompiled (gpu_support); benchmarks/gpu_session.sh's bench step
measures the compiled runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gpu.gpu_support import COMPILED, UNCOMPILED_ENV, require_cuda

require_cuda()
pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(900)
def test_the_gpu_pipeline_benchmark_runs_small_on_the_gpu(tmp_path: Path) -> None:
    out = tmp_path / "gpu_pipeline.json"
    argv = [
        sys.executable,
        str(REPO / "benchmarks" / "gpu_pipeline.py"),
        "--size",
        "tiny",
        "--device",
        "cuda",
    ]
    argv += ["--steps", "12", "--peak-tflops", "989", "--json", str(out), "--workdir", str(tmp_path)]
    argv += ["--compare", "stock"]  # the online comparison is test_online_gpu's
    dirs = ("contract", "operator", "pipeline", "cli")
    paths = [str(REPO / d) for d in dirs] + [os.environ.get("PYTHONPATH", "")]  # keep what brings speculators
    env = {**os.environ, **UNCOMPILED_ENV, "PYTHONPATH": os.pathsep.join(paths).strip(os.pathsep)}
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "| ratio ours / stock |" in done.stdout
    report = json.loads(out.read_text())
    assert report["device"]["type"] == "cuda"
    x = report["extraction"]
    assert x["stageTokensPerSecond"] > 0 and x["forwardTokensPerSecond"] > 0
    assert 0 < x["stageRooflineFraction"] <= 1 and 0 < x["forwardRooflineFraction"] <= 1
    assert x["peakMemoryGiB"] > 0
    t = report["training"]
    assert t["compiled"] is COMPILED
    assert t["settings"]["draft_attn_impl"] == "simple_flex_attention"
    assert t["settings"]["loss_implementation"] == "fused"
    assert not t["stockAdaptedToCpu"]
    ours, stock = t["ours"], t["stock"]
    assert ours["steps"] == stock["steps"] > t["warmupSteps"], "the same data: as many steps"
    assert ours["stopped"] is None is stock["stopped"], "run to their end: no --stop-after-steps"
    assert t["stageResult"]["device"] == "cuda"
    for run in (ours, stock):
        assert run["steps_per_s"] > 0 and run["tokens_per_s"] > 0 and run["peak_memory_gib"] > 0
        assert run["compile_s"] is not None and run["compile_s"] >= 0
    assert ours["first_loss"] == pytest.approx(stock["first_loss"], abs=0.01), "the same first batch"
    assert t["ratio"]["stepsPerSecond"] > 0 and t["ratio"]["tokensPerSecond"] > 0
