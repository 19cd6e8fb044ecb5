"""The train stage on a GPU with speculators' stock settings: flex attention, the fused Triton loss and
spawned loader workers (none of which the CPU runs of tests/pipeline exercise), uncompiled (gpu_support)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from eagle3_pipeline.stage_main import run_stage
from eagle3_pipeline.stages.train.draft import CPU_SETTINGS, load_config
from tests.gpu.gpu_support import require_cuda, tiny_manifest, uncompiled

require_cuda()
pytestmark = pytest.mark.gpu

EPOCHS = 3
UPSTREAM = ["prepare=prepare/p", "extract=extract/x", "vocab=vocab/v"]


@pytest.fixture(scope="module")
def trained(tiny_models: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """prepare, extract, vocab and train for 400 rows of the tiny chat data: (artifacts, train's result)."""
    root = tmp_path_factory.mktemp("train-gpu")
    spec = tiny_manifest(tiny_models, root / "run.yaml", 400, epochs=EPOCHS, learningRate=3e-3)
    art = str(root / "art")
    assert run_stage("prepare", spec, art, "prepare/p", []) == 0
    assert run_stage("extract", spec, art, "extract/x", ["prepare=prepare/p"]) == 0
    assert run_stage("vocab", spec, art, "vocab/v", ["prepare=prepare/p"]) == 0
    with uncompiled():
        assert run_stage("train", spec, art, "train/t", UPSTREAM) == 0
    result: dict[str, Any] = json.loads((root / "art" / "train" / "t" / "result.json").read_text())
    return root / "art", result


@pytest.mark.timeout(900)
def test_training_runs_on_the_gpu_with_speculators_stock_settings(
    trained: tuple[Path, dict[str, Any]],
) -> None:
    art, result = trained
    assert result["device"] == "cuda" and result["worldSize"] == 1
    config = load_config(art / "train" / "t" / "checkpoints" / "run.yaml").flatten()
    assert config["draft_attn_impl"] == "simple_flex_attention" != CPU_SETTINGS["draft_attn_impl"]
    assert config["loss_implementation"] == "fused" != CPU_SETTINGS["loss_implementation"]
    assert config["num_workers"] > 0, "spawned loader workers, as `speculators train` uses them"


@pytest.mark.timeout(900)
def test_the_draft_learns_on_the_gpu(trained: tuple[Path, dict[str, Any]]) -> None:
    _, result = trained
    epochs = result["epochs"]
    assert [e["epoch"] for e in epochs] == list(range(EPOCHS))
    assert all(e["trainSteps"] > 0 and e["trainTokens"] > 0 for e in epochs)
    assert epochs[-1]["trainLoss"] < epochs[0]["trainLoss"], "the training loss decreases"
    assert epochs[-1]["valLoss"] < epochs[0]["valLoss"], "the validation loss decreases"
    assert result["trainTokensPerSecond"] > 0


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    ("method", "extra"), [("peagle", {}), ("dflash", {"blockSize": 4})], ids=["peagle", "dflash"]
)
def test_another_draft_method_trains_and_exports_on_the_gpu(
    method: str, extra: dict[str, Any], trained: tuple[Path, dict[str, Any]]
) -> None:
    """Issue 31: P-EAGLE and DFlash train an epoch on the GPU with speculators' stock settings from the
    module's prepared data, hidden states and vocabulary, and export ships a slim checkpoint of that method
    (vLLM serving them is the CPU tier's, tests/pipeline/test_main_job.py)."""
    import yaml

    from eagle3_contract.api.spec import DraftMethod
    from eagle3_pipeline.data.draft_checkpoint import checkpoint_method

    art = trained[0]
    doc = yaml.safe_load((art.parent / "run.yaml").read_text())
    doc["spec"]["draft"] |= {"method": method, **extra}
    doc["spec"]["training"]["epochs"] = 1
    spec = art.parent / f"{method}.yaml"
    spec.write_text(yaml.safe_dump(doc))
    with uncompiled():
        assert run_stage("train", str(spec), str(art), f"train/{method}", UPSTREAM) == 0
    result = json.loads((art / "train" / method / "result.json").read_text())
    assert result["device"] == "cuda" and result["epochs"][0]["trainSteps"] > 0
    inputs = [f"train=train/{method}", "vocab=vocab/v"]
    assert run_stage("export", str(spec), str(art), f"export/{method}", inputs) == 0
    assert checkpoint_method(art / "export" / method) == DraftMethod(method)
