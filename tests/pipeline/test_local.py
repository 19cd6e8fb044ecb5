"""The local executor: a bad manifest fails before any stage, OOM retries halve the budget, resume skips."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from eagle3_contract.api.manifest import load_manifest
from eagle3_contract.results import ExtractResult
from eagle3_contract.stages import Stage, plan_stages
from eagle3_pipeline.local import LocalOptions, run_stage_with_retries
from tests.pipeline.chat_templates import save_verifier
from tests.pipeline.manifests import base_spec, chat, write_jsonl, write_manifest


def eagle3(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "eagle3_cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        check=False,
    )


def test_a_bad_manifest_fails_before_any_stage_naming_the_field(tmp_path: Path) -> None:
    spec = base_spec(tmp_path / "m", tmp_path / "d.jsonl")
    spec["training"]["epochs"] = 0
    spec["dataset"]["format"] = "csv"
    path = write_manifest(tmp_path / "bad.yaml", spec)
    proc = eagle3("run", str(path), "--artifacts", str(tmp_path / "art"))
    assert proc.returncode == 2
    assert "spec.training.epochs" in proc.stderr and "spec.dataset.format" in proc.stderr
    assert not (tmp_path / "art").exists()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("kind: Deployment\napiVersion: apps/v1\n", "exactly one document of kind Eagle3Run"),
        ("apiVersion: eagle3.dev/v2\nkind: Eagle3Run\nmetadata: {name: x}\nspec: {}\n", "this version reads"),
        ("apiVersion: eagle3.dev/v1alpha1\nkind: Eagle3Run\nspec: {}\n", "metadata.name"),
        ("{[", "not valid YAML"),
    ],
)
def test_manifests_that_are_not_a_run_are_refused(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "m.yaml").write_text(text)
    proc = eagle3("run", str(tmp_path / "m.yaml"))
    assert proc.returncode == 2 and message in proc.stderr


FAKE_STAGE = """#!{python}
import json, os, sys
args = sys.argv[1:]
budget = int(args[args.index("--token-budget") + 1])
with open(os.environ["CALLS"], "a") as f:
    f.write(str(budget) + "\\n")
if budget > int(os.environ["FITS"]):
    sys.exit(86)
out = os.path.join(args[args.index("--artifacts") + 1], args[args.index("--output") + 1])
os.makedirs(out)
json.dump({{"tokenBudget": budget}}, open(os.path.join(out, "result.json"), "w"))
"""


@pytest.mark.parametrize(
    ("fits", "calls", "status"), [(600, [2048, 1024, 512], "done"), (100, [2048, 1024, 512, 256], "failed")]
)
def test_out_of_memory_retries_at_half_the_budget_down_to_the_sequence_length(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fits: int, calls: list[int], status: str
) -> None:
    spec = base_spec(tmp_path / "m", tmp_path / "d.jsonl", maxSequenceLength=256)
    spec["extraction"]["tokenBudget"] = 2048
    manifest = load_manifest(write_manifest(tmp_path / "run.yaml", spec))
    plan = next(p for p in plan_stages(manifest.spec) if p.stage == Stage.EXTRACT)
    fake = tmp_path / "python"
    fake.write_text(FAKE_STAGE.format(python=sys.executable))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("CALLS", str(tmp_path / "calls"))
    monkeypatch.setenv("FITS", str(fits))
    options = LocalOptions(artifacts=tmp_path / "art", python=str(fake))
    outcome = run_stage_with_retries(plan, manifest.path, options, manifest.spec, dict(os.environ))
    assert [int(x) for x in (tmp_path / "calls").read_text().split()] == calls
    assert outcome.status == status and outcome.attempts == len(calls)
    if status == "failed":
        assert "halving stops at 256" in outcome.note
    else:
        assert outcome.result == ExtractResult(token_budget=512)  # result.json, typed


def test_an_attempt_past_the_stage_deadline_fails_as_in_a_cluster(tmp_path: Path) -> None:
    """spec.stages.<stage>.activeDeadlineSeconds is the Job's deadline and the local attempt's timeout."""
    spec = base_spec(tmp_path / "m", tmp_path / "d.jsonl", maxSequenceLength=256)
    spec["stages"] = {"vocab": {"activeDeadlineSeconds": 1}}
    manifest = load_manifest(write_manifest(tmp_path / "run.yaml", spec))
    plan = next(p for p in plan_stages(manifest.spec) if p.stage == Stage.VOCAB)
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\nexec sleep 30\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    options = LocalOptions(artifacts=tmp_path / "art", python=str(fake))
    outcome = run_stage_with_retries(plan, manifest.path, options, manifest.spec, dict(os.environ))
    assert outcome.status == "failed" and outcome.seconds < 20
    assert (
        outcome.note.startswith("DeadlineExceeded")
        and "stages.vocab.activeDeadlineSeconds (1 s)" in outcome.note
    )


@pytest.mark.pipeline
def test_a_second_run_skips_complete_stages_and_an_edit_reruns_only_what_it_changes(tmp_path: Path) -> None:
    verifier = save_verifier(tmp_path / "verifier")
    source = write_jsonl(tmp_path / "d.jsonl", [chat(i) for i in range(12)])
    spec = base_spec(verifier, source)
    path = write_manifest(tmp_path / "run.yaml", spec)
    first = eagle3("run", str(path), "--artifacts", str(tmp_path / "art"), "--until", "vocab")
    assert first.returncode == 0, first.stderr
    second = eagle3("run", str(path), "--artifacts", str(tmp_path / "art"), "--until", "vocab")
    assert second.returncode == 0
    assert second.stderr.count("cached") == 3 and "==> stage" not in second.stderr
    spec["draft"]["vocabSize"] = 48
    write_manifest(path, spec)
    third = eagle3("run", str(path), "--artifacts", str(tmp_path / "art"), "--until", "vocab")
    assert third.returncode == 0
    assert third.stderr.count("==> stage") == 1 and "==> stage vocab" in third.stderr
    vocab_dirs = sorted(p.name for p in (tmp_path / "art" / "vocab").iterdir() if not p.name.startswith("."))
    assert len(vocab_dirs) == 2
    results = [json.loads((tmp_path / "art" / "vocab" / d / "result.json").read_text()) for d in vocab_dirs]
    assert sorted(r["draftVocabSize"] for r in results) == [32, 48]
