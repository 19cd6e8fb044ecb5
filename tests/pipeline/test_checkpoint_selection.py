"""training.checkpointSelection acceptance (issue 31): evaluate measures the last epochs' drafts in vLLM and
export ships the most accepted, not the one with the lowest validation loss.

The choice itself on plain data; export shipping evaluate's choice; and end to end on vLLM CPU, a train
output whose last epoch has the lowest validation loss but a broken head (its lm_head rows shuffled: it
proposes the wrong tokens) ships the earlier, working epoch.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from eagle3_contract.results import OUTPUT_TOKENS_PER_SECOND, EvaluateResult
from eagle3_pipeline.runtime.errors import StageError
from eagle3_pipeline.stage_main import run_stage
from eagle3_pipeline.stages.evaluate.checkpoints import (
    Candidate,
    Measured,
    candidates,
    choice_document,
    choose,
    trained_candidates,
)
from tests.pipeline.draft_support import (
    DATASET,
    conversations,
    evaluate_spec,
    shared_draft,
    write_data_stage,
    write_vocab_stage,
)
from tests.pipeline.manifests import write_manifest

pytestmark = pytest.mark.pipeline


def measured(epoch: int, length: float | None, loss: float | None = 1.0) -> Measured:
    return Measured(Candidate(epoch, f"checkpoints/{epoch}", loss), length, None, None)


# --- the choice -------------------------------------------------------------------------------------------


def test_the_most_accepted_epoch_is_chosen_whatever_its_loss() -> None:
    runs = [measured(3, 2.9, 1.9), measured(4, 3.1, 1.8), measured(5, 2.7, 1.7)]
    assert choose(runs).candidate.epoch == 4


def test_flipping_the_measured_acceptance_flips_the_choice() -> None:
    runs = [measured(3, 2.9, 1.9), measured(4, 3.1, 1.8), measured(5, 2.7, 1.7)]
    flipped = [
        measured(m.candidate.epoch, 6.0 - (m.acceptance_length or 0), m.candidate.val_loss) for m in runs
    ]
    assert choose(flipped).candidate.epoch == 5


def test_ties_go_to_the_lower_loss_then_the_later_epoch() -> None:
    assert choose([measured(1, 2.5, 1.2), measured(2, 2.5, 1.1), measured(3, 2.5, 1.3)]).candidate.epoch == 2
    assert choose([measured(1, 2.5, None), measured(2, 2.5, None)]).candidate.epoch == 2
    # an epoch vLLM never drafted for is never preferred to one it measured
    assert choose([measured(1, None, 0.1), measured(2, 1.01, 9.0)]).candidate.epoch == 2


def test_a_candidates_choice_recorded_before_the_bake_off_still_reads() -> None:
    """Results written before issue 43's bake-off chose draft.candidates by one run's speed, without a
    verdict; a run's status may still hold one, and `eagle3 status` and the Events still show it."""
    doc = {
        "by": OUTPUT_TOKENS_PER_SECOND,
        "epoch": 2,
        "checkpoint": "candidates/dflash/checkpoints/checkpoint_best",
        "checkpoints": [
            {"epoch": 2, "checkpoint": f"candidates/{m}/checkpoints/checkpoint_best", "method": m,
             "valLoss": 1.0, "acceptanceLength": length, "outputTokensPerSecond": speed}
            for m, speed, length in (("eagle3", 410.0, 3.1), ("dflash", 520.0, 2.4))
        ],
    }  # fmt: skip
    choice = EvaluateResult.model_validate({"checkpointSelection": doc}).checkpoint_selection
    assert choice is not None and choice.verdict is None
    assert choice.line() == (
        "candidates: eagle3: 410.0 output tokens/s (acceptance length 3.100), dflash: 520.0 output tokens/s "
        "(acceptance length 2.400); dflash ships"
    )


def test_the_document_and_the_line_hold_every_epoch() -> None:
    runs = [measured(4, 3.1234567, 1.8), measured(5, 2.7, 1.7)]
    doc = choice_document(runs, runs[0], val_loss_epoch=5)
    choice = EvaluateResult.model_validate({"checkpointSelection": doc}).checkpoint_selection
    assert choice is not None and choice.epoch == 4 and choice.checkpoint == "checkpoints/4"
    assert choice.val_loss_epoch == 5 and [c.epoch for c in choice.checkpoints] == [4, 5]
    assert choice.checkpoints[0].acceptance_length == 3.123457
    assert choice.line() == (
        "acceptance length by epoch: epoch 4: 3.123 (val loss 1.800), epoch 5: 2.700 (val loss 1.700); "
        "epoch 4 ships; the lowest validation loss was epoch 5's"
    )


