"""The prepared dataset: what `prepare` (and `generate`, after regeneration) hand to extract, vocab and train.

Layout of a data stage's output directory:
  data/               a Hugging Face dataset (`save_to_disk`, torch format) with `input_ids`, `loss_mask`,
                      `seq_len`, `id` and `split`: train rows first, then validation rows, so speculators'
                      trainer splits it with `train_ratio` = the result's `trainRatio`
  token_freq.pt       {token id: count} over loss-masked tokens of the train rows (speculators' format)
  conversations.jsonl the normalized conversations with their split (what `generate` regenerates)
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3_contract.params import VerifierRef
from eagle3_pipeline.data.conversations import Conversation, RowError, Skips
from eagle3_pipeline.data.masking import ChatTemplate, Tokenized, tokenize_conversation
from eagle3_pipeline.runtime.context import StageContext
from eagle3_pipeline.runtime.errors import StageError
from eagle3_pipeline.runtime.reporter import StageReporter

logger = logging.getLogger(__name__)

DATA_DIR = "data"
TOKEN_FREQ_FILE = "token_freq.pt"
CONVERSATIONS_FILE = "conversations.jsonl"
TRAIN, VAL = "train", "val"


@dataclass(frozen=True)
class Tokenizing:
    """How a data stage tokenizes (prepare's and generate's params carry the same three fields)."""

    verifier: VerifierRef
    max_sequence_length: int
    loss_on_reasoning: bool


def assign_splits(conversations: list[Conversation], fraction: float, seed: int) -> list[Conversation]:
    """Deterministic split and order: rows sorted by a seeded hash of their id; the first share is held out.

    Depends only on the ids, the seed and the fraction, not on file order, so the same rows always land
    in the same split. Returns train rows first, then validation rows.
    """

    def key(conv: Conversation) -> str:
        return hashlib.sha256(f"{seed}\x00{conv['id']}".encode()).hexdigest()

    ordered = sorted(conversations, key=key)
    n_val = round(len(ordered) * fraction)
    if fraction > 0 and n_val == 0 and len(ordered) >= 2:
        n_val = 1
    val = [{**c, "split": VAL} for c in ordered[:n_val]]
    train = [{**c, "split": TRAIN} for c in ordered[n_val:]]
    return train + val


def load_tokenizer(ctx: StageContext[Any, Any], verifier: VerifierRef) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(
            ctx.local_path(verifier.model),
            revision=verifier.revision,
            trust_remote_code=verifier.trust_remote_code,
        )
    except Exception as exc:
        raise StageError(
            f"verifier.model {verifier.model}: cannot load its tokenizer ({type(exc).__name__}: {exc}); "
            "check the id or path (and verifier.trustRemoteCode for models with their own code)"
        ) from None


def chat_template(ctx: StageContext[Any, Any], verifier: VerifierRef) -> ChatTemplate:
    try:
        return ChatTemplate(load_tokenizer(ctx, verifier))
    except ValueError as exc:
        raise StageError(f"verifier.model {verifier.model}: {exc}") from None


def tokenize_all(
    ctx: StageContext[Any, Any],
    tokenizing: Tokenizing,
    template: ChatTemplate,
    conversations: list[Conversation],
    skips: Skips,
    progress: StageReporter | None = None,
) -> list[tuple[Conversation, Tokenized]]:
    """The rows that tokenize within the length limit; the others counted in `skips` (and in `progress`,
    which counts every row and its tokens: prepare's, not generate's final re-tokenizing)."""
    rows = []
    for conv in conversations:
        tokenized, skipped = _tokenized(template, conv, tokenizing, skips)
        if progress is not None:
            progress.advance(1, len(tokenized.input_ids) if tokenized is not None else 0)
            if skipped is not None:
                progress.fail(skipped)
        if tokenized is not None:
            rows.append((conv, tokenized))
    return rows


def _tokenized(
    template: ChatTemplate, conv: Conversation, tokenizing: Tokenizing, skips: Skips
) -> tuple[Tokenized | None, str | None]:
    """(the row tokenized, None), or (None, the reason it is skipped: counted in `skips`)."""
    limit = tokenizing.max_sequence_length
    try:
        tokenized = tokenize_conversation(template, conv["messages"], tokenizing.loss_on_reasoning)
    except RowError as exc:
        skips.add(exc.reason, conv["id"], str(exc))
        return None, exc.reason
    except Exception as exc:  # one row's failure, whatever raised it, never costs the other rows
        skips.add("error", conv["id"], f"{type(exc).__name__}: {exc}")
        return None, "error"
    if len(tokenized.input_ids) > limit:
        skips.add("too_long", conv["id"], f"{len(tokenized.input_ids)} tokens > {limit}")
        return None, "too_long"
    return tokenized, None


def token_frequencies(rows: list[tuple[Conversation, Tokenized]]) -> Counter[int]:
    counts: Counter[int] = Counter()
    for conv, tok in rows:
        if conv["split"] == TRAIN:
            counts.update(t for t, m in zip(tok.input_ids, tok.loss_mask, strict=True) if m)
    return counts


def save_dataset(path: Path, rows: list[tuple[Conversation, Tokenized]]) -> None:
    import datasets

    features = datasets.Features(
        {
            "id": datasets.Value("string"),
            "split": datasets.Value("string"),
            "input_ids": datasets.Sequence(datasets.Value("int64")),
            "loss_mask": datasets.Sequence(datasets.Value("int64")),
            "seq_len": datasets.Value("int64"),
        }
    )
    columns: dict[str, list[Any]] = {
        "id": [c["id"] for c, _ in rows],
        "split": [c["split"] for c, _ in rows],
        "input_ids": [t.input_ids for _, t in rows],
        "loss_mask": [t.loss_mask for _, t in rows],
        "seq_len": [len(t.input_ids) for _, t in rows],
    }
    dataset = datasets.Dataset.from_dict(columns, features=features)
    dataset.set_format(type="torch")
    dataset.save_to_disk(str(path))


def read_conversations(path: Path) -> list[Conversation]:
    """The prepare stage's conversations.jsonl (what generate regenerates and evaluate holds out)."""
    if not path.is_file():
        raise StageError(f"{path}: the prepare stage's output has no {CONVERSATIONS_FILE}; re-run prepare")
    conversations = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            try:
                conversations.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise StageError(f"{path}:{number}: not JSON ({exc}); re-run the prepare stage") from None
    ids = [c.get("id") for c in conversations]
    if len(set(ids)) != len(ids) or not all(isinstance(i, str) for i in ids):
        raise StageError(f"{path}: conversation ids must be unique strings; re-run the prepare stage")
    return conversations


