"""The writer: takes exchanges without blocking, parses and writes them on its own thread, and counts."""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from .config import CaptureConfig, Exchange
from .records import record_of
from .segments import SegmentStore

logger = logging.getLogger(__name__)


class Counters:
    """prometheus_client counters on vLLM's own /metrics where prometheus_client is installed (it is with
    every vLLM); plain numbers otherwise, and for the tests."""

    def __init__(self) -> None:
        self.records = {"written": 0, "dropped": 0, "skipped": 0, "failed": 0}
        self.bytes = 0
        self._records: Any = None
        self._bytes: Any = None
        try:
            from prometheus_client import Counter
        except ImportError:
            return
        try:
            self._records = Counter("eagle3_capture_records", "Captured exchanges by outcome.", ["outcome"])
            self._bytes = Counter("eagle3_capture_bytes", "Bytes of captured records written.")
        except ValueError:  # registered already (a second middleware instance in one process)
            self._records = self._bytes = None

    def count(self, outcome: str, n: int = 1) -> None:
        self.records[outcome] += n
        if self._records is not None:
            self._records.labels(outcome=outcome).inc(n)

    def wrote(self, n: int) -> None:
        self.bytes += n
        if self._bytes is not None:
            self._bytes.inc(n)


class Recorder:
    """Takes exchanges on any thread without blocking; a daemon thread parses them and writes segments."""

    def __init__(self, config: CaptureConfig, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.clock = clock
        self.store = SegmentStore(config)
        self.counters = Counters()
        self.queue: queue.Queue[Exchange | None] = queue.Queue(config.queue_items)
        self.pending: list[bytes] = []
        self.pending_bytes = 0
        self.first_at = 0.0
        self.thread: threading.Thread | None = None
        self.lock = threading.Lock()

    def offer(self, exchange: Exchange) -> None:
        """Never blocks: a full queue drops the exchange (counted)."""
        self._ensure_started()
        try:
            self.queue.put_nowait(exchange)
        except queue.Full:
            self.counters.count("dropped")

    def _ensure_started(self) -> None:
        if self.thread is not None:
            return
        with self.lock:
            if self.thread is None:
                self.store.start()
                self.thread = threading.Thread(target=self._run, name="eagle3-capture", daemon=True)
                self.thread.start()

    def close(self, timeout: float = 10.0) -> None:
        """Write what is pending (the server is shutting down)."""
        if self.thread is None:
            return
        try:
            self.queue.put(None, timeout=timeout)
        except queue.Full:
            return
        self.thread.join(timeout)

    def _run(self) -> None:
        while True:
            wait = self.config.segment_seconds
            if self.pending:
                wait = max(0.0, self.first_at + self.config.segment_seconds - self.clock())
            try:
                item: Exchange | None = self.queue.get(timeout=wait)
            except queue.Empty:  # the segment's time is up
                self._flush()
                continue
            if item is None:
                self._flush()
                return
            self._take(item)
            if self.pending and (
                self.pending_bytes >= self.config.segment_bytes
                or self.clock() - self.first_at >= self.config.segment_seconds
            ):
                self._flush()

    def _take(self, exchange: Exchange) -> None:
        try:
            record = record_of(exchange)
        except (ValueError, TypeError, KeyError, AttributeError):
            self.counters.count("failed")
            return
        if record is None:
            self.counters.count("skipped")
            return
        line = json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
        if not self.pending:
            self.first_at = exchange.served_at
        self.pending.append(line)
        self.pending_bytes += len(line)

    def _flush(self) -> None:
        if not self.pending:
            return
        lines, size = self.pending, self.pending_bytes
        self.pending, self.pending_bytes = [], 0
        try:
            self.store.write(lines, self.first_at)
            self.counters.count("written", len(lines))
            self.counters.wrote(size)
            self.store.prune(self.clock())
        except OSError as err:  # a full or gone volume: the records are lost, serving goes on
            self.counters.count("failed", len(lines))
            logger.warning("capture: could not write %d records to %s: %s", len(lines), self.store.own, err)
