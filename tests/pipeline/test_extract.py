"""The extract stage, transformers backend: speculators' file format, layer ids, batching, resume, OOM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import save_file

from eagle3_pipeline.data.hidden_states import (
    Layout,
    default_aux_layers,
    file_name,
    plan_batches,
    resolve_aux_layers,
    scan_done,
)
from eagle3_pipeline.data.verifier import LocalVerifier
from eagle3_pipeline.runtime.context import work_dir_of
from eagle3_pipeline.runtime.errors import StageError
from eagle3_pipeline.stage_main import run_stage
from eagle3_pipeline.stages.extract.transformers_backend import TransformersExtractor, load_verifier
from tests.pipeline.extract_support import (
    EXTRACT_OUT,
    HIDDEN,
    LAYERS,
    MAX_LEN,
    PREPARE_OUT,
    build_tiny_llama,
    random_rows,
    reference_hidden_states,
    stage_args,
    write_manifest,
    write_prepared,
)

pytestmark = [pytest.mark.pipeline, pytest.mark.usefixtures("one_torch_thread")]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("verifier") / "tiny-llama")


@pytest.fixture
def rows() -> list[list[int]]:
    return random_rows(24, seed=1)


@pytest.fixture
def artifacts(tmp_path: Path, rows: list[list[int]]) -> Path:
    root = tmp_path / "artifacts"
    write_prepared(root, rows)
    return root


def extract(
    tmp_path: Path, model: Path, artifacts: Path, token_budget: int | None = None, **manifest: Any
) -> tuple[int, dict[str, Any]]:
    """Run `eagle3 stage extract` in this process; (exit code, result or {})."""
    spec = write_manifest(tmp_path / "run.yaml", model, **manifest)
    code = run_stage(
        "extract", str(spec), str(artifacts), EXTRACT_OUT, [f"prepare={PREPARE_OUT}"], token_budget
    )
    result_file = artifacts / EXTRACT_OUT / "result.json"
    return code, json.loads(result_file.read_text()) if result_file.exists() else {}


# --- layer ids -------------------------------------------------------------------------------------------


def test_default_layers_follow_speculators() -> None:
    assert default_aux_layers(32) == [2, 16, 29]
    assert resolve_aux_layers(None, 32) == (2, 16, 29)
    assert resolve_aux_layers([9, 0, 4], 10) == (0, 4, 9)  # vLLM collects them sorted


@pytest.mark.parametrize(
    ("layers", "n", "needle"),
    [
        (None, 4, "too few for the default"),
        ([1, 4], 4, "out of range"),  # id n is always stored: not an auxiliary id
        ([1, 9], 4, "out of range"),
        ([1, 1], 8, "repeats"),
    ],
)
def test_bad_layers_name_the_field(layers: list[int] | None, n: int, needle: str) -> None:
    with pytest.raises(StageError, match=r"spec\.extraction\.layers") as info:
        resolve_aux_layers(layers, n)
    assert needle in str(info.value)


def test_layer_ids_match_a_hand_computed_forward(tiny_model: Path) -> None:
    """id i = input of decoder layer i (0 = embeddings), id n = last layer's output BEFORE the final norm."""
    from transformers import AutoModelForCausalLM

    ids = random_rows(1, seed=7, lengths=(20, 20))[0]
    layer_ids = [0, 1, 3, LAYERS]
    expected = reference_hidden_states(tiny_model, ids, layer_ids)
    layout = Layout((0, 1, 3), LAYERS, HIDDEN, "bfloat16")
    extractor = TransformersExtractor(
        load_verifier(LocalVerifier(str(tiny_model), None, False), _cpu()), layout
    )
    got = extractor.forward([ids])[0]
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)

    # transformers' own hidden_states[-1] is after the final norm: not what vLLM (and speculators) store
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    with torch.no_grad():
        hs = model(torch.tensor([ids]), output_hidden_states=True).hidden_states
    for k, layer in enumerate(layer_ids[:-1]):
        torch.testing.assert_close(got[:, k], hs[layer][0], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(got[:, -1], hs[LAYERS][0], atol=1e-3)
    torch.testing.assert_close(model.model.norm(got[:, -1]), hs[LAYERS][0], atol=1e-5, rtol=1e-5)


def test_stage_files_hold_the_hand_computed_layers(
    tmp_path: Path, tiny_model: Path, artifacts: Path, rows: list[list[int]]
) -> None:
    code, result = extract(tmp_path, tiny_model, artifacts, layers=[2, 0])
    assert code == 0
    assert result["layers"] == [0, 2, LAYERS]
    for i in (0, 5, len(rows) - 1):
        with safe_open(str(artifacts / EXTRACT_OUT / file_name(i)), framework="pt") as f:
            hidden = f.get_tensor("hidden_states")
        expected = reference_hidden_states(tiny_model, rows[i], [0, 2, LAYERS])
        assert hidden.dtype == torch.bfloat16
        torch.testing.assert_close(hidden.float(), expected, atol=2e-2, rtol=2e-2)


# --- speculators reads the files -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_speculators_trainer_reads_the_files(
    tmp_path: Path, tiny_model: Path, artifacts: Path, rows: list[list[int]], dtype: str
) -> None:
    from hs_connectors import FileTransfer
    from speculators.train.data import ArrowDataset, CollateFn

    code, result = extract(tmp_path, tiny_model, artifacts, layers=[1, 2], dtype=dtype)
    assert code == 0, result
    out = artifacts / EXTRACT_OUT
    tokens = sum(map(len, rows))
    assert result["samples"] == len(rows) and result["tokens"] == tokens and result["resumed"] == 0
    assert result["layers"] == [1, 2, LAYERS] and result["hiddenSize"] == HIDDEN and result["dtype"] == dtype
    assert result["bytes"] == sum(p.stat().st_size for p in out.glob("hs_*.safetensors"))
    assert result["bytesPerToken"] >= 3 * HIDDEN * 2 + 8  # 3 layers x hidden x 2 bytes + one int64 id
    metadata = json.loads((out / "metadata.json").read_text())
    assert metadata["layers"] == [1, 2, LAYERS] and metadata["transfer"] == "file"
    assert metadata["samples"] == len(rows) and metadata["tokens"] == tokens

    raw = FileTransfer(out).get_cached(3)
    assert raw is not None and raw["hidden_states"].shape == (len(rows[3]), 3, HIDDEN)
    assert raw["hidden_states"].dtype == getattr(torch, dtype) and raw["token_ids"].dtype == torch.int64

    n_train = len(rows) - max(1, int(len(rows) * 0.2))
    ratio = n_train / len(rows)
    train = ArrowDataset(
        MAX_LEN, datapath=artifacts / "prepare/h/data", transfer=FileTransfer(out), on_missing="raise",
        train_ratio=ratio,
    )  # fmt: skip
    val = ArrowDataset(
        MAX_LEN, datapath=artifacts / "prepare/h/data", transfer=FileTransfer(out), on_missing="raise",
        train_ratio=ratio, split="val",
    )  # fmt: skip
    assert len(train) + len(val) == len(rows)
    items = [train[i] for i in range(len(train))] + [val[i] for i in range(len(val))]
    for i, item in enumerate(items):
        stored = FileTransfer(out).get_cached(i)
        assert stored is not None
        assert item["input_ids"].tolist() == rows[i]
        assert item["hidden_states"].shape == (len(rows[i]), 2 * HIDDEN)
        torch.testing.assert_close(item["hidden_states"], stored["hidden_states"][:, :-1].flatten(1))
        torch.testing.assert_close(item["verifier_last_hidden_states"], stored["hidden_states"][:, -1])
    batch = CollateFn(2 * MAX_LEN, HIDDEN, num_target_layers=2)(items[:3])
    assert batch["hidden_states"].shape == (1, 2 * MAX_LEN, 2 * HIDDEN)
    assert batch["verifier_last_hidden_states"].shape == (1, 2 * MAX_LEN, HIDDEN)


