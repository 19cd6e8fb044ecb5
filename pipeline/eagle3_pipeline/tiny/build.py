"""`eagle3 tiny`: build the tiny CPU verifier and its example chat datasets, or find them cached.

Under the models root (`--models`, else `$EAGLE3_MODELS_ROOT`, else
`${XDG_CACHE_HOME:-~/.cache}/eagle3-operator/models`) it writes `tiny-llama/`, a plain Hugging Face Llama
checkpoint with its tokenizer and chat template, and `datasets/tiny-chat.jsonl` (OpenAI messages),
`tiny-chat-sharegpt.jsonl` (the same rows as ShareGPT) and `tiny-prompts.jsonl` (their first user turns),
each row with its `category` (the task kind of its first request).

A build is stamped (`tiny-llama/.eagle3-tiny-build`) with a hash of the builder's source files and parameters:
a complete build with the current hash is reused at once; a changed builder, or `--force`, rebuilds. The build
runs in a hidden sibling directory and is moved into place at the end, stamp last, so an interrupted build
never looks complete. A lock file serializes concurrent builders of one root.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eagle3_pipeline.runtime.context import models_root
from eagle3_pipeline.tiny import CHAT_FILE, DATASET_FILES, MODEL_DIR, PROMPTS_FILE, SHAREGPT_FILE, STAMP_FILE
from eagle3_pipeline.tiny.corpus import categorized_sample, messages_row, prompt_row, sharegpt_row
from eagle3_pipeline.tiny.pretrain import PretrainParams

log = logging.getLogger(__name__)

LOCK_FILE = ".tiny-build.lock"
PARTIAL_DIR = ".tiny-build.partial"


@dataclass(frozen=True)
class ModelParams:
    vocab_size: int = 1024
    hidden_size: int = 128
    intermediate_size: int = 384
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    max_position_embeddings: int = 1024
    rope_theta: float = 10000.0
    dtype: str = "float32"


@dataclass(frozen=True)
class BuildParams:
    model: ModelParams = field(default_factory=ModelParams)
    pretrain: PretrainParams = field(default_factory=PretrainParams)
    tokenizer_conversations: int = 20000
    dataset_seed: int = 2
    dataset_rows: int = 400


def build_hash(params: BuildParams) -> str:
    """sha256 of the builder's source files and its parameters."""
    digest = hashlib.sha256(json.dumps(dataclasses.asdict(params), sort_keys=True).encode())
    for source in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(source.name.encode() + b"\0" + source.read_bytes() + b"\0")
    return digest.hexdigest()


def read_stamp(root: Path) -> dict[str, Any] | None:
    try:
        stamp: dict[str, Any] = json.loads((root / MODEL_DIR / STAMP_FILE).read_text())
    except (OSError, ValueError):
        return None
    return stamp


def is_built(root: Path, digest: str) -> bool:
    """A complete build of this builder: the stamp carries `digest` and every dataset file is there."""
    stamp = read_stamp(root)
    complete = all((root / "datasets" / name).is_file() for name in DATASET_FILES)
    return stamp is not None and stamp.get("hash") == digest and complete


@contextmanager
def locked(root: Path) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    with (root / LOCK_FILE).open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        for row in rows:
            out.write(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")


def write_datasets(directory: Path, params: BuildParams) -> None:
    """The example chat dataset in its three formats, from the corpus with the dataset seed."""
    rows = categorized_sample(params.dataset_seed, params.dataset_rows)  # each with its task kind
    write_jsonl(directory / CHAT_FILE, [messages_row(messages, kind) for messages, kind in rows])
    write_jsonl(directory / SHAREGPT_FILE, [sharegpt_row(messages, kind) for messages, kind in rows])
    write_jsonl(directory / PROMPTS_FILE, [prompt_row(messages, kind) for messages, kind in rows])
    log.info("wrote %d example conversations to %s", len(rows), directory)


def commit(partial: Path, root: Path) -> None:
    """Move a finished build into `root`: the dataset files one by one, then the model directory."""
    datasets = root / "datasets"
    datasets.mkdir(parents=True, exist_ok=True)
    for name in DATASET_FILES:
        os.replace(partial / "datasets" / name, datasets / name)
    target, old = root / MODEL_DIR, partial / "old-model"
    if target.exists():
        os.replace(target, old)
    os.replace(partial / MODEL_DIR, target)
    shutil.rmtree(partial)


def build(root: Path, force: bool = False, params: BuildParams | None = None) -> Path:
    """Build the tiny verifier and datasets under `root` unless a complete build of this builder is there."""
    params = params or BuildParams()
    digest = build_hash(params)
    with locked(root):
        if not force and is_built(root, digest):
            log.info("tiny verifier cached in %s (build %s)", root, digest[:12])
            return root
        from eagle3_pipeline.tiny.model import build_model_dir  # lazily: torch, only when a build is due

        started = time.monotonic()
        partial = root / PARTIAL_DIR
        shutil.rmtree(partial, ignore_errors=True)
        write_datasets(partial / "datasets", params)
        report = build_model_dir(partial / MODEL_DIR, params)
        stamp = {"hash": digest, "params": dataclasses.asdict(params), **report}
        stamp["build_seconds"] = round(time.monotonic() - started, 1)
        (partial / MODEL_DIR / STAMP_FILE).write_text(json.dumps(stamp, indent=2) + "\n")
        commit(partial, root)
        log.info("built the tiny verifier in %s in %.0f s", root, stamp["build_seconds"])
    return root


def main(models: str | None, force: bool = False) -> int:
    """Build (or find cached) the tiny verifier and datasets; print the models root on stdout."""
    root = build(models_root(models), force=force)
    sys.stdout.write(f"{root}\n")
    return 0
