"""Reasons (CamelCase, as condition reasons and metric labels) that both sides name."""

from __future__ import annotations

# verify: the pinned draft's weights have another sha256 than serving.pinnedCheckpoint.sha256.
CHECKSUM_MISMATCH = "ChecksumMismatch"
# verify: the pinned draft's directory or weights are missing.
CHECKPOINT_MISSING = "CheckpointMissing"
# verify: the pinned draft's config.json leaves out a field vLLM reads (it would load vLLM's default instead).
DRAFT_FIELDS_MISSING = "DraftFieldsMissing"
# serving.promotion reviewed: a draft passed the gate and waits in status.candidate, and nothing serves yet.
AWAITING_PROMOTION = "AwaitingPromotion"
# Why a stage's attempt failed (the executors and the metrics classify every failure as one of these).
OUT_OF_MEMORY = "OutOfMemory"
DEADLINE_EXCEEDED = "DeadlineExceeded"
ERROR = "Error"
FAILURE_REASONS = (OUT_OF_MEMORY, DEADLINE_EXCEEDED, ERROR)
# Offline extraction would store more hidden states than the artifacts volume (or the local disk) holds: the
# extract stage is not started (eagle3_contract.storage).
STORAGE_TOO_SMALL = "StorageTooSmall"
# SpecValid False: the spec breaks a rule of the API (eagle3_contract.api.validation); nothing is created.
INVALID_SPEC = "InvalidSpec"
# SpecValid False: the API server refused an object the operator made from the spec (HTTP 422: a field it does
# not take); the condition names the object, the fields and the server's message. Retried at every resync.
REJECTED = "Rejected"