def write_conversations(path: Path, conversations: list[Conversation]) -> None:
    """Written to a temporary file and renamed: generate resumes from this file, it is never half-written."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for conv in conversations:
            f.write(json.dumps(conv, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_prepared(
    work: Path,
    conversations: list[Conversation],
    ctx: StageContext[Any, Any],
    tokenizing: Tokenizing,
    skips: Skips | None = None,
    progress: StageReporter | None = None,
) -> dict[str, Any]:
    """Tokenize, mask and save `conversations` (which carry their split) into `work`; returns statistics.

    With `progress`, it counts the rows (the skipped ones as failures by reason, those of `skips` included).
    """
    import torch

    skips = skips if skips is not None else Skips()
    template = chat_template(ctx, tokenizing.verifier)
    started = time.monotonic()
    if progress is not None:
        progress.begin("rows", len(conversations))
        for reason, count in skips.counts.items():  # rows skipped before tokenizing (loading them)
            progress.fail(reason, count)
    rows = tokenize_all(ctx, tokenizing, template, conversations, skips, progress)
    seconds = time.monotonic() - started
    rows.sort(key=lambda r: r[0]["split"] != TRAIN)  # stable: train rows first, then validation
    n_train = sum(1 for c, _ in rows if c["split"] == TRAIN)
    if n_train == 0:
        raise StageError(
            f"no usable training rows: {len(conversations)} conversations, {skips.total()} skipped "
            f"({dict(skips.counts)}); first problems: {_first_examples(skips)}"
        )
    save_dataset(work / DATA_DIR, rows)
    freq = token_frequencies(rows)
    torch.save(dict(freq), work / TOKEN_FREQ_FILE)
    write_conversations(work / CONVERSATIONS_FILE, conversations)
    for reason, examples in skips.examples.items():
        logger.warning("skipped %d rows (%s), e.g. %s", skips.counts[reason], reason, "; ".join(examples))
    tokens = sum(len(t.input_ids) for _, t in rows)
    return {
        "samples": len(rows),
        "train": n_train,
        "validation": len(rows) - n_train,
        "trainRatio": n_train / len(rows),
        "skipped": dict(sorted(skips.counts.items())),
        "skippedTotal": skips.total(),
        "skippedExamples": {k: v[:2] for k, v in sorted(skips.examples.items())},
        "tokens": tokens,
        "assistantTokens": sum(sum(t.loss_mask) for _, t in rows),
        "uniqueAssistantTokens": len(freq),
        "maxSeqLen": max(len(t.input_ids) for _, t in rows),
        "tokenizeSeconds": round(seconds, 3),
        "tokensPerSecond": round(tokens / seconds, 1) if seconds > 0 else None,
    }


def _first_examples(skips: Skips) -> str:
    return "; ".join(e for examples in skips.examples.values() for e in examples[:1]) or "none"
