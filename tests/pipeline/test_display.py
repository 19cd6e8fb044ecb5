"""`eagle3 run`'s live progress: each stage subprocess gets a metrics port, the executor polls it and shows
one line per stage (rich on a terminal, plain lines elsewhere), the program's lines and its last words on
failure.

The stage program here is a small fake that serves the contract's metrics with prometheus-client, as the
real programs' reporter does (eagle3_contract.stage_metrics names them)."""

from __future__ import annotations

import io
import json
import os
import re
import stat
import sys
import time
from pathlib import Path

import pytest

from eagle3_contract.api.manifest import load_manifest
from eagle3_contract.api.status import StageProgress
from eagle3_contract.results import TrainEpoch, TrainResult
from eagle3_contract.stages import Stage, plan_stages
from eagle3_pipeline.local.display import (
    MetricsPoller,
    PlainDisplay,
    RunObserver,
    StageOutcome,
    TerminalDisplay,
    completed,
    fetch_progress,
    final_line,
    metrics_url,
    progress_fields,
)
from eagle3_pipeline.local.run import LocalOptions, LocalRunError, run_local, run_stage_with_retries
from tests.pipeline.manifests import base_spec, write_manifest

FAKE_STAGE = """#!{python}
import json, os, sys, threading, time
from prometheus_client import CollectorRegistry, Gauge, start_http_server
args = sys.argv[1:]
assert os.environ["EAGLE3_METRICS_HOST"] == "127.0.0.1", os.environ["EAGLE3_METRICS_HOST"]
registry, scrapes, counted = CollectorRegistry(), [0], threading.Condition()
class Scrapes:  # registered first: a scrape counted here reads every gauge after it
    def collect(self):
        with counted:
            scrapes[0] += 1
            counted.notify_all()
        return []
registry.register(Scrapes())
def scraped_twice():  # the executor polls twice a second: wait for it, however slow, not for a time
    with counted:
        wanted = scrapes[0] + 2
        counted.wait_for(lambda: scrapes[0] >= wanted, timeout=120)
done = Gauge("eagle3_stage_units_done", "d", ["unit"], registry=registry)
total = Gauge("eagle3_stage_units", "t", ["unit"], registry=registry)
rate = Gauge("eagle3_stage_units_per_second", "r", ["unit"], registry=registry)
eta = Gauge("eagle3_stage_eta_seconds", "e", registry=registry)
port, host = int(os.environ["EAGLE3_METRICS_PORT"]), os.environ["EAGLE3_METRICS_HOST"]
start_http_server(port, addr=host, registry=registry)
total.labels("rows").set(40)
for i in range(1, 41):
    done.labels("rows").set(i)
    rate.labels("rows").set(20.0)
    eta.set((40 - i) / 20)
    if i % 20 == 0:
        print("stage x: %d/40 rows" % i, file=sys.stderr, flush=True)
        scraped_twice()  # read while it runs (20/40), and its last figures before it ends (40/40)
    time.sleep(0.01)
if os.environ.get("FAKE_FAILS"):
    print("Traceback (most recent call last):\\n  ...", file=sys.stderr)
    print("error: stage x: the input is broken; fix it", file=sys.stderr)
    sys.exit(1)
out = os.path.join(args[args.index("--artifacts") + 1], args[args.index("--output") + 1])
os.makedirs(out)
json.dump({{"seconds": 2.0}}, open(os.path.join(out, "result.json"), "w"))
"""


def fake_python(tmp_path: Path) -> Path:
    fake = tmp_path / "python"
    fake.write_text(FAKE_STAGE.format(python=sys.executable))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    return fake


