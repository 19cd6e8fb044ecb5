"""Segments: records written whole (crash-safe), pruned by age and size, read back in order."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .config import PARTIAL_SUFFIX, SEGMENT_SUFFIX, CaptureConfig


class SegmentStore:
    """The capture directory: this source's segments written whole, everyone's pruned."""

    def __init__(self, config: CaptureConfig) -> None:
        self.config = config
        self.own = config.directory / config.source
        self.sequence = 0

    def start(self) -> None:
        """Make this source's directory; a temporary file a killed writer left is removed."""
        self.own.mkdir(parents=True, exist_ok=True)
        for stale in self.own.glob(f"*{PARTIAL_SUFFIX}"):
            stale.unlink(missing_ok=True)

    def write(self, lines: list[bytes], first_at: float) -> Path:
        stamp = datetime.fromtimestamp(first_at, UTC).strftime("%Y%m%dT%H%M%S.%fZ")
        self.sequence += 1
        # the process id too: vLLM's API servers (--api-server-count) are processes of one pod, one source
        final = self.own / f"{stamp}-{os.getpid()}-{self.sequence:06d}{SEGMENT_SUFFIX}"
        temporary = self.own / f"{final.name}{PARTIAL_SUFFIX}"
        with temporary.open("wb") as f:
            f.write(b"".join(lines))
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, final)
        directory = os.open(self.own, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        return final

    def prune(self, now: float) -> int:
        """Delete segments past the retention, then the oldest beyond max_bytes; the bytes deleted."""
        segments: list[tuple[float, int, Path]] = []
        for path in self.config.directory.glob(f"*/*{SEGMENT_SUFFIX}"):
            try:
                stat = path.stat()
            except FileNotFoundError:  # another pod pruned it
                continue
            segments.append((stat.st_mtime, stat.st_size, path))
        segments.sort()
        total = sum(size for _, size, _ in segments)
        deleted = 0
        for mtime, size, path in segments:
            if now - mtime <= self.config.retention_seconds and total <= self.config.max_bytes:
                break
            path.unlink(missing_ok=True)
            total -= size
            deleted += size
        return deleted


def segments(directory: Path) -> list[Path]:
    """Every source's complete segments (a `.partial` one is being written, or was killed), oldest first:
    by their first record's time, then their source."""
    return sorted(directory.glob(f"*/*{SEGMENT_SUFFIX}"), key=lambda p: (p.name, p.parent.name))


def read_records(directory: Path) -> list[dict[str, Any]]:
    """The records of every complete segment under `directory`, oldest segment first."""
    records: list[dict[str, Any]] = []
    for path in segments(directory):
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:  # pruned meanwhile
            continue
        records.extend(json.loads(line) for line in text.splitlines() if line)
    return records
