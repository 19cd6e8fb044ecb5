"""A stage subprocess of `eagle3 run` whose stderr is read line by line, so the live display can print the
program's lines above its progress lines and keep its last words for the failure message.

Its own process group (process_group.py), stopped whole past the deadline and on SIGTERM or Ctrl-C to this
process: nothing it started outlives this process to keep writing beside the next run.
"""

from __future__ import annotations

import collections
import contextlib
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import IO

from eagle3_pipeline.runtime.process_group import Terminated, stop_group, terminating_raises

TAIL_LINES = 20
READER_JOIN_S = 5.0  # a grandchild that keeps the pipe open does not hold the run


def last_segment(line: str) -> str:
    """What a terminal would show of a line redrawn with carriage returns (a progress bar): its last part."""
    parts = [p for p in line.rstrip("\r\n").split("\r") if p.strip()]
    return parts[-1] if parts else ""


def _write_stderr(line: str) -> None:
    sys.stderr.write(line + "\n")


class StageProcess:
    """Runs one command to its exit code (None past `timeout`), each stderr line passed to `on_line`."""

    def __init__(self, on_line: Callable[[str], None] | None = None) -> None:
        self.on_line = on_line or _write_stderr
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.pid: int | None = None

    def last_words(self) -> str:
        """The program's last non-blank stderr line (its error message), or ''."""
        return next((line.strip() for line in reversed(self.tail) if line.strip()), "")

    def _read(self, stream: IO[bytes]) -> None:
        for raw in iter(stream.readline, b""):
            line = last_segment(raw.decode("utf-8", errors="replace"))
            if not line:
                continue
            self.tail.append(line)
            try:
                self.on_line(line)
            except Exception:
                _write_stderr(line)
        stream.close()

    def run(
        self, command: list[str], env: dict[str, str], timeout: float | None, grace_s: float, what: str
    ) -> int | None:
        """The exit code; None past `timeout` (SIGTERM to the group, SIGKILL after `grace_s`). SIGTERM or
        Ctrl-C here stops the group (SIGTERM or SIGINT) before the interruption goes on."""
        with terminating_raises():
            proc = subprocess.Popen(
                command,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,  # the result JSON line: the executor reads result.json
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
            reader: threading.Thread | None = None
            try:  # from the moment the group exists: a signal that lands while the reader starts stops it too
                self.pid = proc.pid
                assert proc.stderr is not None
                reader = threading.Thread(
                    target=self._read, args=(proc.stderr,), name=f"{what} stderr", daemon=True
                )
                reader.start()
                return proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                stop_group(proc, signal.SIGTERM, grace_s)
                return None
            except BaseException as exc:  # Terminated, KeyboardInterrupt
                sig = signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT
                sys.stderr.write(f"{sig.name}: stopping {what} (pid {proc.pid}) and what it started\n")
                with terminating_raises():  # a second SIGTERM while stopping must not orphan it either
                    stop_group(proc, sig, grace_s)
                raise
            finally:
                if reader is not None:
                    with contextlib.suppress(RuntimeError):  # interrupted before it started: nothing to join
                        reader.join(READER_JOIN_S)
