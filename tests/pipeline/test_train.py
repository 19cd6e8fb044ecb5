"""The train stage: speculators' EAGLE-3 trainer on the CPU, epoch metrics, the best checkpoint, resume, a
warm start."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
import yaml

from eagle3_contract.api.spec import DraftMethod
from eagle3_contract.draft_methods import PARALLEL_DEPTHS
from eagle3_contract.params import train_params
from eagle3_contract.patch_guard import LibraryChanged
from eagle3_pipeline.adapters import eagle3_loss_cpu, speculators_cpu
from eagle3_pipeline.adapters.eagle3_loss_cpu import compute_metrics_once
from eagle3_pipeline.data.draft_checkpoint import (
    best_checkpoint,
    checkpoint_method,
    read_config,
    sha256_of,
    write_serving_checkpoint,
)
from eagle3_pipeline.runtime.context import work_dir_of
from eagle3_pipeline.runtime.errors import StageError
from eagle3_pipeline.stage_main import run_stage
from eagle3_pipeline.stages.train import draft
from eagle3_pipeline.stages.train import program as train_stage
from eagle3_pipeline.stages.train.draft import (
    DraftSources,
    cpu_compute,
    cpu_threads,
    load_config,
    torchrun_argv,
    train_config,
)
from eagle3_pipeline.stages.train.metrics import acceptance_length, read_epochs, summarize, write_epochs
from tests.patch_guards import another_version, check_both_directions
from tests.pipeline.chat_templates import save_verifier
from tests.pipeline.checkpoints import weight_dtypes
from tests.pipeline.manifests import base_spec, chat, write_jsonl, write_manifest

pytestmark = [pytest.mark.pipeline, pytest.mark.usefixtures("one_torch_thread")]

REPO = Path(__file__).resolve().parents[2]
UPSTREAM = ["prepare=prepare/p", "extract=extract/x", "vocab=vocab/v"]
EPOCHS = 3
TTT = 3


def spec(root: Path, **training: Any) -> dict[str, Any]:
    doc = base_spec(root / "verifier", root / "data.jsonl", validationFraction=0.2, maxSequenceLength=128)
    doc["extraction"]["layers"] = [1, 2, 3]
    doc["training"] |= {"epochs": EPOCHS, "learningRate": 3e-3, "sequenceLength": 128, **training}
    return doc


def manifest(root: Path, name: str, **training: Any) -> str:
    return str(write_manifest(root / f"{name}.yaml", spec(root, **training)))


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 4-layer random verifier with a tokenizer, and its prepare, extract and vocab outputs."""
    root = tmp_path_factory.mktemp("train")
    save_verifier(root / "verifier", layers=4)
    write_jsonl(root / "data.jsonl", [chat(i, turns=2) for i in range(40)])
    spec_path = manifest(root, "run")
    art = str(root / "art")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # module fixtures run before the autouse one
    try:
        assert run_stage("prepare", spec_path, art, "prepare/p", []) == 0
        assert run_stage("extract", spec_path, art, "extract/x", ["prepare=prepare/p"]) == 0
        assert run_stage("vocab", spec_path, art, "vocab/v", ["prepare=prepare/p"]) == 0
    finally:
        torch.set_num_threads(threads)
    return root


@pytest.fixture(scope="module")
def trained(upstream: Path) -> dict[str, Any]:
    code = run_stage("train", manifest(upstream, "run"), str(upstream / "art"), "train/t", UPSTREAM)
    assert code == 0
    result: dict[str, Any] = json.loads((upstream / "art" / "train" / "t" / "result.json").read_text())
    return result


