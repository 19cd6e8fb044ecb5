"""Stage programs' live progress: the reporter's metrics (read back by the contract's parser), its rate and
ETA, its bounded log line, the train relay, and a real train stage scraped while it runs."""

from __future__ import annotations

import logging
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from eagle3_contract.api.status import StageProgress
from eagle3_contract.stage_metrics import (
    ENV_METRICS_HOST,
    ENV_METRICS_PORT,
    ENV_PROGRESS_SECONDS,
    parse_progress,
)
from eagle3_pipeline.runtime.reporter import StageReporter
from eagle3_pipeline.stages.train.events import EventsFollower, EventsWriter, relayed
from eagle3_pipeline.stages.train.metrics import MetricsRecorder
from tests.pipeline.chat_templates import save_verifier
from tests.pipeline.manifests import base_spec, chat, write_jsonl, write_manifest

pytestmark = pytest.mark.pipeline

REPO = Path(__file__).resolve().parents[2]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def reporter(stage: str = "train", clock: Clock | None = None, log_seconds: float = 60.0) -> StageReporter:
    return StageReporter(stage, clock=clock or Clock(), wall=lambda: 1.7e9, log_seconds=log_seconds)


def scrape(r: StageReporter) -> StageProgress | None:
    return parse_progress(r.exposition())


# --- the figures, through the contract's parser -------------------------------------------------------------


def test_every_figure_survives_the_round_trip_through_parse_progress() -> None:
    clock = Clock()
    r = reporter(clock=clock)
    assert scrape(r) is None, "nothing counted yet: no progress, only the start time"
    r.train_plan(epochs=10, steps_per_epoch=500, step=0, epochs_done=0)
    for step in range(1, 1201):
        clock.now += 0.25
        r.train_steps(step, loss=1.5, tokens=400)
    r.train_epoch(2, 1.402, [0.7, 0.5, 0.25], 2.0125)
    r.fail("too_long", 2)
    r.fail("request")
    r.set_token_budget(8192)
    assert scrape(r) == StageProgress(
        unit="steps", done=1200, total=5000, rate=4.0, eta_seconds=950.0, tokens=480000, failures=3,
        token_budget=8192, epochs_done=2, epochs=10, step=1200, train_loss=1.5, val_loss=1.402,
        val_accuracy_by_position=[0.7, 0.5, 0.25], estimated_acceptance_length=2.0125,
        tokens_per_second=1600.0,
    )  # fmt: skip
    assert "eagle3_stage_start_time_seconds 1.7e+09" in r.exposition()


def test_what_is_unknown_is_absent_not_zero() -> None:
    clock = Clock()
    r = reporter("generate", clock)
    r.begin("rows")
    progress = scrape(r)
    assert progress == StageProgress(unit="rows", done=0)
    clock.now += 600  # a start-up (vLLM loading) before the first row: not part of the rate
    r.advance(3)
    assert scrape(r).rate is None  # type: ignore[union-attr]
    clock.now += 5
    r.advance(3)
    progress = scrape(r)
    assert progress is not None and progress.rate == 0.6
    assert progress.total is None and progress.eta_seconds is None, "no total: no ETA"
    assert progress.tokens is None and progress.failures is None and progress.epochs is None


def test_the_rate_is_recent_and_a_stall_drops_it_to_zero_without_an_eta() -> None:
    clock = Clock()
    r = reporter("extract", clock)
    r.begin("samples", total=10_000, done=1000)  # an earlier attempt's samples are done, not fast
    for _ in range(600):  # 10 samples/s for 10 minutes
        clock.now += 1
        r.advance(10, tokens=100)
    fast = scrape(r)
    assert fast is not None and fast.done == 7000 and fast.rate == 10.0 and fast.eta_seconds == 300.0
    for _ in range(300):  # 2 samples/s: the window forgets the fast part
        clock.now += 1
        r.advance(2)
    slow = scrape(r)
    assert slow is not None and slow.rate == 2.0 and slow.eta_seconds == (10_000 - 7600) / 2
    clock.now += 600  # nothing for longer than the window
    stalled = scrape(r)
    assert stalled is not None and stalled.rate == 0.0 and stalled.eta_seconds is None
    r.advance(2400)
    clock.now += 1
    done = scrape(r)
    assert done is not None and done.done == done.total and done.eta_seconds == 0.0


