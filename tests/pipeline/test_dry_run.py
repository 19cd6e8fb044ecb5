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
        f"draft.candidates eagle3, dflash: each trained one trains {each} tokens on 0 GPUs in the train "
        "stage" in " ".join(out.split())
    ), out
    assert "draft.candidates" not in plain
    # a bake-off with a training-free rival trains one draft (ngram needs no training) and serves three
    doc["spec"]["draft"] = {"vocabSize": 512, "candidates": ["eagle3", "ngram"]}
    manifest.write_text(yaml.safe_dump(doc))
    rival = " ".join(dry_run(capsys, *args).split())
    assert train_tokens(rival) == alone
    assert "draft.candidates eagle3, ngram: evaluate serves eagle3, ngram beside the verifier alone" in rival
    assert "(3 vLLM servers at once) in 6 paired rounds" in rival


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
    assert "hidden states per token: unknown" in out and "give the shape with --hidden-size" in out
    # a Hub id, said as one: not the words of a local path (issue 42, item 7)
    assert "spec.verifier.model example-org/unknown-model is a Hub id whose config.json is neither" in out
    assert "does not exist" not in out
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


def _unknown_shape(out: str) -> str:
    """The dry run's 'hidden states per token: unknown (...): WHY' line's WHY."""
    line = out.split("hidden states per token: unknown (")[1].split(" GPUs at once")[0]
    return line.split("): ", 1)[1]


def test_a_local_verifier_whose_config_is_not_json_or_lacks_the_hidden_size_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 42, item 7: a malformed config.json read as "not in a local directory, the Hub cache, the Hub
    nor the table of known verifiers"."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    verifier = tmp_path / "verifier"
    verifier.mkdir()
    config = verifier / "config.json"
    config.write_text('{"hidden_size": 128,\n "num_hidden_layers": 2,,}\n')
    spec = {"verifier": {"model": str(verifier)}, "dataset": {"source": "d", "maxSamples": 10}}
    manifest = str(write_manifest(tmp_path / "run.yaml", spec))
    why = _unknown_shape(dry_run(capsys, manifest, "--artifacts", str(tmp_path / "a")))
    assert why.startswith(
        f"spec.verifier.model {verifier}: {config} is not valid JSON (Expecting property name enclosed in "
        "double quotes: line 2 column 25 (char 45)); a checkpoint's config.json is a JSON object with "
        "hidden_size and num_hidden_layers: fix or restore it, or give the shape with --hidden-size"
    ), why
    assert "Hub" not in why
    config.write_text('{"num_hidden_layers": 2, "text_config": {"vocab_size": 10}}')
    why = _unknown_shape(dry_run(capsys, manifest, "--artifacts", str(tmp_path / "a")))
    assert why.startswith(
        f"spec.verifier.model {verifier}: {config} has no positive hidden_size (nor has its text_config); "
        "add the checkpoint's own, or give the shape with --hidden-size"
    ), why
    config.write_text("[]")
    why = _unknown_shape(dry_run(capsys, manifest, "--artifacts", str(tmp_path / "a")))
    assert why.startswith(f"spec.verifier.model {verifier}: {config} is not a JSON object (it holds a list)")


def test_a_local_verifier_path_that_does_not_exist_is_said_to_be_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 42, item 7: distinct from a Hub id not in the cache; a path under /models names where it is
    looked for (--models)."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    missing = tmp_path / "no-such-verifier"
    for model, said in [
        (str(missing), f"spec.verifier.model {missing} does not exist on this machine (a path, not a Hub"),
        (
            "/models/llama",
            f"spec.verifier.model /models/llama (here {tmp_path / 'models' / 'llama'}) does not exist on "
            "this machine",
        ),
    ]:
        spec = {"verifier": {"model": model}, "dataset": {"source": "d", "maxSamples": 10}}
        manifest = str(write_manifest(tmp_path / "run.yaml", spec))
        args = ("--artifacts", str(tmp_path / "a"), "--models", str(tmp_path / "models"))
        why = _unknown_shape(dry_run(capsys, manifest, *args))
        assert why.startswith(said) and "correct the path (--models maps /models)" in why, why
        assert "Hub cache" not in why


def test_the_estimate_is_held_against_the_volume_and_the_disk_as_the_operator_and_a_run_hold_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 42, item 7: the dry run never compared its estimate with spec.storage.artifacts.size. 1,000 x
    4,096 tokens x (4 layers x 4,096 x 2 B + 8) = 134.3 GB offline."""
    from eagle3_pipeline.local import dry_run as dry_run_module

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(dry_run_module, "free_bytes", lambda _path: 10**15)  # a roomy disk
    shape = ("--hidden-size", "4096", "--layers", "32", "--artifacts", str(tmp_path / "a"))

    def out_with(storage: dict[str, str], mode: str = "offline") -> str:
        spec = {
            "verifier": {"model": "example-org/unknown-model"},
            "dataset": {"source": "d", "maxSamples": 1000, "maxSequenceLength": 4096},
            "extraction": {"mode": mode},
            "storage": {"artifacts": storage},
        }
        return dry_run(capsys, str(write_manifest(tmp_path / "run.yaml", spec)), *shape)

    out = out_with({"size": "100Gi"})
    assert (
        "storage: too small for the operator (it fails the run StorageTooSmall before extract): extract "
        "would store 134.3 GB of hidden states (4096000 tokens x 32776 B, upper bound from "
        "dataset.maxSamples x maxSequenceLength (1000 x 4096)), but the artifacts volume "
        "(spec.storage.artifacts.size 100Gi) holds 107.4 GB: set spec.storage.artifacts.size to at least "
        "126Gi (a claim the operator already created keeps its size: expand it with `kubectl patch pvc`"
    ) in out, out
    assert "too small for `eagle3 run`" not in out
    out = out_with({"size": "126Gi"})
    assert "storage: extract would store 134.3 GB; spec.storage.artifacts.size 126Gi (135.3 GB) holds it" in (
        out
    )
    assert "storage:" not in out_with({"size": "1Gi"}, mode="online")  # nothing stored: nothing to hold
    assert "spec.storage.artifacts.size" not in out_with({"claimName": "mine"})  # its size is the claim's
    monkeypatch.setattr(dry_run_module, "free_bytes", lambda _path: 10**9)  # 1 GB free here
    out = out_with({"size": "200Gi"})
    assert (
        "storage: too small for `eagle3 run` here (it stops before extract): extract would store 134.3 GB "
        "of hidden states (4096000 tokens x 32776 B, upper bound from dataset.maxSamples x "
        f"maxSequenceLength (1000 x 4096)), but the free space under {tmp_path / 'a'} holds 1.0 GB: free "
        "133.3 GB more on that disk, or give --artifacts a directory on a disk with 134.3 GB free"
    ) in out, out
    assert "kubectl" not in out.split("too small for `eagle3 run` here")[1]
