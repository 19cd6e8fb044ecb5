"""What `eagle3 stage verify` reports when the weights on the volume are not the pinned ones, for the tests
that play its Job (the planner's and the operator's) without running the stage program.

The message comes from the stage program's own `checksum_mismatch` and `CheckFailed.termination_detail`, the
code that writes it in a real Job, so the played message cannot drift from the real one.
"""

from __future__ import annotations

import json

from eagle3_pipeline.stages.verify.program import checksum_mismatch


def mismatch_message(expected: str, actual: str, path: str) -> str:
    """The verify Job's termination message for a pinned checkpoint whose weights have another sha256."""
    return json.dumps(checksum_mismatch(path, expected, actual).termination_detail())
