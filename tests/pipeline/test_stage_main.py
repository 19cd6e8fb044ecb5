"""`eagle3 stage`'s lifecycle: only an output with its result marker is complete, one writer per output."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from eagle3_pipeline import stage_main
from eagle3_pipeline.runtime.context import StageContext, is_complete
from tests.pipeline.manifests import base_spec, write_manifest


def fake_program(calls: list[str]) -> Any:
    """A prepare program that writes one file into its work directory and reports one sample."""

    def run(ctx: StageContext[Any, Any]) -> dict[str, Any]:
        calls.append(str(ctx.work))
        (ctx.work / "data.txt").write_text("rows\n")
        return {"samples": 1}

    return run


@pytest.fixture
def spec_path(tmp_path: Path) -> Path:
    return write_manifest(tmp_path / "run.yaml", base_spec(tmp_path / "m", tmp_path / "d.jsonl"))


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    made: list[str] = []
    monkeypatch.setattr(stage_main, "program", lambda stage: fake_program(made))
    return made


def test_an_existing_empty_output_is_moved_aside_and_the_stage_runs(
    tmp_path: Path, spec_path: Path, calls: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    """`mkdir -p A/prepare/x && eagle3 stage prepare --output prepare/x` used to succeed writing nothing."""
    out = tmp_path / "art" / "prepare" / "x"
    out.mkdir(parents=True)
    (out / "stray").write_text("half-copied\n")
    code = stage_main.run_stage("prepare", str(spec_path), str(tmp_path / "art"), "prepare/x", [])
    assert code == 0 and len(calls) == 1
    assert is_complete(out) and (out / "data.txt").read_text() == "rows\n"
    assert json.loads((out / "result.json").read_text())["samples"] == 1
    aside = [p for p in out.parent.iterdir() if p.name.startswith(".x.incomplete-")]
    assert len(aside) == 1 and (aside[0] / "stray").read_text() == "half-copied\n"
    assert str(aside[0]) in caplog.text and "not a complete stage output" in caplog.text


def test_a_complete_output_found_at_commit_is_kept(
    tmp_path: Path, spec_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another attempt that finished first (same content hash) wins; this attempt's work is dropped."""
    out = tmp_path / "art" / "prepare" / "x"

    def run(ctx: StageContext[Any, Any]) -> dict[str, Any]:
        out.mkdir(parents=True)
        (out / "result.json").write_text(json.dumps({"samples": 7}))
        (ctx.work / "data.txt").write_text("mine\n")
        return {"samples": 1}

    monkeypatch.setattr(stage_main, "program", lambda stage: run)
    assert stage_main.run_stage("prepare", str(spec_path), str(tmp_path / "art"), "prepare/x", []) == 0
    assert json.loads((out / "result.json").read_text()) == {"samples": 7}
    assert not (out / "data.txt").exists() and not (out.parent / ".x.partial").exists()


