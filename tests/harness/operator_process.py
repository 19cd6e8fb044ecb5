"""`eagle3 operator` as its own process, for the fault tests.

The in-process runner (`tests.harness.cluster.running_operator`) shares the test's event loop, so it cannot be
frozen, killed or cut off from the API server on its own. A process can: SIGSTOP plays a hung operator,
SIGKILL a crash, and its kubeconfig can point through a `StallingProxy`. It runs exactly what a Deployment
runs (`python -m eagle3_cli operator`), logging in with a kubeconfig as `kubectl` would.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

from tests.operator.apiserver import die_with_parent, free_port, write_kubeconfig

LOG_TAIL = 3000


class OperatorProcess:
    """A running `eagle3 operator`: signals, its liveness and metrics endpoints, its log."""

    def __init__(
        self, proc: asyncio.subprocess.Process, log_path: Path, health_port: int, metrics_port: int
    ) -> None:
        self.proc, self.log_path = proc, log_path
        self.health_port, self.metrics_port = health_port, metrics_port
        # A fresh connection per request: a pooled one to a frozen process would hang the next probe.
        self._http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def _log_tail(self) -> str:
        return self.log()[-LOG_TAIL:]

    async def ready(self, timeout: float = 30.0) -> None:
        """Until /healthz answers 200; an AssertionError with the log's tail if it exits or times out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.returncode is not None:
                raise AssertionError(
                    f"the operator exited with {self.returncode} before it was ready; log tail:\n"
                    f"{self._log_tail()}"
                )
            if await self.health() == 200:
                return
            await asyncio.sleep(0.2)
        raise AssertionError(f"the operator was not ready in {timeout}s; log tail:\n{self._log_tail()}")

    async def health(self, timeout: float = 2.0) -> int | None:
        """The HTTP status of /healthz (500: a probe failed), or None if nothing answers within `timeout`."""
        try:
            url = f"http://127.0.0.1:{self.health_port}/healthz"
            async with self._http.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                await resp.read()
                return resp.status
        except (aiohttp.ClientError, TimeoutError):
            return None

    async def probes(self, timeout: float = 2.0) -> dict[str, Any] | None:
        """What /healthz answers (kopf's probes by id: `peering`, `resync`), or None if nothing answers."""
        try:
            url = f"http://127.0.0.1:{self.health_port}/healthz"
            async with self._http.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                found: dict[str, Any] = await resp.json(content_type=None)
                return found
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None

    async def metrics(self, timeout: float = 5.0) -> str:
        """The text of /metrics; raises if it does not answer 200."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        async with self._http.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            resp.raise_for_status()
            return await resp.text()

    def _signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)

    def pause(self) -> None:
        """SIGSTOP: a hung operator (its sockets stay open, nothing answers, no lease is renewed)."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL: a crash, no clean-up; `wait` for the exit code."""
        self._signal(signal.SIGKILL)

    async def wait(self, timeout: float) -> int:
        """The exit code once it exits; TimeoutError if it is still running after `timeout` seconds."""
        return await asyncio.wait_for(self.proc.wait(), timeout)

    async def stop(self, timeout: float = 20.0) -> int:
        """SIGCONT (should it be paused), SIGTERM, SIGKILL after `timeout` seconds; the exit code."""
        self.resume()
        self._signal(signal.SIGTERM)
        try:
            return await self.wait(timeout)
        except TimeoutError:
            self.kill()
            return await self.proc.wait()

    async def close(self) -> None:
        if self.returncode is None:
            await self.stop()
        await self._http.close()


def _next_free_index(tmp_path: Path) -> int:
    n = 1
    while (tmp_path / f"operator-{n}.log").exists():
        n += 1
    return n


@asynccontextmanager
async def operator_process(
    url: str,
    token: str,
    namespace: str,
    tmp_path: Path,
    resync_seconds: float | None = 1.0,
    api_timeout_seconds: float | None = 3.0,
    wait_ready: bool = True,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> AsyncIterator[OperatorProcess]:
    """Spawn `eagle3 operator` for `namespace` against `url` as the user of `token`; stopped on exit.

    Its kubeconfig and log are tmp_path/kubeconfig-N and tmp_path/operator-N.log (N counts the processes
    started in tmp_path). `resync_seconds`/`api_timeout_seconds` None leave the command's defaults; `env`
    adds to (or overrides) the test's environment, less KUBERNETES_SERVICE_HOST so that the kubeconfig wins.
    """
    n = _next_free_index(tmp_path)
    kubeconfig = write_kubeconfig(tmp_path / f"kubeconfig-{n}", url, token, "operator")
    log_path = tmp_path / f"operator-{n}.log"
    health_port, metrics_port = free_port(), free_port()
    argv = [
        sys.executable, "-m", "eagle3_cli", "operator", "--namespace", namespace,
        "--health-port", str(health_port), "--metrics-port", str(metrics_port),
    ]  # fmt: skip
    if resync_seconds is not None:
        argv += ["--resync-seconds", str(resync_seconds)]
    if api_timeout_seconds is not None:
        argv += ["--api-timeout-seconds", str(api_timeout_seconds)]
    argv += list(extra_args)
    child_env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    child_env |= dict(env or {}) | {"KUBECONFIG": str(kubeconfig)}
    with log_path.open("ab") as out:
        proc = await asyncio.create_subprocess_exec(
            *argv, env=child_env, stdout=out, stderr=asyncio.subprocess.STDOUT, preexec_fn=die_with_parent
        )
    op = OperatorProcess(proc, log_path, health_port, metrics_port)
    try:
        if wait_ready:
            await op.ready()
        yield op
    finally:
        await op.close()


__all__ = ["OperatorProcess", "operator_process"]
