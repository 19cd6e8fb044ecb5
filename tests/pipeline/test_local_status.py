"""`eagle3 status FILE`: a local run's status, from the plan, the complete outputs and what `eagle3 run`
recorded (eagle3_pipeline.local.status), in the shape of an Eagle3Run's status."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import pytest

from eagle3_contract.api.manifest import Manifest, load_manifest
from eagle3_contract.api.status import RunPhase, StagePhase
from eagle3_contract.stages import plan_stages
from eagle3_pipeline.local.display import PlainDisplay
from eagle3_pipeline.local.run import LocalOptions, LocalRunError, run_local
from eagle3_pipeline.local.status import local_status, run_status, status_file
from tests.pipeline.chat_templates import save_verifier
from tests.pipeline.manifests import base_spec, write_manifest


def manifest_and_dirs(tmp_path: Path) -> tuple[Manifest, dict[str, str]]:
    manifest = load_manifest(write_manifest(tmp_path / "run.yaml", base_spec(tmp_path / "m", tmp_path / "d")))
    return manifest, {p.stage.value: p.output_dir for p in plan_stages(manifest.spec) if not p.skipped}


def complete(art: Path, output_dir: str, result: dict[str, Any]) -> None:
    (art / output_dir).mkdir(parents=True)
    (art / output_dir / "result.json").write_text(json.dumps(result))


def record(art: Path, pid: int | None, stages: dict[str, Any], error: str | None = None) -> None:
    path = status_file(art, "t")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"run": "t", "pid": pid, "stages": stages, "error": error}))


def test_complete_outputs_succeed_and_the_rest_is_pending(tmp_path: Path) -> None:
    manifest, dirs = manifest_and_dirs(tmp_path)
    art = tmp_path / "art"
    complete(art, dirs["prepare"], {"samples": 12, "seconds": 3.5})
    status = local_status(manifest, art)
    assert status.phase == RunPhase.PENDING and status.current_stage == "extract"
    prepare = status.stages["prepare"]
    assert prepare.phase == StagePhase.SUCCEEDED and prepare.result == {"samples": 12, "seconds": 3.5}
    assert prepare.hash == dirs["prepare"].split("/")[1] and prepare.completion_time is not None
    assert status.stages["generate"].phase == StagePhase.SKIPPED  # regeneration is off in this spec
    assert {status.stages[s].phase for s in ("extract", "vocab", "train")} == {StagePhase.PENDING}
    [ready] = status.conditions
    assert (ready.type, ready.status) == ("Ready", "False") and "extract has not run" in ready.message


def test_a_running_stage_shows_its_live_progress(tmp_path: Path) -> None:
    manifest, dirs = manifest_and_dirs(tmp_path)
    art = tmp_path / "art"
    progress = {"unit": "samples", "done": 120, "total": 400, "rate": 8.0, "etaSeconds": 35}
    running = {"phase": "Running", "outputDir": dirs["extract"], "attempts": 2, "progress": progress}
    record(art, os.getpid(), {"extract": running})
    status = local_status(manifest, art)
    assert status.phase == RunPhase.RUNNING and status.progress == "extract 120/400 samples"
    assert status.eta == "35s" and status.stages["extract"].attempts == 2


def test_a_record_of_another_hash_or_a_dead_run_is_not_taken_as_running(tmp_path: Path) -> None:
    manifest, dirs = manifest_and_dirs(tmp_path)
    art = tmp_path / "art"
    record(art, os.getpid(), {"extract": {"phase": "Running", "outputDir": "extract/0123456789ab"}})
    assert local_status(manifest, art).stages["extract"].phase == StagePhase.PENDING  # the spec was edited
    record(art, 2**22 + 1, {"extract": {"phase": "Running", "outputDir": dirs["extract"]}})  # no such pid
    status = local_status(manifest, art)
    assert status.phase == RunPhase.FAILED and "stopped" in (status.stages["extract"].message or "")


def test_why_the_last_run_stopped_is_the_runs_message() -> None:
    stages = {"evaluate": {"phase": "Succeeded"}, "export": {"phase": "Pending"}}
    status = run_status(stages, running=False, error="the draft failed the gate")
    assert status["phase"] == "Failed" and status["conditions"][0]["message"] == "the draft failed the gate"
    done = run_status({"export": {"phase": "Succeeded"}}, running=False, error=None)
    assert done["phase"] == "Succeeded" and done["conditions"][0]["status"] == "True"


def test_reading_a_run_twice_gives_the_same_status() -> None:
    """Ready's lastTransitionTime is when a stage last started or finished, not when the status was read:
    `eagle3 status --watch -o json` prints a document on a change only."""
    stages = {
        "train": {
            "phase": "Succeeded",
            "startTime": "2026-12-05T10:00:00Z",
            "completionTime": "2026-12-05T10:09:59Z",
        },
        "evaluate": {"phase": "Running", "startTime": "2026-12-05T10:10:00Z"},
    }
    first = run_status(stages, running=True)
    assert first["conditions"][0]["lastTransitionTime"] == "2026-12-05T10:10:00Z"
    assert run_status(stages, running=True) == first


def test_a_failed_stage_reports_its_error_not_the_progress_line_it_ended_with(tmp_path: Path) -> None:
    """Issue 28, item 5: the real prepare program writes its error, then its progress reporter's closing
    line; `eagle3 run` and `eagle3 status` report the error (from the termination message), not that line."""
    data = tmp_path / "data.jsonl"
    data.write_text("")
    spec = base_spec(save_verifier(tmp_path / "verifier"), data)
    manifest = load_manifest(write_manifest(tmp_path / "run.yaml", spec))
    art = tmp_path / "art"
    shown = io.StringIO()
    with pytest.raises(LocalRunError) as failed:
        run_local(manifest, LocalOptions(artifacts=art, until="prepare"), PlainDisplay(shown))
    assert "stage prepare: 0 rows" in shown.getvalue().splitlines()[-2]  # its last line, before the outcome
    error = str(failed.value)
    assert "no rows (the file is empty" in error and " INFO " not in error, error
    message = local_status(manifest, art).stages["prepare"].message or ""
    assert "exit code 1: " in message and "no rows (the file is empty" in message, message
    assert " INFO " not in message, message


def test_a_check_that_failed_after_an_earlier_pass_shows_the_latest_verdict(tmp_path: Path) -> None:
    """Issue 28, item 14: a pinned draft tampered with after verify passed fails verify on the next run;
    `eagle3 status` showed the earlier pass (its result.json is still there) and Ready True."""
    spec = base_spec(tmp_path / "m", tmp_path / "d")
    spec["serving"] = {"pinnedCheckpoint": {"path": "/artifacts/drafts/a", "sha256": "ab" * 32}}
    manifest = load_manifest(write_manifest(tmp_path / "run.yaml", spec))
    dirs = {p.stage.value: p.output_dir for p in plan_stages(manifest.spec) if not p.skipped}
    art = tmp_path / "art"
    complete(art, dirs["verify"], {"sha256": "ab" * 32, "seconds": 0.2})
    passed = local_status(manifest, art)
    assert passed.stages["verify"].phase == StagePhase.SUCCEEDED
    os.utime(art / dirs["verify"] / "result.json", (1_700_000_000, 1_700_000_000))  # the pass, earlier
    failed = {
        "phase": "Failed",
        "outputDir": dirs["verify"],
        "attempts": 1,
        "completionTime": "2026-12-05T10:00:00Z",
    }
    record(
        art, None, {"verify": failed | {"message": "exit code 87: sha256 mismatch"}}, "stage verify failed"
    )
    status = local_status(manifest, art)
    assert status.stages["verify"].phase == StagePhase.FAILED
    assert "sha256 mismatch" in (status.stages["verify"].message or "")
    assert status.phase == RunPhase.FAILED and status.conditions[0].status == "False"
    record(art, None, {"verify": failed | {"completionTime": "2023-01-01T00:00:00Z"}})  # before the pass
    assert local_status(manifest, art).stages["verify"].phase == StagePhase.SUCCEEDED


# Issue 42, item 7: damaged records and results, and a pid that now names another process.


@pytest.mark.parametrize(
    "text",
    [
        "[]",
        '"x"',
        "{",
        '{"stages": []}',
        '{"stages": {"prepare": "Running"}}',
        '{"pid": "1", "stages": null}',
    ],
)
def test_a_damaged_status_record_is_read_as_far_as_it_is_whole(tmp_path: Path, text: str) -> None:
    manifest, dirs = manifest_and_dirs(tmp_path)
    art = tmp_path / "art"
    complete(art, dirs["prepare"], {"samples": 12})
    status_file(art, "t").parent.mkdir(parents=True, exist_ok=True)
    status_file(art, "t").write_text(text)
    status = local_status(manifest, art)  # no traceback: the stages from their outputs
    assert status.stages["prepare"].phase == StagePhase.SUCCEEDED
    assert status.stages["extract"].phase == StagePhase.PENDING


@pytest.mark.parametrize(("text", "what"), [("[]", "a JSON list"), ('{"a": ', "not JSON"), ("\xff", "not")])
def test_a_damaged_result_names_its_file_and_the_fix(tmp_path: Path, text: str, what: str) -> None:
    manifest, dirs = manifest_and_dirs(tmp_path)
    art = tmp_path / "art"
    complete(art, dirs["prepare"], {})
    path = art / dirs["prepare"] / "result.json"
    path.write_bytes(text.encode("latin-1"))
    with pytest.raises(ValueError) as caught:  # `eagle3 status` prints a ValueError's message, rc 1
        local_status(manifest, art)
    assert str(path) in str(caught.value) and what in str(caught.value)
    assert f"delete {path.parent}" in str(caught.value)


def test_a_recorded_pid_that_another_process_now_has_is_not_the_run() -> None:
    from eagle3_pipeline.local.status import alive, process_start

    started = process_start(os.getpid())
    assert started is not None  # Linux: /proc
    assert alive(os.getpid(), started) and alive(os.getpid())  # an older record without its start: the pid
    assert not alive(os.getpid(), started + 1)  # the pid is reused by a later process
    assert not alive(True) and not alive("12") and not alive(-1)


def test_the_recorder_writes_when_its_process_started(tmp_path: Path) -> None:
    from eagle3_pipeline.local.status import StatusRecorder, process_start

    status_file(tmp_path, "t").parent.mkdir(parents=True)
    recorder = StatusRecorder(status_file(tmp_path, "t"), "t")
    recorder.stage_started("prepare", "prepare/abc", 1)
    recorder._write(force=True)
    written = json.loads(status_file(tmp_path, "t").read_text())
    assert written["pid"] == os.getpid() and written["pidStart"] == process_start(os.getpid())