class Recorder(RunObserver):
    def __init__(self) -> None:
        self.events: list[tuple[str, object]] = []

    def stage_started(self, stage: str, output_dir: str, attempt: int) -> None:
        self.events.append(("started", attempt))

    def stage_progress(self, stage: str, progress: StageProgress) -> None:
        self.events.append(("progress", progress))

    def stage_output(self, stage: str, line: str) -> None:
        self.events.append(("line", line))

    def stage_finished(self, outcome: StageOutcome) -> None:
        self.events.append(("finished", outcome.status))

    def of(self, kind: str) -> list[object]:
        return [value for k, value in self.events if k == kind]


def vocab_plan(tmp_path: Path):  # type: ignore[no-untyped-def]
    manifest = load_manifest(write_manifest(tmp_path / "run.yaml", base_spec(tmp_path / "m", tmp_path / "d")))
    return manifest, next(p for p in plan_stages(manifest.spec) if p.stage == Stage.VOCAB)


def test_the_stage_serves_its_progress_on_the_port_the_executor_gave_and_the_line_follows_it(
    tmp_path: Path,
) -> None:
    manifest, plan = vocab_plan(tmp_path)
    options = LocalOptions(artifacts=tmp_path / "art", python=str(fake_python(tmp_path)))
    seen = Recorder()
    outcome = run_stage_with_retries(plan, manifest.path, options, manifest.spec, dict(os.environ), seen)
    assert outcome.status == "done", outcome.note
    figures = [p for p in seen.of("progress") if isinstance(p, StageProgress)]
    assert len(figures) >= 2, seen.events  # read while it ran, about twice a second
    assert [p.done for p in figures] == sorted(p.done for p in figures)
    assert figures[-1].done == 40 and figures[-1].total == 40 and figures[-1].unit == "rows"
    assert outcome.progress == completed(figures[-1])  # the stage's last figures stay with its outcome
    assert seen.of("line") == ["stage x: 20/40 rows", "stage x: 40/40 rows"]


def test_a_failed_stage_keeps_the_programs_last_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifest, plan = vocab_plan(tmp_path)
    options = LocalOptions(artifacts=tmp_path / "art", python=str(fake_python(tmp_path)))
    monkeypatch.setenv("FAKE_FAILS", "1")
    seen = Recorder()
    outcome = run_stage_with_retries(plan, manifest.path, options, manifest.spec, dict(os.environ), seen)
    assert outcome.status == "failed"
    assert outcome.note == "exit code 1: error: stage x: the input is broken; fix it"
    assert "Traceback (most recent call last):" in seen.of("line")  # every line is shown


def test_off_a_terminal_each_stage_leaves_its_lines_and_one_final_line(tmp_path: Path) -> None:
    spec = base_spec(tmp_path / "m", tmp_path / "d")
    manifest = load_manifest(write_manifest(tmp_path / "run.yaml", spec))
    options = LocalOptions(artifacts=tmp_path / "art", until="prepare", python=str(fake_python(tmp_path)))
    out = io.StringIO()
    run_local(manifest, options, PlainDisplay(out))
    skipped, *lines = out.getvalue().splitlines()
    assert skipped.startswith("predict   skipped: evaluation.predict is false"), skipped  # off by default
    assert lines[0].startswith("==> stage prepare (prepare/")
    assert lines[1:3] == ["stage x: 20/40 rows", "stage x: 40/40 rows"]
    assert lines[3].startswith("prepare   done in ") and lines[3].endswith("s  40/40 rows"), lines[3]
    assert len(lines) == 4
    again = io.StringIO()
    run_local(manifest, options, PlainDisplay(again))
    assert again.getvalue().splitlines()[1].startswith("prepare   reused (prepare/"), again.getvalue()


