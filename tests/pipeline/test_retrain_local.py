"""`eagle3 run FILE --retrain RECORDS`: what stops it before any stage, and the line it ends with."""

from __future__ import annotations

from pathlib import Path

import pytest

from eagle3_cli.main import main as eagle3_main
from eagle3_contract.api.manifest import load_manifest
from eagle3_contract.generation import plan_generation
from eagle3_contract.results import EvaluateResult
from eagle3_contract.stages import Stage, plan_stages
from eagle3_pipeline.local.display import StageOutcome
from eagle3_pipeline.local.retrain import Retrain, RetrainError, plan, verdict
from eagle3_pipeline.local.status import local_status, record_name
from tests.harness.results import FAKE_RESULTS
from tests.tiny_spec import EXAMPLE

pytestmark = pytest.mark.pipeline


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--epochs", "2"], "--original-ratio and --epochs shape a --retrain generation"),
        (["--retrain", "records.jsonl", "--until", "train"], "leave out --until"),
        (["--retrain", "records.jsonl", "--original-ratio", "-1"], "is not a number of at least 0"),
    ],
)
def test_wrong_retrain_arguments_are_refused_before_anything_runs(
    args: list[str], said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        eagle3_main(["run", str(EXAMPLE), "--artifacts", str(tmp_path / "art"), *args])
    assert exit_.value.code == 2 and said in capsys.readouterr().err
    assert not (tmp_path / "art").exists()


def test_a_generation_needs_the_runs_exported_draft_and_the_records(tmp_path: Path) -> None:
    manifest = load_manifest(EXAMPLE)
    art = tmp_path / "art"
    with pytest.raises(RetrainError, match="let the run finish first"):
        plan(manifest, art, Retrain(tmp_path / "records.jsonl"))
    export = next(p for p in plan_stages(manifest.spec) if p.stage is Stage.EXPORT)
    (art / export.output_dir).mkdir(parents=True)
    (art / export.output_dir / "result.json").write_text("{}")
    (art / ".runs").mkdir()
    with pytest.raises(RetrainError, match="no such file or directory of captured records"):
        plan(manifest, art, Retrain(tmp_path / "records.jsonl"))
    (tmp_path / "records.jsonl").write_text("")
    generation, path = plan(manifest, art, Retrain(tmp_path / "records.jsonl", 0.5, 2))
    assert generation.serving.path == export.output_dir and generation.original_ratio == 0.5
    written = load_manifest(path)
    assert written.spec.training.epochs == 2 and written.name == manifest.name
    # `eagle3 status` on the generation's manifest: its own stages (the run's vocab among them), its record
    status = local_status(written, art)
    planned = {p.stage.value: p for p in plan_generation(manifest.spec, generation)}
    assert {name: s.output_dir for name, s in status.stages.items() if s.output_dir} == {
        name: p.output_dir for name, p in planned.items() if not p.skipped
    }
    assert record_name(written) == "tiny-generation-2" and record_name(manifest) == "tiny"


def test_the_last_line_says_whether_the_new_draft_is_accepted_more() -> None:
    evaluate = FAKE_RESULTS[Stage.EVALUATE]
    assert isinstance(evaluate, EvaluateResult)
    incumbent = {"path": "export/abc", "method": "eagle3", "acceptanceLength": 1.2, "acceptanceRatio": 1.3333}
    better = EvaluateResult.parse({**evaluate.document(), "incumbent": incumbent})
    line = verdict([StageOutcome(Stage.EVALUATE.value, "done", result=better)])
    assert line is not None and "is accepted more than the serving draft" in line and "1.33x" in line
    worse = EvaluateResult.parse({**evaluate.document(), "incumbent": incumbent | {"acceptanceRatio": 0.9}})
    line = verdict([StageOutcome(Stage.EVALUATE.value, "done", result=worse)])
    assert line is not None and "is not accepted more" in line
    assert verdict([StageOutcome(Stage.EVALUATE.value, "done", result=evaluate)]) is None