@pytest.mark.timeout(600)
def test_a_bfloat16_verifier_trains_on_the_cpu_with_muons_iterations_in_float32(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 30: real checkpoints ship bfloat16, and the CPU path had only met float32 verifiers. A bfloat16
    verifier goes through prepare, extract, vocab and a training epoch, on the path of a CPU without native
    bfloat16 (Muon's Newton-Schulz iterations in float32), whatever this machine's CPU is."""
    save_verifier(tmp_path / "verifier", layers=4, dtype="bfloat16")
    assert weight_dtypes(tmp_path / "verifier") == {torch.bfloat16}
    write_jsonl(tmp_path / "data.jsonl", [chat(i, turns=2) for i in range(24)])
    spec_path, art = manifest(tmp_path, "run", epochs=1), str(tmp_path / "art")
    monkeypatch.setenv("EAGLE3_CPU_BF16", "0")
    for stage, output, inputs in (
        ("prepare", "prepare/p", []),
        ("extract", "extract/x", ["prepare=prepare/p"]),
        ("vocab", "vocab/v", ["prepare=prepare/p"]),
    ):
        assert run_stage(stage, spec_path, art, output, inputs) == 0, stage
    assert run_stage("train", spec_path, art, "train/t", UPSTREAM) == 0
    result = json.loads((tmp_path / "art" / "train" / "t" / "result.json").read_text())
    [epoch] = result["epochs"]
    assert epoch["trainLoss"] > 0 and math.isfinite(epoch["valLoss"]) and result["device"] == "cpu"


@pytest.mark.timeout(300)
def test_a_peagle_draft_trains_on_the_cpu_and_exports_a_parallel_drafting_checkpoint(
    upstream: Path, tmp_path: Path
) -> None:
    """Issue 31: draft.method peagle trains speculators' P-EAGLE draft from the same prepared data, hidden
    states and vocabulary (bfloat16 files read in float32 on the CPU), with accuracy by depth, and its slim
    serving checkpoint keeps what vLLM's P-EAGLE loader needs (the trained embeddings, mask_hidden)."""
    doc = spec(upstream, epochs=2)
    doc["draft"] = {**doc.get("draft", {}), "method": "peagle"}
    path = str(write_manifest(upstream / "peagle.yaml", doc))
    assert run_stage("train", path, str(upstream / "art"), "train/peagle", UPSTREAM) == 0
    output = upstream / "art" / "train" / "peagle"
    result = json.loads((output / "result.json").read_text())
    assert [e["epoch"] for e in result["epochs"]] == [0, 1]
    for epoch in result["epochs"]:
        assert math.isfinite(epoch["valLoss"]) and epoch["trainLoss"] > 0
        assert len(epoch["valAccuracyByPosition"]) == PARALLEL_DEPTHS  # one per depth
        assert all(0.0 <= a <= 1.0 for a in epoch["valAccuracyByPosition"])
    checkpoint = best_checkpoint(output)
    assert checkpoint_method(checkpoint) == DraftMethod.PEAGLE
    write_serving_checkpoint(checkpoint, tmp_path / "slim", "org/verifier")
    assert checkpoint_method(tmp_path / "slim") == DraftMethod.PEAGLE
    from safetensors import safe_open

    with safe_open(str(tmp_path / "slim" / "model.safetensors"), "pt") as weights:
        names = set(weights.keys())
    assert "mask_hidden" in names and any("embed_tokens" in n for n in names), sorted(names)


@pytest.mark.timeout(300)
def test_a_dflash_draft_trains_on_the_cpu_and_exports_its_block(upstream: Path, tmp_path: Path) -> None:
    """Issue 31: draft.method dflash trains speculators' DFlash draft from the same prepared data, hidden
    states (bfloat16 files read in float32 on the CPU, the batch not shifted) and vocabulary, with accuracy
    by block position and speculators' own expected accepted length; the checkpoint keeps its block size
    and the layers it reads, and its slim copy is what vLLM's dflash method loads."""
    doc = spec(upstream, epochs=2)
    doc["draft"] = {**doc.get("draft", {}), "method": "dflash", "blockSize": 4}
    path = str(write_manifest(upstream / "dflash.yaml", doc))
    assert run_stage("train", path, str(upstream / "art"), "train/dflash", UPSTREAM) == 0
    output = upstream / "art" / "train" / "dflash"
    result = json.loads((output / "result.json").read_text())
    assert [e["epoch"] for e in result["epochs"]] == [0, 1]
    records = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    for epoch, record in zip(result["epochs"], records, strict=True):
        assert math.isfinite(epoch["valLoss"]) and epoch["trainLoss"] > 0
        assert len(epoch["valAccuracyByPosition"]) == 3  # block positions 1 to 3 (0 is the anchor)
        assert all(0.0 <= a <= 1.0 for a in epoch["valAccuracyByPosition"])
        eal = record["speculatorsVal"]["eal_epoch"]  # DFlash's own estimate, counted per block
        assert epoch["estimatedAcceptanceLength"] == pytest.approx(eal, abs=1e-6) and 1.0 <= eal <= 4.0
    checkpoint = best_checkpoint(output)
    assert checkpoint_method(checkpoint) == DraftMethod.DFLASH
    config = read_config(checkpoint)
    assert config["block_size"] == 4 and config["aux_hidden_state_layer_ids"] == [1, 2, 3]
    write_serving_checkpoint(checkpoint, tmp_path / "slim", "org/verifier")
    assert checkpoint_method(tmp_path / "slim") == DraftMethod.DFLASH


@pytest.mark.timeout(300)
def test_draft_candidates_are_trained_in_turn_each_in_its_own_directory(upstream: Path) -> None:
    """Issue 31: draft.candidates trains each method from the same data into candidates/<method>/; the result
    lists each one's best checkpoint and keeps draft.method's figures at the top, as a run without."""
    doc = spec(upstream, epochs=1)
    doc["draft"] = {**doc.get("draft", {}), "candidates": ["eagle3", "dflash"], "blockSize": 4}
    path = str(write_manifest(upstream / "candidates.yaml", doc))
    assert run_stage("train", path, str(upstream / "art"), "train/candidates", UPSTREAM) == 0
    output = upstream / "art" / "train" / "candidates"
    result = json.loads((output / "result.json").read_text())
    assert [c["method"] for c in result["candidates"]] == ["eagle3", "dflash"]
    for c in result["candidates"]:
        assert c["checkpoint"] == f"candidates/{c['method']}/checkpoints/checkpoint_best"
        checkpoint = output / c["checkpoint"]
        assert checkpoint_method(checkpoint) == DraftMethod(c["method"])
        assert math.isfinite(c["bestValLoss"]) and c["parameters"] > 0
        assert (output / "candidates" / c["method"] / "metrics.jsonl").is_file()
    assert result["checkpoint"] == result["candidates"][0]["checkpoint"]  # draft.method (eagle3)'s
    assert best_checkpoint(output) == (output / result["candidates"][0]["checkpoint"]).resolve()
    assert not (output / "checkpoints").exists()


@pytest.mark.timeout(300)
def test_the_loss_computed_once_per_forward_trains_the_same_draft(
    upstream: Path, trained: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 30: the loss a draft past the tiny one takes on the CPU (adapters.eagle3_loss_cpu), through a
    whole training of the tiny draft: the losses and accuracies of speculators' own loss, epoch by epoch."""
    original, taken = draft.cpu_compute, []

    def fused_too(trainer: Any, hidden_size: int, native_bf16: bool) -> bool:
        taken.append(original(trainer, hidden_size, native_bf16))
        return True

    steps = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        steps.append(args[4])  # the TTT step
        return compute_metrics_once(*args, **kwargs)

    monkeypatch.setattr(draft, "cpu_compute", fused_too)
    monkeypatch.setattr(eagle3_loss_cpu, "compute_metrics_once", counted)
    assert run_stage("train", manifest(upstream, "run"), str(upstream / "art"), "train/fused", UPSTREAM) == 0
    assert taken == [False], "the tiny draft takes speculators' own loss unless told otherwise"
    assert steps and set(steps) == set(range(TTT)), "every forward's TTT steps took the replacement"
    result = json.loads((upstream / "art" / "train" / "fused" / "result.json").read_text())
    for ours, theirs in zip(result["epochs"], trained["epochs"], strict=True):
        for key in ("trainLoss", "valLoss"):
            assert ours[key] == pytest.approx(theirs[key], rel=1e-3), (key, ours["epoch"])
        for key in ("trainAccuracyByPosition", "valAccuracyByPosition"):
            assert ours[key] == pytest.approx(theirs[key], abs=0.01), (key, ours["epoch"])


@pytest.mark.timeout(300)
def test_every_epoch_has_train_and_validation_loss_and_per_position_accuracy(
    upstream: Path, trained: dict[str, Any]
) -> None:
    out = upstream / "art" / "train" / "t"
    lines = read_epochs(out / "metrics.jsonl")
    assert [e["epoch"] for e in lines] == [e["epoch"] for e in trained["epochs"]] == list(range(EPOCHS))
    for e in trained["epochs"]:
        assert e["trainLoss"] > 0 and e["valLoss"] > 0 and e["trainSteps"] > 0 and e["trainTokens"] > 0
        for key in ("trainAccuracyByPosition", "valAccuracyByPosition", "valFullAccuracyByPosition"):
            assert len(e[key]) == TTT and all(0.0 <= a <= 1.0 for a in e[key]), key
        assert e["estimatedAcceptanceLength"] == acceptance_length(e["valAccuracyByPosition"])
    best = min(trained["epochs"], key=lambda e: e["valLoss"])
    assert trained["bestEpoch"] == best["epoch"] and trained["bestValLoss"] == best["valLoss"]
    assert trained["valAccuracyByPosition"] == best["valAccuracyByPosition"]
    assert trained["parameters"] > 0 and trained["trainTokensPerSecond"] > 0 and trained["seconds"] > 0
    assert trained["device"] == "cpu" and trained["resumedFromEpoch"] is None
    assert trained["epochs"][-1]["valLoss"] < trained["epochs"][0]["valLoss"], "the draft learns"


@pytest.mark.timeout(300)
def test_the_best_checkpoint_loads_as_an_eagle3_draft_with_the_vocab_stages_mapping(
    upstream: Path, trained: dict[str, Any]
) -> None:
    from speculators import SpeculatorModel
    from speculators.models.eagle3 import Eagle3DraftModel

    out = upstream / "art" / "train" / "t"
    best = out / trained["checkpoint"]
    assert trained["checkpoint"] == "checkpoints/checkpoint_best"
    assert best.resolve() == (out / "checkpoints" / str(trained["bestEpoch"])).resolve()
    assert (best / "config.json").is_file() and (best / "model.safetensors").is_file()
    for epoch in range(EPOCHS):  # every epoch as speculators writes it
        assert (out / "checkpoints" / str(epoch) / "optimizer_state_dict.pt").is_file()
    model = SpeculatorModel.from_pretrained(str(best))
    assert isinstance(model, Eagle3DraftModel)
    assert model.config.eagle_aux_hidden_state_layer_ids == [1, 2, 3] == trained["auxLayers"]
    vocab = upstream / "art" / "vocab" / "v"
    n = trained["draftVocabSize"]
    assert model.d2t is not None and model.t2d is not None
    assert np.array_equal(model.d2t.numpy(), np.load(vocab / f"d2t-{n}.npy"))
    assert np.array_equal(model.t2d.numpy(), np.load(vocab / f"t2d-{n}.npy"))
    config = json.loads((best / "config.json").read_text())
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == TTT


@pytest.mark.timeout(300)
def test_speculators_run_yaml_reproduces_the_training_config(upstream: Path, trained: dict[str, Any]) -> None:
    """The torchrun workers train from run.yaml: it must be the very config the stage resolved."""
    out = upstream / "art" / "train" / "t"
    reloaded = load_config(out / "checkpoints" / "run.yaml").flatten()
    assert reloaded["on_missing"] == "raise", "never speculators' default: asking a vLLM on localhost"
    assert reloaded["hidden_states_path"] == str(upstream / "art" / "extract" / "x")
    assert (reloaded["draft_attn_impl"], reloaded["loss_implementation"]) == ("sdpa", "eager")
    assert (reloaded["epochs"], reloaded["lr"], reloaded["ttt_steps"]) == (EPOCHS, 3e-3, TTT)
    assert reloaded["total_seq_len"] == 128 and reloaded["target_layer_ids"] == [1, 2, 3]


def signal_after_first_epoch(spec_path: str, art: Path, output: str, sig: signal.Signals, log: Path) -> int:
    """Run `eagle3 stage train` as a subprocess, send `sig` once an epoch is complete; its exit code."""
    argv = [sys.executable, "-m", "eagle3_cli", "stage", "train", "--spec", spec_path]
    argv += ["--artifacts", str(art), "--output", output] + [f"--input={i}" for i in UPSTREAM]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    metrics = work_dir_of(art / output) / "metrics.jsonl"
    with log.open("wb") as sink:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 200
            while not read_epochs(metrics):
                assert proc.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, "no epoch finished in time"
                time.sleep(0.05)
            proc.send_signal(sig)
        finally:
            proc.wait(timeout=120)
    return proc.returncode


@pytest.mark.timeout(300)
def test_a_killed_stage_resumes_after_its_last_complete_epoch(upstream: Path, tmp_path: Path) -> None:
    epochs = 6
    spec_path = manifest(upstream, "resume", epochs=epochs)
    art = upstream / "art"
    work = work_dir_of(art / "train" / "r")
    code = signal_after_first_epoch(spec_path, art, "train/r", signal.SIGKILL, tmp_path / "stage.log")
    assert code == -signal.SIGKILL and not (art / "train" / "r").exists()
    before = read_epochs(work / "metrics.jsonl")
    assert 1 <= len(before) < epochs

    assert run_stage("train", spec_path, str(art), "train/r", UPSTREAM) == 0
    result = json.loads((art / "train" / "r" / "result.json").read_text())
    assert result["resumedFromEpoch"] == len(before), "it starts after the last complete epoch"
    assert [e["epoch"] for e in result["epochs"]] == list(range(epochs))
    lines = (art / "train" / "r" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines] == list(range(epochs)), "one line per epoch"
    assert read_epochs(art / "train" / "r" / "metrics.jsonl")[: len(before)] == before, "kept, not redone"
    lrs = [e["learningRate"]["AdamW"] for e in result["epochs"]]
    assert lrs == sorted(lrs, reverse=True) and len(set(lrs)) == epochs, "the schedule went on, not over"


@pytest.mark.timeout(300)
def test_sigterm_is_an_interrupted_attempt_not_a_finished_one(upstream: Path, tmp_path: Path) -> None:
    """speculators saves `interrupted/` on SIGTERM and returns normally: the stage must not commit."""
    art = upstream / "art"
    log = tmp_path / "stage.log"
    code = signal_after_first_epoch(
        manifest(upstream, "term", epochs=6), art, "train/term", signal.SIGTERM, log
    )
    text = log.read_text()
    assert code == 1 and not (art / "train" / "term").exists(), text[-4000:]
    # wherever the signal landed, training stopped at the end of a step (adapters.speculators_interrupt)
    assert "training stops at the end of this step" in text, text[-4000:]
    assert "training stopped after epochs" in text and "next attempt resumes" in text, text[-4000:]
    assert (work_dir_of(art / "train" / "term") / "checkpoints" / "0" / "model.safetensors").is_file()


def test_an_attempts_incomplete_epochs_are_dropped_and_the_best_link_repaired(tmp_path: Path) -> None:
    save, metrics = tmp_path / "checkpoints", tmp_path / "metrics.jsonl"
    for epoch in (0, 1, 2):
        (save / str(epoch)).mkdir(parents=True)
    (save / "interrupted").mkdir()
    for epoch in (0, 1):
        (save / str(epoch) / "model.safetensors").write_bytes(b"x")
    (save / "checkpoint_best").symlink_to("0", target_is_directory=True)
    (save / "epoch2_end").symlink_to("2")
    write_epochs(metrics, [line(0, 2.0), line(1, 1.5), line(2, 1.0)])  # epoch 2's weights never landed
    with metrics.open("a") as f:
        f.write('{"epoch": 3, "valL')  # a torn line
    assert train_stage.keep_complete_epochs(save, metrics) == 2
    assert sorted(p.name for p in save.iterdir()) == ["0", "1", "checkpoint_best"]
    assert os.readlink(save / "checkpoint_best") == "1", "the lower validation loss of the kept epochs"
    assert json.loads((save / "1" / "val_metrics.json").read_text()) == {"loss_epoch": 1.5}
    assert [e["epoch"] for e in read_epochs(metrics)] == [0, 1]
    assert metrics.read_text().count("\n") == 2


def line(epoch: int, loss: float) -> dict[str, Any]:
    acc = [0.5, 0.4, 0.3]
    return {
        "epoch": epoch,
        "valLoss": loss,
        "valAccuracyByPosition": acc,
        "estimatedAcceptanceLength": acceptance_length(acc),
        "trainTokens": 100,
        "trainSeconds": 2.0,
        "speculatorsVal": {"loss_epoch": loss},
    }


def test_the_summary_names_the_best_epoch_and_the_acceptance_estimate() -> None:
    assert acceptance_length([0.5, 0.5, 0.5]) == 1.875
    summary = summarize([line(0, 2.0), line(1, 1.0), line(2, 1.0)])
    assert (summary["bestEpoch"], summary["bestValLoss"]) == (1, 1.0), "the earliest on a tie"
    assert summary["trainTokensPerSecond"] == 50.0
    assert all("speculatorsVal" not in e for e in summary["epochs"])


# --- failures ---------------------------------------------------------------------------------------------


def test_a_missing_vocab_input_fails_naming_it(upstream: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inputs = ["prepare=prepare/p", "extract=extract/x"]
    assert run_stage("train", manifest(upstream, "run"), str(upstream / "art"), "train/nv", inputs) == 1
    assert "needs the output of stage vocab" in capsys.readouterr().err
    assert not (upstream / "art" / "train" / "nv").exists()


def test_missing_hidden_states_fail_before_training_and_never_ask_a_server(
    upstream: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import openai

    def no_server(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the train stage tried to reach a vLLM server")

    monkeypatch.setattr(openai, "OpenAI", no_server)
    art = upstream / "art"
    shutil.copytree(art / "extract" / "x", art / "extract" / "gap")
    (art / "extract" / "gap" / "hs_3.safetensors").unlink()
    inputs = ["prepare=prepare/p", "extract=extract/gap", "vocab=vocab/v"]
    assert run_stage("train", manifest(upstream, "run"), str(art), "train/gap", inputs) == 1
    err = capsys.readouterr().err
    assert "no hidden states for 1 rows (e.g. hs_3.safetensors)" in err and "re-run stage extract" in err
    assert not work_dir_of(art / "train" / "gap").exists()


def test_a_vocab_made_for_another_draft_size_is_refused(
    upstream: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = spec(upstream)
    doc["draft"]["vocabSize"] = 64
    path = str(write_manifest(upstream / "v64.yaml", doc))
    assert run_stage("train", path, str(upstream / "art"), "train/v64", UPSTREAM) == 1
    assert "draft.vocabSize 64" in capsys.readouterr().err


# --- the CPU adaptation and the launch -------------------------------------------------------------------


def test_the_cpu_adaptation_matches_the_installed_speculators_and_refuses_another(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Fails when speculators changes under the patches: re-check speculators_cpu against the new version."""
    assert speculators_cpu.GUARD.version == "0.9.0"
    check_both_directions(monkeypatch, tmp_path, speculators_cpu.GUARD)


@pytest.mark.skipif(torch.accelerator.is_available(), reason="patches only without an accelerator")
def test_another_speculators_is_refused_before_anything_is_patched(monkeypatch: pytest.MonkeyPatch) -> None:
    from speculators.train import distributed, trainer

    another_version(monkeypatch, speculators_cpu.GUARD)
    original = trainer.get_local_rank
    with pytest.raises(LibraryChanged, match=r"speculators==0\.9\.0"), speculators_cpu.cpu_adapted():
        pass
    assert trainer.get_local_rank is original
    monkeypatch.setenv("LOCAL_RANK", "0")  # as torchrun sets it: setup_distributed would start gloo
    with pytest.raises(LibraryChanged, match=r"speculators==0\.9\.0"):
        speculators_cpu.setup_distributed()
    assert not distributed.is_distributed()


class _WhatTheWorkerSees(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Each item: the worker's pid and the value of a module attribute the parent process patched."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> tuple[int, str]:
        return os.getpid(), speculators_cpu.CPU


@pytest.mark.skipif(torch.accelerator.is_available(), reason="loader workers are forked only without one")
def test_without_an_accelerator_the_loader_workers_are_forked_with_the_parents_patches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """speculators spawns its loader workers (each re-imports torch and speculators); on the CPU they are
    forked: they start at once and see what the training process patched (speculators_cpu.PATCHES)."""
    monkeypatch.setattr(speculators_cpu, "CPU", "patched in the parent")
    spawned = torch.utils.data.DataLoader(
        _WhatTheWorkerSees(), batch_size=None, num_workers=2, multiprocessing_context="spawn"
    )
    inline = torch.utils.data.DataLoader(_WhatTheWorkerSees(), batch_size=None, num_workers=0)
    speculators_cpu.fork_loader_workers((spawned, inline))
    assert spawned.multiprocessing_context.get_start_method() == "fork"
    assert inline.multiprocessing_context is None, "a loader without workers is left as it is"
    seen = list(spawned)
    assert {value for _, value in seen} == {"patched in the parent"}
    assert os.getpid() not in {pid for pid, _ in seen}, "the items came from worker processes"


@pytest.mark.skipif(torch.accelerator.is_available(), reason="patches only without an accelerator")
def test_the_cpu_patches_hold_only_inside_the_block() -> None:
    from speculators.train import checkpointer, trainer

    originals = trainer.get_local_rank, checkpointer.get_current_device, torch.accelerator.synchronize
    with speculators_cpu.cpu_adapted() as on_cpu:
        assert on_cpu
        assert trainer.get_local_rank() == "cpu" and checkpointer.get_current_device() == "cpu"
        torch.accelerator.synchronize()  # raises without an accelerator, outside the block
    after = trainer.get_local_rank, checkpointer.get_current_device, torch.accelerator.synchronize
    assert after == originals


def test_torchrun_runs_the_worker_once_per_gpu_from_run_yaml(tmp_path: Path) -> None:
    argv = torchrun_argv(8, tmp_path / "run.yaml", tmp_path / "m.jsonl", tmp_path / "t.json", python="py")
    assert argv == [
        "py", "-m", "torch.distributed.run", "--standalone", "--nnodes", "1", "--nproc-per-node", "8",
        "-m", "eagle3_pipeline.stages.train.draft",
        "--config", str(tmp_path / "run.yaml"), "--metrics", str(tmp_path / "m.jsonl"),
        "--info", str(tmp_path / "t.json"),
    ]  # fmt: skip
    help_text = subprocess.run(
        [sys.executable, "-m", "eagle3_pipeline.stages.train.draft", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "--config" in help_text and "--metrics" in help_text


def test_a_draft_past_the_tiny_one_trains_on_every_cpu_it_is_given() -> None:
    """Issue 30: a hidden-576 draft (a 100M-class verifier's) got one thread of the machine's, by a rule
    measured on the hidden-128 tiny draft only."""
    assert [cpu_threads(h, 16) for h in (32, 128, 511, 512, 576, 4096)] == [1, 1, 1, 16, 16, 16]
    assert cpu_threads(576, 2) == 2 and cpu_threads(576, 0) == 1


def test_a_draft_past_the_tiny_one_computes_in_bfloat16_on_a_cpu_that_has_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 30: speculators autocasts to "cuda" without an accelerator, which torch disables; on a CPU with
    native bfloat16 a 100M-class draft's products run in bfloat16 as on a GPU. The tiny draft (and every draft
    on a CPU without it) stays in float32."""
    monkeypatch.setenv("OMP_NUM_THREADS", str(torch.get_num_threads()))  # pin_threads leaves them as they are

    def device_after(hidden: int, native: bool) -> tuple[str, bool]:
        trainer = SimpleNamespace(device_type="cuda")  # what speculators sets without an accelerator
        fused = cpu_compute(trainer, hidden, native)
        return trainer.device_type, fused

    assert device_after(576, native=True) == ("cpu", True)
    assert device_after(128, native=True) == ("cuda", False)  # the demo's draft: its figures stay
    assert device_after(576, native=False) == ("cuda", True)  # the loss computed once is in float32 too


@pytest.mark.parametrize(
    ("scheduler", "expected"),
    [("linear", ("linear", 0.5)), ("cosine", ("cosine", 0.5)), ("constant", ("cosine", 0.0))],
)
def test_the_schedulers_map_onto_speculators(
    upstream: Path, scheduler: str, expected: tuple[str, float], tmp_path: Path
) -> None:
    from eagle3_contract.api.manifest import load_manifest

    doc = spec(upstream, scheduler=scheduler, warmupRatio=0.1)
    run = load_manifest(write_manifest(tmp_path / "s.yaml", doc))
    art = upstream / "art"
    sources = DraftSources(
        verifier=str(upstream / "verifier"),
        trust_remote_code=False,
        dataset=art / "prepare" / "p" / "data",
        hidden_states=art / "extract" / "x",
        transfer="file",
        aux_layers=[1, 2, 3],
        hidden_size=32,
        d2t=art / "vocab" / "v" / "d2t-32.npy",
        t2d=art / "vocab" / "v" / "t2d-32.npy",
        vocab_size=32,
        train_ratio=0.8,
    )
    cfg = train_config(train_params(run.spec), sources, tmp_path / "ckpt", cpu=False)
    flat = cfg.flatten()
    assert (flat["scheduler_type"], flat["scheduler_num_cosine_cycles"]) == expected
    assert flat["scheduler_warmup_ratio"] == 0.1
    assert flat["draft_attn_impl"] == "simple_flex_attention", "stock settings with an accelerator"
    assert yaml.safe_load(cfg.dump_yaml())["train"]["generation"]["on_missing"] == "raise"


@pytest.mark.parametrize(
    ("transfer", "backend_field", "value"),
    [
        ("file", "hidden_states_path", "kept"),
        ("fp8", "hidden_states_path", "kept"),
        ("mooncake", "mooncake_master", "10.0.0.7:50051"),
    ],
)
def test_online_training_asks_the_producers_with_the_transfers_own_settings(
    upstream: Path, transfer: str, backend_field: str, value: str, tmp_path: Path
) -> None:
    from eagle3_contract.api.manifest import load_manifest

    run = load_manifest(write_manifest(tmp_path / "s.yaml", spec(upstream)))
    art = upstream / "art"
    sources = DraftSources(
        verifier=str(upstream / "verifier"),
        trust_remote_code=False,
        dataset=art / "prepare" / "p" / "data",
        hidden_states=tmp_path / "kept",
        transfer=transfer,
        aux_layers=[1, 2, 3],
        hidden_size=32,
        d2t=art / "vocab" / "v" / "d2t-32.npy",
        t2d=art / "vocab" / "v" / "t2d-32.npy",
        vocab_size=32,
        train_ratio=0.8,
        endpoint="http://producers:8000/v1",
        mooncake_master="10.0.0.7:50051",
    )
    flat = train_config(train_params(run.spec), sources, tmp_path / "ckpt", cpu=True).flatten()
    assert (flat["on_missing"], flat["vllm_endpoint"]) == ("generate", "http://producers:8000/v1")
    assert flat["hidden_states_backend"] == transfer
    expected = str(tmp_path / value) if backend_field == "hidden_states_path" else value
    assert flat[backend_field] == expected


def test_online_mooncake_without_a_master_is_refused(upstream: Path, tmp_path: Path) -> None:
    from eagle3_contract.api.manifest import load_manifest

    run = load_manifest(write_manifest(tmp_path / "s.yaml", spec(upstream)))
    art = upstream / "art"
    sources = DraftSources(
        verifier=str(upstream / "verifier"),
        trust_remote_code=False,
        dataset=art / "prepare" / "p" / "data",
        hidden_states=tmp_path / "kept",
        transfer="mooncake",
        aux_layers=[1, 2, 3],
        hidden_size=32,
        d2t=art / "vocab" / "v" / "d2t-32.npy",
        t2d=art / "vocab" / "v" / "t2d-32.npy",
        vocab_size=32,
        train_ratio=0.8,
        endpoint="http://producers:8000/v1",
    )
    with pytest.raises(StageError, match="EAGLE3_MOONCAKE_MASTER"):
        train_config(train_params(run.spec), sources, tmp_path / "ckpt", cpu=True)


# --- training.warmStart: fine-tuning an exported draft ---------------------------------------------------

EXPORT = "export/warm"


@pytest.fixture(scope="module")
def exported(upstream: Path, trained: dict[str, Any]) -> Path:
    """The trained draft (3 epochs) as export writes it: slim, without the verifier's embeddings."""
    art = upstream / "art"
    write_serving_checkpoint(
        art / "train" / "t" / trained["checkpoint"], art / EXPORT, str(upstream / "verifier")
    )
    return art / EXPORT


def train_run(
    upstream: Path, name: str, inputs: list[str] = UPSTREAM, **training: Any
) -> tuple[int, dict[str, Any]]:
    art = upstream / "art"
    code = run_stage("train", manifest(upstream, name, **training), str(art), f"train/{name}", inputs)
    result = art / "train" / name / "result.json"
    return code, json.loads(result.read_text()) if result.is_file() else {}


@pytest.mark.timeout(300)
def test_a_warm_start_begins_where_the_exported_draft_ended(
    upstream: Path,
    trained: dict[str, Any],
    exported: Path,
) -> None:
    digest = sha256_of(exported / "model.safetensors")
    code, result = train_run(upstream, "warm", epochs=1, warmStart={"path": EXPORT, "sha256": digest})
    assert code == 0
    assert result["warmStart"] == {"from": EXPORT, "start": "warm"}
    [first] = result["epochs"]
    cold_first = trained["epochs"][0]["valLoss"]
    # the exported draft trained 3 epochs: one more epoch from there is below a fresh draft's first
    assert first["valLoss"] < cold_first, (first["valLoss"], cold_first)


@pytest.mark.timeout(300)
def test_another_vocabulary_mapping_starts_cold_and_says_so(upstream: Path, exported: Path) -> None:
    art = upstream / "art"
    shutil.copytree(art / "vocab" / "v", art / "vocab" / "other", dirs_exist_ok=True)
    vocab = json.loads((art / "vocab" / "other" / "result.json").read_text())
    d2t = art / "vocab" / "other" / vocab["d2t"]
    offsets = np.load(d2t)
    # draft tokens 1 and 2 swap their target tokens (target = index + offset): a valid mapping, another one
    targets = offsets[[1, 2]] + np.array([1, 2])
    offsets[[1, 2]] = targets[::-1] - np.array([1, 2])
    np.save(d2t, offsets)
    inputs = [i if not i.startswith("vocab=") else "vocab=vocab/other" for i in UPSTREAM]
    code, result = train_run(upstream, "cold", inputs, epochs=1, warmStart={"path": EXPORT})
    assert code == 0
    assert result["warmStart"]["start"] == "cold"
    assert "vocabulary mapping (d2t) differs" in result["warmStart"]["reason"]


def test_files_that_are_not_the_digests_fail_before_training(
    upstream: Path,
    exported: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, result = train_run(upstream, "mismatch", epochs=1, warmStart={"path": EXPORT, "sha256": "0" * 64})
    assert code != 0 and not result
    assert "ChecksumMismatch" in capsys.readouterr().err
    code, _ = train_run(upstream, "missing", epochs=1, warmStart={"path": "export/nothing"})
    assert code != 0
    assert "no config.json, model.safetensors" in capsys.readouterr().err
