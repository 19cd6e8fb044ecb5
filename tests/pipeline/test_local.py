"""The local executor: a bad manifest fails before any stage, OOM retries halve the budget, resume skips."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eagle3_contract.api.manifest import load_manifest
from eagle3_contract.results import ExtractResult
from eagle3_contract.stages import Stage, plan_stages
from eagle3_pipeline.local.run import LocalOptions, run_stage_with_retries
from eagle3_pipeline.runtime.locks import hold_output_lock
from eagle3_pipeline.runtime.process_group import group_members
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
    fake.write_text("#!/bin/sh\nexec sleep 600\n")  # would outlast the test's timeout: killed at the deadline
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    options = LocalOptions(artifacts=tmp_path / "art", python=str(fake))
    outcome = run_stage_with_retries(plan, manifest.path, options, manifest.spec, dict(os.environ))
    assert outcome.status == "failed" and outcome.seconds < 300
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
    assert second.stderr.count(" reused (") == 3 and "==> stage" not in second.stderr
    spec["draft"]["vocabSize"] = 48
    write_manifest(path, spec)
    third = eagle3("run", str(path), "--artifacts", str(tmp_path / "art"), "--until", "vocab")
    assert third.returncode == 0
    assert third.stderr.count("==> stage") == 1 and "==> stage vocab" in third.stderr
    vocab_dirs = sorted(p.name for p in (tmp_path / "art" / "vocab").iterdir() if not p.name.startswith("."))
    assert len(vocab_dirs) == 2
    results = [json.loads((tmp_path / "art" / "vocab" / d / "result.json").read_text()) for d in vocab_dirs]
    assert sorted(r["draftVocabSize"] for r in results) == [32, 48]


# --- nothing built from user input leaves the artifacts root (issue 13, item 4) ----------------------------


@pytest.mark.parametrize("name", ["../../escaped", "a/b", "MyRun", "my_run"])
def test_a_name_the_api_server_refuses_runs_nothing_and_writes_nothing(tmp_path: Path, name: str) -> None:
    path = write_manifest(tmp_path / "m.yaml", base_spec(tmp_path / "m", tmp_path / "d.jsonl"), name=name)
    proc = eagle3("run", str(path), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "metadata.name" in proc.stderr and "DNS-1123 subdomain" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.yaml"]


def test_the_longest_name_the_api_server_accepts_runs_locally(tmp_path: Path) -> None:
    """253 characters: the snapshot of the manifest still fits a file name (255 bytes)."""
    from eagle3_pipeline.local.run import snapshot

    name = "a" * 253
    path = write_manifest(tmp_path / "m.yaml", base_spec(tmp_path / "m", tmp_path / "d.jsonl"), name=name)
    manifest = load_manifest(path)
    copy = snapshot(manifest, tmp_path / "art")
    assert copy.parent == tmp_path / "art" / ".runs" and load_manifest(copy).name == name


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--output", "../x"),
        ("--output", "prepare/../../x"),
        ("--output", "{tmp}/elsewhere"),
        ("--input", "prepare=../../etc"),
        ("--input", "prepare=/etc"),
    ],
)
def test_stage_paths_outside_the_artifacts_root_are_refused(tmp_path: Path, flag: str, value: str) -> None:
    path = write_manifest(tmp_path / "m.yaml", base_spec(tmp_path / "m", tmp_path / "d.jsonl"))
    art = tmp_path / "art"
    art.mkdir()
    args = ["stage", "vocab", "--spec", str(path), "--artifacts", str(art), "--output", "vocab/x"]
    value = value.format(tmp=tmp_path)
    args += [flag, value] if flag == "--input" else []
    if flag == "--output":
        args[args.index("vocab/x")] = value
    proc = eagle3(*args)
    assert proc.returncode == 1, proc.stderr
    assert f"{flag} " in proc.stderr and "outside --artifacts" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art", "m.yaml"]
    assert list(art.iterdir()) == []


def test_a_stage_that_exits_0_without_a_result_fails_with_a_message(tmp_path: Path) -> None:
    spec = base_spec(tmp_path / "m", tmp_path / "d.jsonl", maxSequenceLength=256)
    manifest = load_manifest(write_manifest(tmp_path / "run.yaml", spec))
    plan = next(p for p in plan_stages(manifest.spec) if p.stage == Stage.VOCAB)
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    options = LocalOptions(artifacts=tmp_path / "art", python=str(fake))
    outcome = run_stage_with_retries(plan, manifest.path, options, manifest.spec, dict(os.environ))
    assert outcome.status == "failed"
    assert f"{plan.output_dir}/result.json" in outcome.note and "not a complete stage output" in outcome.note


@pytest.mark.pipeline
def test_an_emptied_output_directory_is_redone_not_taken_as_finished(tmp_path: Path) -> None:
    """`rm -rf prepare/<hash>/*` used to give a FileNotFoundError traceback on every later run."""
    verifier = save_verifier(tmp_path / "verifier")
    source = write_jsonl(tmp_path / "d.jsonl", [chat(i) for i in range(6)])
    path = write_manifest(tmp_path / "run.yaml", base_spec(verifier, source))
    art = tmp_path / "art"
    first = eagle3("run", str(path), "--artifacts", str(art), "--until", "prepare")
    assert first.returncode == 0, first.stderr
    (output,) = [p for p in (art / "prepare").iterdir() if not p.name.startswith(".")]
    for child in output.iterdir():
        shutil.rmtree(child) if child.is_dir() else child.unlink()
    second = eagle3("run", str(path), "--artifacts", str(art), "--until", "prepare")
    assert second.returncode == 0, second.stderr
    assert "Traceback" not in second.stderr and "==> stage prepare" in second.stderr
    assert "not a complete stage output" in second.stderr and (output / "result.json").is_file()
    assert any(p.name.startswith(f".{output.name}.incomplete-") for p in (art / "prepare").iterdir())


# --- error text is printed as it is, never as rich markup (issue 13, item 5) -------------------------------


@pytest.mark.parametrize(
    ("patch", "shown"),
    [
        ({"queueName": "Bad!"}, "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"),
        ({"dataset": {"[bold]loud": 1}}, "spec.dataset.[bold]loud"),
        ({"dataset": {"[/oops]": 1}}, "spec.dataset.[/oops]"),
    ],
)
def test_errors_are_printed_verbatim(tmp_path: Path, patch: dict[str, object], shown: str) -> None:
    spec = base_spec(tmp_path / "m", tmp_path / "d.jsonl")
    for key, value in patch.items():
        spec[key] = {**spec[key], **value} if isinstance(value, dict) else value
    path = write_manifest(tmp_path / "m.yaml", spec)
    proc = eagle3("run", str(path), "--artifacts", str(tmp_path / "art"))
    assert proc.returncode == 2, proc.stderr
    assert shown in proc.stderr and "Traceback" not in proc.stderr and "MarkupError" not in proc.stderr


STUBBORN_STAGE = """#!{python}
import os, subprocess, sys, time
subprocess.Popen(["sleep", "60"])  # a grandchild in the stage's process group, as vLLM's workers are
try:  # ready (the pid written) only once Popen has returned and Ctrl-C is answered: a signal inside
    open(os.environ["PIDFILE"], "w").write(str(os.getpid()))  # Popen's fork raised outside the try
    time.sleep(60)
