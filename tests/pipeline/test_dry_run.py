"""`eagle3 run FILE --dry-run`: the stage plan and the estimates, nothing run, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from eagle3_cli.main import main as eagle3_main
from eagle3_pipeline.stage_main import run_stage
from tests.pipeline.chat_templates import save_verifier
from tests.pipeline.manifests import base_spec, chat, write_jsonl, write_manifest
from tests.tiny_spec import EXAMPLE


def dry_run(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    code = eagle3_main(["run", *args, "--dry-run"])
    out = capsys.readouterr().out
    assert code == 0, out
    return " ".join(out.split())  # rich wraps cells: compare words


@pytest.mark.pipeline
def test_the_tiny_example_prints_its_plan_and_estimates(
    tmp_path: Path, tiny_models: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    art = tmp_path / "art"
    out = dry_run(capsys, str(EXAMPLE), "--models", str(tiny_models), "--artifacts", str(art))
    assert not art.exists(), "a dry run writes nothing"
    for stage in ("prepare", "generate", "extract", "vocab", "train", "evaluate", "export"):
        assert f"│ {stage} │ run │" in out
    assert "│ verify │ skip │" in out
    # layers [1, 2, 3] and the last of a 128-wide verifier in bf16, with the int64 token id
    assert "hidden states per token: 1,032 B (4 layers x 128 x bfloat16 + token id)" in out
    assert "from the verifier's config (" in out
    # 400 rows, 256 of them tokenized with the verifier's chat template (regeneration rewrites the answers)
    assert "estimated: 256 of 400 rows tokenized with the verifier's chat template" in out
    assert "offline (this spec)" in out and "x6 training.epochs" in out


@pytest.mark.pipeline
def test_draft_candidates_show_what_each_one_trains_and_the_servers_evaluate_adds(
    tmp_path: Path, tiny_models: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["draft"] |= {"candidates": ["eagle3", "dflash"], "blockSize": 4}
    manifest = tmp_path / "candidates.yaml"
    manifest.write_text(yaml.safe_dump(doc))
    args = (str(manifest), "--models", str(tiny_models), "--artifacts", str(tmp_path / "art"))
    out = dry_run(capsys, *args)
    plain = dry_run(capsys, str(EXAMPLE), *args[1:])

    def train_tokens(text: str) -> int:  # the columns after the stage's: GPUs, pods, tokens, output
        return int(text.split("│ train │ run │")[1].split("│")[2].strip().replace(",", ""))

    train, alone = train_tokens(out), train_tokens(plain)
    assert train == 2 * alone  # both trained, in turn, from the same data
    each = f"{alone:,}"
    assert (
        f"draft.candidates eagle3, dflash: each trains {each} tokens on 0 GPUs in the train stage" in out
    ), out
    assert "draft.candidates" not in plain


@pytest.mark.pipeline
def test_a_prepared_output_makes_the_tokens_exact(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    verifier = save_verifier(tmp_path / "verifier")
    source = write_jsonl(tmp_path / "data.jsonl", [chat(i) for i in range(12)])
    spec = base_spec(verifier, source)
    spec["training"]["epochs"] = 3
    manifest = write_manifest(tmp_path / "run.yaml", spec)
    before = dry_run(capsys, str(manifest), "--artifacts", str(tmp_path / "art"))
    assert "counted: all 12 rows tokenized with the verifier's chat template" in before
    from eagle3_contract.api.manifest import load_manifest
    from eagle3_contract.stages import Stage, plan_stages

    plan = next(p for p in plan_stages(load_manifest(manifest).spec) if p.stage is Stage.PREPARE)
    assert run_stage("prepare", str(manifest), str(tmp_path / "art"), plan.output_dir, []) == 0
    result = json.loads((tmp_path / "art" / plan.output_dir / "result.json").read_text())
    assert (result["hiddenSize"], result["numHiddenLayers"]) == (32, 2)  # for status.plan.estimates
    after = dry_run(capsys, str(manifest), "--artifacts", str(tmp_path / "art"))
    assert "│ prepare │ reuse │" in after and "│ extract │ run │" in after
    assert f"tokens: {result['tokens']:,} (exact: from prepare's result)" in after
    # layers [1] and the last: 2 x 32 x 2 bytes + 8 = 136; hidden size from prepare's result
    assert (
        "hidden states per token: 136 B (2 layers x 32 x bfloat16 + token id); hidden size from prepare"
        in after
    )
    per_epoch = result["tokens"] * 136
    assert f"{per_epoch * 3 / 1000:.1f} kB" in after  # online: every epoch again


def test_a_hub_verifier_and_dataset_give_the_upper_bound_and_download_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty Hub cache
    spec = {
        "verifier": {"model": "moonshotai/Kimi-K2.5", "tensorParallelSize": 8},
        "dataset": {"source": "HuggingFaceH4/ultrachat_200k", "maxSamples": 1000, "maxSequenceLength": 4096},
        "extraction": {"mode": "online", "servers": 2},
        "training": {"gpus": 8, "nodes": 2},
    }
    out = dry_run(
        capsys, str(write_manifest(tmp_path / "run.yaml", spec)), "--artifacts", str(tmp_path / "a")
    )
    assert "tokens: 4,096,000 (upper bound from dataset.maxSamples x maxSequenceLength (1000 x 4096))" in out
    # the table of known verifiers: Kimi-K2.5's text config is 7168 wide (issue 29: "unknown" before)
    assert "hidden states per token: 57,352 B (4 layers x 7168 x bfloat16 + token id)" in out
    assert "from the table of known verifiers (huggingface.co/moonshotai/Kimi-K2.5" in out
    assert "│ train │ run │ 16 │ 2 │ 40,960,000 │ + 16 GPUs of" in out  # training.epochs 10
    assert "│ extract │ skip │ 0 │ 0 │ - │" in out and "online (this spec)" in out
    assert not (tmp_path / "a").exists() and not (tmp_path / "hf").exists()


def test_the_llama_example_is_sized_from_the_table_of_known_verifiers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 29: 50,000 samples x 4,096 tokens x (4 layers x 4096 x 2 B + an 8-byte token id) = 6.7 TB
    stored offline, which the example's volume must hold."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    example = Path(__file__).resolve().parents[2] / "examples" / "llama-3.1-8b.yaml"
    out = dry_run(capsys, str(example), "--artifacts", str(tmp_path / "a"))
    per_token = 4 * 4096 * 2 + 8
    assert f"hidden states per token: {per_token:,} B (4 layers x 4096 x bfloat16 + token id)" in out
    assert "tokens: 204,800,000 (upper bound" in out
    stored = 204_800_000 * per_token
    assert f"│ offline (this spec) │ {stored / 1e12:.1f} TB │" in out, out
    assert "│ serve │ serve │ 1 │ 1 │ - │" in out  # one replica of a one-GPU verifier
    assert not (tmp_path / "hf").exists(), "the table needs no download"


def test_the_kimi_example_shows_every_gpu_it_holds_serving_included(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 29: the Kimi example's 2 x 8 serving GPUs were missing; a canary's are shown beside them."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    example = Path(__file__).resolve().parents[2] / "examples" / "kimi-k2.5-tp8.yaml"
    out = dry_run(capsys, str(example), "--artifacts", str(tmp_path / "a"))
    assert "│ serve │ serve │ 16 │ 2 │ - │" in out and "│ canary │" not in out
    # online: train's 2 nodes of 8 and the 2 producers of 8 at once
    assert "│ train │ run │ 16 │ 2 │" in out and "+ 16 GPUs of hidden-state" in out
    assert "GPUs at once, at most: 32" in out
    doc = yaml.safe_load(example.read_text())
    doc["spec"]["serving"]["canary"] = {"replicas": 1}
    canary = tmp_path / "canary.yaml"
    canary.write_text(yaml.safe_dump(doc))
    out = dry_run(capsys, str(canary), "--artifacts", str(tmp_path / "a"))
    assert "│ canary │ serve │ 8 │ 1 │ - │" in out


def test_an_unknown_verifier_is_sized_from_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no network here: the Hub is not asked
    spec = {"verifier": {"model": "example-org/unknown-model"}, "dataset": {"source": "d", "maxSamples": 10}}
    manifest = str(write_manifest(tmp_path / "run.yaml", spec))
    out = dry_run(capsys, manifest, "--artifacts", str(tmp_path / "a"))
    assert "hidden states per token: unknown" in out and "give it with --hidden-size" in out
    out = dry_run(
        capsys, manifest, "--artifacts", str(tmp_path / "a"), "--hidden-size", "1024", "--layers", "16"
    )
    assert "hidden states per token: 8,200 B (4 layers x 1024 x bfloat16 + token id)" in out
    assert "given on the command line" in out
    with pytest.raises(SystemExit) as refused:
        eagle3_main(["run", manifest, "--hidden-size", "1024"])  # not a dry run
    assert refused.value.code == 2


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--layers", "80"], "--layers sizes a --dry-run's verifier together with --hidden-size"),
        (["--hidden-size", "1000000000000000", "--layers", "80"], "hidden size is at most 131,072"),
        (["--hidden-size", "8192", "--layers", "100000"], "layers is at most 1,024"),
    ],
)
def test_a_dry_runs_verifier_shape_is_whole_and_plausible(
    capsys: pytest.CaptureFixture[str], args: list[str], said: str
) -> None:
    """Issue 42, item 7: --layers without --hidden-size was ignored with rc 0, and a hidden size of 1e15
    printed estimates of 1638.4 EB."""
    with pytest.raises(SystemExit) as exited:
        eagle3_main(["run", str(EXAMPLE), "--dry-run", *args])
    assert exited.value.code == 2 and said in capsys.readouterr().err
