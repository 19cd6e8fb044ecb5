"""What `eagle3 stage verify` reports when the weights on the volume are not the pinned ones, for the tests
that play its Job (the planner's and the operator's) without running the stage program."""

from __future__ import annotations

import json


def mismatch_message(expected: str, actual: str, path: str) -> str:
    """The verify Job's termination message for a pinned checkpoint whose weights have another sha256."""
    error = (
        f"/artifacts/{path}/model.safetensors has sha256 {actual}, but serving.pinnedCheckpoint.sha256 is "
        f"{expected}: these are not the weights that were promoted; pin the checkpoint a run exported "
        "(`eagle3 promote RUN` copies its path and sha256)"
    )
    return json.dumps(
        {"error": error, "reason": "ChecksumMismatch", "path": path, "file": "model.safetensors",
         "expected": expected, "actual": actual}
    )  # fmt: skip
