"""What `eagle3 status TARGET` reads (eagle3_cli.status_targets): a manifest, the artifacts directory that
`eagle3 run` wrote (built here by hand, as `eagle3 run` records it), a directory of those, a directory holding
a manifest; a directory that is none of these is an error that says what was expected."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from eagle3_cli.main import main
from eagle3_cli.status_targets import is_path
from eagle3_contract.api.manifest import load_manifest
from eagle3_contract.stages import Stage, plan_stages
from tests.pipeline.manifests import base_spec, write_manifest

PREPARED = {"samples": 400, "skippedTotal": 0, "tokens": 20291, "assistantTokens": 6346}


@pytest.fixture(autouse=True)
def _own_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """main() writes the log format into the environment (for its subprocesses): not into the test run's."""
    monkeypatch.delenv("EAGLE3_LOG_FORMAT", raising=False)
    monkeypatch.delenv("EAGLE3_VERBOSE", raising=False)


def finished_prepare(tmp: Path, name: str = "tiny") -> tuple[Path, Path]:
    """A manifest, and the artifacts directory `eagle3 run` leaves after its prepare stage: the manifest's
    snapshot and the run's record in .runs/, and prepare's output with its result.json."""
    manifest = write_manifest(tmp / f"{name}.yaml", base_spec(tmp / "m", tmp / "d"), name=name)
    artifacts = tmp / "eagle3-artifacts" / name
    (artifacts / ".runs").mkdir(parents=True)
    shutil.copyfile(manifest, artifacts / ".runs" / f"{name}.yaml")
    plan = next(p for p in plan_stages(load_manifest(manifest).spec) if p.stage == Stage.PREPARE)
    output = artifacts / plan.output_dir
    output.mkdir(parents=True)
    (output / "result.json").write_text(json.dumps(PREPARED))
    record = {"phase": "Succeeded", "outputDir": plan.output_dir, "attempts": 2, "seconds": 7.0}
    recorded = {"run": name, "pid": None, "stages": {"prepare": record}, "error": None}
    (artifacts / ".runs" / f"{name}.status.json").write_text(json.dumps(recorded))
    return manifest, artifacts


def status_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main(["status", *argv, "-o", "json"]) == 0, capsys.readouterr().err
    document: dict[str, Any] = json.loads(capsys.readouterr().out)
    return document


def test_an_artifacts_directory_is_the_run_it_holds(tmp_path: Path, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    manifest, artifacts = finished_prepare(tmp_path)
    document = status_json(capsys, str(artifacts))
    assert (document["name"], document["artifacts"]) == ("tiny", str(artifacts))
    prepare = document["status"]["stages"]["prepare"]
    assert (prepare["phase"], prepare["attempts"], prepare["result"]) == ("Succeeded", 2, PREPARED)
    assert "outputDir" in prepare and "output_dir" not in prepare  # as the API shows it
    by_manifest = status_json(capsys, str(manifest), "--artifacts", str(artifacts))
    assert by_manifest["status"]["stages"] == document["status"]["stages"]
    monkeypatch.setenv("COLUMNS", "300")  # the headline on one line
    assert main(["status", str(artifacts)]) == 0
    out = capsys.readouterr().out
    assert f"local run tiny ({artifacts})" in out and "samples=400" in out


def test_a_directory_of_artifacts_directories_holding_one_run_is_that_run(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    _, artifacts = finished_prepare(tmp_path)
    assert status_json(capsys, str(artifacts.parent))["artifacts"] == str(artifacts)
    finished_prepare(tmp_path, name="other")
    assert main(["status", str(artifacts.parent)]) == 1
    err = capsys.readouterr().err
    assert "holds the artifacts directories of 2 runs; give one of them" in err
    assert str(artifacts) in err and str(artifacts.parent / "other") in err


def test_a_directory_holding_one_manifest_is_that_run(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    manifest, artifacts = finished_prepare(tmp_path)
    runs = tmp_path / "runs"
    runs.mkdir()
    shutil.copyfile(manifest, runs / "eagle3run.yaml")
    (runs / "models-job.yaml").write_text("apiVersion: batch/v1\nkind: Job\nmetadata: {name: m}\n")
    (runs / "notes.yaml").write_text("key: [unclosed\n")  # no manifest: not read as one
    document = status_json(capsys, str(runs), "--artifacts", str(artifacts))
    assert document["name"] == "tiny" and document["status"]["stages"]["prepare"]["phase"] == "Succeeded"
    shutil.copyfile(manifest, runs / "second.yaml")
    assert main(["status", str(runs)]) == 1
    err = capsys.readouterr().err
    assert "holds 2 Eagle3Run manifests" in err and "second.yaml" in err and "give one of them" in err


def test_a_directory_that_holds_no_run_says_what_was_expected(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "empty").mkdir()
    assert main(["status", str(tmp_path / "empty")]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"error: {tmp_path / 'empty'} is neither an artifacts directory"
    )
    assert "give a run's manifest file, its artifacts directory" in err[0]
    assert main(["status", str(tmp_path / "gone")]) == 1
    assert "gone: no such file or directory; give a run's manifest" in capsys.readouterr().err


def test_artifacts_beside_an_artifacts_directory_or_a_namespace_beside_a_path_are_refused(
    tmp_path, capsys
) -> None:  # type: ignore[no-untyped-def]
    manifest, artifacts = finished_prepare(tmp_path)
    assert main(["status", str(artifacts), "--artifacts", str(tmp_path / "x")]) == 1
    assert "drop --artifacts" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["status", str(manifest), "-n", "team-a"])
    assert exc.value.code == 2
    assert "-n and --kubeconfig name a run in the cluster" in capsys.readouterr().err


def test_a_target_is_a_path_when_it_exists_or_can_only_be_one(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny").mkdir()
    assert is_path("tiny") and is_path("run.yaml") and is_path("some/dir")
    assert not is_path("tiny-2") and not is_path("team.a")