def test_an_output_made_incomplete_during_the_run_is_set_aside_at_commit(
    tmp_path: Path, spec_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "art" / "prepare" / "x"

    def run(ctx: StageContext[Any, Any]) -> dict[str, Any]:
        out.mkdir(parents=True)  # e.g. a copy in progress, no marker
        (ctx.work / "data.txt").write_text("mine\n")
        return {"samples": 1}

    monkeypatch.setattr(stage_main, "program", lambda stage: run)
    assert stage_main.run_stage("prepare", str(spec_path), str(tmp_path / "art"), "prepare/x", []) == 0
    assert is_complete(out) and (out / "data.txt").read_text() == "mine\n"
    assert any(p.name.startswith(".x.incomplete-") for p in out.parent.iterdir())


def test_a_stage_error_names_the_stage_once(
    tmp_path: Path, spec_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`stage extract` errors used to print 'stage extract: stage extract: ...'."""
    code = stage_main.run_stage(
        "extract", str(spec_path), str(tmp_path / "art"), "extract/e", ["prepare=prepare/missing"]
    )
    err = capsys.readouterr().err
    assert code == 1 and "not a complete stage output" in err
    assert err.count("stage extract") == 1, err


def test_a_second_writer_is_refused_while_the_first_holds_the_lock(
    tmp_path: Path, spec_path: Path, calls: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from eagle3_pipeline.runtime.locks import hold_output_lock

    out = tmp_path / "art" / "prepare" / "x"
    with hold_output_lock(out) as lock:
        code = stage_main.run_stage("prepare", str(spec_path), str(tmp_path / "art"), "prepare/x", [])
    assert code == 1 and calls == []
    assert f"holds the lock {lock}" in capsys.readouterr().err
    assert stage_main.run_stage("prepare", str(spec_path), str(tmp_path / "art"), "prepare/x", []) == 0


def test_a_failed_stages_log_is_kept_where_its_message_says(
    tmp_path: Path, spec_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """generate's failure named `generate/.<hash>.partial/vllm.log`, which the failure had just deleted."""
    from eagle3_pipeline.runtime.errors import StageError

    def run(ctx: StageContext[Any, Any]) -> dict[str, Any]:
        (ctx.work / "vllm.log").write_text("engine core died: bad flag\n")
        (ctx.work / "rows.bin").write_bytes(b"x" * 10)
        raise StageError(
            f"the vLLM server exited with code 1 (log: {ctx.work / 'vllm.log'}); last lines: ..."
        )

    monkeypatch.setattr(stage_main, "program", lambda stage: run)
    code = stage_main.run_stage("prepare", str(spec_path), str(tmp_path / "art"), "prepare/x", [])
    err = capsys.readouterr().err
    assert code == 1 and not (tmp_path / "art" / "prepare" / ".x.partial").exists()
    kept = tmp_path / "art" / "prepare" / ".x.failed" / "vllm.log"
    assert f"(log: {kept})" in err, err
    assert kept.read_text() == "engine core died: bad flag\n"
    assert not (kept.parent / "rows.bin").exists(), "only the logs are kept, not the partial data"


def test_a_long_result_keeps_the_speculation_schedule_in_the_termination_message() -> None:
    cells = [
        {"numSpeculativeTokens": k, "concurrency": c, "acceptanceLength": 2.123456, "speedup": 1.234567}
        for k in range(1, 8)
        for c in (1, 8, 32)
    ]
    schedule = [{"minBatchSize": 1, "maxBatchSize": 2, "numSpeculativeTokens": 3, "concurrency": 1}]
    baselines = [{"concurrency": c, "outputTokensPerSecond": 100.0 * c} for c in (1, 8, 32)]
    result = {
        "acceptanceLength": 2.5,
        "degenerateExamples": [f"conversation-{i:04d}" for i in range(200)],
        "speculation": {"cells": cells, "baselines": baselines, "schedule": schedule},
    }
    text = stage_main.termination_text(result)
    assert len(text.encode()) <= stage_main.TERMINATION_LIMIT < len(json.dumps(result))
    # the cells stay in result.json; the schedule serving needs and the scalars come through
    assert json.loads(text) == {
        "acceptanceLength": 2.5,
        "speculation": {"schedule": schedule, "baselines": baselines},
    }
    short = {"acceptanceLength": 2.5, "speculation": {"cells": cells[:2], "schedule": schedule}}
    assert json.loads(stage_main.termination_text(short)) == short
    assert json.loads(stage_main.termination_text({"samples": 1, "rows": ["x" * 5000]})) == {"samples": 1}


def test_a_long_result_keeps_the_checkpoint_choice_in_the_termination_message() -> None:
    choice = {"by": "acceptance", "epoch": 4, "checkpoint": "checkpoints/4", "checkpoints": [{"epoch": 4}]}
    result = {"acceptanceLength": 2.5, "degenerateExamples": ["x" * 40] * 200, "checkpointSelection": choice}
    text = stage_main.termination_text(result)
    assert json.loads(text) == {"acceptanceLength": 2.5, "checkpointSelection": choice}
