"""Does the artifacts volume hold what offline extraction will store? Asked before extract starts, by the
operator (against the claim it creates: spec.storage.artifacts.size, `claim_too_small`) and by `eagle3 run`
(against the local filesystem's free space, `disk_too_small`), so a run too big for its volume is refused up
front instead of failing hours into extract with a full disk; `eagle3 run --dry-run` asks both before
anything runs. Each refusal says how to make room where the hidden states go, then how to store less.
"""

from __future__ import annotations

from eagle3_contract.api.spec import Eagle3RunSpec
from eagle3_contract.api.status import Estimates
from eagle3_contract.estimates import human_bytes
from eagle3_contract.quantity import quantity

# What to change to store less, wherever the hidden states go (the refusal says it after how to make room).
STORE_LESS = (
    "lower dataset.maxSamples or dataset.maxSequenceLength, store fewer extraction.layers or "
    "extraction.dtype fp8, or train with extraction.mode online (nothing stored)"
)
GIBIBYTE = 2**30


def requested_bytes(spec: Eagle3RunSpec) -> int | None:
    """The size of the claim the operator creates; None where the run uses an existing claim (its size is
    the claim's, not the spec's) or the size is no quantity."""
    if spec.storage.artifacts.claim_name is not None:
        return None
    value = quantity(str(spec.storage.artifacts.size))
    return int(value) if value is not None else None


def offline_bytes(spec: Eagle3RunSpec, estimates: Estimates) -> int | None:
    """What offline extraction stores; None where the run extracts online or the figure is unknown."""
    return estimates.hidden_states.offline.stored_bytes if spec.extraction.mode == "offline" else None


def claim_too_small(spec: Eagle3RunSpec, estimates: Estimates) -> str | None:
    """Why offline extraction does not fit in the claim the operator creates (spec.storage.artifacts.size),
    with the size to set; None where it fits, the run extracts online, or either figure is unknown."""
    need, size = offline_bytes(spec, estimates), requested_bytes(spec)
    if need is None or size is None or need <= size:
        return None
    room = (
        f"set spec.storage.artifacts.size to at least {-(-need // GIBIBYTE)}Gi (a claim the operator already "
        "created keeps its size: expand it with `kubectl patch pvc`, where its StorageClass allows it)"
    )
    where = f"the artifacts volume (spec.storage.artifacts.size {spec.storage.artifacts.size})"
    return _refusal(estimates, need, size, where, room)


def disk_too_small(spec: Eagle3RunSpec, estimates: Estimates, free: int, directory: str) -> str | None:
    """Why offline extraction does not fit in the `free` bytes of the filesystem of `directory` (a local
    run's artifacts), with how much to free; None where it fits, the run extracts online, or the figure
    is unknown."""
    need = offline_bytes(spec, estimates)
    if need is None or need <= free:
        return None
    room = (
        f"free {human_bytes(need - free)} more on that disk, or give --artifacts a directory on a disk with "
        f"{human_bytes(need)} free"
    )
    return _refusal(estimates, need, free, f"the free space under {directory}", room)


def _refusal(estimates: Estimates, need: int, capacity: int, where: str, room: str) -> str:
    hs = estimates.hidden_states
    per_token = f"{estimates.tokens} tokens x {hs.bytes_per_token} B" if estimates.tokens else "its tokens"
    return (
        f"extract would store {human_bytes(need)} of hidden states ({per_token}, {estimates.tokens_basis}), "
        f"but {where} holds {human_bytes(capacity)}: {room}; or {STORE_LESS}"
    )
