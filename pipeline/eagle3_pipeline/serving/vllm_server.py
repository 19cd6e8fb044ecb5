"""A vLLM OpenAI-compatible server that a stage starts, waits for, and stops: generate and evaluate use it.

    with VllmServer(ctx, verifier, seed=seed) as server:  # `vllm serve` the verifier on a loopback port
        client = AsyncOpenAI(base_url=server.base_url, api_key="none")
        ... model=server.model_name ...

The executable is $EAGLE3_VLLM (what `eagle3 run --vllm` passes), else `vllm` on PATH: a separate environment
(vLLM pins torch exactly); locally `scripts/build-vllm-cpu.sh` builds a CPU one. The server's output goes to
`<work>/vllm.log`. It dies with the stage: its own process group is terminated on exit (SIGTERM, then SIGKILL
after a grace period), and PR_SET_PDEATHSIG sends it SIGTERM if the stage process is killed outright.
An out-of-memory at start (or later, see `check`) raises OutOfMemory, so the stage exits with the OOM code and
is retried at half the token budget. On a CPU without native bfloat16 (eagle3_pipeline.runtime.host_cpu) the
server computes in float32 (`--dtype float32`, `cpu_dtype_options`) unless verifier.vllmArgs sets --dtype:
vLLM would serve a bfloat16 checkpoint in bfloat16, about 15 output tokens/s there (issue 30).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from eagle3_contract.vllm_command import Endpoint, VllmEngine, vllm_serve_args
from eagle3_pipeline.runtime.context import StageContext
from eagle3_pipeline.runtime.errors import OutOfMemory, StageError
from eagle3_pipeline.runtime.host_cpu import native_bfloat16
from eagle3_pipeline.runtime.process_group import group_members as group_members  # re-exported: tests use it
from eagle3_pipeline.runtime.process_group import signal_group as _signal_group

logger = logging.getLogger(__name__)

ENV_VLLM = "EAGLE3_VLLM"
LOG_FILE = "vllm.log"
SERVED_MODEL_NAME = "verifier"
HOST = "127.0.0.1"
# Set in the server's environment unless the caller's environment sets them: models are local directories
# (the stage never downloads), and vLLM's CPU backend would otherwise reserve far more KV cache than a small
# machine has (GiB; a GPU build ignores it).
SERVER_ENV_DEFAULTS = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
STARTUP_TIMEOUT_S = 1800.0  # a 1T-parameter verifier loads for many minutes
STOP_GRACE_S = 30.0
LOG_TAIL_LINES = 40
# Lines of a vLLM log that mean the engine ran out of (accelerator or host) memory.
OOM_MARKERS = (
    "out of memory",
    "outofmemoryerror",
    "no available memory for the cache blocks",
    "larger than the available kv cache memory",
    "insufficient memory",
    "cannot allocate memory",
)
ACCELERATOR_DEVICES = ("/dev/nvidiactl", "/dev/kfd")  # NVIDIA, AMD ROCm
PR_SET_PDEATHSIG = 1
PORT_ATTEMPTS = 3  # a free port can be taken by someone else before vLLM binds it


def build_serve_argv(
    executable: str,
    engine: VllmEngine,
    *,
    port: int,
    seed: int,
    max_num_batched_tokens: int | None = None,
    served_model_name: str = SERVED_MODEL_NAME,
    enforce_eager: bool = False,
    host: str = HOST,
    speculative_config: Mapping[str, Any] | None = None,
    kv_transfer_config: Mapping[str, Any] | None = None,
    options: Sequence[str] = (),
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The `vllm serve` command line of a stage's server: the contract's one builder (the serving
    Deployment's too), `engine.model` being the verifier's path on this machine."""
    return [
        executable,
        "serve",
        *vllm_serve_args(
            engine,
            Endpoint(host, port, served_model_name),
            speculative_config=speculative_config,
            kv_transfer_config=kv_transfer_config,
            seed=seed,
            max_num_batched_tokens=max_num_batched_tokens,
            enforce_eager=enforce_eager,
            options=options,
            extra_args=extra_args,
        ),
    ]


def find_vllm(env: dict[str, str] | None = None) -> str:
    """$EAGLE3_VLLM, else `vllm` on PATH; a StageError that says how to get one otherwise."""
    env = dict(os.environ) if env is None else env
    configured = env.get(ENV_VLLM)
    if configured:
        if not os.access(configured, os.X_OK):
            raise StageError(
                f"${ENV_VLLM}={configured} is not an executable file; point it at a vLLM environment's "
                "bin/vllm (locally: the path scripts/build-vllm-cpu.sh prints)"
            )
        return configured
    found = shutil.which("vllm", path=env.get("PATH"))
    if found is None:
        raise StageError(
            "this stage needs vLLM, but there is no `vllm` on PATH and $EAGLE3_VLLM is not set: locally, run "
            "scripts/build-vllm-cpu.sh and pass the path it prints to `eagle3 run --vllm` (or set "
            "$EAGLE3_VLLM); in a cluster, use the pipeline image, which ships vLLM"
        )
    return found


