"""The export stage: the slim serving checkpoint (what it keeps and drops, its size, digests and config), its
refusals (a stale mapping, a bloated checkpoint), speculators loading it, and, with vLLM, that vLLM accepts
the slim draft exactly as it accepts train's full checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from eagle3_contract.api.manifest import load_manifest
from eagle3_contract.api.speculation import BaselineCell, SpeculationTable, SweepCell, plan_schedule
from eagle3_contract.results import VerifyResult
from eagle3_contract.stages import Stage
from eagle3_pipeline.data.draft_checkpoint import (
    foreign_embeddings,
    load_serving_draft,
    mapping_problem,
    read_config,
    serving_weights,
    unservable_mapping,
)
from eagle3_pipeline.runtime.context import StageContext
from eagle3_pipeline.serving.requests import Measurement
from eagle3_pipeline.stage_main import run_stage
from eagle3_pipeline.stages.evaluate.program import measure
from eagle3_pipeline.stages.evaluate.prompts import held_out_prompts
from eagle3_pipeline.stages.evaluate.servers import ServerPool
from tests.pipeline.draft_support import (
    DATASET,
    VERIFIER,
    conversations,
    evaluate_spec,
    shared_draft,
    write_data_stage,
    write_train_stage,
    write_vocab_stage,
)
from tests.pipeline.manifests import write_manifest
from tests.pipeline.test_vllm_server import vllm_or_skip

SPEC_VERIFIER = f"/models/{VERIFIER}"  # as the spec names it: not a path on this machine
pytestmark = pytest.mark.pipeline


@dataclass(frozen=True)
class Export:
    code: int
    output: Path
    source: Path  # train's checkpoint_best
    result: dict[str, Any]


def export(root: Path, draft: Path, vocab_draft: Path | None = None) -> Export:
    """Run export on `draft` as train's output, with the vocab stage's mapping from `vocab_draft`."""
    art = root / "art"
    train = write_train_stage(art, draft)
    vocab = write_vocab_stage(art, vocab_draft or draft)
    manifest = write_manifest(root / "run.yaml", evaluate_spec())
    code = run_stage("export", str(manifest), str(art), "export/h", [f"train={train}", f"vocab={vocab}"])
    output = art / "export" / "h"
    result = json.loads((output / "result.json").read_text()) if code == 0 else {}
    return Export(code, output, art / train / "checkpoints" / "checkpoint_best", result)


def export_with_table(root: Path, draft: Path, evaluated: dict[str, Any]) -> Export:
    """Export with evaluation.sweep: evaluate's result (`evaluated`) is an input too."""
    art = root / "art"
    inputs = [f"train={write_train_stage(art, draft)}", f"vocab={write_vocab_stage(art, draft)}"]
    (art / "evaluate" / "h").mkdir(parents=True)
    (art / "evaluate" / "h" / "result.json").write_text(json.dumps(evaluated))
    spec = evaluate_spec(sweep={"numSpeculativeTokens": [1, 3]}, concurrencies=[1, 4])
    manifest = write_manifest(root / "run.yaml", spec)
    code = run_stage("export", str(manifest), str(art), "export/h", [*inputs, "evaluate=evaluate/h"])
    output = art / "export" / "h"
    result = json.loads((output / "result.json").read_text()) if code == 0 else {}
    return Export(code, output, art / "train" / "checkpoints" / "checkpoint_best", result)


def verify_pinned(export: Export, monkeypatch: pytest.MonkeyPatch) -> tuple[int, dict[str, Any]]:
    """`eagle3 stage verify` of the exported draft, pinned at its path and sha256."""
    art = export.output.parents[1]
    termination = art.parent / "termination-log"
    monkeypatch.setenv("EAGLE3_TERMINATION_LOG", str(termination))
    spec = evaluate_spec()
    spec["serving"] = {"pinnedCheckpoint": {"path": "export/h", "sha256": export.result["sha256"]}}
    manifest = write_manifest(art.parent / "pinned.yaml", spec)
    code = run_stage("verify", str(manifest), str(art), "verify/h", [])
    return code, json.loads(termination.read_text())


TABLE = SpeculationTable(
    cells=[
        SweepCell(num_speculative_tokens=k, concurrency=c, acceptance_length=1.5, output_tokens_per_second=t,
                  speedup=s)
        for k, c, t, s in ((1, 1, 30.0, 1.5), (1, 4, 60.0, 0.8), (3, 1, 24.0, 1.2), (3, 4, 50.0, 0.9))
    ],
    baselines=[BaselineCell(concurrency=1, output_tokens_per_second=20.0),
               BaselineCell(concurrency=4, output_tokens_per_second=75.0)],
)  # fmt: skip


