"""`eagle3 plan` on the tiny example in vLLM CPU 0.32: the step-cost prediction (two servers: the verifier
alone and with an untrained draft), concurrencies 1 and 2, 32-token answers; and what `eagle3 plan` refuses or
reads before any server starts."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from eagle3_contract.api.manifest import load_manifest
from eagle3_pipeline.local.plan import main as plan_main
from eagle3_pipeline.local.plan import predict_manifest, run_plan
from tests.pipeline.test_vllm_server import vllm_or_skip
from tests.tiny_spec import minimal

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "tiny" / "eagle3run.yaml"


@pytest.fixture(scope="module")
def planned(tiny_models: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    vllm = vllm_or_skip()
    root = tmp_path_factory.mktemp("plan")
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["evaluation"].update(
        {"concurrencies": [1, 2], "maxTokens": 32, "targetAcceptanceLength": 2.5}
    )
    manifest = root / "run.yaml"
    manifest.write_text(yaml.safe_dump(doc))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EAGLE3_MODELS_ROOT", str(tiny_models))
        mp.setenv("EAGLE3_VLLM", vllm)
        run_plan(str(manifest), str(root / "art"), str(tiny_models), vllm)
        yield manifest, root / "art"


@pytest.mark.vllm
@pytest.mark.timeout(900)
def test_plan_measures_step_cost_on_cpu_and_fills_every_cell(planned: tuple[Path, Path]) -> None:
    manifest, art = planned
    result = run_plan(str(manifest), str(art), None, None)  # cached: no server starts again
    assert result.method == "step-cost" and result.concurrencies == [1, 2]
    assert result.baseline_tokens_per_second and all(b and b > 0 for b in result.baseline_tokens_per_second)
    assert result.measured_acceptance_length and all(
        a is not None and 1.0 <= a < 1.5 for a in result.measured_acceptance_length
    )  # the untrained draft is hardly ever accepted
    lengths = [a.acceptance_length or 0.0 for a in result.acceptance_lengths or []]
    assert 2.5 in lengths and max(lengths) <= 4.0  # the target, and the published ones clamped to k + 1
    assert result.speedup is not None and len(result.speedup) == len(lengths)
    assert all(s is not None and s > 0 for row in result.speedup for s in row)
    assert result.break_even is not None and len(result.break_even) == 2
    assert result.prompts_source and "tiny-chat.jsonl" in result.prompts_source
    assert result.server_start_seconds and set(result.server_start_seconds) == {"baseline", "draft"}


@pytest.mark.vllm
@pytest.mark.timeout(300)
def test_eagle3_plan_prints_the_table(
    planned: tuple[Path, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    manifest, art = planned
    # rich wraps a header at the 80 columns it assumes without a terminal ("concurrency\n2" where a faster
    # machine's cells are a digit wider); a user's wide terminal is what this checks
    monkeypatch.setenv("COLUMNS", "200")
    assert plan_main(str(manifest), str(art), None, None, [3.1]) == 0
    out = capsys.readouterr().out
    # the title names the verifier class whose published figures the table cites (the tiny one has none)
    assert "predicted speedup (step-cost, k=3, verifier class unknown)" in out and "concurrency 2" in out
    assert "3.10" in out  # the --acceptance-length row
    assert "verifier alone" in out and "break-even" in out


def test_every_command_reads_the_run_out_of_a_file_with_other_documents(tmp_path: Path) -> None:
    """`eagle3 plan` read the file with yaml.safe_load and failed on a ConfigMap before the run."""
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"a": "b"}}
    path = tmp_path / "both.yaml"
    path.write_text(
        yaml.safe_dump_all(
            [
                config_map,
                {
                    "apiVersion": "eagle3.dev/v1alpha1",
                    "kind": "Eagle3Run",
                    "metadata": {"name": "run"},
                    "spec": minimal(),
                },
            ]
        )
    )
    manifest = load_manifest(path)
    written = predict_manifest(manifest, tmp_path / "art")
    copy = load_manifest(written)
    assert copy.name == manifest.name and copy.spec.evaluation.predict is True
    assert [d["kind"] for d in yaml.safe_load_all(written.read_text())] == ["Eagle3Run"]


def test_an_acceptance_length_outside_1_to_k_plus_1_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 28, item 12: -1, 0, nan, inf were printed as rows (-0.45x); 100 gave 50x at k = 3."""
    from eagle3_cli.main import parser

    for bad in ("-1", "0", "0.99", "nan", "inf", "x"):
        with pytest.raises(SystemExit) as exited:
            parser().parse_args(["plan", "run.yaml", "--acceptance-length", bad])
        assert exited.value.code == 2
        assert "--acceptance-length" in capsys.readouterr().err
    assert parser().parse_args(["plan", "f", "--acceptance-length", "1"]).acceptance_length == [1.0]
    path = tmp_path / "run.yaml"
    run = {
        "apiVersion": "eagle3.dev/v1alpha1",
        "kind": "Eagle3Run",
        "metadata": {"name": "run"},
        "spec": minimal(),
    }
    path.write_text(yaml.safe_dump(run))
    assert plan_main(str(path), str(tmp_path / "art"), None, None, [2.0, 4.5]) == 2  # k = 3: at most 4
    assert "--acceptance-length 4.5: at most k + 1 = 4" in capsys.readouterr().err
    assert not (tmp_path / "art").exists()  # refused before anything ran


def _run_file(tmp_path: Path, **draft: object) -> Path:
    spec = minimal()
    spec.setdefault("draft", {}).update(draft)
    path = tmp_path / "run.yaml"
    run = {
        "apiVersion": "eagle3.dev/v1alpha1",
        "kind": "Eagle3Run",
        "metadata": {"name": "run"},
        "spec": spec,
    }
    path.write_text(yaml.safe_dump(run))
    return path


@pytest.mark.parametrize("method", ["peagle", "dflash"])
def test_plan_on_another_draft_method_names_the_method_not_a_field_the_user_never_set(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], method: str
) -> None:
    """Issue 42, item 7: the refusal blamed evaluation.predict, which `eagle3 plan` had set itself."""
    path = _run_file(tmp_path, method=method)
    assert plan_main(str(path), str(tmp_path / "art"), None, None, []) == 2
    err = capsys.readouterr().err
    assert f"draft.method is {method}" in err and "evaluation.predict" not in err
    assert not (tmp_path / "art").exists()


@pytest.mark.parametrize(
    ("document", "what"),
    [
        ({"concurrencies": "1,2"}, "not a predict result (concurrencies"),
        ({}, "no table"),
        ({"concurrencies": [1], "acceptanceLengths": [{"length": 2.0}], "speedup": []}, "does not match"),
    ],
)
def test_a_cached_prediction_of_the_wrong_shape_is_an_error_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], document: dict[str, object], what: str
) -> None:
    """Issue 42, item 7: a cached predict result of the wrong type printed an empty table with rc 0."""
    import json

    from eagle3_contract.stages import Stage, plan_stages
    from eagle3_pipeline.local.plan import predict_manifest

    path = _run_file(tmp_path)
    art = tmp_path / "art"
    predicting = load_manifest(predict_manifest(load_manifest(path), art))
    plan = next(p for p in plan_stages(predicting.spec) if p.stage is Stage.PREDICT)
    (art / plan.output_dir).mkdir(parents=True)
    (art / plan.output_dir / "result.json").write_text(json.dumps(document))
    assert plan_main(str(path), str(art), None, None, []) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert what in err and "result.json" in err and "delete" in err