except KeyboardInterrupt:  # as `eagle3 stage` answers Ctrl-C
    sys.exit(130)
"""

# `eagle3 run` itself, whose stages run as `sys.executable -m eagle3_cli stage ...`: here the fake stage.
# Ctrl-C as a terminal delivers it: a suite started in the background by a non-interactive shell (`make test
# &`) inherits SIGINT ignored, and Python then never raises KeyboardInterrupt (nor do the stages it starts).
DRIVER = """
import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
fake = sys.argv.pop()
sys.executable = fake
from eagle3_cli.main import main
raise SystemExit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_to_the_run_stops_the_running_stages_whole_process_group(
    tmp_path: Path, sig: signal.Signals, code: int
) -> None:
    """SIGTERM to `eagle3 run` used to orphan the stage, which kept writing beside the next run's stage."""
    spec = base_spec(tmp_path / "m", tmp_path / "d.jsonl", maxSequenceLength=256)
    manifest = write_manifest(tmp_path / "run.yaml", spec)
    fake = tmp_path / "python"
    fake.write_text(STUBBORN_STAGE.format(python=sys.executable))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    pidfile = tmp_path / "pid"
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, "run", str(manifest), "--artifacts", str(tmp_path / "art"), str(fake)],
        env={**os.environ, "PIDFILE": str(pidfile)},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not (pidfile.exists() and pidfile.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        stage_pid = int(pidfile.read_text())
        while len(group_members(stage_pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(group_members(stage_pid)) == 2, "the stage and its grandchild run in their own group"
        driver.send_signal(sig)
        _, err = driver.communicate(timeout=120)  # a hang bound: the stop returns as soon as it is done
        assert driver.returncode == code, err
        assert group_members(stage_pid) == [], "no process of the stage's group outlives the run"
        assert "Traceback" not in err and "stopping stage prepare" in err
    finally:
        driver.kill()
        with contextlib.suppress(ProcessLookupError, NameError):
            os.killpg(stage_pid, signal.SIGKILL)


def test_a_second_writer_of_one_output_fails_at_once_naming_the_lock_and_its_holder(tmp_path: Path) -> None:
    spec = base_spec(tmp_path / "m", tmp_path / "d.jsonl")
    manifest = write_manifest(tmp_path / "run.yaml", spec)
    art = tmp_path / "art"
    with hold_output_lock(art / "prepare" / "x"):
        started = time.monotonic()
        proc = eagle3(
            "stage", "prepare", "--spec", str(manifest), "--artifacts", str(art), "--output", "prepare/x"
        )
        assert time.monotonic() - started < 30
    assert proc.returncode == 1
    lock = art / "prepare" / ".x.lock"
    assert str(lock) in proc.stderr and f"pid {os.getpid()}" in proc.stderr, proc.stderr
    assert not (art / "prepare" / "x").exists() and not (art / "prepare" / ".x.partial").exists()


def test_the_summary_table_shows_notes_verbatim() -> None:
    from rich.console import Console

    from eagle3_pipeline.local.display import StageOutcome, summary_table

    console = Console(record=True, width=200)
    console.print(summary_table([StageOutcome("prepare", "failed", note="[/oops] key [bold]loud")]))
    assert "[/oops] key [bold]loud" in console.export_text()


def test_the_summary_tables_key_value_figures_carry_no_thousands_separators() -> None:
    """Issue 29: `tokensPerSecond=3,164, bytesPerToken=1,035,` read as a list of its own."""
    from rich.console import Console

    from eagle3_contract.results import ExtractResult
    from eagle3_pipeline.local.display import StageOutcome, summary_table

    result = ExtractResult(samples=12, tokens=40960, tokens_per_second=3164.4, bytes_per_token=1035.0)
    console = Console(record=True, width=200)
    console.print(summary_table([StageOutcome("extract", "done", result=result)]))
    text = console.export_text()
    assert "tokens=40960, tokensPerSecond=3164, bytesPerToken=1035" in text, text


def test_the_sweep_table_shows_each_cell_against_the_verifier_alone_and_the_tuned_k() -> None:
    from rich.console import Console

    from eagle3_pipeline.local.display import StageOutcome
    from eagle3_pipeline.local.evaluation_tables import sweep_table
    from tests.harness.results import fake_model

    evaluate = fake_model("evaluate")
    assert sweep_table([StageOutcome("prepare", "done")]) is None  # no sweep: no table
    console = Console(record=True, width=200)
    console.print(sweep_table([StageOutcome("evaluate", "done", result=evaluate)]))
    text = console.export_text()
    table = evaluate.speculation
    assert table is not None
    for cell in table.cells:
        assert cell.output_tokens_per_second is not None
        assert f"{cell.output_tokens_per_second:.4g} ({cell.acceptance_length:.2f}," in text
    rows = {line.split("│")[1].strip(): line for line in text.splitlines() if line.count("│") > 2}
    assert [str(r.num_speculative_tokens) in rows["tuned k"] for r in table.schedule] == [True] * len(
        table.schedule
    )
    assert "alone" in rows


def test_the_tuned_k_row_shows_the_k_served_at_every_measured_concurrency() -> None:
    """Issue 29: a concurrency inside a range starting lower printed "-", which reads as speculation off."""
    from rich.console import Console

    from eagle3_contract.api.speculation import BaselineCell, SpeculationTable, SweepCell, plan_schedule
    from eagle3_contract.results import EvaluateResult
    from eagle3_pipeline.local.display import StageOutcome
    from eagle3_pipeline.local.evaluation_tables import sweep_table

    measured = [(1, 1, 30.0, 1.5), (1, 4, 60.0, 1.2), (1, 8, 90.0, 0.9), (3, 1, 36.0, 1.8), (3, 4, 70.0, 1.4),
                (3, 8, 80.0, 0.8)]  # fmt: skip
    cells = [
        SweepCell(num_speculative_tokens=k, concurrency=c, acceptance_length=1.5, output_tokens_per_second=t,
                  speedup=x)
        for k, c, t, x in measured
    ]  # fmt: skip
    schedule = plan_schedule(cells)
    assert any(r.min_batch_size < 4 <= r.max_batch_size for r in schedule), schedule  # 4 is inside a range
    baselines = [BaselineCell(concurrency=c, output_tokens_per_second=20.0 * c) for c in (1, 4, 8)]
    table = SpeculationTable(cells=cells, baselines=baselines, schedule=schedule)
    result = EvaluateResult(acceptance_length=1.5, speculation=table)
    console = Console(record=True, width=200)
    console.print(sweep_table([StageOutcome("evaluate", "done", result=result)]))
    [row] = [line for line in console.export_text().splitlines() if "tuned k" in line]
    served = [cell.strip() for cell in row.split("│")[2:-1]]
    expected = [
        str(next(r.num_speculative_tokens for r in schedule if r.min_batch_size <= c <= r.max_batch_size))
        for c in (1, 4, 8)
    ]
    assert served == expected and "-" not in served, (row, schedule)


# sysfs refuses mkdir to every user, root included: an artifacts directory nobody can write
UNWRITABLE = "/sys/eagle3-not-writable/art"


def test_unwritable_artifacts_are_named_not_a_traceback(tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path / "run.yaml", base_spec(tmp_path / "m", tmp_path / "d.jsonl"))
    proc = eagle3("run", str(manifest), "--artifacts", UNWRITABLE)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "cannot write" in proc.stderr and "/sys/eagle3-not-writable" in proc.stderr
    assert "--artifacts" in proc.stderr


def test_a_stage_on_unwritable_artifacts_names_the_path(tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path / "run.yaml", base_spec(tmp_path / "m", tmp_path / "d.jsonl"))
    proc = eagle3(
        "stage", "prepare", "--spec", str(manifest), "--artifacts", UNWRITABLE, "--output", "prepare/x"
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "stage prepare: cannot write /sys/eagle3-not-writable" in proc.stderr and "writable" in proc.stderr


# --- what the verifier's config rules out fails before any stage (issue 13) --------------------------------


def config_only_verifier(path: Path) -> Path:
    """A verifier with a config and no weights: a check that loaded weights would fail differently."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"num_attention_heads": 6, "num_hidden_layers": 4}))
    return path


TP_PROBLEM = "spec.verifier.tensorParallelSize: 4 does not divide the verifier's 6 attention heads"


def unfit_manifest(tmp_path: Path) -> Path:
    spec = base_spec(config_only_verifier(tmp_path / "verifier"), tmp_path / "d.jsonl")
    spec["verifier"]["tensorParallelSize"] = 4
    spec["extraction"]["layers"] = [1, 4, 9]
    return write_manifest(tmp_path / "m.yaml", spec)


def test_eagle3_run_refuses_what_the_verifiers_config_rules_out(tmp_path: Path) -> None:
    path = unfit_manifest(tmp_path)
    proc = eagle3("run", str(path), "--artifacts", str(tmp_path / "art"))
    assert proc.returncode == 2, proc.stderr
    assert TP_PROBLEM in proc.stderr
    assert "spec.extraction.layers: ids [4, 9] are beyond the verifier's 4 decoder layers" in proc.stderr
    assert not (tmp_path / "art").exists()


def test_the_extract_stage_fails_fast_with_the_same_message(tmp_path: Path) -> None:
    path = unfit_manifest(tmp_path)
    art = tmp_path / "art"
    art.mkdir()
    proc = eagle3("stage", "extract", "--spec", str(path), "--artifacts", str(art), "--output", "extract/x")
    assert proc.returncode == 1, proc.stderr
    assert TP_PROBLEM in proc.stderr
    assert "spec.extraction.layers: ids [4, 9] are beyond the verifier's 4 decoder layers" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.pipeline
def test_offline_extract_that_the_disk_cannot_hold_is_refused_before_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 29: `eagle3 run` refuses offline extract when its hidden states (exact once prepare has run)
    exceed the artifacts directory's free space, naming both figures, as the operator refuses a volume."""
    from eagle3_cli.main import main
    from eagle3_pipeline.local import storage_check

    verifier = save_verifier(tmp_path / "verifier")
    source = write_jsonl(tmp_path / "d.jsonl", [chat(i) for i in range(12)])
    path = write_manifest(tmp_path / "run.yaml", base_spec(verifier, source))
    monkeypatch.setattr(storage_check, "free_bytes", lambda _path: 999)  # a nearly full disk
    code = main(["run", str(path), "--artifacts", str(tmp_path / "art"), "--until", "extract"])
    err = capsys.readouterr().err
    assert code == 1, err
    [flat] = [line for line in err.splitlines() if line.startswith("error: ")]
    assert "extract would store" in flat and "holds 999 B" in flat
    # a local run's advice is about its disk (issue 42, item 7): not the claim's size, not `kubectl patch pvc`
    assert f"the free space under {tmp_path / 'art'} holds 999 B: free " in flat
    assert "more on that disk" in flat
    assert "spec.storage.artifacts.size" not in flat and "kubectl" not in flat
    assert not (tmp_path / "art" / "extract").exists(), "extract never started"
    assert (tmp_path / "art" / "prepare").is_dir(), "prepare ran: its result gave the exact figure"
