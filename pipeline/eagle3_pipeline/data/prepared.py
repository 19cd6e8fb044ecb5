"""The prepared dataset: what `prepare` (and `generate`, after regeneration) hand to extract, vocab and train.

Layout of a data stage's output directory:
  data/               a Hugging Face dataset (`save_to_disk`, torch format) with `input_ids`, `loss_mask`,
                      `seq_len`, `id` and `split`: train rows first, then validation rows, so speculators'
                      trainer splits it with `train_ratio` = the result's `trainRatio`
  token_freq.pt       {token id: count} over loss-masked tokens of the train rows (speculators' format)
  conversations.jsonl the normalized conversations with their split (what `generate` regenerates)
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import shutil
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator, Sized
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, cast

from eagle3_contract.params import VerifierRef
from eagle3_pipeline.data.conversations import Conversation, RowError, Skips
from eagle3_pipeline.data.masking import TOOL_CALLS_UNTRAINED, ChatTemplate, Tokenized, tokenize_conversation
from eagle3_pipeline.data.spool import TRAIN as TRAIN
from eagle3_pipeline.data.spool import VAL as VAL
from eagle3_pipeline.data.spool import split_key, validation_count
from eagle3_pipeline.runtime.context import StageContext
from eagle3_pipeline.runtime.errors import StageError
from eagle3_pipeline.runtime.reporter import StageReporter

logger = logging.getLogger(__name__)

DATA_DIR = "data"
TOKEN_FREQ_FILE = "token_freq.pt"
CONVERSATIONS_FILE = "conversations.jsonl"
WRITER_BATCH_ROWS = 1000  # rows the dataset writer holds before it writes them out


@dataclass(frozen=True)
class Tokenizing:
    """How a data stage tokenizes (prepare's and generate's params carry the same three fields)."""

    verifier: VerifierRef
    max_sequence_length: int
    loss_on_reasoning: bool


def assign_splits(conversations: list[Conversation], fraction: float, seed: int) -> list[Conversation]:
    """Deterministic split and order: rows sorted by a seeded hash of their id; the first share is held out.

    Depends only on the ids, the seed and the fraction, not on file order, so the same rows always land
    in the same split. Returns train rows first, then validation rows (prepare streams the same order from
    its spool: eagle3_pipeline.data.spool).
    """
    ordered = sorted(conversations, key=lambda conv: split_key(seed, conv["id"]))
    n_val = validation_count(len(ordered), fraction)
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
    return list(tokenized_rows(template, conversations, tokenizing, skips, progress))


def tokenized_rows(
    template: ChatTemplate,
    conversations: Iterable[Conversation],
    tokenizing: Tokenizing,
    skips: Skips,
    progress: StageReporter | None = None,
    figures: Figures | None = None,
) -> Iterator[tuple[Conversation, Tokenized]]:
    """tokenize_all, one row at a time; the time spent tokenizing is added to `figures`."""
    for conv in conversations:
        started = time.perf_counter()
        tokenized, skipped = _tokenized(template, conv, tokenizing, skips)
        if figures is not None:
            figures.tokenize_seconds += time.perf_counter() - started
        if progress is not None:
            progress.advance(1, len(tokenized.input_ids) if tokenized is not None else 0)
            if skipped is not None:
                progress.fail(skipped)
        if tokenized is not None:
            yield conv, tokenized


def _tokenized(
    template: ChatTemplate, conv: Conversation, tokenizing: Tokenizing, skips: Skips
) -> tuple[Tokenized | None, str | None]:
    """(the row tokenized, None), or (None, the reason it is skipped: counted in `skips`)."""
    limit = tokenizing.max_sequence_length
    try:
        tokenized = tokenize_conversation(
            template, conv["messages"], tokenizing.loss_on_reasoning, conv.get("tools")
        )
    except RowError as exc:  # the row's own problem (a bug of this code raises on: the stage fails)
        skips.add(exc.reason, conv["id"], str(exc))
        return None, exc.reason
    if len(tokenized.input_ids) > limit:
        skips.add("too_long", conv["id"], f"{len(tokenized.input_ids)} tokens > {limit}")
        return None, "too_long"
    return tokenized, None


FEATURES = {
    "id": "string",
    "split": "string",
    "input_ids": "int64[]",
    "loss_mask": "int64[]",
    "seq_len": "int64",
}


def save_dataset(path: Path, rows: Iterator[dict[str, Any]]) -> None:
    """Write `rows` as a Hugging Face dataset (`save_to_disk`, torch format) without holding them: the
    generator is written in batches of WRITER_BATCH_ROWS to an Arrow file beside `path`, which is moved into
    place in shards and removed."""
    import datasets

    def feature(kind: str) -> Any:
        if kind.endswith("[]"):
            return datasets.Sequence(datasets.Value(kind[:-2]))
        return datasets.Value(kind)

    scratch = path.with_name(path.name + ".building")
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        with _quiet_datasets():
            dataset = datasets.Dataset.from_generator(
                lambda: rows,
                features=datasets.Features({name: feature(kind) for name, kind in FEATURES.items()}),
                cache_dir=str(scratch),
                fingerprint=uuid.uuid4().hex,  # never a cached build: the rows are this run's
                writer_batch_size=WRITER_BATCH_ROWS,
            )
            dataset.set_format(type="torch")
            dataset.save_to_disk(str(path))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@contextlib.contextmanager
def _quiet_datasets() -> Iterator[None]:
    """No progress bars of the datasets library: the stage reports its own progress, one line at a time."""
    import datasets

    enabled = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if enabled:
            datasets.enable_progress_bars()


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


def write_conversations(path: Path, conversations: Iterable[Conversation]) -> None:
    """Written to a temporary file and renamed: generate resumes from this file, it is never half-written."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for conv in conversations:
            f.write(json.dumps(conv, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


@dataclass
class Figures:
    """What write_prepared counts while the rows stream past."""

    rows: int = 0  # conversations seen, tokenized or not
    samples: int = 0
    train: int = 0
    tokens: int = 0
    assistant_tokens: int = 0
    max_seq_len: int = 0
    tokenize_seconds: float = 0.0
    frequencies: Counter[int] = field(default_factory=Counter)
    # the samples by what they hold (masking's Tokenized.kind)
    kinds: Counter[str] = field(default_factory=Counter)

    def add(self, split: str, tokenized: Tokenized) -> None:
        self.samples += 1
        self.kinds[tokenized.kind] += 1
        self.tokens += len(tokenized.input_ids)
        self.assistant_tokens += sum(tokenized.loss_mask)
        self.max_seq_len = max(self.max_seq_len, len(tokenized.input_ids))
        if split == TRAIN:
            self.train += 1
            self.frequencies.update(
                t for t, m in zip(tokenized.input_ids, tokenized.loss_mask, strict=True) if m
            )


def write_prepared(
    work: Path,
    conversations: Iterable[Conversation],
    ctx: StageContext[Any, Any],
    tokenizing: Tokenizing,
    skips: Skips | None = None,
    progress: StageReporter | None = None,
    total: int | None = None,
) -> dict[str, Any]:
    """Tokenize, mask and save `conversations` (which carry their split) into `work`, one row at a time;
    returns statistics. The dataset holds train rows first: an iterator (prepare's spool) must yield them in
    that order, and is written to conversations.jsonl as it streams past; a list (generate's) is written as
    given and its rows are tokenized train rows first (a stable sort).

    With `progress`, it counts the rows (the skipped ones as failures by reason, those of `skips` included)
    of `total` (default: len(conversations)).
    """
    import torch

    skips = skips if skips is not None else Skips()
    template = chat_template(ctx, tokenizing.verifier)
    if progress is not None:
        progress.begin("rows", total if total is not None else len(cast(Sized, conversations)))
        for reason, count in skips.counts.items():  # rows skipped before tokenizing (loading them)
            progress.fail(reason, count)
    figures = Figures()
    streamed = not isinstance(conversations, list)
    if not streamed:  # generate's list: conversations.jsonl as given, the dataset's train rows first
        write_conversations(work / CONVERSATIONS_FILE, cast(list[Conversation], conversations))
        conversations = sorted(conversations, key=lambda conv: conv["split"] != TRAIN)
    conversations_tmp = work / (CONVERSATIONS_FILE + ".tmp")
    with conversations_tmp.open("w", encoding="utf-8") if streamed else contextlib.nullcontext() as written:
        rows = _dataset_rows(conversations, written, template, tokenizing, skips, figures, progress)
        first = next(rows, None)  # the datasets library refuses to write no rows at all
        if first is not None:
            save_dataset(work / DATA_DIR, itertools.chain([first], rows))
        if figures.train == 0:
            raise StageError(
                f"no usable training rows: {figures.rows} conversations, {skips.total()} skipped "
                f"({dict(skips.counts)}); first problems: {_first_examples(skips)}"
            )
        if written is not None:
            written.flush()
            os.fsync(written.fileno())
    if streamed:
        os.replace(conversations_tmp, work / CONVERSATIONS_FILE)
    torch.save(dict(figures.frequencies), work / TOKEN_FREQ_FILE)
    for reason, examples in skips.examples.items():
        logger.warning("skipped %d rows (%s), e.g. %s", skips.counts[reason], reason, "; ".join(examples))
    _log_kinds(figures.kinds, template)
    return {
        "samples": figures.samples,
        "kept": dict(sorted(figures.kinds.items())),
        "train": figures.train,
        "validation": figures.samples - figures.train,
        "trainRatio": figures.train / figures.samples,
        "skipped": dict(sorted(skips.counts.items())),
        "skippedTotal": skips.total(),
        "skippedExamples": {k: v[:2] for k, v in sorted(skips.examples.items())},
        "tokens": figures.tokens,
        "assistantTokens": figures.assistant_tokens,
        "uniqueAssistantTokens": len(figures.frequencies),
        "maxSeqLen": figures.max_seq_len,
        "tokenizeSeconds": round(figures.tokenize_seconds, 3),
        "tokensPerSecond": round(figures.tokens / figures.tokenize_seconds, 1)
        if figures.tokenize_seconds > 0
        else None,
    }


def _dataset_rows(
    conversations: Iterable[Conversation],
    written: IO[str] | None,
    template: ChatTemplate,
    tokenizing: Tokenizing,
    skips: Skips,
    figures: Figures,
    progress: StageReporter | None,
) -> Iterator[dict[str, Any]]:
    """The dataset's rows; each conversation also goes to `written` (if any), tokenized or not."""
    written_rows = _written(conversations, written, figures)
    for conv, tokenized in tokenized_rows(template, written_rows, tokenizing, skips, progress, figures):
        figures.add(conv["split"], tokenized)
        ids = tokenized.input_ids
        yield {"id": conv["id"], "split": conv["split"], "input_ids": ids, "loss_mask": tokenized.loss_mask,
               "seq_len": len(ids)}  # fmt: skip


def _written(
    conversations: Iterable[Conversation], written: IO[str] | None, figures: Figures
) -> Iterator[Conversation]:
    seen_validation = False
    for conv in conversations:
        if conv["split"] == TRAIN and seen_validation:
            raise ValueError("write_prepared: a train row after a validation row (train rows come first)")
        seen_validation |= conv["split"] != TRAIN
        figures.rows += 1
        if written is not None:
            written.write(json.dumps(conv, ensure_ascii=False) + "\n")
        yield conv


def _log_kinds(kinds: Counter[str], template: ChatTemplate) -> None:
    """The samples by what they hold; a warning where tool calls stay out of the loss."""
    logger.info("kept %s", ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items())))
    if kinds[TOOL_CALLS_UNTRAINED]:
        why = (
            "renders some of them elsewhere than inside the assistant's turn"
            if template.closes_tool_calls
            else "does not render tool calls inside an assistant turn its end-of-turn marker closes"
        )
        logger.warning(
            "%d rows keep (some of) their tool calls out of the loss: the verifier's chat template %s; "
            "their assistant text is trained",
            kinds[TOOL_CALLS_UNTRAINED],
            why,
        )


def _first_examples(skips: Skips) -> str:
    return "; ".join(e for examples in skips.examples.values() for e in examples[:1]) or "none"