def test_fp8_files_are_what_fp8transfer_dequantizes(
    tmp_path: Path, tiny_model: Path, artifacts: Path, rows: list[list[int]]
) -> None:
    from hs_connectors import FP8Transfer
    from speculators.train.data import ArrowDataset

    code, result = extract(tmp_path, tiny_model, artifacts, layers=[1, 2], dtype="fp8")
    assert code == 0 and result["transfer"] == "fp8"
    assert result["bytesPerToken"] < 3 * HIDDEN * 2  # about half of bf16
    out = artifacts / EXTRACT_OUT
    with safe_open(str(out / file_name(0)), framework="pt") as f:
        assert f.get_slice("hidden_states").get_dtype() == "F8_E4M3"
        assert f.get_slice("hidden_states_scales").get_shape() == [len(rows[0]), 1, 1]
    for i in (0, 7):
        sample = FP8Transfer(out, dequantize_dtype=torch.float32).get_cached(i)
        assert sample is not None and "hidden_states_scales" not in sample
        expected = reference_hidden_states(tiny_model, rows[i], [1, 2, LAYERS])
        amax = expected.abs().amax(dim=(1, 2), keepdim=True)
        assert ((sample["hidden_states"] - expected).abs() <= 0.07 * amax).all()
    dataset = ArrowDataset(
        MAX_LEN, datapath=artifacts / "prepare/h/data", transfer=FP8Transfer(out), on_missing="raise"
    )
    assert dataset[0]["hidden_states"].shape == (len(rows[0]), 2 * HIDDEN)