def test_the_sweeps_table_travels_through_the_manifest_to_verify(
    tiny_models: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """evaluate's table goes into the exported manifest; verify reads it back for a pinned draft."""
    table = TABLE.model_copy(update={"schedule": plan_schedule(TABLE.cells)})
    document = table.model_dump(mode="json", by_alias=True)
    assert [r["numSpeculativeTokens"] for r in document["schedule"]] == [1, 0]
    draft = shared_draft(tiny_models, tmp_path_factory.getbasetemp(), fitted=False)
    done = export_with_table(tmp_path_factory.mktemp("swept"), draft, {"speculation": document})
    assert done.code == 0
    manifest = json.loads((done.output / "manifest.json").read_text())
    assert manifest["speculation"] == document
    assert sorted(manifest["files"]) == ["config.json", "config.py", "model.safetensors"]  # as before
    code, verified = verify_pinned(done, monkeypatch)
    assert code == 0 and verified["speculation"] == document
    parsed = VerifyResult.parse(verified)
    assert parsed is not None and parsed.speculation == table
    # a manifest edited by hand into a malformed table fails verify, naming it
    manifest["speculation"] = {
        "schedule": [{"minBatchSize": 0, "maxBatchSize": 4, "numSpeculativeTokens": 1}]
    }
    (done.output / "manifest.json").write_text(json.dumps(manifest))
    code, failed = verify_pinned(done, monkeypatch)
    assert code != 0 and "malformed speculation table" in json.dumps(failed)


def test_without_a_table_the_manifest_has_none_and_verify_says_null(
    exported: Export, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run without evaluation.sweep, or a manifest exported before it existed: nothing to serve tuned."""
    assert "speculation" not in json.loads((exported.output / "manifest.json").read_text())
    code, verified = verify_pinned(exported, monkeypatch)
    assert code == 0 and verified["speculation"] is None and verified["manifest"] is True


@pytest.fixture(scope="module")
def exported(tiny_models: Path, tmp_path_factory: pytest.TempPathFactory) -> Export:
    draft = shared_draft(tiny_models, tmp_path_factory.getbasetemp(), fitted=False)
    return export(tmp_path_factory.mktemp("export"), draft)


def test_the_export_keeps_what_vllm_needs_in_bf16(exported: Export) -> None:
    assert exported.code == 0
    files = sorted(p.name for p in exported.output.iterdir())
    assert files == ["config.json", "config.py", "manifest.json", "model.safetensors", "result.json"]
    full, slim = (
        load_file(str(exported.source / "model.safetensors")),
        load_file(str(exported.output / "model.safetensors")),
    )
    assert set(full) - set(slim) == {"embed_tokens.weight"} == set(exported.result["droppedTensors"])
    for name, tensor in slim.items():
        assert tensor.dtype == (full[name].dtype if name in ("d2t", "t2d") else torch.bfloat16)
        assert torch.equal(tensor, full[name].to(tensor.dtype)), name
    assert exported.result["droppedFiles"] == ["optimizer_state_dict.pt", "scheduler_state_dict.pt"]
    assert (exported.output / "model.safetensors").stat().st_mode & 0o044 == 0o044  # the serving pod reads it
    config = json.loads((exported.output / "config.json").read_text())
    assert config["speculators_config"]["verifier"]["name_or_path"] == SPEC_VERIFIER
    assert config["dtype"] == "bfloat16" and config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]


def test_the_manifest_and_the_result_carry_the_digests(exported: Export) -> None:
    manifest = json.loads((exported.output / "manifest.json").read_text())
    weights = (exported.output / "model.safetensors").read_bytes()
    assert manifest["sha256"] == exported.result["sha256"] == hashlib.sha256(weights).hexdigest()
    for name, entry in manifest["files"].items():
        data = (exported.output / name).read_bytes()
        assert entry == {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    assert sorted(manifest["files"]) == ["config.json", "config.py", "model.safetensors"]
    assert (
        exported.result["bytes"] == manifest["bytes"] == sum(f["bytes"] for f in manifest["files"].values())
    )
    assert manifest["verifier"] == SPEC_VERIFIER


def test_its_size_is_the_drafts_bf16_weights_and_the_mapping(exported: Export, tiny_models: Path) -> None:
    from speculators import SpeculatorModel

    r = exported.result
    model: Any = SpeculatorModel.from_pretrained(str(exported.source))  # its verifier is on this machine
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    head = model.lm_head.weight.numel()
    assert r["trainableParameters"] == trainable and r["draftHeadParameters"] == head
    d2t, t2d = model.d2t, model.t2d
    assert d2t is not None and t2d is not None
    mapping = d2t.numel() * 8 + t2d.numel()
    assert r["mappingBytes"] == mapping and r["expectedBytes"] == 2 * (trainable + head) + mapping
    assert r["ratio"] == pytest.approx(r["bytes"] / r["expectedBytes"], abs=1e-4) and r["ratio"] <= 1.05
    embeddings = model.embed_tokens.weight.numel() * 2  # train's frozen copy of the verifier's, in bf16
    assert r["sourceBytes"] - r["bytes"] > embeddings  # it is gone, and so is the optimizer state


def test_speculators_loads_the_export_given_the_verifier(exported: Export, tiny_models: Path) -> None:
    from speculators import SpeculatorModel

    # speculators reads the verifier at name_or_path (layer count, embeddings): /models/... is not here
    with pytest.raises(Exception, match="tiny-llama"):
        SpeculatorModel.from_pretrained(str(exported.output))
    verifier = tiny_models / VERIFIER
    state = load_serving_draft(exported.output, str(verifier)).state_dict()
    for name, tensor in load_file(str(exported.output / "model.safetensors")).items():
        assert torch.equal(state[name].to(tensor.dtype), tensor), name
    embeddings = load_file(str(verifier / "model.safetensors"))["model.embed_tokens.weight"]
    assert torch.equal(state["embed_tokens.weight"], embeddings.to(state["embed_tokens.weight"].dtype))


def test_the_dropped_embeddings_are_the_verifiers_whatever_memory_held(
    exported: Export, tiny_models: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """transformers 5 allocates the missing embeddings with torch.empty_like; speculators 0.9 fills them from
    the verifier only if that memory happens to hold a NaN. Memory without one is simulated here."""
    from speculators import SpeculatorModel
    from speculators.models.eagle3 import Eagle3SpeculatorConfig

    empty_like = torch.empty_like
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: empty_like(*a, **k).fill_(7.0))
    verifier = str(tiny_models / VERIFIER)
    config = Eagle3SpeculatorConfig.from_pretrained(str(exported.output))
    config.speculators_config.verifier.name_or_path = verifier
    plain: Any = SpeculatorModel.from_pretrained(str(exported.output), config=config)
    assert bool((plain.embed_tokens.weight == 7.0).all()), "speculators now fills them itself: simplify"
    model = load_serving_draft(exported.output, verifier)
    assert not bool((model.embed_tokens.weight == 7.0).any())


def test_a_draft_trained_on_another_mapping_is_refused(
    tiny_models: Path,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
) -> None:
    draft = shared_draft(tiny_models, tmp_path_factory.getbasetemp(), fitted=False)
    other = tmp_path / "other"
    other.mkdir()
    tensors = load_file(str(draft / "model.safetensors"))
    d2t, t2d = tensors["d2t"].clone(), tensors["t2d"].clone()
    moved = int(torch.nonzero(~t2d)[0])  # a token outside the draft vocabulary replaces the last one inside
    last = int(torch.nonzero(t2d)[-1])
    t2d[last], t2d[moved] = False, True
    d2t = torch.nonzero(t2d).flatten() - torch.arange(len(d2t))
    save_file({"d2t": d2t, "t2d": t2d}, str(other / "model.safetensors"))
    result = export(tmp_path, draft, vocab_draft=other)
    assert result.code == 1 and not result.output.exists()
    err = capsys.readouterr().err
    assert "carries another d2t/t2d mapping than the vocab stage's" in err and "re-run stage train" in err


def test_a_bloated_checkpoint_fails_loudly(
    tiny_models: Path,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
) -> None:
    draft = tmp_path / "draft"
    shutil.copytree(shared_draft(tiny_models, tmp_path_factory.getbasetemp(), fitted=False), draft)
    (draft / "config.py").write_text("# padding\n" * 20_000)  # 200 kB of config code the export copies
    result = export(tmp_path, draft)
    assert result.code == 1
    err = capsys.readouterr().err
    assert "more than 5% over" in err and "config.py" in err


def test_trained_embeddings_are_kept(tiny_models: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    draft = shared_draft(tiny_models, tmp_path_factory.getbasetemp(), fitted=False)
    config = read_config(draft)
    frozen = serving_weights(draft, config)
    trained = serving_weights(draft, config | {"embed_requires_grad": True})
    assert frozen.dropped == ["embed_tokens.weight"] and trained.dropped == []
    embeddings = trained.tensors["embed_tokens.weight"].numel()
    assert trained.trainable_parameters == frozen.trainable_parameters + embeddings


def test_mapping_checks_name_what_is_wrong() -> None:
    t2d = torch.zeros(16, dtype=torch.bool)
    t2d[[1, 4, 5, 9]] = True
    offsets = torch.arange(4)
    d2t = torch.tensor([1, 4, 5, 9]) - offsets
    assert mapping_problem(d2t, t2d, 16) is None and unservable_mapping(d2t, 16) is None
    shuffled = torch.tensor([4, 1, 9, 5]) - offsets
    assert unservable_mapping(shuffled, 16) is None  # vLLM serves it, to the wrong tokens
    problem = mapping_problem(shuffled, t2d, 16)
    assert problem is not None and "d2t maps 4 of 4 draft tokens elsewhere than t2d says" in problem
    assert "draft token 0 -> target 4, t2d's 0-th token is 1" in problem
    outside = torch.tensor([1, 4, 5, 20]) - offsets
    assert unservable_mapping(outside, 16) == (
        "d2t maps 1 draft tokens outside the verifier's vocabulary of 16 tokens"
    )
    assert unservable_mapping(torch.tensor([1, 4, 4, 9]) - offsets, 16) is not None
    assert "covers 16 target tokens, the verifier's vocabulary has 32" in str(mapping_problem(d2t, t2d, 32))
    assert "lacks d2t or t2d" in str(mapping_problem(None, t2d, 16))


def test_embeddings_of_another_verifier_are_noticed(
    tiny_models: Path, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    draft = shared_draft(tiny_models, tmp_path_factory.getbasetemp(), fitted=False)
    verifier = str(tiny_models / VERIFIER)
    assert foreign_embeddings(draft, verifier) is None  # made against this verifier
    assert foreign_embeddings(draft, SPEC_VERIFIER) is None  # not on this machine: not checked
    other = tmp_path / "other"
    shutil.copytree(draft, other)
    tensors = load_file(str(other / "model.safetensors"))
    tensors["embed_tokens.weight"][[3, 7]] += 1.0
    save_file(tensors, str(other / "model.safetensors"))
    problem = foreign_embeddings(other, verifier)
    assert problem == "2 of 1024 rows of the draft's copy of embed_tokens differ from the verifier's"


# --- with vLLM ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vllm_models(tiny_models: Path) -> Iterator[Path]:
    vllm = vllm_or_skip()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EAGLE3_VLLM", vllm)
        mp.setenv("EAGLE3_MODELS_ROOT", str(tiny_models))
        yield tiny_models


@pytest.mark.vllm
@pytest.mark.timeout(900)
def test_vllm_accepts_the_export_as_it_accepts_the_full_checkpoint(
    vllm_models: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    root = tmp_path_factory.mktemp("export-vllm")
    exported = export(root, shared_draft(vllm_models, tmp_path_factory.getbasetemp()))
    assert exported.code == 0
    art = root / "art"
    data = write_data_stage(art, conversations(vllm_models / DATASET))
    prompts = held_out_prompts(art / data / "conversations.jsonl", 16).prompts
    manifest = load_manifest(write_manifest(root / "run.yaml", evaluate_spec(prompts=16)))
    ctx = StageContext.of_spec(Stage.EVALUATE, manifest.name, manifest.spec, art, art / "evaluate" / "h")
    ctx.begin()
    with ServerPool(ctx) as pool:  # two drafts: two servers
        full, slim = (
            measure(ctx, pool, prompts, exported.source),
            measure(ctx, pool, prompts, exported.output),
        )
    assert full.outputs == slim.outputs and full.output_tokens == slim.output_tokens
    assert full.counters == slim.counters and accepted(full) > 0  # the same draft tokens, accepted alike
    log = (ctx.work / "vllm-draft.log").read_text()
    assert "embed_tokens identical to the target" in log  # the full checkpoint's copy was a duplicate
    assert "without its own embed_tokens" in log  # the slim one has none


def accepted(measurement: Measurement) -> float:
    assert measurement.counters is not None
    return measurement.counters.accepted
