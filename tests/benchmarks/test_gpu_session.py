"""`benchmarks/gpu_session.sh` without a GPU: its plan (`--dry-run`: every step, its command and budget,
within the 8 minutes of one device call), the options of its tier and bench steps, its report's reading of
what the steps leave behind, and its CPU smoke mode (the steps on the CPU: what is new on a device is the
device)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.benchmarks.test_gpu_pipeline import bench

REPO = Path(__file__).resolve().parents[2]
SESSION = REPO / "benchmarks" / "gpu_session.sh"
STEPS = ["start", "check", "bench", "models", "tier", "report"]
LIMIT_S = 480  # one device call of 8 minutes, the machine's start included
_ROW = re.compile(r"^  (\w+) +(\d+)  (.*)$")


def report_module() -> ModuleType:
    return bench("gpu_session_report")


def session(*args: str, out: Path, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "PYTHON": sys.executable, "OUT": str(out), **env}
    return subprocess.run(
        ["bash", str(SESSION), *args], cwd=REPO, env=environ, capture_output=True, text=True, timeout=timeout
    )


def plan_rows(stdout: str) -> dict[str, tuple[int, str]]:
    """The plan's table: step -> (budget, command or note)."""
    rows = [m for line in stdout.splitlines() if (m := _ROW.match(line))]
    return {m.group(1): (int(m.group(2)), m.group(3)) for m in rows}


def test_the_dry_run_plans_every_step_with_budgets_within_8_minutes(tmp_path: Path) -> None:
    done = session("--dry-run", "--models", str(tmp_path), out=tmp_path / "out")
    assert done.returncode == 0, done.stderr
    rows = plan_rows(done.stdout)
    assert list(rows) == [*STEPS, "total"]
    budgets = {step: rows[step][0] for step in STEPS}
    assert all(seconds > 0 for seconds in budgets.values())
    assert rows["total"][0] == sum(budgets.values()) <= LIMIT_S
    assert "machine's start" in rows["start"][1]
    assert "gpu_pipeline.sh" in rows["check"][1] and "--install-only" in rows["check"][1]
    assert "eagle3_cli tiny --models" in rows["models"][1]
    tier = rows["tier"][1]
    assert "-m pytest" in tier and "-m gpu" in tier and "--junitxml" in tier and "-rA" in tier
    assert tier.endswith("tests/gpu/test_benchmark_gpu.py"), "the benchmark test, the longest, last"
    bench = rows["bench"][1]
    assert "gpu_pipeline.py" in bench and "--size 1b" in bench and "TORCHINDUCTOR_CACHE_DIR" in bench
    phases = dict(re.findall(r"--budget (\w+)=(\d+)", bench))
    assert set(phases) == {"describe", "build", "data", "vocab", "extract", "train", "stock"}
    assert sum(int(s) for s in phases.values()) <= budgets["bench"] - 5, "the phases fit the bench step"
    settings = json.loads(done.stdout.split("bench settings: ", 1)[1].splitlines()[0])
    assert settings["device"] == "cuda" and settings["size"] == "1b"
    assert settings["warmup"] < settings["stop_after_steps"] <= settings["steps"]
    assert settings["budgets"] == {k: float(v) for k, v in phases.items()}
    assert not (tmp_path / "out").exists(), "a dry run writes nothing"


def test_the_dry_run_refuses_a_plan_over_the_limit_and_options_that_do_not_parse(tmp_path: Path) -> None:
    over = session("--dry-run", "--budget", "tier=300", out=tmp_path)
    assert over.returncode == 2 and "more than --limit 480" in over.stderr
    squeezed = session("--dry-run", "--budget", "bench=100", out=tmp_path)
    assert squeezed.returncode == 2 and "bench phases need" in squeezed.stderr
    wrong = session("--dry-run", "--", "--size", "2b", out=tmp_path)
    assert wrong.returncode == 2 and "invalid choice: '2b'" in wrong.stderr
    assert session("--dry-run", "--skip", "lunch", out=tmp_path).returncode == 2
    skipped = session("--dry-run", "--skip-tier", "--skip", "models", out=tmp_path)
    rows = plan_rows(skipped.stdout)
    assert skipped.returncode == 0 and rows["tier"][0] == rows["models"][0] == 0
    assert rows["total"][0] == sum(rows[step][0] for step in STEPS)


