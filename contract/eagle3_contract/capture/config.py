"""The capture's settings (from the environment the operator gives vLLM's container), its unit of work."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CAPTURED_PATH = "/v1/chat/completions"
PACKAGE = "eagle3_capture"  # the name this package is mounted under in the vLLM pod
MIDDLEWARE = f"{PACKAGE}.middleware.CaptureMiddleware"  # what `vllm serve --middleware` is given
MAX_BODY_BYTES = 4 << 20  # a request or an answer larger than this is not captured (counted as dropped)
SEGMENT_SUFFIX = ".jsonl"
PARTIAL_SUFFIX = ".partial"  # a segment being written: never read, removed at the next start

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass(frozen=True)
class CaptureConfig:
    directory: Path
    source: str  # this server's name (the pod's): its segments' subdirectory
    sample_rate: float = 1.0
    max_bytes: int = 1 << 30
    retention_seconds: float = 7 * 86400.0
    segment_bytes: int = 1 << 20  # a segment is written when its records reach this size
    segment_seconds: float = 30.0  # ... or when its first record is this old
    queue_items: int = 1024  # exchanges waiting for the writer; beyond, dropped

    @classmethod
    def from_env(cls, env: MutableMapping[str, str] | None = None) -> CaptureConfig:
        """The settings the operator puts in the vLLM container's environment (EAGLE3_CAPTURE_*)."""
        env = os.environ if env is None else env
        if not env.get("EAGLE3_CAPTURE_DIR"):
            raise ValueError(
                f"{MIDDLEWARE} needs EAGLE3_CAPTURE_DIR, the directory to record to: the operator sets it "
                "with serving.capture; set it (and EAGLE3_CAPTURE_SAMPLE_RATE) when starting vLLM by hand"
            )
        try:
            return cls(
                directory=Path(env["EAGLE3_CAPTURE_DIR"]),
                source=env.get("EAGLE3_CAPTURE_SOURCE") or os.uname().nodename,
                sample_rate=float(env.get("EAGLE3_CAPTURE_SAMPLE_RATE", "1")),
                max_bytes=int(env.get("EAGLE3_CAPTURE_MAX_BYTES", str(1 << 30))),
                retention_seconds=float(env.get("EAGLE3_CAPTURE_RETENTION_SECONDS", str(7 * 86400))),
                segment_seconds=float(env.get("EAGLE3_CAPTURE_SEGMENT_SECONDS", "30")),
            )
        except ValueError as err:
            raise ValueError(f"{MIDDLEWARE}: an EAGLE3_CAPTURE_* variable is not a number: {err}") from err


@dataclass(frozen=True)
class Exchange:
    """One sampled request and its answer, as the bytes that crossed the wire."""

    served_at: float
    request: bytes
    response: bytes
    status: int
    streamed: bool