# --- batching by token budget ----------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(min_value=1, max_value=64), min_size=0, max_size=60),
    budget=st.integers(min_value=64, max_value=1000),
)
def test_batches_fit_the_budget_and_cover_every_row(lengths: list[int], budget: int) -> None:
    pairs = list(enumerate(lengths))
    batches = plan_batches(pairs, budget)
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
    for batch in batches:
        assert len(batch) * max(lengths[i] for i in batch) <= budget
    # greedy and longest-first: no two consecutive batches could have been one
    for a in batches[:-1]:
        assert (len(a) + 1) * max(lengths[i] for i in a) > budget


def test_a_row_longer_than_the_budget_is_a_clear_error() -> None:
    with pytest.raises(StageError, match=r"row 1 has 80 tokens.*spec.extraction.tokenBudget"):
        plan_batches([(0, 10), (1, 80), (2, 70)], 64)


def test_padding_does_not_change_hidden_states(tiny_model: Path) -> None:
    rows = random_rows(5, seed=3, lengths=(3, 40))
    layout = Layout((0, 2), LAYERS, HIDDEN, "bfloat16")
    extractor = TransformersExtractor(
        load_verifier(LocalVerifier(str(tiny_model), None, False), _cpu()), layout
    )
    batched = extractor.forward(rows)
    assert batched.shape == (5, max(map(len, rows)), 3, HIDDEN)
    for k, ids in enumerate(rows):
        single = extractor.forward([ids])[0]
        torch.testing.assert_close(batched[k, : len(ids)], single, atol=1e-5, rtol=1e-5)


def test_budget_shapes_the_batches(
    tmp_path: Path, tiny_model: Path, artifacts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[int, int]] = []
    forward = TransformersExtractor.forward

    def spy(self: TransformersExtractor, batch: list[list[int]]) -> torch.Tensor:
        seen.append((len(batch), max(map(len, batch))))
        return forward(self, batch)

    monkeypatch.setattr(TransformersExtractor, "forward", spy)
    code, result = extract(tmp_path, tiny_model, artifacts, token_budget=100, layers=[1, 2])
    assert code == 0 and result["tokenBudget"] == 100
    assert all(rows * longest <= 100 for rows, longest in seen)
    assert sum(rows for rows, _ in seen) == result["samples"]


# --- resume, out-of-memory, bad input --------------------------------------------------------------------


def test_resume_after_a_killed_stage(tmp_path: Path, tiny_model: Path) -> None:
    """SIGKILL mid-run; the rerun keeps every complete file (same inode, mtime) and replaces damaged ones."""
    artifacts = tmp_path / "artifacts"
    rows = random_rows(600, seed=5, lengths=(40, MAX_LEN))
    write_prepared(artifacts, rows)
    spec = write_manifest(tmp_path / "run.yaml", tiny_model, layers=[1, 2])
    work = work_dir_of(artifacts / EXTRACT_OUT)
    argv = [
        sys.executable,
        "-m",
        "eagle3_cli",
        "stage",
        "extract",
        *stage_args(spec, artifacts, MAX_LEN),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        deadline = time.monotonic() + 90
        while len(list(work.glob("hs_*.safetensors"))) < 20:
            assert proc.poll() is None, "the stage ended before it could be killed"
            assert time.monotonic() < deadline, "no hidden-state files appeared"
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not (artifacts / EXTRACT_OUT).exists()
    files = sorted(work.glob("hs_*.safetensors"))
    assert 20 <= len(files) < len(rows)
    damaged, kept = files[0], files[1:]
    damaged.write_bytes(damaged.read_bytes()[:100])  # a truncated file at its final name
    (work / "hs_7.safetensors.tmp").write_bytes(b"half")  # a write the kill interrupted
    before = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in kept}

    code, result = extract(tmp_path, tiny_model, artifacts, token_budget=MAX_LEN, layers=[1, 2])
    assert code == 0
    assert result["resumed"] == len(kept)
    assert result["extractedSamples"] == len(rows) - len(kept)
    out = artifacts / EXTRACT_OUT
    after = {name: ((out / name).stat().st_ino, (out / name).stat().st_mtime_ns) for name in before}
    assert after == before
    assert len(list(out.glob("hs_*.safetensors"))) == len(rows)
    assert not list(out.glob("*.tmp"))
    with safe_open(str(out / damaged.name), framework="pt") as f:
        assert f.get_slice("token_ids").get_shape()[0] > 0


