"""Real stage programs for the tier: `eagle3 stage` processes serving their progress metrics on
$EAGLE3_METRICS_PORT, scraped with the labels the run's stage PodMonitor gives (namespace, run, stage, pod).

- `training`: `eagle3 stage train` on a tiny random verifier (tests/pipeline's), after real prepare,
  extract and vocab stages. Its learning rate warms up over the whole run to 1.0 (TRAIN), so the validation
  loss rises at epochs 1 to 4 (0.0077, 0.0082, 0.0107, 0.0218, 0.0273, then it falls): the case
  Eagle3ValidationLossRising is for, from the end of epoch 2 (3 epochs done) to the end of epoch 4. Seeded,
  on the CPU: the same losses every time.
- `hung`: `eagle3 stage generate` whose vLLM server hangs: a stand-in `vllm` (FAKE_VLLM) that answers
  /health and /v1/models and never answers a chat completion. One row (a system turn only) fails at once,
  the others wait: a failed row, then a rate of 0 while the pod is up and the stage is not done, what
  Eagle3StageStalled is for. The reporter's rate covers its last RATE_WINDOW_SECONDS: it is 0 that long
  after the failure.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from eagle3_contract.stage_metrics import (
    ENV_METRICS_HOST,
    ENV_METRICS_PORT,
    METRICS_PATH,
    RATE_WINDOW_SECONDS,
)
from eagle3_pipeline.serving.vllm_server import ENV_VLLM, free_port
from tests.observability.operator_stack import NAMESPACE
from tests.observability.prometheus import Target, wait_for
from tests.pipeline.draft_support import DATASET, conversations, write_data_stage
from tests.pipeline.manifests import base_spec, chat, write_jsonl, write_manifest

EAGLE3 = str(Path(sys.executable).with_name("eagle3"))
HOST = "127.0.0.1"
TRAIN_ROWS, VALIDATION_FRACTION = 40, 0.2
TRAIN: dict[str, Any] = {
    "epochs": 8,
    "learningRate": 1.0,
    "warmupRatio": 0.99,  # the rate climbs for the whole run: the validation loss rises from epoch 1
    "scheduler": "constant",
    "sequenceLength": 128,
}
RISING_AT = 3  # epochs done when the validation loss has risen for 2 epochs in a row (epochs 1 and 2)
UPSTREAM = ["prepare=prepare/t", "extract=extract/t", "vocab=vocab/t"]
HUNG_ROWS = 6
STALL_WAIT_S = RATE_WINDOW_SECONDS + 60.0
UPSTREAM_TIMEOUT_S = 600.0
STOP_GRACE_S = 15.0

FAKE_VLLM = """
import argparse, json, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

parser = argparse.ArgumentParser()
parser.add_argument("--host", default="127.0.0.1")
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--served-model-name", default="model")
args, _ = parser.parse_known_args(sys.argv[2:])


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/health":
            return self.reply({})
        if self.path == "/v1/models":
            return self.reply({"object": "list", "data": [{"id": args.served_model_name, "object": "model"}]})
        self.send_error(404)

    def do_POST(self):  # a hung engine: the request is read, never answered
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        threading.Event().wait()

    def reply(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a):
        pass


server = ThreadingHTTPServer((args.host, args.port), Handler)
server.daemon_threads = True
server.serve_forever()
"""


@dataclass
class StageProcess:
    """One `eagle3 stage` program serving its metrics, and the target Prometheus scrapes it as."""

    run: str
    stage: str
    argv: list[str]
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    port: int = 0
    process: subprocess.Popen[bytes] | None = None

    @property
    def target(self) -> Target:
        labels = {
            "namespace": NAMESPACE,
            "run": self.run,
            "stage": self.stage,
            "pod": f"{self.run}-{self.stage}-0",
        }
        return Target(f"stage-{self.run}", f"{HOST}:{self.port}", labels)

    def start(self) -> subprocess.Popen[bytes]:
        self.port = self.port or free_port()  # chosen beforehand: Prometheus may know the target already
        env = os.environ | self.env | {ENV_METRICS_PORT: str(self.port), ENV_METRICS_HOST: HOST}
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env
            )
        return self.process

    def serving(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(
                f"{self.stage} of {self.run} exited with {self.process.returncode}: {self.tail()}"
            )
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"http://{HOST}:{self.port}{METRICS_PATH}", timeout=5.0).status_code == 200
        return False

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM (the program keeps its finished work and exits), SIGKILL after the grace."""
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10.0)


def stage_argv(stage: str, spec: Path, art: Path, output: str, inputs: list[str]) -> list[str]:
    return [EAGLE3, "stage", stage, "--spec", str(spec), "--artifacts", str(art), "--output", output] + [
        f"--input={i}" for i in inputs
    ]


