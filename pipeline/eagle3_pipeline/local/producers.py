"""Hidden-state producers for `eagle3 run` in online mode: what the operator's producer Deployment (and the
Mooncake master) are in a cluster, as local processes around the train stage.

`LocalProducers` starts `eagle3 produce` (vLLM with the `extract_hidden_states` method) on a loopback port,
and `mooncake_master` for `extraction.transfer: mooncake`, waits until the producer answers (failing fast,
with the log's last lines, when it exits first), and gives the train stage the environment that points at
them (eagle3_contract.online). Like a Deployment it replaces a producer that dies while training runs (the
trainer waits for it and goes on); on exit it stops them all, so their memory is freed when training ends.

Locally one producer serves however many `extraction.servers` the spec asks for (in a cluster a Service
spreads the requests over the replicas).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import TracebackType

import httpx

from eagle3_contract.api.spec import Eagle3RunSpec
from eagle3_contract.online import (
    ENV_HIDDEN_STATES_ENDPOINT,
    ENV_MOONCAKE_MASTER,
    endpoint_url,
    mooncake_master_argv,
    produce_argv,
)
from eagle3_pipeline.runtime.process_group import stop_group
from eagle3_pipeline.serving.vllm_server import HOST, free_port
from eagle3_pipeline.stages.train.online_samples import producers_answer

logger = logging.getLogger(__name__)

READY_TIMEOUT_S = 900.0
MASTER_READY_TIMEOUT_S = 60.0
MOONCAKE_HOSTNAME = "MOONCAKE_LOCAL_HOSTNAME"  # hs_connectors' variable
WATCH_INTERVAL_S = 2.0
STOP_GRACE_S = 30.0
LOG_TAIL_LINES = 30


def answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


class ProducerError(RuntimeError):
    """A producer (or the Mooncake master) could not start; the message carries its log's last lines."""


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class LocalProcess:
    """One long-running child in its own process group, logging to a file; restartable."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.name, self.argv, self.env, self.log = name, argv, env, log
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
            )

    def exited(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            stop_group(self.proc, signal.SIGTERM, STOP_GRACE_S)


class LocalProducers:
    """The producers (and Mooncake master) of one train stage: a context manager yielding the stage env."""

    def __init__(self, spec: Eagle3RunSpec, spec_file: Path, artifacts: Path, env: dict[str, str]) -> None:
        self.spec, self.spec_file, self.artifacts, self.env = spec, spec_file, artifacts, dict(env)
        self.logs = artifacts / ".producers"
        self.processes: list[LocalProcess] = []
        self.endpoint = ""
        self._stopping = threading.Event()
        self._watcher: threading.Thread | None = None

    def __enter__(self) -> dict[str, str]:
        try:
            return self._start()
        except BaseException:
            self._stop()
            raise

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop()

    def _start(self) -> dict[str, str]:
        extra: dict[str, str] = {}
        x = self.spec.extraction
        if x.transfer == "mooncake":
            extra[ENV_MOONCAKE_MASTER] = self._start_master()
            # the address hs_connectors' clients (the producer, the trainer) give the store: loopback here
            extra[MOONCAKE_HOSTNAME] = self.env.get(MOONCAKE_HOSTNAME, HOST)
        if x.servers > 1:
            logger.info("extraction.servers is %d: locally one producer serves the train stage", x.servers)
        port = free_port()
        self.endpoint = endpoint_url(HOST, port)
        argv = produce_argv(str(self.spec_file), str(self.artifacts), port)
        producer = LocalProcess(
            "producer",
            [sys.executable, "-m", "eagle3_cli", *argv[1:]],
            {**self.env, **extra},
            self.logs / "producer.log",
        )
        sys.stderr.write(f"==> hidden-state producer on {self.endpoint} (log: {producer.log})\n")
        producer.start()
        self.processes.append(producer)
        self._wait_ready(producer)
        self._watcher = threading.Thread(target=self._watch, name="producer-watch", daemon=True)
        self._watcher.start()
        return {**extra, ENV_HIDDEN_STATES_ENDPOINT: self.endpoint}

    def _start_master(self) -> str:
        executable = shutil.which("mooncake_master", path=self.env.get("PATH"))
        if executable is None:
            raise ProducerError(
                "extraction.transfer is mooncake, but there is no `mooncake_master` on PATH: install the "
                "mooncake-transfer-engine package (mooncake-transfer-engine-non-cuda on a CPU machine)"
            )
        port, metrics = free_port(), free_port()
        master = LocalProcess(
            "mooncake master", mooncake_master_argv(port, metrics), self.env, self.logs / "mooncake.log"
        )
        master.argv[0] = executable
        master.start()
        self.processes.append(master)
        deadline = time.monotonic() + MASTER_READY_TIMEOUT_S
        while not answers(f"http://{HOST}:{metrics}/health"):
            if master.exited() is not None or time.monotonic() > deadline:
                raise ProducerError(f"the Mooncake master did not start:\n{log_tail(master.log)}")
            time.sleep(0.2)
        return f"{HOST}:{port}"

    def _wait_ready(self, producer: LocalProcess) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not producers_answer(self.endpoint):
            code = producer.exited()
            if code is not None:
                raise ProducerError(
                    f"the hidden-state producer exited with code {code} before answering; its log "
                    f"({producer.log}) ends:\n{log_tail(producer.log)}"
                )
            if time.monotonic() > deadline:
                raise ProducerError(f"the hidden-state producer did not answer in {READY_TIMEOUT_S:.0f} s")
            time.sleep(1.0)

    def _watch(self) -> None:
        """Replace a producer that died while training runs, as its Deployment would."""
        while not self._stopping.wait(WATCH_INTERVAL_S):
            for process in self.processes:
                code = process.exited()
                if code is not None and not self._stopping.is_set():
                    process.restarts += 1
                    logger.warning(
                        "the %s exited (code %s): starting it again (restart %d)",
                        process.name,
                        code,
                        process.restarts,
                    )
                    process.start()

    def _stop(self) -> None:
        self._stopping.set()
        if self._watcher is not None:
            self._watcher.join(timeout=WATCH_INTERVAL_S * 2)
        for process in reversed(self.processes):
            with contextlib.suppress(OSError):
                process.stop()
