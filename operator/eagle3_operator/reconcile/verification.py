"""The verify stage's verdict: a pinned draft whose files are not the ones promoted is refused, clearly.

`eagle3 stage verify` exits with CHECK_FAILED_EXIT_CODE and a termination message `{"reason", "error", ...}`
when the pinned draft's weights are missing or have another sha256 than `serving.pinnedCheckpoint.sha256`.
The Job fails at once (podFailurePolicy) and nothing starts it again for the same pin: the same files would
give the same answer. The serving Deployment is not rolled, so the previous draft, if any, keeps serving.
"""

from __future__ import annotations

import re
from typing import Any

_REASON = re.compile(r"^[A-Z][A-Za-z0-9]{0,127}$")


def check_failure(job_name: str, detail: dict[str, Any] | None) -> tuple[str, str] | None:
    """(reason, message) of a failed verify Job whose program named what it found wrong (`detail`: its
    termination message), else None."""
    detail = detail or {}
    reason, error = detail.get("reason"), detail.get("error")
    if not (isinstance(reason, str) and _REASON.match(reason) and isinstance(error, str) and error):
        return None
    return reason, (
        f"{error.rstrip('.')}. vLLM is not rolled to this draft (the previous draft, if any, keeps serving), "
        "and nothing checks it again until serving.pinnedCheckpoint changes; after restoring the files, "
        f"delete Job {job_name} to check them again"
    )