def test_on_a_terminal_one_live_line_per_stage_ends_with_its_outcome(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rich.console import Console

    spec = base_spec(tmp_path / "m", tmp_path / "d")
    manifest = load_manifest(write_manifest(tmp_path / "run.yaml", spec))
    options = LocalOptions(artifacts=tmp_path / "art", until="prepare", python=str(fake_python(tmp_path)))
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=120, color_system=None)
    run_local(manifest, options, TerminalDisplay(console))
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.getvalue())  # no cursor moves
    assert "stage x: 40/40 rows\n" in text  # the program's lines, above the live line
    final = text.rsplit("\r", 1)[-1].splitlines()  # the live area's last drawing
    [line] = [row for row in final if row.startswith("prepare")]
    assert "40/40 rows" in line and "done in" in line, line
    monkeypatch.setenv("FAKE_FAILS", "1")
    options = LocalOptions(artifacts=tmp_path / "art2", until="prepare", python=str(fake_python(tmp_path)))
    screen.truncate(0)
    with pytest.raises(LocalRunError, match="exit code 1: error: stage x: the input is broken"):
        run_local(manifest, options, TerminalDisplay(console))
    assert "failed after" in screen.getvalue()


def test_the_poller_ignores_a_program_that_does_not_answer_yet() -> None:
    from eagle3_pipeline.serving.vllm_server import free_port

    port = free_port()
    assert fetch_progress(metrics_url("127.0.0.1", port), timeout=0.2) is None
    seen: list[StageProgress] = []
    with MetricsPoller(metrics_url("127.0.0.1", port), seen.append, interval=0.05):
        time.sleep(0.3)
    assert seen == []


def test_the_line_shows_trains_epochs_and_loss() -> None:
    progress = StageProgress(
        unit="steps",
        done=120,
        total=400,
        rate=3.14159,
        eta_seconds=89,
        epochs_done=2,
        epochs=6,
        train_loss=0.8861,
    )
    assert progress_fields(progress) == {
        "count": "120/400 steps",
        "rate": "3.14 steps/s",
        "eta": "ETA 1m",
        "extra": "epoch 2/6 loss 0.8861",
    }
    done = StageOutcome("train", "done", seconds=137.24, attempts=1, progress=progress)
    assert final_line(done) == "train     done in 137.2s  120/400 steps  epoch 2/6 loss 0.8861"
    done.progress = completed(progress)  # the last poll may be before the end: a stage that succeeded did all
    assert final_line(done) == "train     done in 137.2s  400/400 steps  epoch 6/6 loss 0.8861"
    # the last poll came before the last validation: the line shows the result's last epoch, as metrics.jsonl
    stale = progress.model_copy(update={"val_loss": 1.949, "done": 398, "total": 398})
    epochs = [
        TrainEpoch(epoch=i, train_loss=0.5 - i / 100, val_loss=2.0 - i / 10, train_steps=66) for i in range(6)
    ]
    result = TrainResult(epochs=[*epochs[:5], epochs[5].model_copy(update={"train_steps": 70})])
    done.progress = completed(stale, result)
    assert final_line(done) == "train     done in 137.2s  400/400 steps  epoch 6/6 loss 0.45 val loss 1.5"
    oom = StageOutcome("extract", "failed", seconds=3, attempts=2, note="OutOfMemory")
    assert final_line(oom) == "extract   failed after 3.0s (2 attempts): OutOfMemory"
    assert progress_fields(None) == {"count": "", "rate": "", "eta": "", "extra": ""}


def test_the_run_records_its_stages_for_eagle3_status(tmp_path: Path) -> None:
    spec = base_spec(tmp_path / "m", tmp_path / "d")
    manifest = load_manifest(write_manifest(tmp_path / "run.yaml", spec))
    options = LocalOptions(artifacts=tmp_path / "art", until="prepare", python=str(fake_python(tmp_path)))
    run_local(manifest, options, PlainDisplay(io.StringIO()))
    recorded = json.loads((tmp_path / "art" / ".runs" / "t.status.json").read_text())
    prepare = recorded["stages"]["prepare"]
    assert prepare["phase"] == "Succeeded" and prepare["attempts"] == 1 and prepare["seconds"] > 1
    assert prepare["progress"]["done"] == 40 and recorded["pid"] is None