def test_the_tier_step_collects_as_planned(tmp_path: Path) -> None:
    """The tier's command from the plan, collecting only: without CUDA every module skips itself."""
    rows = plan_rows(session("--dry-run", out=tmp_path).stdout)
    argv = [*shlex.split(rows["tier"][1]), "--collect-only", "-q"]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode in (0, 5), done.stdout[-2000:] + done.stderr[-2000:]  # 5: every module skipped
    assert "error" not in done.stdout.lower()
    assert (tmp_path / "gpu_tier.xml").exists()


def junit(cases: list[tuple[str, str, str | None]]) -> str:
    body = []
    for name, outcome, why in cases:
        inner = "" if outcome == "passed" else f'<{outcome} message="{why}">{why}</{outcome}>'
        case = f'<testcase classname="tests.gpu.test_train_gpu" name="{name}" time="12.5">'
        body.append(f"{case}{inner}</testcase>")
    return f'<testsuites><testsuite name="pytest">{"".join(body)}</testsuite></testsuites>'


def partial_bench() -> dict[str, Any]:
    """A benchmark whose stock run ran past its budget: extraction and our run measured, stock not."""
    ours: dict[str, Any] = {"tokens_per_s": 41000.0, "steps_per_s": 20.0, "measured_steps": 39}
    ours |= {"warmup_steps": 11}
    ours |= {"compile_s": 71.5, "first_step_s": 80.2, "peak_memory_gib": 9.5, "stopped": "steps"}
    extraction = {"stageTokensPerSecond": 90000.0, "forwardTokensPerSecond": 200000.0}
    extraction |= {"rooflineTokensPerSecond": 400000.0, "stageRooflineFraction": 0.225}
    extraction |= {"forwardRooflineFraction": 0.5, "peakMemoryGiB": 12.25}
    return {
        "device": {"type": "cuda", "name": "NVIDIA H200"},
        "extraction": extraction,
        "training": {"ours": ours, "compiled": True},
        "overBudget": {"stock": 45.0},
    }