def test_out_of_memory_exits_86_keeps_files_and_a_half_budget_retry_finishes(
    tmp_path: Path, tiny_model: Path, artifacts: Path, rows: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = {"n": 0}
    forward = TransformersExtractor.forward

    def flaky(self: TransformersExtractor, batch: list[list[int]]) -> torch.Tensor:
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return forward(self, batch)

    termination = tmp_path / "termination-log"
    monkeypatch.setenv("EAGLE3_TERMINATION_LOG", str(termination))
    monkeypatch.setattr(TransformersExtractor, "forward", flaky)
    code, _ = extract(tmp_path, tiny_model, artifacts, token_budget=128, layers=[1, 2])
    assert code == 86
    assert json.loads(termination.read_text())["oom"] is True
    assert not (artifacts / EXTRACT_OUT).exists()
    kept = sorted(work_dir_of(artifacts / EXTRACT_OUT).glob("hs_*.safetensors"))
    assert kept  # the two batches before the failure

    monkeypatch.setattr(TransformersExtractor, "forward", forward)
    code, result = extract(tmp_path, tiny_model, artifacts, token_budget=64, layers=[1, 2])
    assert code == 0
    assert result["resumed"] == len(kept) and result["tokenBudget"] == 64
    assert len(list((artifacts / EXTRACT_OUT).glob("hs_*.safetensors"))) == len(rows)


def test_missing_input_is_a_clear_error_and_leaves_no_output(
    tmp_path: Path, tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    artifacts = tmp_path / "artifacts"
    spec = write_manifest(tmp_path / "run.yaml", tiny_model, layers=[1, 2])
    code = run_stage("extract", str(spec), str(artifacts), EXTRACT_OUT, ["prepare=prepare/h"])
    assert code == 1
    assert "input prepare" in capsys.readouterr().err
    assert not (artifacts / EXTRACT_OUT).exists() and not work_dir_of(artifacts / EXTRACT_OUT).exists()


@pytest.mark.parametrize(
    ("manifest", "budget", "needle"),
    [
        ({"layers": [1, 7]}, None, "ids [7] are beyond the verifier's 4 decoder layers"),
        ({}, None, "too few for the default auxiliary layers"),
        ({"layers": [1, 2]}, 32, "longer than the token budget 32"),
    ],
)
def test_bad_spec_is_a_clear_error_and_leaves_no_output(
    tmp_path: Path,
    tiny_model: Path,
    artifacts: Path,
    capsys: pytest.CaptureFixture[str],
    manifest: dict[str, Any],
    budget: int | None,
    needle: str,
) -> None:
    code, _ = extract(tmp_path, tiny_model, artifacts, token_budget=budget, **manifest)
    assert code == 1
    assert needle in capsys.readouterr().err
    assert not (artifacts / EXTRACT_OUT).exists() and not work_dir_of(artifacts / EXTRACT_OUT).exists()


def test_scan_keeps_complete_files_and_removes_the_rest(tmp_path: Path) -> None:
    layout = Layout((1,), 2, 8, "bfloat16")

    def sample(tokens: int, layers: int = 2) -> dict[str, torch.Tensor]:
        return {
            "hidden_states": torch.zeros(tokens, layers, 8, dtype=torch.bfloat16),
            "token_ids": torch.zeros(tokens, dtype=torch.int64),
        }

    save_file(sample(5), str(tmp_path / file_name(0)))
    save_file(sample(4), str(tmp_path / file_name(1)))  # the row has 5 tokens
    save_file(sample(5, layers=3), str(tmp_path / file_name(2)))  # another layout
    (tmp_path / file_name(3)).write_bytes((tmp_path / file_name(0)).read_bytes()[:-3])  # truncated
    save_file(sample(5), str(tmp_path / file_name(9)))  # no such row
    (tmp_path / "hs_4.safetensors.tmp").write_bytes(b"")
    (tmp_path / "vllm.log").write_text("kept")
    assert scan_done(tmp_path, [5, 5, 5, 5, 5], layout) == {0}
    assert sorted(p.name for p in tmp_path.iterdir()) == [file_name(0), "vllm.log"]


def _cpu() -> torch.device:
    return torch.device("cpu")