def has_package(module: str, env: dict[str, str] | None = None) -> bool:
    """Whether vLLM's own environment (the Python beside its executable) can import `module`."""
    executable = Path(find_vllm(env)).resolve()
    python = executable.parent / "python"
    if not python.exists():
        python = Path(sys.executable)  # a `vllm` installed in this very environment
    probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    return subprocess.run([str(python), "-c", probe], capture_output=True, check=False).returncode == 0


def accelerator_present() -> bool:
    """A GPU device node is visible: CUDA graphs and torch.compile pay off; without one, run eagerly."""
    return any(os.path.exists(device) for device in ACCELERATOR_DEVICES)


def cpu_dtype_options(engine: VllmEngine, options: Sequence[str]) -> list[str]:
    """`--dtype float32` on a machine without an accelerator whose CPU has no native bfloat16, unless the
    stage's options or verifier.vllmArgs set --dtype; nothing otherwise."""
    if accelerator_present() or native_bfloat16():
        return []
    given = [*options, *engine.vllm_args]
    if any(arg == "--dtype" or arg.startswith("--dtype=") for arg in given):
        return []
    _log_float32()
    return ["--dtype", "float32"]


@functools.cache
def _log_float32() -> None:
    """The choice, logged once per process."""
    logger.info(
        "vLLM computes in float32 here: this CPU has no native bfloat16 (flags avx512_bf16, amx_bf16); "
        "verifier.vllmArgs --dtype overrides"
    )