def test_eagle3_status_shows_each_epochs_acceptance_beside_its_loss() -> None:
    from eagle3_cli.status import result_text

    runs = [measured(4, 3.1, 1.8), measured(5, 2.7, 1.7)]
    document = {"acceptanceLength": 3.1, "checkpointSelection": choice_document(runs, runs[0], 5)}
    text = result_text("evaluate", EvaluateResult.model_validate(document), None)
    assert text == (
        "acceptance length 3.1, acceptance length by epoch: epoch 4: 3.100 (val loss 1.800), epoch 5: 2.700 "
        "(val loss 1.700); epoch 4 ships; the lowest validation loss was epoch 5's"
    )


def write_epochs(art: Path, drafts: list[Path], losses: list[float], name: str = "train/h") -> str:
    """A train output with one checkpoint per draft (epoch i: drafts[i]), its result's epochs with `losses`,
    and checkpoint_best at the lowest loss, as the train stage leaves it."""
    out = art / name
    for epoch, draft in enumerate(drafts):
        shutil.copytree(draft, out / "checkpoints" / str(epoch))
    best = min(range(len(losses)), key=losses.__getitem__)
    (out / "checkpoints" / "checkpoint_best").symlink_to(str(best))
    epochs = [{"epoch": e, "valLoss": loss} for e, loss in enumerate(losses)]
    result = {"checkpoint": "checkpoints/checkpoint_best", "epochs": epochs, "bestEpoch": best}
    (out / "result.json").write_text(json.dumps(result) + "\n")
    return name


def test_the_trained_candidates_are_each_methods_best(tmp_path: Path, tiny_models: Path) -> None:
    draft = shared_draft(tiny_models, tmp_path.parent, fitted=False)
    train = tmp_path / "train"
    listed = []
    for method in ("eagle3", "peagle"):
        shutil.copytree(draft, train / "candidates" / method / "checkpoints" / "1")
        (train / "candidates" / method / "checkpoints" / "checkpoint_best").symlink_to("1")
        best = f"candidates/{method}/checkpoints/checkpoint_best"
        listed.append({"method": method, "checkpoint": best, "bestEpoch": 1, "bestValLoss": 1.5})
    (train / "result.json").write_text(json.dumps({"candidates": listed}))
    found = trained_candidates(train)
    assert [(c.method, c.epoch, c.val_loss) for c in found] == [("eagle3", 1, 1.5), ("peagle", 1, 1.5)]
    shutil.rmtree(train / "candidates" / "peagle" / "checkpoints" / "1")
    with pytest.raises(StageError, match=r"candidate peagle .* has no config.json"):
        trained_candidates(train)


def test_the_candidates_are_the_last_epochs(tmp_path: Path, tiny_models: Path) -> None:
    draft = shared_draft(tiny_models, tmp_path.parent, fitted=False)
    train = tmp_path / write_epochs(tmp_path, [draft] * 4, [4.0, 3.0, 2.0, float("nan")])
    assert [(c.epoch, c.val_loss) for c in candidates(train, 3)] == [(1, 3.0), (2, 2.0), (3, None)]
    assert [c.epoch for c in candidates(train, 9)] == [0, 1, 2, 3]
    assert candidates(train, 0) == []
    (train / "checkpoints" / "2" / "model.safetensors").unlink()
    with pytest.raises(StageError, match=r"epoch 2 .* has no model.safetensors.*re-run stage train"):
        candidates(train, 3)


# --- export ships evaluate's choice -------------------------------------------------------------------------


def broken_head(draft: Path, out: Path) -> Path:
    """A copy of `draft` with its lm_head rows shuffled: the same mapping and shapes, the wrong proposals."""
    shutil.copytree(draft, out)
    tensors = load_file(str(out / "model.safetensors"))
    head = tensors["lm_head.weight"]
    tensors["lm_head.weight"] = head[torch.randperm(len(head), generator=torch.Generator().manual_seed(0))]
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def acceptance_spec(**evaluation: Any) -> dict[str, Any]:
    spec = evaluate_spec(**evaluation)
    spec["training"] = {"epochs": 2, "checkpointSelection": "acceptance", "checkpointsToEvaluate": 2}
    return spec


def run_export(root: Path, art: Path, train: str, vocab: str) -> dict[str, Any]:
    manifest = write_manifest(root / "run.yaml", acceptance_spec())
    inputs = [f"train={train}", f"vocab={vocab}", "evaluate=evaluate/h"]
    code = run_stage("export", str(manifest), str(art), "export/h", inputs)
    assert code == 0
    return json.loads((art / "export" / "h" / "result.json").read_text())


