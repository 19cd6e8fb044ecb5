"""Chat datasets in, normalized conversations out: OpenAI messages, ShareGPT or prompt-only rows.

Every row becomes `{"id", "messages": [{"role", "content", "reasoning_content"?}]}` with roles system, user
and assistant; rows that cannot be read that way are counted by reason, never silently dropped.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eagle3_pipeline.errors import StageError

logger = logging.getLogger(__name__)

Message = dict[str, str]
Conversation = dict[str, Any]
FILE_SUFFIXES = (".jsonl", ".json", ".parquet")
SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "model": "assistant",
    "system": "system",
}
MESSAGE_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
EXAMPLES_PER_REASON = 5


class RowError(ValueError):
    """Why one row is skipped; `reason` is the counter key."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


@dataclass
class Skips:
    """Rows skipped, by reason, with a few example ids and details per reason."""

    counts: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)

    def add(self, reason: str, row_id: str, detail: str) -> None:
        self.counts[reason] += 1
        shown = self.examples.setdefault(reason, [])
        if len(shown) < EXAMPLES_PER_REASON:
            shown.append(f"{row_id}: {detail}")

    def total(self) -> int:
        return sum(self.counts.values())


def read_rows(source: str, split: str) -> Iterator[tuple[str, Any]]:
    """(row id, raw row) from a local file or directory, or a Hugging Face dataset id."""
    path = Path(source)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.suffix in FILE_SUFFIXES)
        if not files:
            raise StageError(f"dataset.source {source}: a directory without .jsonl, .json or .parquet files")
        for file in files:
            yield from _read_file(file, prefix=f"{file.relative_to(path)}:")
    elif path.is_file():
        yield from _read_file(path, prefix="")
    elif source.startswith(("/", ".")) or path.suffix in FILE_SUFFIXES:
        raise StageError(f"dataset.source {source}: no such file or directory")
    else:
        yield from _read_hub(source, split)


def _read_file(path: Path, prefix: str) -> Iterator[tuple[str, Any]]:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        for i, row in enumerate(pq.read_table(path).to_pylist()):
            yield f"{prefix}{i}", row
        return
    text = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix == ".json" and text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise StageError(f"dataset.source {path}: not valid JSON ({exc})") from None
        for i, row in enumerate(rows):
            yield f"{prefix}{i}", row
        return
    for i, line in enumerate(text.splitlines()):
        if not line.strip():
            continue
        try:
            yield f"{prefix}{i + 1}", json.loads(line)
        except json.JSONDecodeError as exc:
            yield f"{prefix}{i + 1}", RowError("malformed", f"line {i + 1} is not JSON ({exc.msg})")


def _read_hub(source: str, split: str) -> Iterator[tuple[str, Any]]:
    import datasets

    try:
        dataset = datasets.load_dataset(source, split=split)
    except Exception as exc:
        raise StageError(
            f"dataset.source {source}: not a local path, and loading it from the Hugging Face Hub failed "
            f"({type(exc).__name__}: {exc}); give a local .jsonl/.json/.parquet path, or check the id/split"
        ) from None
    for i, row in enumerate(dataset):
        yield str(i), row


def detect_format(row: Any) -> str | None:
    if not isinstance(row, dict):
        return None
    if isinstance(row.get("messages"), list):
        return "messages"
    if isinstance(row.get("conversations"), list):
        return "sharegpt"
    if isinstance(row.get("prompt"), str):
        return "prompts"
    return None


def _text(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) for p in value):
        if any(p.get("type", "text") != "text" for p in value):
            raise RowError("multimodal", f"{where} has non-text parts; only text conversations are supported")
        return "".join(str(p.get("text", "")) for p in value)
    raise RowError("malformed", f"{where} is {type(value).__name__}, expected a string")


def _message(raw: Any, index: int, roles: dict[str, str], role_key: str, content_key: str) -> Message:
    where = f"turn {index}"
    if not isinstance(raw, dict):
        raise RowError("malformed", f"{where} is not an object")
    role = roles.get(str(raw.get(role_key, "")).lower())
    if role is None:
        raise RowError(
            "malformed", f"{where} has {role_key} {raw.get(role_key)!r}, not one of {sorted(roles)}"
        )
    message = {"role": role, "content": _text(raw.get(content_key), f"{where}.{content_key}")}
    reasoning = raw.get("reasoning_content", raw.get("reasoning"))
    if role == "assistant" and reasoning:
        message["reasoning_content"] = _text(reasoning, f"{where}.reasoning_content")
    return message


def normalize(row: Any, fmt: str) -> list[Message]:
    """The row's messages, or RowError saying why the row cannot be used."""
    if isinstance(row, RowError):
        raise row
    if detect_format(row) is None:
        keys = sorted(row)[:6] if isinstance(row, dict) else type(row).__name__
        raise RowError("malformed", f"no 'messages', 'conversations' or 'prompt' field (found {keys})")
    if fmt == "prompts":
        if not isinstance(row.get("prompt"), str):
            raise RowError("malformed", "no 'prompt' string")
        system = row.get("system")
        head = [{"role": "system", "content": system}] if isinstance(system, str) and system else []
        messages = [*head, {"role": "user", "content": row["prompt"]}]
    elif fmt == "sharegpt":
        turns = row.get("conversations")
        if not isinstance(turns, list):
            raise RowError("malformed", "no 'conversations' list (is dataset.format right?)")
        messages = [_message(t, i, SHAREGPT_ROLES, "from", "value") for i, t in enumerate(turns)]
    else:
        turns = row.get("messages")
        if not isinstance(turns, list):
            raise RowError("malformed", "no 'messages' list (is dataset.format right?)")
        messages = [_message(t, i, MESSAGE_ROLES, "role", "content") for i, t in enumerate(turns)]
    return _checked(messages)


def _checked(messages: list[Message]) -> list[Message]:
    if not messages:
        raise RowError("empty", "no turns")
    for i, m in enumerate(messages):
        if not m["content"].strip() and not m.get("reasoning_content"):
            raise RowError("empty", f"turn {i} ({m['role']}) is empty")
    if all(m["role"] == "system" for m in messages):
        raise RowError("empty", "only system turns")
    return messages


def load_conversations(
    source: str, split: str, fmt: str, max_samples: int | None = None
) -> tuple[list[Conversation], Skips, str]:
    """Normalized conversations (in source order), skipped rows, and the format used."""
    skips = Skips()
    out: list[Conversation] = []
    chosen = None if fmt == "auto" else fmt
    seen: Counter[str] = Counter()
    for row_id, row in read_rows(source, split):
        if isinstance(row, dict) and isinstance(row.get("id"), str | int):
            row_id = str(row["id"])
        seen[row_id] += 1
        if seen[row_id] > 1:  # ids key the split and regeneration's resume: keep them unique
            row_id = f"{row_id}#{seen[row_id]}"
        if chosen is None:
            chosen = detect_format(row)
        try:
            messages = normalize(row, chosen or "messages")
        except RowError as exc:
            skips.add(exc.reason, row_id, str(exc))
            continue
        out.append({"id": row_id, "messages": messages})
        if max_samples is not None and len(out) >= max_samples:
            break
    return out, skips, chosen or "messages"
