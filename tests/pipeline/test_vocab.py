"""The vocab stage: speculators' d2t/t2d mapping from token frequencies, with coverage and clear failures."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from eagle3_pipeline.stage_main import run_stage
from tests.pipeline.chat_templates import save_verifier
from tests.pipeline.manifests import base_spec, chat, write_jsonl, write_manifest

pytestmark = pytest.mark.pipeline


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("vocab")
    verifier = save_verifier(root / "verifier")
    source = write_jsonl(root / "data.jsonl", [chat(i, turns=2) for i in range(40)])
    spec_path = write_manifest(root / "run.yaml", base_spec(verifier, source))
    assert run_stage("prepare", str(spec_path), str(root / "art"), "prepare/p", []) == 0
    return root


def vocab(root: Path, size: int, out: str = "vocab/v") -> tuple[int, Path]:
    spec = base_spec(root / "verifier", root / "data.jsonl")
    spec["draft"]["vocabSize"] = size
    spec_path = write_manifest(root / f"run-{size}.yaml", spec)
    code = run_stage("vocab", str(spec_path), str(root / "art"), out, ["prepare=prepare/p"])
    return code, root / "art" / out


def result_of(out: Path) -> dict[str, Any]:
    value: dict[str, Any] = json.loads((out / "result.json").read_text())
    return value


def test_the_mapping_keeps_the_most_frequent_assistant_tokens(prepared: Path) -> None:
    code, out = vocab(prepared, 16, "vocab/a")
    assert code == 0
    d2t, t2d = np.load(out / "d2t-16.npy"), np.load(out / "t2d-16.npy")
    freq: dict[int, int] = torch.load(prepared / "art" / "prepare" / "p" / "token_freq.pt")
    target = d2t + np.arange(16)
    assert t2d.dtype == bool and t2d.sum() == 16 and t2d[target].all()
    assert list(target) == sorted(target)
    top = sorted(freq, key=lambda t: (-freq[t], t))[:16]
    assert set(top) <= set(target.tolist()), "every frequent assistant token is in the draft vocabulary"
    result = result_of(out)
    covered = sum(freq[t] for t in top) / sum(freq.values())
    assert result["coverage"] == pytest.approx(covered, abs=1e-6)
    assert result["targetVocabSize"] == len(t2d)
    assert (result["d2t"], result["t2d"]) == ("d2t-16.npy", "t2d-16.npy")


def test_a_vocabulary_larger_than_the_assistant_tokens_is_padded_and_covers_all(prepared: Path) -> None:
    code, out = vocab(prepared, 128, "vocab/b")
    assert code == 0
    result = result_of(out)
    assert result["coverage"] == 1.0 and result["uniqueCoverage"] == 1.0
    assert np.load(out / "t2d-128.npy").sum() == 128


def test_a_vocabulary_larger_than_the_verifiers_fails(
    prepared: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = vocab(prepared, 100_000, "vocab/c")
    assert code == 1 and not out.exists()
    assert "larger than the verifier's vocabulary" in capsys.readouterr().err


def test_missing_frequencies_fail_instead_of_falling_back_to_the_full_vocabulary(
    prepared: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = prepared / "art" / "prepare" / "nofreq"
    shutil.copytree(prepared / "art" / "prepare" / "p", broken)
    (broken / "token_freq.pt").unlink()
    spec_path = write_manifest(
        prepared / "run-x.yaml", base_spec(prepared / "verifier", prepared / "data.jsonl")
    )
    code = run_stage("vocab", str(spec_path), str(prepared / "art"), "vocab/d", ["prepare=prepare/nofreq"])
    assert code == 1 and not (prepared / "art" / "vocab" / "d").exists()
    assert "silently use the full target vocabulary" in capsys.readouterr().err


def test_an_incomplete_input_is_refused(prepared: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec_path = write_manifest(
        prepared / "run-y.yaml", base_spec(prepared / "verifier", prepared / "data.jsonl")
    )
    code = run_stage("vocab", str(spec_path), str(prepared / "art"), "vocab/e", ["prepare=prepare/missing"])
    assert code == 1
    assert "not a complete stage output" in capsys.readouterr().err