def training_spec(root: Path) -> Path:
    """The tiny random verifier, 40 chats (8 held out) and the rising-loss training of TRAIN."""
    from tests.pipeline.chat_templates import save_verifier

    save_verifier(root / "verifier", layers=4)
    write_jsonl(root / "data.jsonl", [chat(i, turns=2) for i in range(TRAIN_ROWS)])
    doc = base_spec(
        root / "verifier", root / "data.jsonl", validationFraction=VALIDATION_FRACTION, maxSequenceLength=128
    )
    doc["extraction"]["layers"] = [1, 2, 3]
    doc["training"] |= TRAIN
    return write_manifest(root / "training.yaml", doc, name="training")


def hung_spec(root: Path) -> Path:
    """The tiny verifier's spec with regeneration; up to half the rows may fail (the one bad row does)."""
    from tests.pipeline.draft_support import evaluate_spec

    doc = evaluate_spec()  # /models/...: $EAGLE3_MODELS_ROOT (the tier sets it) maps them onto `models`
    doc["regeneration"] = {"enabled": True, "maxTokens": 8, "concurrency": 2, "maxFailedFraction": 0.5}
    return write_manifest(root / "hung.yaml", doc, name="hung")


def hung_rows(models: Path) -> list[dict[str, Any]]:
    """A row generate cannot answer (no user turn) first, then the dataset's first chats."""
    bad = {
        "id": "no-question",
        "messages": [{"role": "system", "content": "Nothing to answer."}],
        "split": "train",
    }
    return [bad, *conversations(models / DATASET)[: HUNG_ROWS - 1]]


class StageStack:
    """The tier's stage programs: `hung` at once, the training's upstream stages in the background, and the
    train stage when `train` is called (after the vLLM traffic: its rising epochs must be live at `end`)."""

    def __init__(self, models: Path, work: Path) -> None:
        self.work = work
        work.mkdir(parents=True, exist_ok=True)
        self.art = work / "art"
        self.fake_vllm = work / "fake-vllm"
        self.fake_vllm.write_text(f"#!{sys.executable}\n{FAKE_VLLM}")
        self.fake_vllm.chmod(self.fake_vllm.stat().st_mode | stat.S_IXUSR)
        data = write_data_stage(self.art, hung_rows(models), "prepare/hung")
        spec = hung_spec(work)
        self.hung = StageProcess(
            "hung", "generate", stage_argv("generate", spec, self.art, "generate/hung", [f"prepare={data}"]),
            work / "hung.log", {ENV_VLLM: str(self.fake_vllm)},
        )  # fmt: skip
        self.train_spec = training_spec(work / "training")
        self.training = StageProcess(
            "training", "train", stage_argv("train", self.train_spec, self.art, "train/t", UPSTREAM),
            work / "training.log", {"OMP_NUM_THREADS": "1"},
        )  # fmt: skip
        self._upstream = threading.Thread(target=self._run_upstream, name="upstream stages", daemon=True)
        self._upstream_error: str | None = None
        self._step: StageProcess | None = None  # the upstream stage running now
        self._closed = threading.Event()

    def start(self) -> None:
        self.hung.start()
        self._upstream.start()

    def _run_upstream(self) -> None:
        inputs = {"prepare": [], "extract": UPSTREAM[:1], "vocab": UPSTREAM[:1]}
        for stage, needs in inputs.items():
            argv = stage_argv(stage, self.train_spec, self.art, f"{stage}/t", needs)
            step = StageProcess("training", stage, argv, self.work / f"{stage}.log", {"OMP_NUM_THREADS": "1"})
            if self._closed.is_set():
                return
            self._step = step
            try:
                code = step.start().wait(UPSTREAM_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                step.stop()
                code = None
            if code != 0:
                self._upstream_error = f"stage {stage} ended with {code}: {step.tail()}"
                return

    def train(self, before_start: Callable[[StageProcess], None] = lambda process: None) -> StageProcess:
        """Start the train stage once its inputs are done; returns when it serves its metrics. Its port is
        chosen first and handed to `before_start` (so Prometheus scrapes it from its first second: a tiny
        epoch can end before a target added afterwards is first scraped)."""
        self._upstream.join(UPSTREAM_TIMEOUT_S)
        assert not self._upstream.is_alive(), "the training's upstream stages did not finish"
        assert self._upstream_error is None, self._upstream_error
        self.training.port = free_port()
        before_start(self.training)
        self.training.start()
        wait_for(self.training.serving, 120, "the train stage serving its metrics")
        return self.training

    def close(self) -> None:
        self._closed.set()
        for process in (self._step, self.training, self.hung):
            if process is not None:
                process.stop()