def test_the_end_line_says_how_fast_the_whole_stage_went_however_short(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    r = reporter("train", clock)
    caplog.set_level(logging.INFO, logger="eagle3_pipeline.runtime.reporter")
    r.train_plan(epochs=1, steps_per_epoch=30)
    clock.now += 120  # building the trainer: not part of the rate
    for step in range(1, 31):  # 30 steps in 0.6 s: too short for a live rate, not for the end line's
        clock.now += 0.02
        r.train_steps(step, loss=1.0, tokens=100)
    assert scrape(r).rate is None  # type: ignore[union-attr]
    clock.now += 300  # saving the checkpoint: a pause after the last step, not a stall
    r.close()
    end = [rec.getMessage() for rec in caplog.records][-1]
    assert end.startswith("stage train: 30/30 steps (100%), 50.0 steps/s; epoch 0/1, loss 1.000"), end
    assert end.endswith("3000 tokens, 5000 tokens/s"), end


def test_many_updates_make_few_log_lines(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    r = reporter("generate", clock, log_seconds=60)
    caplog.set_level(logging.INFO, logger="eagle3_pipeline.runtime.reporter")
    r.begin("rows", total=100_000)
    for _ in range(100_000):  # 100,000 rows in 500 s
        clock.now += 0.005
        r.advance(1, tokens=7)
        if clock.now % 50 < 0.005:
            r.fail("request")
    r.close()
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "eagle3_pipeline.runtime.reporter"]
    assert len(lines) == 1 + 8 + 1, lines  # the start, one a minute, the end
    assert lines[0] == "stage generate: 0/100000 rows (0%)"
    assert lines[1].startswith("stage generate: 12000/100000 rows (12%), 200 rows/s, ETA 7m; 84000 tokens")
    assert lines[-1].startswith("stage generate: 100000/100000 rows (100%), 200 rows/s; 700000 tokens")
    assert "failed (request " in lines[-1]


def test_the_train_line_reads_like_a_person_would_write_it(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    r = reporter(clock=clock)
    r.train_plan(10, 500)
    for step in range(1, 1201):
        clock.now += 1 / 3.1
        r.train_steps(step, loss=1.234)
    r.train_epoch(2, 1.402, [0.8, 0.6], 2.71)
    assert r.line().startswith(
        "stage train: 1200/5000 steps (24%), 3.1 steps/s, ETA 20m; epoch 2/10, loss 1.234, val loss 1.402, "
        "est. acceptance 2.71"
    )


def test_updates_from_threads_are_all_counted() -> None:
    r = StageReporter("extract")
    r.begin("samples")

    def count() -> None:
        for _ in range(20_000):
            r.advance(1, tokens=2)
            r.fail("x")

    threads = [threading.Thread(target=count) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    progress = scrape(r)
    assert progress is not None and (progress.done, progress.tokens, progress.failures) == (
        80_000,
        160_000,
        80_000,
    )


# --- serving ------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
        return str(response.read().decode())


def test_the_endpoint_serves_while_open_and_frees_its_port_when_closed() -> None:
    port = free_port()
    env = {ENV_METRICS_PORT: str(port), ENV_METRICS_HOST: "127.0.0.1", ENV_PROGRESS_SECONDS: "5"}
    r = StageReporter.from_env("vocab", env)
    assert r.log_seconds == 5.0
    r.begin("steps", 2)
    r.advance()
    progress = parse_progress(get(port))
    assert progress is not None and (progress.unit, progress.done, progress.total) == ("steps", 1, 2)
    r.close()
    with pytest.raises(urllib.error.URLError):
        get(port)
    again = StageReporter.from_env("vocab", env)  # the port is free for the next program
    again.begin("steps", 2)
    assert parse_progress(get(port)) == StageProgress(unit="steps", done=0, total=2)
    again.close()


def test_no_port_serves_nothing_and_a_taken_port_is_only_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    assert StageReporter.from_env("prepare", {})._server is None
    assert StageReporter.from_env("prepare", {ENV_METRICS_PORT: "0"})._server is None
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = StageReporter.from_env("prepare", {ENV_METRICS_PORT: str(port), ENV_METRICS_HOST: "127.0.0.1"})
    assert r._server is None and "cannot serve progress metrics" in caplog.text
    r.close()


# --- training: speculators' records, and the relay from torchrun's rank 0 ----------------------------------


def step_record(epoch: int, step: int, loss: float) -> dict[str, Any]:
    profile = {"step_ms": 100.0, "tokens_per_s": 1000.0}  # 100 tokens per step
    return {"train": {"loss": loss}, "profile": profile, "epoch": epoch, "lr": 0.1, "global_step": step}


def val_record(epoch: int) -> dict[str, Any]:
    val = {"loss_epoch": 2.5, "cond_acc_0_epoch": 0.5, "cond_acc_1_epoch": 0.5}
    return {"val": val, "epoch": epoch}


def feed(recorder: MetricsRecorder, steps_per_epoch: int, epochs: int) -> None:
    logger = logging.getLogger("test.speculators.metrics")
    for epoch in range(epochs):
        for k in range(steps_per_epoch):
            recorder.emit(
                logger.makeRecord(
                    "m", logging.INFO, "", 0, step_record(epoch, epoch * 4 + k, 3.0), None, None
                )
            )
        recorder.emit(logger.makeRecord("m", logging.INFO, "", 0, val_record(epoch), None, None))


def test_the_metrics_recorder_tells_the_reporter_every_step_and_epoch(tmp_path: Path) -> None:
    r = StageReporter("train")
    r.train_plan(3, 4)
    feed(MetricsRecorder(tmp_path / "metrics.jsonl", progress=r, world_size=2), steps_per_epoch=4, epochs=2)
    progress = scrape(r)
    assert progress is not None
    assert (progress.done, progress.total, progress.step, progress.epochs_done, progress.epochs) == (
        8,
        12,
        8,
        2,
        3,
    )
    assert (progress.train_loss, progress.val_loss, progress.tokens) == (3.0, 2.5, 8 * 100 * 2)
    assert progress.val_accuracy_by_position == [0.5, 0.5] and progress.estimated_acceptance_length == 1.75


def test_a_torchrun_workers_progress_reaches_the_stages_reporter_in_a_few_lines(tmp_path: Path) -> None:
    events = tmp_path / "progress.jsonl"
    r = StageReporter("train")
    with relayed(events, r):
        writer = EventsWriter(events, flush_seconds=3600)  # the steps of an epoch: one line
        writer.train_plan(3, 4, step=0, epochs_done=0)
        feed(MetricsRecorder(tmp_path / "metrics.jsonl", progress=writer), steps_per_epoch=4, epochs=2)
        writer.close()
        assert len(events.read_text().splitlines()) == 1 + 2 * 2
    assert not events.exists(), "no progress file is left in the stage's output"
    progress = scrape(r)
    assert progress is not None
    assert (progress.done, progress.total, progress.epochs_done, progress.tokens) == (8, 12, 2, 800)
    assert (progress.train_loss, progress.val_loss) == (3.0, 2.5)


def test_a_torn_or_foreign_line_is_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    events = tmp_path / "progress.jsonl"
    plan = '{"plan": {"epochs": 2, "steps_per_epoch": 5, "step": 0, "epochs_done": 0}}'
    steps = '{"steps": {"step": 3, "steps": 3, "tokens": 9, "loss": null}}'
    events.write_text(f'{{"plan": {{"epochs": 2}}}}\n{plan}\n{steps}\n{{"epo')
    r = StageReporter("train")
    follower = EventsFollower(events, r)
    follower.read()
    progress = scrape(r)
    assert progress is not None and (progress.step, progress.tokens) == (3, 9)
    assert "skipping a progress line" in caplog.text
    with events.open("a") as f:
        f.write('ch": {"epochs_done": 1, "val_loss": 2.0, "accuracy": [], "acceptance": 1.0}}\n')
    follower.read()
    assert scrape(r) is not None and r.figures().epochs_done == 1


# --- a real stage program, scraped while it runs ------------------------------------------------------------

EPOCHS = 3
UPSTREAM = ["prepare=prepare/p", "extract=extract/x", "vocab=vocab/v"]


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """A small random verifier and its prepare, extract and vocab outputs (the stages run in this process),
    and the progress lines they logged."""
    import torch

    from eagle3_pipeline.stage_main import run_stage

    root = tmp_path_factory.mktemp("progress")
    save_verifier(root / "verifier", layers=4)
    write_jsonl(root / "data.jsonl", [chat(i, turns=2) for i in range(24)])
    doc = base_spec(root / "verifier", root / "data.jsonl", validationFraction=0.25, maxSequenceLength=128)
    doc["extraction"]["layers"] = [1, 2, 3]
    doc["training"] |= {"epochs": EPOCHS, "learningRate": 3e-3, "sequenceLength": 128}
    spec = str(write_manifest(root / "run.yaml", doc))
    art = str(root / "art")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    lines, progress_logger = Lines(), logging.getLogger("eagle3_pipeline.runtime.reporter")
    level = progress_logger.level
    progress_logger.addHandler(lines)
    progress_logger.setLevel(logging.INFO)
    try:
        assert run_stage("prepare", spec, art, "prepare/p", []) == 0
        assert run_stage("extract", spec, art, "extract/x", ["prepare=prepare/p"]) == 0
        assert run_stage("vocab", spec, art, "vocab/v", ["prepare=prepare/p"]) == 0
    finally:
        torch.set_num_threads(threads)
        progress_logger.removeHandler(lines)
        progress_logger.setLevel(level)
    return root, lines.lines


def test_the_data_stages_log_where_they_start_and_end(upstream: tuple[Path, list[str]]) -> None:
    _, lines = upstream
    assert lines[0] == "stage prepare: 0 rows", "the start line, before the rows are read"
    assert lines[1].startswith("stage prepare: 24/24 rows (100%)") and " tokens" in lines[1]
    extract = [line for line in lines if line.startswith("stage extract:")]
    assert extract[0] == "stage extract: 0/24 samples (0%); token budget 512"
    assert extract[-1].startswith("stage extract: 24/24 samples (100%)") and "token budget 512" in extract[-1]
    vocab = [line for line in lines if line.startswith("stage vocab:")]
    assert vocab[0] == "stage vocab: 0/2 steps (0%)" and len(vocab) == 2
    assert re.fullmatch(r"stage vocab: 2/2 steps \(100%\)(, [0-9.]+k? steps/s)?", vocab[1]), vocab


def scrape_while_running(proc: subprocess.Popen[bytes], port: int, log: Path) -> list[StageProgress]:
    seen: list[StageProgress] = []
    deadline = time.monotonic() + 240
    while proc.poll() is None:
        assert time.monotonic() < deadline, "the train stage did not finish in time"
        try:
            progress = parse_progress(get(port))
        except (urllib.error.URLError, ConnectionError):
            progress = None  # not serving yet, or just stopped
        if progress is not None and (not seen or progress != seen[-1]):
            seen.append(progress)
        time.sleep(0.1)
    assert proc.returncode == 0, log.read_text()[-3000:]
    return seen


@pytest.mark.timeout(300)
def test_a_running_train_stage_serves_its_steps_and_epochs(
    upstream: tuple[Path, list[str]], tmp_path: Path
) -> None:
    root, _ = upstream
    port = free_port()
    argv = [sys.executable, "-m", "eagle3_cli", "stage", "train", "--spec", str(root / "run.yaml")]
    argv += ["--artifacts", str(root / "art"), "--output", "train/t", *(f"--input={i}" for i in UPSTREAM)]
    env = os.environ | {"OMP_NUM_THREADS": "1", ENV_PROGRESS_SECONDS: "1"}
    env |= {ENV_METRICS_PORT: str(port), ENV_METRICS_HOST: "127.0.0.1"}
    log = tmp_path / "stage.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT)
        try:
            seen = scrape_while_running(proc, port, log)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)
    assert seen and all(p.unit == "steps" and p.epochs == EPOCHS for p in seen)
    steps = [p.step or 0 for p in seen]
    epochs = [p.epochs_done or 0 for p in seen]
    assert steps == sorted(steps) and len(set(steps)) >= 3, steps
    assert epochs == sorted(epochs) and len(set(epochs)) >= 2, epochs
    last = seen[-1]
    assert last.total and last.total % EPOCHS == 0 and last.done > 0  # epochs of packed batches may vary
    assert last.tokens and last.train_loss
    # tokens/s comes from the same window as the step rate: served wherever a rate is (none before a second of
    # steps: a fast machine trains this whole stage in about that, so no scrape need see one)
    assert all(p.tokens_per_second for p in seen if p.rate), seen
    with_val = [p for p in seen if p.epochs_done]
    assert with_val and all(p.val_loss and p.val_accuracy_by_position for p in with_val)
    assert "steps (100%), " in log.read_text() and f"; epoch {EPOCHS}/{EPOCHS}, " in log.read_text()
    assert not (root / "art" / "train" / "t" / "progress.jsonl").exists()


def test_a_total_estimated_short_grows_to_what_was_done() -> None:
    r = reporter("train", Clock())
    r.train_plan(2, 5)  # steps per epoch from the first epoch's batches: packing may add one later
    r.train_steps(11)
    progress = scrape(r)
    assert progress is not None and (progress.done, progress.total) == (11, 11)


def test_the_validation_loss_rises_count_the_epochs_in_a_row_it_went_up() -> None:
    r = reporter()
    r.train_plan(6, 10)
    rises = []
    for epoch, loss in enumerate([1.0, 1.1, 1.2, 0.9, 0.95, 0.95], start=1):
        r.train_epoch(epoch, loss, [0.5], 1.5)
        rises.append(r.figures().val_loss_rises)
    assert rises == [0, 1, 2, 0, 1, 0]  # an equal loss ends the run of rises
    assert "eagle3_train_val_loss_rises 0.0" in r.exposition()


def test_a_stall_after_steps_within_one_second_is_a_rate_of_exactly_zero() -> None:
    clock = Clock()
    r = reporter("extract", clock)
    r.begin("samples", total=100)
    assert scrape(r).rate is None  # type: ignore[union-attr]  # starting up: no rate, not a stall
    for _ in range(10):
        clock.now += 0.3
        r.advance(1)
    clock.now += 200  # longer than the rate's window without a unit
    progress = scrape(r)
    assert progress is not None and progress.rate == 0.0 and progress.eta_seconds is None
