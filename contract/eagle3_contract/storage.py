"""Does the artifacts volume hold what offline extraction will store? Asked before extract starts, by the
operator (against the claim it creates: spec.storage.artifacts.size) and by `eagle3 run` (against the local
filesystem's free space), so a run too big for its volume is refused up front instead of failing hours into
extract with a full disk.
"""

from __future__ import annotations

from eagle3_contract.api.spec import Eagle3RunSpec
from eagle3_contract.api.status import Estimates
from eagle3_contract.estimates import human_bytes
from eagle3_contract.quantity import quantity

# What to change, as the refusal says it.
REMEDY = (
    "raise spec.storage.artifacts.size (a claim the operator already created keeps its size: expand it with "
    "`kubectl patch pvc`, where its StorageClass allows it), lower dataset.maxSamples or "
    "dataset.maxSequenceLength, store fewer extraction.layers or extraction.dtype fp8, or train with "
    "extraction.mode online (nothing stored)"
)


def requested_bytes(spec: Eagle3RunSpec) -> int | None:
    """The size of the claim the operator creates; None where the run uses an existing claim (its size is
    the claim's, not the spec's) or the size is no quantity."""
    if spec.storage.artifacts.claim_name is not None:
        return None
    value = quantity(str(spec.storage.artifacts.size))
    return int(value) if value is not None else None


def too_small(spec: Eagle3RunSpec, estimates: Estimates, capacity: int | None, where: str) -> str | None:
    """Why offline extraction does not fit in `capacity` bytes (`where` names them), or None: it fits, the
    run extracts online, or either figure is unknown."""
    hs = estimates.hidden_states
    need = hs.offline.stored_bytes
    if spec.extraction.mode != "offline" or need is None or capacity is None or need <= capacity:
        return None
    per_token = f"{estimates.tokens} tokens x {hs.bytes_per_token} B" if estimates.tokens else "its tokens"
    return (
        f"extract would store {human_bytes(need)} of hidden states ({per_token}, {estimates.tokens_basis}), "
        f"but {where} holds {human_bytes(capacity)}: {REMEDY}"
    )