def free_port(host: str = HOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def looks_out_of_memory(log_text: str) -> bool:
    lowered = log_text.lower()
    return any(marker in lowered for marker in OOM_MARKERS)


def _die_with_parent() -> None:
    """Runs in the child between fork and exec: SIGTERM when the spawning thread (the stage's main) dies."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class VllmServer:
    """`vllm serve` for the stage's verifier, as a context manager: healthy on enter, gone on exit.

    `verifier` and `seed` come from the stage's params and tuning (`VllmVerifier.engine`); `ctx` gives the
    work directory, the local paths and the token budget of the command line.
    """

    def __init__(
        self,
        ctx: StageContext[Any, Any],
        engine: VllmEngine,
        *,
        seed: int,
        speculative_config: Mapping[str, Any] | None = None,
        kv_transfer_config: Mapping[str, Any] | None = None,
        options: Sequence[str] = (),
        extra_args: Sequence[str] = (),
        max_num_batched_tokens: int | None = None,
        served_model_name: str = SERVED_MODEL_NAME,
        startup_timeout_s: float = STARTUP_TIMEOUT_S,
        stop_grace_s: float = STOP_GRACE_S,
        log_path: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.ctx = ctx
        self.engine = engine
        self.seed = seed
        self.speculative_config = speculative_config
        self.kv_transfer_config = kv_transfer_config
        self.options = list(options)
        self.extra_args = list(extra_args)
        self.max_num_batched_tokens = (
            max_num_batched_tokens if max_num_batched_tokens is not None else ctx.token_budget
        )
        self.model_name = served_model_name
        self.startup_timeout_s = startup_timeout_s
        self.stop_grace_s = stop_grace_s
        self.log_path = log_path if log_path is not None else ctx.work / LOG_FILE
        self.env = dict(env or {})  # set in the server's environment over the stage's own
        self.port = 0
        self.argv: list[str] = []
        self.process: subprocess.Popen[bytes] | None = None
        self.started_s = 0.0  # seconds from spawn to a healthy /v1/models
        self._log_offset = 0
        self._spawned_at = 0.0
        self._stopped = False

    @property
    def base_url(self) -> str:
        """The OpenAI API root, e.g. http://127.0.0.1:PORT/v1."""
        return f"http://{HOST}:{self.port}/v1"

    @property
    def root_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def worker_spins(self) -> bool:
        """Whether vLLM's model worker is a process of its own, which busy-polls its shared-memory queue for
        1 s after its last step (vllm/distributed/device_communicators/shm_broadcast.py, SpinCondition): vLLM
        CPU's default. Not where V1 multiprocessing is off (VLLM_ENABLE_V1_MULTIPROCESSING=0: engine and
        worker in the API server's process, no queue; measured by benchmarks/vllm_spin.py: 1.0 CPU-s in
        the second after an answer with it, none without)."""
        value = {**os.environ, **self.env}.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
        return value.strip() not in ("0", "false", "False")

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def __enter__(self) -> VllmServer:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Spawn the server and wait until it serves the model; on failure nothing is left running."""
        env = dict(os.environ)
        executable = find_vllm(env)
        for key, value in SERVER_ENV_DEFAULTS.items():
            env.setdefault(key, value)
        env.update(self.env)
        for attempt in range(1, PORT_ATTEMPTS + 1):
            self.port = free_port()
            self.argv = self._argv(executable)
            self._spawn(env)
            try:
                self._wait_ready()
                return
            except StageError as exc:
                self.stop()
                if "address already in use" not in str(exc).lower() or attempt == PORT_ATTEMPTS:
                    raise
                logger.warning("port %d was taken before vLLM bound it; retrying on another", self.port)
            except BaseException:
                self.stop()
                raise

    def _argv(self, executable: str) -> list[str]:
        return build_serve_argv(
            executable,
            replace(self.engine, model=self.ctx.local_path(self.engine.model)),
            port=self.port,
            seed=self.seed,
            max_num_batched_tokens=self.max_num_batched_tokens,
            served_model_name=self.model_name,
            enforce_eager=not accelerator_present(),
            speculative_config=self.speculative_config,
            kv_transfer_config=self.kv_transfer_config,
            options=[*cpu_dtype_options(self.engine, self.options), *self.options],
            extra_args=self.extra_args,
        )

    def _spawn(self, env: dict[str, str]) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self._log_offset = log.tell()
            log.write(f"==> eagle3: {' '.join(self.argv)}\n".encode())
            log.flush()
            logger.info("starting vLLM (log: %s): %s", self.log_path, " ".join(self.argv))
            self.process = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its own process group: stop() reaches the engine processes too
                preexec_fn=_die_with_parent,
            )
        self._spawned_at = time.monotonic()
        self._stopped = False

    def _wait_ready(self) -> None:
        deadline = self._spawned_at + self.startup_timeout_s
        with httpx.Client(timeout=5.0) as client:
            for path in ("/health", "/v1/models"):
                while not self._answers(client, path):
                    self.check()
                    if time.monotonic() > deadline:
                        raise StageError(
                            f"the vLLM server did not answer {path} within {self.startup_timeout_s:.0f} s "
                            f"(log: {self.log_path}); last lines:\n{self.log_tail()}"
                        )
                    time.sleep(1.0)
        self.started_s = time.monotonic() - self._spawned_at
        logger.info("vLLM serves %s at %s (ready in %.1f s)", self.model_name, self.base_url, self.started_s)

    def _answers(self, client: httpx.Client, path: str) -> bool:
        try:
            response = client.get(self.root_url + path)
        except httpx.HTTPError:
            return False
        if response.status_code != 200:
            return False
        if path == "/v1/models":
            served = {m.get("id") for m in response.json().get("data", [])}
            if self.model_name not in served:
                raise StageError(f"the vLLM server serves {sorted(served)}, not {self.model_name}")
        return True

    def check(self) -> None:
        """Raise if the server has exited: OutOfMemory when its log says so or it was SIGKILLed (the kernel's
        OOM killer, most likely), StageError otherwise."""
        if self.process is None:
            raise StageError("the vLLM server was not started")
        code = self.process.poll()
        if code is None:
            return
        tail = self.log_tail()
        where = f"(log: {self.log_path}); last lines:\n{tail}"
        if looks_out_of_memory(tail) or code == -signal.SIGKILL:
            raise OutOfMemory(f"the vLLM server ran out of memory (exit code {code}) {where}")
        raise StageError(f"the vLLM server exited with code {code} {where}")

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last lines this server wrote (not earlier attempts' lines in the same file)."""
        try:
            with self.log_path.open("rb") as f:
                f.seek(self._log_offset)
                text = f.read().decode("utf-8", errors="replace")
        except OSError as exc:
            return f"(cannot read {self.log_path}: {exc})"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM to the server's process group, SIGKILL to what is left after the grace; idempotent."""
        proc = self.process
        if proc is None or self._stopped:
            return
        self._stopped = True
        _signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_grace_s
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=self.stop_grace_s)
        # the engine processes shut down after the API server: give them the rest of the grace period
        while group_members(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = group_members(proc.pid)
        if left or proc.poll() is None:
            logger.warning(
                "vLLM processes %s ignored SIGTERM for %.0f s: killing them", left, self.stop_grace_s
            )
            _signal_group(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10.0)
        logger.info("vLLM server (pid %d) stopped, exit code %s", proc.pid, proc.returncode)