def test_export_ships_the_epoch_evaluate_chose(tmp_path: Path, tiny_models: Path) -> None:
    good = shared_draft(tiny_models, tmp_path.parent, fitted=False)
    art = tmp_path / "art"
    train = write_epochs(art, [good, broken_head(good, tmp_path / "broken")], [2.0, 1.0])
    runs = [measured(0, 1.6, 2.0), measured(1, 1.05, 1.0)]
    (art / "evaluate" / "h").mkdir(parents=True)
    document = {"checkpointSelection": choice_document(runs, choose(runs), val_loss_epoch=1)}
    (art / "evaluate" / "h" / "result.json").write_text(json.dumps(document))
    run_export(tmp_path, art, train, write_vocab_stage(art, good))
    shipped = load_file(str(art / "export" / "h" / "model.safetensors"))
    assert torch.equal(
        shipped["lm_head.weight"], load_file(str(good / "model.safetensors"))["lm_head.weight"]
    )
    manifest = json.loads((art / "export" / "h" / "manifest.json").read_text())
    assert (
        manifest["checkpointSelection"]["epoch"] == 0 and manifest["checkpointSelection"]["valLossEpoch"] == 1
    )


def test_export_refuses_a_choice_train_no_longer_has(
    tmp_path: Path, tiny_models: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    termination = tmp_path / "termination-log"
    monkeypatch.setenv("EAGLE3_TERMINATION_LOG", str(termination))
    good = shared_draft(tiny_models, tmp_path.parent, fitted=False)
    art = tmp_path / "art"
    train = write_epochs(art, [good], [2.0])
    runs = [measured(3, 1.6)]
    (art / "evaluate" / "h").mkdir(parents=True)
    document = {"checkpointSelection": choice_document(runs, runs[0], val_loss_epoch=0)}
    (art / "evaluate" / "h" / "result.json").write_text(json.dumps(document))
    manifest = write_manifest(tmp_path / "run.yaml", acceptance_spec())
    inputs = [f"train={train}", f"vocab={write_vocab_stage(art, good)}", "evaluate=evaluate/h"]
    assert run_stage("export", str(manifest), str(art), "export/h", inputs) != 0
    failure = json.loads(termination.read_text())
    assert (
        "evaluate chose epoch 3" in failure["error"]
        and "re-run stages train and evaluate" in failure["error"]
    )


# --- end to end on vLLM CPU -------------------------------------------------------------------------------


@pytest.mark.vllm
@pytest.mark.timeout(900)
def test_the_most_accepted_epoch_ships_not_the_lowest_loss(
    tmp_path: Path,
    tiny_models: Path,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    from tests.pipeline.test_vllm_server import vllm_or_skip

    monkeypatch.setenv("EAGLE3_VLLM", vllm_or_skip())
    monkeypatch.setenv("EAGLE3_MODELS_ROOT", str(tiny_models))
    good = shared_draft(tiny_models, tmp_path_factory.getbasetemp())  # fitted: about 1.7 tokens a step
    art = tmp_path / "art"
    # the last epoch has the lowest validation loss (checkpoint_best), and a head that proposes wrong tokens
    train = write_epochs(art, [good, broken_head(good, tmp_path / "broken")], [2.0, 1.0])
    data = write_data_stage(art, conversations(tiny_models / DATASET))
    manifest = write_manifest(tmp_path / "run.yaml", acceptance_spec(prompts=8, maxTokens=32))
    code = run_stage("evaluate", str(manifest), str(art), "evaluate/h", [f"prepare={data}", f"train={train}"])
    assert code == 0
    output = art / "evaluate" / "h"
    result = EvaluateResult.model_validate(json.loads((output / "result.json").read_text()))
    choice = result.checkpoint_selection
    assert choice is not None and choice.val_loss_epoch == 1
    by_epoch = {c.epoch: c for c in choice.checkpoints}
    assert sorted(by_epoch) == [0, 1]
    good_length, broken_length = by_epoch[0].acceptance_length, by_epoch[1].acceptance_length
    assert good_length is not None and broken_length is not None and good_length > broken_length
    assert choice.epoch == 0 and choice.checkpoint == "checkpoints/0"
    # the figures of the run are the chosen epoch's measurement (no sampling, no sweep: its greedy run)
    assert result.acceptance_length == good_length
    assert result.draft_checkpoint is not None and result.draft_checkpoint.endswith("checkpoints/0")
    for epoch in (0, 1):
        assert (output / f"vllm-draft-epoch{epoch}.log").is_file()
        assert not (output / f"draft-epoch{epoch}").exists()  # the slim copies are removed
    run_export(tmp_path, art, train, write_vocab_stage(art, good))
    shipped = load_file(str(art / "export" / "h" / "model.safetensors"))
    assert torch.equal(
        shipped["lm_head.weight"], load_file(str(good / "model.safetensors"))["lm_head.weight"]
    )
