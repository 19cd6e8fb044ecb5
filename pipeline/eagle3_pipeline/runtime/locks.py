"""One writer per stage output: `eagle3 stage` holds `<stage>/.<hash>.lock` (flock) for its whole run.

Two writers on one work directory (a re-run started while an orphaned stage still runs, two Jobs of one
stage) would interleave their files and commit a mix. The lock is an advisory flock, released by the kernel
when its holder exits however it exits, so a crash never leaves a stale lock; the holder writes its pid into
the file so the refused writer can name it. A holder that finishes removes the file (while it still holds
the lock), so a finished or refused stage leaves nothing beside its output; a writer that locked a file
another one removed meanwhile locks the new file instead (the inode check below).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path

from eagle3_pipeline.runtime.errors import StageError

logger = logging.getLogger(__name__)


class OutputLocked(StageError):
    """Another process writes this output now."""


def lock_path_of(output: Path) -> Path:
    return output.parent / f".{output.name}.lock"


@contextlib.contextmanager
def hold_output_lock(output: Path) -> Iterator[Path]:
    """Hold the output's lock while inside; raises OutputLocked at once when another process holds it.

    A filesystem without flock (some network filesystems answer ENOLCK) runs unlocked, with a warning:
    refusing every stage there would be worse than the race the lock prevents.
    """
    path = lock_path_of(output)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, locked = _open_locked(path, output)
    try:
        if locked:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
        yield path
    finally:
        if locked:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # still under the lock: no other writer holds this file
        os.close(fd)  # releases the flock


def _open_locked(path: Path, output: Path) -> tuple[int, bool]:
    """(fd, locked): the lock file, flocked, and the one at `path` now (not a file its holder removed)."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not O_TRUNC: the holder's pid must survive
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                holder = _holder(fd)
                os.close(fd)
                raise OutputLocked(
                    f"{output} is being written by another process ({holder} holds the lock {path}); "
                    "wait for it to finish or stop it, then run again"
                ) from None
            logger.warning("cannot lock %s (%s): running without the one-writer lock", path, exc.strerror)
            return fd, False
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd, True
        os.close(fd)  # its holder removed it as we locked it: lock the file that is there now


def _holder(fd: int) -> str:
    """`pid N on HOST` from the lock file, as far as the holder has written it."""
    try:
        words = os.pread(fd, 200, 0).decode(errors="replace").split()
    except OSError:
        words = []
    if not words:
        return "a process that has not written its pid yet"
    host = f" on {words[1]}" if len(words) > 1 else ""
    return f"pid {words[0]}{host}"
