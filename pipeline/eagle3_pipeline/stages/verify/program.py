"""verify: the pinned draft's files on the artifacts volume are the ones promoted through git.

The operator cannot read the volume, so before it rolls vLLM to `serving.pinnedCheckpoint` it runs this
program (no GPU) where the files are. It hashes `model.safetensors` in chunks and compares the digest with
`serving.pinnedCheckpoint.sha256`, the digest `eagle3 promote` copied from the training run's status; then
every other file export listed in `manifest.json` against the manifest (the pinned digest anchors the weights,
the manifest the rest). A missing file or another digest exits CHECK_FAILED_EXIT_CODE with a termination
message naming the reason (CheckpointMissing, ChecksumMismatch), the path and both digests, which the
operator turns into the run's Failed condition; the Deployment is not rolled.

The result: the path, the weights' sha256, the checkpoint's bytes, each file's digest, and the speculation-
length table export copied into the manifest from evaluate's sweep (`speculation`: what
`serving.speculationLength: tuned` serves for the pinned draft; null for a manifest without one, as export
wrote before the sweep, or without a manifest). The stage reads
the files every time it runs (its output is never reused: a check is about the files as they are now).
Progress: the files hashed, of the weights and the others the manifest lists.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from eagle3_contract.api.speculation import SpeculationTable
from eagle3_contract.draft_methods import method_of_checkpoint
from eagle3_contract.mounts import draft_path
from eagle3_contract.params import VerifyParams, VerifyTuning
from eagle3_contract.reasons import CHECKPOINT_MISSING, CHECKSUM_MISMATCH, DRAFT_FIELDS_MISSING
from eagle3_pipeline.data.draft_checkpoint import (
    CONFIG_FILE,
    MANIFEST_FILE,
    SPECULATION_KEY,
    WEIGHTS_FILE,
    sha256_of,
    unstated_fields,
)
from eagle3_pipeline.runtime.context import StageContext
from eagle3_pipeline.runtime.errors import CheckFailed, StageError
from eagle3_pipeline.runtime.reporter import StageReporter

logger = logging.getLogger(__name__)

WHAT_TO_DO = "pin the checkpoint a run exported (`eagle3 promote RUN` copies its path and sha256)"


def run(ctx: StageContext[VerifyParams, VerifyTuning]) -> dict[str, Any]:
    started = time.monotonic()
    pinned = ctx.params.pinned_checkpoint
    if pinned is None or pinned.sha256 is None:
        raise StageError(
            "stage verify checks serving.pinnedCheckpoint against its sha256, but this spec sets no "
            "serving.pinnedCheckpoint.sha256: there is nothing to verify"
        )
    shown = draft_path(pinned.path)  # as the pods see it: /artifacts/<path>
    directory = Path(ctx.local_path(shown))
    weights = directory / WEIGHTS_FILE
    if not weights.is_file():
        raise CheckFailed(
            CHECKPOINT_MISSING,
            f"the pinned draft has no {WEIGHTS_FILE} at {shown}/{WEIGHTS_FILE} "
            f"(serving.pinnedCheckpoint.path {pinned.path!r}): the path is wrong, or the files are on "
            f"another volume than this run's artifacts volume (storage.artifacts.claimName); {WHAT_TO_DO}",
            path=pinned.path,
            file=WEIGHTS_FILE,
            expected=pinned.sha256,
        )
    ctx.progress.begin("files", 1)
    actual = sha256_of(weights)
    ctx.progress.advance()
    if actual != pinned.sha256:
        raise checksum_mismatch(pinned.path, pinned.sha256, actual)
    files = check_manifest(directory, shown, pinned.path, actual, ctx.progress) or {
        WEIGHTS_FILE: {"sha256": actual, "bytes": weights.stat().st_size}
    }
    method = check_fields(directory, shown, pinned.path)
    logger.info("verify: %s has sha256 %s, as pinned; %d file(s) checked", shown, actual, len(files))
    return {
        "path": pinned.path,
        "sha256": actual,
        "bytes": sum(int(f["bytes"]) for f in files.values()),
        "files": files,
        "manifest": (directory / MANIFEST_FILE).is_file(),
        "speculation": manifest_speculation(directory, shown),
        "method": method,
        "seconds": round(time.monotonic() - started, 3),
    }


def manifest_speculation(directory: Path, shown: str) -> dict[str, Any] | None:
    """The speculation-length table of the draft's manifest (export's `speculation`), validated; None when
    there is no manifest or it has none."""
    manifest_file = directory / MANIFEST_FILE
    if not manifest_file.is_file():
        return None
    value = json.loads(manifest_file.read_text()).get(SPECULATION_KEY)  # check_manifest parsed it already
    if value is None:
        return None
    try:
        table = SpeculationTable.model_validate(value)
    except ValidationError as exc:
        problem = str(exc).splitlines()[0]
        raise StageError(
            f"{shown}/{MANIFEST_FILE} has a malformed {SPECULATION_KEY} table ({problem}); {WHAT_TO_DO}"
        ) from None
    return table.model_dump(mode="json", by_alias=True)


def checksum_mismatch(path: str, expected: str, actual: str) -> CheckFailed:
    """The failed check for pinned weights with another sha256; the operator tests play it (by
    `termination_detail()`) without running the stage, so its words are written only here."""
    return CheckFailed(
        CHECKSUM_MISMATCH,
        f"{draft_path(path)}/{WEIGHTS_FILE} has sha256 {actual}, but serving.pinnedCheckpoint.sha256 is "
        f"{expected}: these are not the weights that were promoted (the files were replaced, or the "
        f"pin names another checkpoint); {WHAT_TO_DO}",
        path=path,
        file=WEIGHTS_FILE,
        expected=expected,
        actual=actual,
    )


def check_fields(directory: Path, shown: str, path: str) -> str | None:
    """The draft's config.json states every field vLLM reads for its method (MethodRow.vllm_reads), so vLLM
    loads the draft that was trained, not its own defaults (speculators #1065, vLLM #54526); returns the
    method (what serving rolls out). A config this version cannot read is left to vLLM (None)."""
    try:
        config = json.loads((directory / CONFIG_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(config, dict):
        return None
    missing = unstated_fields(config)
    if missing:
        raise CheckFailed(
            DRAFT_FIELDS_MISSING,
            f"the pinned draft's {shown}/{CONFIG_FILE} does not state {', '.join(missing)}: vLLM would serve "
            "it with its own defaults for them, not as it was trained; re-export it with this version, or "
            f"add the fields with the trained values; {WHAT_TO_DO}",
            path=path,
            file=CONFIG_FILE,
            missing=missing,
        )
    method = method_of_checkpoint(config)
    return method.value if method is not None else None


def check_manifest(
    directory: Path, shown: str, path: str, weights_sha256: str, progress: StageReporter | None = None
) -> dict[str, Any]:
    """Every file export's manifest.json lists, against its digest; {} without a manifest (a draft that was
    not exported by this pipeline: only its weights, which the pin names, are checked)."""
    manifest_file = directory / MANIFEST_FILE
    if not manifest_file.is_file():
        logger.warning("verify: %s has no %s; only %s is checked", shown, MANIFEST_FILE, WEIGHTS_FILE)
        return {}
    try:
        listed = json.loads(manifest_file.read_text())["files"]
    except (ValueError, KeyError, TypeError) as exc:
        raise StageError(f"{shown}/{MANIFEST_FILE} is not export's manifest ({exc}); {WHAT_TO_DO}") from None
    if not isinstance(listed, dict) or WEIGHTS_FILE not in listed:
        raise StageError(f"{shown}/{MANIFEST_FILE} lists no {WEIGHTS_FILE}; {WHAT_TO_DO}")
    if progress is not None:
        progress.set_total(len(listed))  # the weights, hashed already, among them
    checked: dict[str, Any] = {}
    for name, entry in sorted(listed.items()):
        expected = str((entry or {}).get("sha256"))
        target = directory / name
        if not target.is_file():
            raise CheckFailed(
                CHECKPOINT_MISSING,
                f"{shown}/{name}, listed in the draft's {MANIFEST_FILE}, is missing; {WHAT_TO_DO}",
                path=path, file=name, expected=expected,
            )  # fmt: skip
        actual = weights_sha256 if name == WEIGHTS_FILE else sha256_of(target)
        if progress is not None and name != WEIGHTS_FILE:
            progress.advance()
        if actual != expected:
            raise CheckFailed(
                CHECKSUM_MISMATCH,
                f"{shown}/{name} has sha256 {actual}, but the draft's {MANIFEST_FILE} says {expected}: the "
                f"checkpoint was changed after export; {WHAT_TO_DO}",
                path=path, file=name, expected=expected, actual=actual,
            )  # fmt: skip
        checked[name] = {"sha256": actual, "bytes": target.stat().st_size}
    return checked
