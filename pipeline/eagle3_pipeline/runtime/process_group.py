"""Child process groups and signals: a stage (and the vLLM server it starts) runs in a process group of its
own, so stopping it reaches every process it started, and a signal to its parent is passed on to it.

Python's default SIGTERM ends a process on the spot: no `finally` runs, the children it started are orphaned
and keep writing. `terminating_raises` turns SIGTERM into `Terminated` (a SystemExit with code 143), so the
process unwinds like on Ctrl-C: the parent stops the child's group, a stage stops its vLLM server and releases
its output lock.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

logger = logging.getLogger(__name__)


class Terminated(SystemExit):
    """SIGTERM arrived: unwind (finally blocks run) and exit 128 + the signal's number."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated(signum)


@contextlib.contextmanager
def terminating_raises() -> Iterator[None]:
    """While inside, SIGTERM raises Terminated (in the main thread only: elsewhere Python cannot set it)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of a process group, from /proc; [] where there is no /proc."""
    members = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # after "pid (comm) ": state, ppid, pgrp, ...
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def stop_group(proc: subprocess.Popen[bytes], sig: signal.Signals, grace_s: float) -> None:
    """Send `sig` to the group led by `proc`, wait up to `grace_s` for all of it, then SIGKILL what is left.

    The leader is reaped here; its group's other members (a server it started) get the same grace, since a
    stage stops its own vLLM server on the way out.
    """
    signal_group(proc.pid, sig)
    deadline = time.monotonic() + grace_s
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)
    while group_members(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = group_members(proc.pid)
    if left or proc.poll() is None:
        logger.warning("processes %s ignored %s for %.0f s: killing them", left, sig.name, grace_s)
        signal_group(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10.0)