def test_the_report_says_what_each_step_measured_and_what_is_missing(tmp_path: Path) -> None:
    steps = "step\tbudget\tseconds\texit\tstatus\nstart\t90\t\t\tallowance\ncheck\t25\t12\t0\tok\n"
    steps += "bench\t235\t235\t124\tover budget\ntier\t110\t80\t1\tfailed\n"
    (tmp_path / "gpu_session.steps.tsv").write_text(steps)
    cases = [("test_the_draft_learns", "passed", None), ("test_stock_settings", "failure", "assert 1 == 2")]
    (tmp_path / "gpu_tier.xml").write_text(junit(cases))
    (tmp_path / "gpu_pipeline.json").write_text(json.dumps(partial_bench()))
    module = report_module()
    assert module.main(["--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "gpu_session.json").read_text())
    assert report["usedSeconds"] == 90 + 12 + 235 + 80
    tier = report["tier"]
    assert tier["counts"] == {"passed": 1, "failed": 1}
    assert "tests/gpu/test_extract_gpu.py" in tier["notReached"]
    assert "tests/gpu/test_train_gpu.py" not in tier["notReached"]
    training = report["training"]
    assert training["ours"]["tokens_per_s"] == 41000.0 and training["ours"]["compile_s"] == 71.5
    assert "phase stock ran past its 45.0 s budget" in training["stock"]["missing"]
    assert report["peakMemory"]["maxGiB"] == 12.25
    text = (tmp_path / "gpu_session.md").read_text()
    assert "| tests.gpu.test_train_gpu::test_stock_settings | failed | 12.5 | assert 1 == 2 |" in text
    assert "| tests/gpu/test_extract_gpu.py | not reached | | |" in text
    assert "Training (compiled): ours: 41,000.0 tokens/s over 39 steps after a 11-step warm-up" in text
    assert "stock: missing:" in text and "0.225 of the prefill roofline" in text


def test_the_report_reads_the_tiers_log_when_pytest_left_no_junit(tmp_path: Path) -> None:
    log = [
        "tests/gpu/test_extract_gpu.py::test_match PASSED                    [ 20%]",
        "tests/gpu/test_train_gpu.py::test_learns FAILED                     [ 40%]",
        "FAILED tests/gpu/test_train_gpu.py::test_learns - AssertionError: loss",
    ]
    (tmp_path / "gpu_tier.log").write_text("\n".join(log) + "\n")
    module = report_module()
    report = module.build(tmp_path, 480)
    tests = {t["test"]: (t["outcome"], t["why"]) for t in report["tier"]["tests"]}
    assert tests == {
        "tests/gpu/test_extract_gpu.py::test_match": ("passed", None),
        "tests/gpu/test_train_gpu.py::test_learns": ("failed", "AssertionError: loss"),
    }
    assert report["training"]["missing"].startswith("missing: no gpu_pipeline.json")
    assert "missing" in report["extraction"] and "missing" in report["peakMemory"]


@pytest.mark.pipeline
@pytest.mark.timeout(600)
def test_the_session_runs_its_steps_on_the_cpu(tmp_path: Path) -> None:
    """--cpu-smoke: the checks, the benchmark on the tiny verifier (stopped after its steps, as on a device),
    the tier (every module skips itself without CUDA) and the report."""
    out, work = tmp_path / "out", tmp_path / "work"
    work.mkdir()
    done = session("--cpu-smoke", out=out, timeout=580, WORKDIR=str(work))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    report = json.loads((out / "gpu_session.json").read_text())
    status = {s["step"]: s["status"] for s in report["steps"]}
    assert status == {
        "start": "allowance",
        "check": "ok",
        "bench": "ok",
        "models": "skipped",
        "tier": "ok: every test skipped itself (no CUDA)",
        "report": "ok",
    }
    assert report["tier"]["counts"] == {"skipped": 5} and not report["tier"]["notReached"]
    bench = json.loads((out / "gpu_pipeline.json").read_text())
    x = bench["extraction"]
    assert x["tokens"] == bench["data"]["tokens"] > 0 and x["peakMemoryGiB"] is None
    assert 0 < x["stageRooflineFraction"] <= 1 and 0 < x["forwardRooflineFraction"] <= 1
    t = bench["training"]
    assert (t["settings"]["draft_attn_impl"], t["settings"]["loss_implementation"]) == ("sdpa", "eager")
    assert t["stockAdaptedToCpu"] and not t["compiled"] and t["stageResult"] is None
    ours, stock = t["ours"], t["stock"]
    assert ours["steps"] == stock["steps"] == t["stopAfterSteps"] == 6, "both stopped after their steps"
    assert ours["stopped"] == stock["stopped"] == "steps"
    assert ours["first_loss"] == pytest.approx(stock["first_loss"], abs=1e-3), "the same seed, the same batch"
    for run in (ours, stock):
        assert run["tokens_per_s"] > 0 and run["compile_s"] is not None and run["peak_memory_gib"] is None
    assert "| ratio ours / stock |" in (out / "gpu_pipeline.md").read_text()
    assert "  ours: step 0 at " in (out / "gpu_pipeline.log").read_text()
    assert report["training"]["ratio"] > 0 and "CPU" in report["peakMemory"]["missing"]
    assert not list(work.iterdir()), "the run directory and the compile caches are removed"
